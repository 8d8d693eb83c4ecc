//! The UI's listener: HTTP/1.1, over TLS when the collector has a
//! certificate (the same one gRPC uses). Connections are capped in all and
//! per client address, request heads are bounded in size and time, an
//! answer the client does not read is cut (`WriteStall`), and each
//! connection has a deadline, so a slow or hostile client holds little.
//! When every place is taken, a few spare ones answer `/healthz` alone,
//! so a health check still gets through. Stops with the collector.
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
pub const MAX_CONNECTIONS: usize = 256;
/// Connections one client address holds at once, so that a few hostile or
/// broken clients cannot take every connection (a browser opens about 6).
pub const MAX_PER_ADDRESS: usize = 8;
/// Connections past `MAX_CONNECTIONS` that answer `/healthz` only, each
/// briefly, so a health check gets through a full UI.
pub const HEALTH_SPARE: usize = 8;
const HEALTH_DEADLINE: Duration = Duration::from_secs(5);
/// An answer the client reads nothing of for this long is cut: a client
/// that asks and never reads would otherwise hold its connection (and the
/// answer's memory) until the connection's deadline.
pub const WRITE_STALL: Duration = Duration::from_secs(10);
/// A client must send its request line and headers within this.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A TLS handshake must finish within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// One request's answer must be ready within this, as gRPC's deadline.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(120);
/// Whole life of one connection (keep-alive included).
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(300);
/// Request head size limit.
const MAX_HEAD_BYTES: usize = 16 * 1024;
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

pub struct HttpSettings {
    /// `IP:PORT`, or `none`.
    pub listen: String,
    /// Host names answered besides IP addresses and `localhost`.
    pub hosts: Vec<String>,
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
    hosts: Vec<String>,
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
        let hosts = settings.hosts.iter().map(|h| h.trim().to_ascii_lowercase()).filter(|h| !h.is_empty()).collect();
        Ok(Some(HttpServer { listener, local, tls, hosts }))
    }

    /// Host names answered besides IP addresses and `localhost`.
    pub fn hosts(&self) -> Vec<String> {
        self.hosts.clone()
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
        let mut spare = JoinSet::new();
        let mut per_address: std::collections::HashMap<std::net::IpAddr, usize> = Default::default();
        tracing::info!(url = %format!("{}://{local}/", if self.tls.is_some() { "https" } else { "http" }), "web UI listening");
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                Some(_) = spare.join_next(), if !spare.is_empty() => {}
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
                        if spare.len() < HEALTH_SPARE {
                            spare.spawn(health_only(stream, peer, self.tls.clone()));
                        } else {
                            tracing::warn!(%peer, limit = MAX_CONNECTIONS, "web UI busy; closing connection");
                        }
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
        spare.abort_all();
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, async { while connections.join_next().await.is_some() {} }).await;
        connections.abort_all();
        Ok(())
    }
}

/// A spare place: `/healthz` is answered, anything else is told the UI is
/// busy; the whole exchange within `HEALTH_DEADLINE`.
async fn health_only(stream: TcpStream, peer: SocketAddr, tls: Option<TlsAcceptor>) {
    let served = tokio::time::timeout(HEALTH_DEADLINE, async move {
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(HEALTH_DEADLINE)
            .max_buf_size(MAX_HEAD_BYTES)
            .keep_alive(false);
        let service = service_fn(|request: hyper::Request<hyper::body::Incoming>| async move {
            Ok::<_, Infallible>(routes::busy_or_healthy(request.method(), request.uri().path()))
        });
        match tls {
            Some(acceptor) => {
                if let Ok(stream) = acceptor.accept(stream).await {
                    let _ = http.serve_connection(TokioIo::new(WriteStall::new(stream)), service).await;
                }
            }
            None => {
                let _ = http.serve_connection(TokioIo::new(WriteStall::new(stream)), service).await;
            }
        }
    })
    .await;
    if served.is_err() {
        tracing::debug!(%peer, "web UI: a spare connection reached its deadline");
    }
}

/// A connection that ends when what is written to it sits unread for
/// `WRITE_STALL` (the client's window and the socket's buffer both full).
pub struct WriteStall<T> {
    inner: T,
    /// Armed while a write waits.
    stalled: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<T> WriteStall<T> {
    pub fn new(inner: T) -> WriteStall<T> {
        WriteStall { inner, stalled: None }
    }

    /// Pending: arms the timer, or fails once it has run out.
    fn waiting(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Error> {
        use std::future::Future as _;
        let timer = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(WRITE_STALL)));
        match timer.as_mut().poll(cx) {
            std::task::Poll::Ready(()) => std::task::Poll::Ready(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the client read nothing of the answer for {} s", WRITE_STALL.as_secs()),
            )),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WriteStall<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WriteStall<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match std::pin::Pin::new(&mut self.inner).poll_write(cx, buf) {
            std::task::Poll::Pending => self.waiting(cx).map(Err),
            done => {
                self.stalled = None;
                done
            }
        }
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match std::pin::Pin::new(&mut self.inner).poll_flush(cx) {
            std::task::Poll::Pending => self.waiting(cx).map(Err),
            done => {
                self.stalled = None;
                done
            }
        }
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
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
            Ok(Ok(stream)) => serve_http(TokioIo::new(WriteStall::new(stream)), peer, ui, stop).await,
            Ok(Err(error)) => tracing::debug!(%peer, %error, "web UI: TLS handshake failed"),
            Err(_) => tracing::debug!(%peer, "web UI: TLS handshake timed out"),
        },
        None => serve_http(TokioIo::new(WriteStall::new(stream)), peer, ui, stop).await,
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
