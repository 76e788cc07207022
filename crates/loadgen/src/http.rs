//! A lean HTTP/1.1 client for the Reservoir API: one keep-alive connection per
//! load-generating client (hyper's low-level `http1` connection, `TCP_NODELAY`),
//! reopened only after the server or the network closed it.
//!
//! Each benchmark client owns its connection, so N clients mean N connections
//! and at most N requests in flight, the same shape as N Redis connections on
//! the baseline side.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// A failed request: the connection failed or the server answered outside 2xx.
#[derive(Debug)]
pub enum HttpError {
    /// Connecting, writing or reading failed (the connection is dropped).
    Transport(String),
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::Transport(e) => write!(f, "transport: {e}"),
        }
    }
}

/// The host and port of a base URL such as `http://127.0.0.1:8080`.
pub fn authority_of(url: &str) -> Result<String, String> {
    let uri: Uri = url.parse().map_err(|e| format!("bad url {url:?}: {e}"))?;
    if uri.scheme_str().is_some_and(|s| s != "http") {
        return Err(format!("only http:// is supported, got {url:?}"));
    }
    let auth = uri
        .authority()
        .ok_or_else(|| format!("url {url:?} has no host"))?;
    Ok(match auth.port_u16() {
        Some(_) => auth.to_string(),
        None => format!("{}:80", auth.host()),
    })
}

/// `Authorization` for every request, from `RESERVOIR_TOKEN` (read once): a
/// Reservoir that authenticates (`scripts/bench-http`'s `reservoir-auth`).
fn authorization() -> Option<&'static hyper::header::HeaderValue> {
    static VALUE: std::sync::OnceLock<Option<hyper::header::HeaderValue>> =
        std::sync::OnceLock::new();
    VALUE
        .get_or_init(|| {
            let token = std::env::var("RESERVOIR_TOKEN").ok()?;
            hyper::header::HeaderValue::from_str(&format!("Bearer {}", token.trim())).ok()
        })
        .as_ref()
}

/// One keep-alive connection to one server.
pub struct HttpConn {
    authority: String,
    sender: Option<SendRequest<Full<Bytes>>>,
    /// How many TCP connections this client opened (1 when keep-alive held).
    pub connects: u64,
}

impl HttpConn {
    /// A client for `authority` (`host:port`); connects lazily.
    pub fn new(authority: String) -> HttpConn {
        HttpConn {
            authority,
            sender: None,
            connects: 0,
        }
    }

    async fn sender(&mut self) -> Result<&mut SendRequest<Full<Bytes>>, HttpError> {
        if let Some(s) = &mut self.sender {
            if s.ready().await.is_err() {
                self.sender = None;
            }
        }
        if self.sender.is_none() {
            let stream = TcpStream::connect(&self.authority)
                .await
                .map_err(|e| HttpError::Transport(format!("connect {}: {e}", self.authority)))?;
            stream
                .set_nodelay(true)
                .map_err(|e| HttpError::Transport(e.to_string()))?;
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| HttpError::Transport(format!("handshake: {e}")))?;
            tokio::spawn(async move {
                // Ends when the server closes the connection or the sender is dropped.
                let _ = conn.await;
            });
            self.connects += 1;
            self.sender = Some(sender);
        }
        Ok(self.sender.as_mut().expect("set above"))
    }

    /// Sends one request and reads the whole answer; any status is returned as is.
    pub async fn request(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<(StatusCode, Bytes), HttpError> {
        let authority = self.authority.clone();
        let sender = self.sender().await?;
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, authority);
        if body.is_some() {
            req = req.header(CONTENT_TYPE, "application/json");
        }
        if let Some(value) = authorization() {
            req = req.header(hyper::header::AUTHORIZATION, value);
        }
        let req = req
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| HttpError::Transport(format!("building request: {e}")))?;
        let result = async {
            let resp = sender.send_request(req).await?;
            let status = resp.status();
            let body = resp.into_body().collect().await?.to_bytes();
            Ok::<_, hyper::Error>((status, body))
        }
        .await;
        match result {
            Ok(ok) => Ok(ok),
            Err(e) => {
                self.sender = None;
                Err(HttpError::Transport(e.to_string()))
            }
        }
    }

    /// `POST path` with a JSON body.
    pub async fn post_json(
        &mut self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<(StatusCode, Bytes), HttpError> {
        let bytes = Bytes::from(serde_json::to_vec(body).expect("a Value always serialises"));
        self.request(Method::POST, path, Some(bytes)).await
    }

    /// `GET path`.
    pub async fn get(&mut self, path: &str) -> Result<(StatusCode, Bytes), HttpError> {
        self.request(Method::GET, path, None).await
    }
}
