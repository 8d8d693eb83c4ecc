//! The UI's listener: HTTP/1.1, over TLS when the collector has a
//! certificate (the same one gRPC uses). Connections are capped, request
//! heads are bounded in size and time, and each connection has a deadline,
//! so a slow or hostile client holds little. Stops with the collector.
use std::{convert::Infallible, future::Future, net::SocketAddr, path::Path, sync::Arc, time::Duration};

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpStream, sync::watch, task::JoinSet};
use tokio_rustls::{
    TlsAcceptor,
    rustls::{
        self,
        pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    },
};

use super::{HttpError, Shared, routes};

/// Connections served at once; more are closed as they arrive.
const MAX_CONNECTIONS: usize = 64;
/// Connections one client address holds at once, so that a few hostile or
/// broken clients cannot take every connection (a browser opens about 6).
const MAX_PER_ADDRESS: usize = 16;
/// A client must send its request line and headers within this.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A TLS handshake must finish within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// One request's answer must be ready within this, as gRPC's deadline.
const REQUEST_DEADLINE: Duration = Duration::from_secs(120);
/// Whole life of one connection (keep-alive included).
const CONNECTION_DEADLINE: Duration = Duration::from_secs(300);
/// Request head size limit.
const MAX_HEAD_BYTES: usize = 16 * 1024;
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

pub struct HttpSettings {
    /// `IP:PORT`, or `none`.
    pub listen: String,
    /// Certificate and key (PEM): serve over TLS.
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// With TLS: require client certificates signed by this CA, as gRPC
    /// does under mTLS, so the UI is no way around it.
    pub client_ca: Option<std::path::PathBuf>,
}

/// A bound listener, not yet serving.
pub struct HttpServer {
    listener: std::net::TcpListener,
    local: SocketAddr,
    tls: Option<TlsAcceptor>,
}

fn read(path: &Path) -> Result<Vec<u8>, HttpError> {
    std::fs::read(path).map_err(|source| HttpError::ReadFile { path: path.display().to_string(), source })
}

fn acceptor(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<TlsAcceptor, HttpError> {
    let pem_err = |path: &Path| {
        let path = path.display().to_string();
        move |e: rustls::pki_types::pem::Error| HttpError::Pem { path, reason: e.to_string() }
    };
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&read(cert)?).collect::<Result<_, _>>().map_err(pem_err(cert))?;
    if certs.is_empty() {
        return Err(HttpError::Pem { path: cert.display().to_string(), reason: "no CERTIFICATE block".into() });
    }
    let key = PrivateKeyDer::from_pem_slice(&read(key)?).map_err(pem_err(key))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls_err = |e: rustls::Error| HttpError::Tls { reason: e.to_string() };
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(tls_err)?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&read(ca)?) {
                roots.add(cert.map_err(pem_err(ca))?).map_err(tls_err)?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| HttpError::Tls { reason: format!("client CA {}: {e}", ca.display()) })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certs, key).map_err(tls_err)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

impl HttpServer {
    /// Binds now, so a taken port or a bad certificate fails at start with
    /// the rest of the configuration. None: `--http-listen none`.
    pub fn bind(settings: &HttpSettings) -> Result<Option<HttpServer>, HttpError> {
        let given = settings.listen.trim();
        if given.eq_ignore_ascii_case("none") {
            return Ok(None);
        }
        let addr: SocketAddr = given.parse().map_err(|_| HttpError::InvalidAddress { addr: given.to_string() })?;
        let tls =
            settings.tls.as_ref().map(|(cert, key)| acceptor(cert, key, settings.client_ca.as_deref())).transpose()?;
        let listener = std::net::TcpListener::bind(addr).map_err(|source| HttpError::Bind { addr, source })?;
        let local = listener.local_addr().map_err(|source| HttpError::Bind { addr, source })?;
        listener.set_nonblocking(true).map_err(|source| HttpError::Bind { addr, source })?;
        Ok(Some(HttpServer { listener, local, tls }))
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn url(&self) -> String {
        format!("{}://{}/", if self.tls.is_some() { "https" } else { "http" }, self.local)
    }

    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Serves until `shutdown` completes.
    pub async fn serve(self, ui: Shared, shutdown: impl Future<Output = ()> + Send) -> Result<(), HttpError> {
        let local = self.local;
        let listener = tokio::net::TcpListener::from_std(self.listener)
            .map_err(|source| HttpError::Bind { addr: local, source })?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut connections = JoinSet::new();
        let mut per_address: std::collections::HashMap<std::net::IpAddr, usize> = Default::default();
        tracing::info!(url = %format!("{}://{local}/", if self.tls.is_some() { "https" } else { "http" }), "web UI listening");
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                Some(ended) = connections.join_next(), if !connections.is_empty() => {
                    if let Ok(address) = ended
                        && let Some(held) = per_address.get_mut(&address)
                    {
                        *held -= 1;
                        if *held == 0 {
                            per_address.remove(&address);
                        }
                    }
                }
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(accepted) => accepted,
                        Err(error) => {
                            tracing::warn!(%error, "web UI: accept failed");
                            tokio::time::sleep(ACCEPT_BACKOFF).await;
                            continue;
                        }
                    };
                    if connections.len() >= MAX_CONNECTIONS {
                        tracing::warn!(%peer, limit = MAX_CONNECTIONS, "web UI busy; closing connection");
                        continue;
                    }
                    let held = per_address.entry(peer.ip()).or_default();
                    if *held >= MAX_PER_ADDRESS {
                        tracing::debug!(%peer, limit = MAX_PER_ADDRESS, "web UI: this address holds its share of connections; closing");
                        continue;
                    }
                    *held += 1;
                    let _ = stream.set_nodelay(true);
                    connections.spawn(connection(stream, peer, self.tls.clone(), ui.clone(), stop_rx.clone()));
                }
            }
        }
        let _ = stop_tx.send(true);
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, async { while connections.join_next().await.is_some() {} }).await;
        connections.abort_all();
        Ok(())
    }
}

/// Serves one connection; returns the client's address, whose count of
/// connections it held.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    ui: Shared,
    stop: watch::Receiver<bool>,
) -> std::net::IpAddr {
    match tls {
        Some(acceptor) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
            Ok(Ok(stream)) => serve_http(TokioIo::new(stream), peer, ui, stop).await,
            Ok(Err(error)) => tracing::debug!(%peer, %error, "web UI: TLS handshake failed"),
            Err(_) => tracing::debug!(%peer, "web UI: TLS handshake timed out"),
        },
        None => serve_http(TokioIo::new(stream), peer, ui, stop).await,
    }
    peer.ip()
}

async fn serve_http<I>(io: I, peer: SocketAddr, ui: Shared, mut stop: watch::Receiver<bool>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT).max_buf_size(MAX_HEAD_BYTES);
    let conn = http.serve_connection(
        io,
        service_fn(move |request| {
            let ui = ui.clone();
            async move {
                // Past the deadline the request is dropped, which cancels
                // its store work.
                match tokio::time::timeout(REQUEST_DEADLINE, routes::respond(ui, request, peer.ip())).await {
                    Ok(answer) => Ok::<_, Infallible>(answer),
                    Err(_) => Ok(routes::too_slow(REQUEST_DEADLINE)),
                }
            }
        }),
    );
    tokio::pin!(conn);
    let served = tokio::time::timeout(CONNECTION_DEADLINE, async {
        tokio::select! {
            result = conn.as_mut() => result,
            _ = stop.changed() => {
                conn.as_mut().graceful_shutdown();
                conn.as_mut().await
            }
        }
    })
    .await;
    match served {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::debug!(%peer, %error, "web UI: connection ended with an error"),
        Err(_) => tracing::debug!(%peer, "web UI: connection deadline reached"),
    }
}
