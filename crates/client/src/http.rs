//! One HTTP exchange with the ledger and what it comes to for the retry
//! loop: an answer (2xx read as the wanted type; 429 a refusal, or a wait for
//! its `Retry-After`; 503 ask again; anything else definitive), or no answer.
//! The exchange itself is the client's [`crate::transport::Transport`].

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use crate::client::Client;
use crate::error::Error;
use crate::owners::About;
use crate::retry::Attempt;
pub(crate) use crate::transport::Exchange;
use crate::transport::Outgoing;
use crate::types::Problem;

impl Client {
    pub(crate) async fn exchange(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Exchange {
        self.exchange_at(None, method, path, body, timeout).await
    }

    /// One exchange about a reservation: at the owner learnt for it, if
    /// any, and what the answer teaches about owners (see [`crate::owners`]).
    pub(crate) async fn exchange_about(
        &self,
        about: About<'_>,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Exchange {
        let owners = self.inner.owners.as_ref();
        let owner = owners.and_then(|o| o.of(&about));
        let exchange = self
            .exchange_at(owner.as_deref(), method, path, body, timeout)
            .await;
        if let Some(owners) = owners {
            owners.learn(&exchange, owner, &about);
        }
        exchange
    }

    /// [`Client::exchange`] at the node `at` instead of the configured URL.
    async fn exchange_at(
        &self,
        at: Option<&str>,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Exchange {
        let base = at.unwrap_or(&self.inner.base);
        let request = Outgoing {
            method,
            url: format!("{base}{path}"),
            body,
            token: self.inner.token.as_deref(),
            timeout,
        };
        self.inner.transport.send(request).await
    }

    pub(crate) fn classify<T: serde::de::DeserializeOwned>(
        &self,
        exchange: Exchange,
    ) -> Attempt<T> {
        match exchange {
            Exchange::Lost { why, .. } => Attempt::Again { why, after: None },
            Exchange::Answer { status, body, .. } if status.is_success() => {
                match serde_json::from_slice(&body) {
                    Ok(v) => Attempt::Done(v),
                    Err(e) => Attempt::Fail(Error::Protocol(format!(
                        "{e}: {}",
                        String::from_utf8_lossy(&body)
                    ))),
                }
            }
            Exchange::Answer {
                status,
                retry_after,
                body,
                ..
            } if status == StatusCode::TOO_MANY_REQUESTS => {
                if self.inner.retry.retry_refusals {
                    Attempt::Again {
                        why: format!("429 {}", problem(&body).code()),
                        after: retry_after,
                    }
                } else {
                    Attempt::Fail(Error::Refused {
                        problem: Box::new(problem(&body)),
                        retry_after,
                    })
                }
            }
            Exchange::Answer {
                status,
                retry_after,
                body,
                ..
            } if matches!(
                status,
                StatusCode::SERVICE_UNAVAILABLE
                    | StatusCode::BAD_GATEWAY
                    | StatusCode::GATEWAY_TIMEOUT
            ) =>
            {
                // Not now: the ledger (or a proxy before it) asks for a retry.
                Attempt::Again {
                    why: format!("{} {}", status.as_u16(), problem(&body).code()),
                    after: retry_after,
                }
            }
            Exchange::Answer { status, body, .. } => Attempt::Fail(rejected(status, &body)),
        }
    }
}

pub(crate) fn problem(body: &[u8]) -> Problem {
    serde_json::from_slice(body).unwrap_or_else(|_| Problem {
        detail: String::from_utf8_lossy(body).into_owned(),
        ..Problem::default()
    })
}

pub(crate) fn rejected(status: StatusCode, body: &[u8]) -> Error {
    Error::Rejected {
        status: status.as_u16(),
        problem: Box::new(problem(body)),
    }
}
