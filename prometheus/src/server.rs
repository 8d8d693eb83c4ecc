//! The HTTP endpoint Prometheus scrapes: `GET /metrics`, plus `/` and
//! `/healthz`.
//!
//! One request per connection (no keep-alive): a scrape every few seconds
//! gains nothing from reuse, and it lets every connection have a short
//! deadline. Connections are capped, headers are bounded in size and time,
//! and request bodies are ignored.
use std::{convert::Infallible, future::Future, net::SocketAddr, sync::Arc, time::Duration};

use hyper::{
    Method, Request, Response, StatusCode,
    body::Incoming,
    header::{self, HeaderValue},
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{sync::watch, task::JoinSet};

use super::MetricsError;

/// Renders the exposition body for one scrape. It runs on the runtime's
/// worker, so it must be quick (format a snapshot; do not gather).
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Connections served at once; more are closed as they arrive.
const MAX_CONNECTIONS: usize = 16;
/// A client must send its request line and headers within this.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Whole life of one connection, slow readers included.
const CONNECTION_DEADLINE: Duration = Duration::from_secs(30);
/// Time given to requests in flight when stopping.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Request head size limit; hyper's own minimum.
const MAX_HEAD_BYTES: usize = 8192;
/// Wait after a failed accept (EMFILE and the like) before trying again,
/// so a persistent failure does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// A bound, not yet serving, metrics listener.
pub struct MetricsServer {
    listener: std::net::TcpListener,
    local: SocketAddr,
}

impl MetricsServer {
    /// Binds `addr` (`IP:PORT`; port 0 picks a free one). Needs no runtime,
    /// so a bad address fails at startup with the other configuration.
    /// `HOST:PORT`, or a port alone (`9187`, `:9187`) for loopback: the
    /// page names digests and hosts, so it is not offered beyond this host
    /// unless asked for.
    pub fn bind(addr: &str) -> Result<MetricsServer, MetricsError> {
        let given = addr.trim();
        let port = given.strip_prefix(':').unwrap_or(given);
        let addr: SocketAddr = if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) {
            format!("127.0.0.1:{port}").parse()
        } else {
            given.parse()
        }
        .map_err(|_| MetricsError::InvalidAddress { addr: addr.to_string() })?;
        if !addr.ip().is_loopback() {
            tracing::warn!(%addr, "serving /metrics beyond this host: it names instances, digests and hosts");
        }
        let listener = std::net::TcpListener::bind(addr).map_err(|source| match source.kind() {
            std::io::ErrorKind::AddrInUse => MetricsError::AddressInUse { addr },
            _ => MetricsError::Bind { addr, source },
        })?;
        let local = listener.local_addr().map_err(|source| MetricsError::Bind { addr, source })?;
        // tokio requires a non-blocking socket.
        listener.set_nonblocking(true).map_err(|source| MetricsError::Bind { addr, source })?;
        Ok(MetricsServer { listener, local })
    }

    /// The address actually bound (the port chosen when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Serves until `shutdown` completes, then gives requests in flight
    /// `SHUTDOWN_GRACE` to finish. Spawn it on the caller's runtime.
    pub async fn serve(self, render: Render, shutdown: impl Future<Output = ()> + Send) -> Result<(), MetricsError> {
        let local = self.local;
        let listener = tokio::net::TcpListener::from_std(self.listener)
            .map_err(|source| MetricsError::Bind { addr: local, source })?;
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .keep_alive(false)
            .max_buf_size(MAX_HEAD_BYTES);
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut connections = JoinSet::new();
        tracing::info!(%local, "metrics endpoint listening");

        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(accepted) => accepted,
                        Err(error) => {
                            tracing::warn!(%error, "metrics endpoint: accept failed");
                            tokio::time::sleep(ACCEPT_BACKOFF).await;
                            continue;
                        }
                    };
                    if connections.len() >= MAX_CONNECTIONS {
                        tracing::warn!(%peer, limit = MAX_CONNECTIONS, "metrics endpoint busy; closing connection");
                        continue;
                    }
                    let conn = http.serve_connection(TokioIo::new(stream), service_fn({
                        let render = render.clone();
                        move |request| {
                            let render = render.clone();
                            async move { Ok::<_, Infallible>(respond(&request, &render)) }
                        }
                    }));
                    let mut stop = stop_rx.clone();
                    connections.spawn(async move {
                        tokio::pin!(conn);
                        let served = tokio::time::timeout(CONNECTION_DEADLINE, async {
                            tokio::select! {
                                result = conn.as_mut() => result,
                                _ = stop.changed() => {
                                    // Finish the request in flight, then close.
                                    conn.as_mut().graceful_shutdown();
                                    conn.as_mut().await
                                }
                            }
                        });
                        log_outcome(served.await, peer);
                    });
                }
            }
        }

        let _ = stop_tx.send(true);
        let drained = tokio::time::timeout(SHUTDOWN_GRACE, async { while connections.join_next().await.is_some() {} });
        if drained.await.is_err() {
            tracing::warn!(left = connections.len(), "metrics endpoint: abandoning slow connections");
        }
        tracing::info!(%local, "metrics endpoint stopped");
        Ok(())
    }
}

/// Clients that hang up early, send garbage or stall are their problem,
/// not the agent's: worth a debug line at most.
fn log_outcome(served: Result<hyper::Result<()>, tokio::time::error::Elapsed>, peer: SocketAddr) {
    match served {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::debug!(%peer, %error, "metrics connection failed"),
        Err(_) => tracing::debug!(%peer, "metrics connection exceeded its deadline"),
    }
}

fn respond(request: &Request<Incoming>, render: &Render) -> Response<String> {
    let path = request.uri().path();
    if !matches!(path, "/" | "/metrics" | "/healthz") {
        return plain(StatusCode::NOT_FOUND, "not found: metrics are at /metrics\n".into());
    }
    // hyper leaves the body out of HEAD responses itself.
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n".into());
        response.headers_mut().insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match path {
        "/metrics" => {
            let mut response = plain(StatusCode::OK, render());
            response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
            response
        }
        "/healthz" => plain(StatusCode::OK, "ok\n".into()),
        _ => plain(StatusCode::OK, "sqlbee: Prometheus metrics are at /metrics\n".into()),
    }
}

fn plain(status: StatusCode, body: String) -> Response<String> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    /// One raw HTTP/1.1 exchange; returns the status line, headers and body
    /// as one string.
    fn exchange(addr: SocketAddr, request: &str) -> String {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
    }

    fn get(addr: SocketAddr, method: &str, path: &str) -> String {
        exchange(addr, &format!("{method} {path} HTTP/1.1\r\nHost: test\r\n\r\n"))
    }

    #[test]
    fn routes_statuses_and_shutdown() {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let server = MetricsServer::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let render: Render = Arc::new(|| "# TYPE x gauge\nx 1\n".to_string());
        let task = runtime.spawn(server.serve(render, async move {
            let _ = stopped.await;
        }));

        let metrics = get(addr, "GET", "/metrics");
        assert!(metrics.starts_with("HTTP/1.1 200 OK\r\n"), "{metrics}");
        assert!(metrics.contains("content-type: text/plain; version=0.0.4; charset=utf-8\r\n"), "{metrics}");
        assert!(metrics.contains("connection: close\r\n"), "{metrics}");
        assert!(metrics.ends_with("\r\n\r\n# TYPE x gauge\nx 1\n"), "{metrics}");
        let head = get(addr, "HEAD", "/metrics");
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"), "{head}");
        assert!(get(addr, "GET", "/metrics?x=1").starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(get(addr, "GET", "/healthz").ends_with("\r\n\r\nok\n"));
        assert!(get(addr, "GET", "/").contains("/metrics"));
        assert!(get(addr, "GET", "/metricsx").starts_with("HTTP/1.1 404 Not Found\r\n"));
        let post = get(addr, "POST", "/metrics");
        assert!(post.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"), "{post}");
        assert!(post.contains("allow: GET, HEAD\r\n"), "{post}");
        // hyper answers 431 and closes; the unread rest of the head may turn
        // that into a reset before the client reads it. Either way the head
        // is refused and the server carries on.
        let huge = format!("GET /metrics HTTP/1.1\r\nHost: test\r\nX-Big: {}\r\n\r\n", "a".repeat(64 * 1024));
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = stream.write_all(huge.as_bytes());
        let mut refused = String::new();
        let _ = stream.read_to_string(&mut refused);
        assert!(refused.is_empty() || refused.starts_with("HTTP/1.1 431"), "{refused}");
        assert!(get(addr, "GET", "/healthz").ends_with("ok\n"));

        let err = MetricsServer::bind(&addr.to_string()).err().expect("second bind on the same port");
        assert!(matches!(err, MetricsError::AddressInUse { .. }), "{err}");

        stop.send(()).unwrap();
        let stopped = runtime.block_on(async { tokio::time::timeout(Duration::from_secs(10), task).await });
        stopped.expect("server stops on its signal").unwrap().unwrap();
        assert!(std::net::TcpStream::connect(addr).is_err(), "listener closed after shutdown");
    }

    #[test]
    fn bad_addresses_are_explained() {
        let err = MetricsServer::bind("localhost:9104").err().unwrap();
        assert!(matches!(err, MetricsError::InvalidAddress { .. }), "{err}");
        assert!(err.to_string().contains("IP:PORT"), "{err}");
        assert!(matches!(MetricsServer::bind("127.0.0.1").err().unwrap(), MetricsError::InvalidAddress { .. }));
    }

    #[test]
    fn a_port_alone_binds_to_loopback() {
        for given in ["0", ":0"] {
            let server = MetricsServer::bind(given).unwrap();
            assert!(server.local_addr().ip().is_loopback(), "{given} -> {}", server.local_addr());
        }
    }
}
