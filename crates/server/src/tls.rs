//! Optional TLS on the HTTP listener (rustls with the ring provider):
//! `--tls-cert` and `--tls-key` name PEM files. Without them the listener is
//! plain HTTP, as before.
//!
//! Handshakes run in tasks of their own, each bounded in time
//! ([`HANDSHAKE_TIMEOUT`]) and in number ([`MAX_HANDSHAKES`]), so a client
//! that stalls its handshake never holds up the next accept; finished
//! connections reach axum through [`TlsListener`], an `axum::serve::Listener`.
//! [`serve`] is the one way every listener of the crate is served.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// Longest a client may take over its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most handshakes in progress at once; more connections wait to be accepted.
pub const MAX_HANDSHAKES: usize = 1_024;

/// The certificate chain and private key, PEM files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The acceptor for `files`, or why the files cannot serve.
pub fn acceptor(files: &TlsFiles) -> Result<TlsAcceptor, String> {
    let unreadable = |path: &Path, e: &dyn std::fmt::Display| {
        format!("TLS: cannot read {}: {e}", path.display())
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| unreadable(&files.cert, &e))?
        .collect::<Result<_, _>>()
        .map_err(|e| unreadable(&files.cert, &e))?;
    if certs.is_empty() {
        return Err(format!("TLS: no certificate in {}", files.cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| unreadable(&files.key, &e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("TLS: the certificate and key do not serve: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Connections whose handshake finished, for `axum::serve`.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    accepting: tokio::task::AbortHandle,
}

impl TlsListener {
    pub fn new(listener: TcpListener, acceptor: TlsAcceptor) -> std::io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (done, ready) = mpsc::channel(64);
        let accepting = tokio::spawn(async move {
            let slots = Arc::new(Semaphore::new(MAX_HANDSHAKES));
            loop {
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let (tcp, addr) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        // Out of file descriptors and the like: back off, as axum does.
                        tracing::warn!(%err, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let (acceptor, done) = (acceptor.clone(), done.clone());
                tokio::spawn(async move {
                    let _slot = slot;
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = done.send((tls, addr)).await;
                        }
                        Ok(Err(err)) => tracing::debug!(%addr, %err, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%addr, "TLS handshake timed out"),
                    }
                });
            }
        })
        .abort_handle();
        Ok(TlsListener {
            ready,
            local,
            accepting,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accept task ended (the runtime is shutting down).
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// Serves `app` on `listener` until `shutdown`, over TLS when `tls` is given.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    app: axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    match tls {
        None => axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(|e| e.to_string()),
        Some(acceptor) => {
            let listener = TlsListener::new(listener, acceptor).map_err(|e| e.to_string())?;
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
                .map_err(|e| e.to_string())
        }
    }
}
