//! The book's side of the ledger's HTTP: issue a shard under an id of the
//! book's own (a lost answer asked again under it), and reconcile one.
//! What the book decides locally is in the parent module.

use std::time::{Duration, Instant};

use super::*;
use crate::retry::Backoff;

impl ShardBook {
    /// A fresh shard id (`sh-` and 32 hex digits, as the ledger picks its
    /// own), for [`ShardBook::issue_as`].
    pub fn new_shard_id() -> String {
        format!("sh-{:032x}", fastrand::u128(..))
    }

    /// Asks the ledger for a shard bound to this process and installs it,
    /// under a fresh id (see [`ShardBook::issue_as`]).
    pub async fn issue(
        &self,
        http: &reqwest::Client,
        base_url: &str,
        subject: &str,
        route: &str,
        units: u64,
        ttl_ms: u64,
    ) -> Result<ShardDocument, ReconcileError> {
        let shard_id = Self::new_shard_id();
        self.issue_as(&shard_id, http, base_url, subject, route, units, ttl_ms)
            .await
    }

    /// The same under `shard_id`. A lost answer (none, or a 503) is asked
    /// again with the same id and body until the retry policy's deadline
    /// ([`ShardBook::with_retry`]); the ledger answers the shard it issued
    /// under that id, so a retry never issues a second one. After an
    /// [`ReconcileError::Unavailable`] the shard may be issued: ask again
    /// with the same id.
    #[allow(clippy::too_many_arguments)]
    pub async fn issue_as(
        &self,
        shard_id: &str,
        http: &reqwest::Client,
        base_url: &str,
        subject: &str,
        route: &str,
        units: u64,
        ttl_ms: u64,
    ) -> Result<ShardDocument, ReconcileError> {
        let body = serde_json::json!({
            "subject": subject, "route": route, "units": units,
            "gateway_id": self.gateway_id, "gateway_boot_epoch": self.boot_epoch,
            "ttl_ms": ttl_ms, "shard_id": shard_id,
        });
        let url = format!("{}/v1/shards", base_url.trim_end_matches('/'));
        let deadline = Instant::now() + self.retry.deadline;
        let mut backoff = Backoff::new(self.retry.clone());
        let (status, text) = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let timeout = left.min(self.retry.attempt_timeout);
            let why = match post_for_success(http, &url, &body, Some(timeout)).await {
                Err(ReconcileError::Unavailable(why)) => why,
                answered => break answered?,
            };
            let wait = backoff.next_delay();
            if wait >= deadline.saturating_duration_since(Instant::now()) {
                return Err(ReconcileError::Unavailable(format!(
                    "{why} (shard {shard_id} may have been issued: ask again under its id)"
                )));
            }
            tracing::debug!(shard_id, %why, "issue: asking again under the same shard id");
            tokio::time::sleep(wait).await;
        };
        let document: ShardDocument =
            serde_json::from_str(&text).map_err(|e| ReconcileError::Refused {
                status,
                body: format!("unreadable shard: {e}"),
            })?;
        self.install(document.clone())
            .map_err(|e| ReconcileError::Refused {
                status,
                body: format!("issued shard not usable: {e}"),
            })?;
        Ok(document)
    }

    /// Reconciles `shard_id`: closes it for admission, sends the terminal
    /// receipts, and keeps the ledger's answer. Call again after an
    /// [`ReconcileError::Unavailable`]: the same receipts go out, and the
    /// ledger remints at most once.
    pub async fn reconcile(
        &self,
        http: &reqwest::Client,
        base_url: &str,
        shard_id: &str,
    ) -> Result<ReconcileOutcome, ReconcileError> {
        let body = match self.begin_reconcile(shard_id)? {
            Reconcile::Done(outcome) => return Ok(outcome),
            Reconcile::Send(body) => body,
        };
        let url = format!(
            "{}/v1/shards/{shard_id}/reconcile",
            base_url.trim_end_matches('/')
        );
        let (status, text) = post_for_success(http, &url, &body, None).await?;
        let outcome: ReconcileOutcome =
            serde_json::from_str(&text).map_err(|e| ReconcileError::Refused {
                status,
                body: format!("unreadable answer: {e}"),
            })?;
        self.note_reconciled(shard_id, outcome.clone());
        Ok(outcome)
    }
}

/// POSTs `body` to `url` (answered within `timeout`, if given): a 200 or
/// 201 gives its status and body text; no answer or a 503 is
/// [`ReconcileError::Unavailable`] (try again later), any other status
/// [`ReconcileError::Refused`].
async fn post_for_success(
    http: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
    timeout: Option<Duration>,
) -> Result<(u16, String), ReconcileError> {
    let unavailable = |e: reqwest::Error| ReconcileError::Unavailable(e.to_string());
    let mut request = http.post(url).json(body);
    if let Some(timeout) = timeout {
        request = request.timeout(timeout);
    }
    let response = request.send().await.map_err(unavailable)?;
    let status = response.status().as_u16();
    let text = response.text().await.map_err(unavailable)?;
    match status {
        200 | 201 => Ok((status, text)),
        503 => Err(ReconcileError::Unavailable(text)),
        _ => Err(ReconcileError::Refused { status, body: text }),
    }
}
