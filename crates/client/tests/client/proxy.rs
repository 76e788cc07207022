//! A fault proxy between the client and the ledger: the one fault a real part
//! cannot produce on demand, an answer lost after the ledger committed it.
//!
//! It speaks just enough HTTP/1.1 (requests and answers with Content-Length,
//! which is all the ledger sends) to forward one request at a time over a
//! fresh upstream connection. A request matching an armed rule is forwarded,
//! its whole answer read from the ledger — so the step is committed — and then
//! the client's connection is closed instead of answered. The upstream address
//! can be switched, so the client keeps one address across server restarts;
//! while no ledger listens there, client connections are closed unanswered.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct Rules {
    /// (request-line prefix such as `POST /v1/reservations `, answers left to drop)
    drop: Vec<(String, usize)>,
    /// (prefix, the proxy's own answer, forward the request first): every
    /// matching request is answered so, as a proxy that forwarded it and
    /// stopped waiting would, or a ledger that decided nothing.
    answer: Vec<(String, Vec<u8>, bool)>,
    /// Request lines forwarded to the ledger, in order.
    forwarded: Vec<String>,
    dropped: Vec<String>,
}

pub struct FaultProxy {
    pub addr: SocketAddr,
    upstream: Arc<Mutex<SocketAddr>>,
    rules: Arc<Mutex<Rules>>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let upstream = Arc::new(Mutex::new(upstream));
        let rules = Arc::new(Mutex::new(Rules::default()));
        let (u, r) = (upstream.clone(), rules.clone());
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(serve(conn, u.clone(), r.clone()));
            }
        });
        FaultProxy {
            addr,
            upstream,
            rules,
            task,
        }
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_upstream(&self, addr: SocketAddr) {
        *self.upstream.lock().unwrap() = addr;
    }

    /// Drops the answers of the next `n` requests whose request line starts with `prefix`.
    pub fn drop_answers(&self, prefix: &str, n: usize) {
        self.rules
            .lock()
            .unwrap()
            .drop
            .push((prefix.to_string(), n));
    }

    /// Answers every request whose line starts with `prefix` with `status`
    /// and a problem of `code`, after forwarding it to the ledger (so it
    /// commits) when `forward`.
    pub fn answer_with(&self, prefix: &str, status: u16, code: &str, forward: bool) {
        let body = format!(
            "{{\"type\":\"https://reservoir.dev/problems/{code}\",\"title\":\"{code}\",\"status\":{status},\"detail\":\"from the fault proxy\"}}"
        );
        let answer = format!(
            "HTTP/1.1 {status} Fault\r\ncontent-type: application/problem+json\r\nretry-after: 0\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        self.rules
            .lock()
            .unwrap()
            .answer
            .push((prefix.to_string(), answer.into_bytes(), forward));
    }

    pub fn clear(&self) {
        let mut rules = self.rules.lock().unwrap();
        rules.drop.clear();
        rules.answer.clear();
    }

    /// Requests forwarded to the ledger whose line starts with `prefix`.
    pub fn forwarded(&self, prefix: &str) -> usize {
        let rules = self.rules.lock().unwrap();
        rules
            .forwarded
            .iter()
            .filter(|l| l.starts_with(prefix))
            .count()
    }

    pub fn dropped(&self, prefix: &str) -> usize {
        let rules = self.rules.lock().unwrap();
        rules
            .dropped
            .iter()
            .filter(|l| l.starts_with(prefix))
            .count()
    }
}

impl FaultProxy {
    /// Stops listening and holds the port, so from now on every connection
    /// to it is refused at once (no attempt can reach the ledger through it).
    pub async fn stop(mut self) -> reservoir_testkit::DeadPort {
        self.task.abort();
        // The listener is dropped with the aborted task.
        let _ = (&mut self.task).await;
        reservoir_testkit::DeadPort::hold(self.addr)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One HTTP message: head (through the blank line) and body, as raw bytes.
async fn read_message(conn: &mut (impl AsyncRead + Unpin)) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    assert!(
        !head.contains("transfer-encoding: chunked"),
        "the proxy reads Content-Length only: {head}"
    );
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0);
    let start = buf.len();
    buf.resize(start + length, 0);
    conn.read_exact(&mut buf[start..]).await.ok()?;
    Some(buf)
}

async fn serve(mut client: TcpStream, upstream: Arc<Mutex<SocketAddr>>, rules: Arc<Mutex<Rules>>) {
    while let Some(request) = read_message(&mut client).await {
        let line = String::from_utf8_lossy(&request)
            .lines()
            .next()
            .unwrap_or("")
            .to_string();
        let instead = {
            let rules = rules.lock().unwrap();
            let hit = rules
                .answer
                .iter()
                .find(|(p, _, _)| line.starts_with(p.as_str()));
            hit.map(|(_, answer, forward)| (answer.clone(), *forward))
        };
        if let Some((answer, false)) = &instead {
            if client.write_all(answer).await.is_err() {
                return;
            }
            continue;
        }
        let target = *upstream.lock().unwrap();
        let Ok(mut server) = TcpStream::connect(target).await else {
            return; // no ledger there now: close unanswered
        };
        if server.write_all(&request).await.is_err() {
            return;
        }
        rules.lock().unwrap().forwarded.push(line.clone());
        let Some(answer) = read_message(&mut server).await else {
            return;
        };
        let lose = {
            let mut guard = rules.lock().unwrap();
            let r = &mut *guard;
            let hit = r
                .drop
                .iter_mut()
                .find(|(prefix, left)| *left > 0 && line.starts_with(prefix.as_str()));
            match hit {
                Some((_, left)) => {
                    *left -= 1;
                    r.dropped.push(line.clone());
                    true
                }
                None => false,
            }
        };
        let answer = instead.map_or(answer, |(answer, _)| answer);
        if lose || client.write_all(&answer).await.is_err() {
            return; // the ledger committed; the client never hears of it
        }
    }
}
