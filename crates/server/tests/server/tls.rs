//! TLS on the HTTP listener (`--tls-cert`, `--tls-key`): a client that trusts
//! the test CA (`fixtures/tls-ca.pem`, which signed `tls-cert.pem` for
//! localhost and 127.0.0.1; both valid until 2126) publishes, reserves and reads the books with a
//! bearer token over TLS; plain HTTP on the same port gets no HTTP answer; the
//! two flags go together.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use reservoir_core::{Side, Term};
use reservoir_server::tls::TlsFiles;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::auth::{Role, Tokens};
use crate::support::*;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/server/fixtures"
    ))
    .join(name)
}

/// One HTTP/1.1 exchange over TLS: (status, body).
async fn exchange(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> Option<(u16, Value)> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(fixture("tls-ca.pem")).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.ok()?;
    let mut tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .ok()?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let auth = token
        .map(|t| format!("authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n{auth}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(request.as_bytes()).await.ok()?;
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer);
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let payload = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    Some((
        status,
        serde_json::from_str(payload).unwrap_or(Value::String(payload.to_string())),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_is_served_over_tls_and_only_over_tls() {
    let dir = crate::support::tempdir().unwrap();
    let tokens = Tokens::create_in(dir.path());
    let config = reservoir_server::Config {
        auth: tokens.auth_config(),
        tls: Some(TlsFiles {
            cert: fixture("tls-cert.pem"),
            key: fixture("tls-key.pem"),
        }),
        ..test_config(dir.path())
    };
    let log = Arc::new(reservoir_log::memory::MemoryLog::new());
    let claim = log.claim("tls-writer");
    let server = TestServer::start_unready(log, config, claim).await;
    let addr = server.base.trim_start_matches("http://").to_string();
    eventually(std::time::Duration::from_secs(20), || async {
        exchange(&addr, "GET", "/readyz", None, None)
            .await
            .filter(|(s, _)| *s == 200)
    })
    .await;
    let op = tokens.of(Role::Operator).unwrap();
    let gw = tokens.of(Role::GatewayA).unwrap();
    let publish =
        json!({"accounting_epoch": "e1", "policy": policy("tenant-a", "chat", 1, 1_000, 10)});
    let (s, b) = exchange(&addr, "POST", "/v1/policies", Some(&op), Some(&publish))
        .await
        .unwrap();
    assert_eq!(s, 201, "{b}");
    let reserve = json!({"id": "tls-1", "subject": "tenant-a", "route": "chat", "units": 100});
    let (s, b) = exchange(&addr, "POST", "/v1/reservations", Some(&gw), Some(&reserve))
        .await
        .unwrap();
    assert_eq!(s, 201, "{b}");
    let (s, _) = exchange(&addr, "GET", "/v1/partitions", None, None)
        .await
        .unwrap();
    assert_eq!(s, 401, "TLS does not replace the token");
    // Plain HTTP on the TLS port is not answered as HTTP.
    let mut plain = TcpStream::connect(&addr).await.unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer).await;
    assert!(
        !answer.starts_with(b"HTTP/"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    // The books, over TLS.
    let (s, parts) = exchange(&addr, "GET", "/v1/partitions", Some(&op), None)
        .await
        .unwrap();
    assert_eq!(s, 200);
    for p in parts.as_array().unwrap() {
        assert_eq!(p["conservation"], "ok", "{p}");
        let side = |side: Side| -> u64 {
            Term::ALL
                .iter()
                .filter(|t| t.side() == side)
                .map(|t| p[t.name()].as_u64().unwrap())
                .sum()
        };
        assert_eq!(side(Side::Source), side(Side::Destination), "{p}");
        assert_eq!(p["reserved_units"], 100);
    }
    server.stop().await;
}

#[test]
fn tls_cert_and_key_go_together_and_must_load() {
    let parse = |args: &[&str]| {
        reservoir_server::config::Cli::try_parse_from(
            std::iter::once("reservoir").chain(args.iter().copied()),
        )
    };
    assert!(parse(&["serve", "--tls-cert", "c.pem"]).is_err());
    assert!(parse(&["serve", "--tls-key", "k.pem"]).is_err());
    assert!(parse(&["serve", "--tls-cert", "c.pem", "--tls-key", "k.pem"]).is_ok());
    // A key that is not a key is refused at start, with the file named.
    let swapped = TlsFiles {
        cert: fixture("tls-cert.pem"),
        key: fixture("tls-cert.pem"),
    };
    let err = reservoir_server::tls::acceptor(&swapped)
        .err()
        .expect("refused");
    assert!(err.contains("tls-cert.pem"), "{err}");
}
