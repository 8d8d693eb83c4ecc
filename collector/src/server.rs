//! Wires the gRPC server: listener, TLS/mTLS, health, auth in front of
//! Ingest and Query, the retention and rollup tasks, and a clean stop. Knows every
//! collector part; holds no logic of its own.
use std::{
    future::Future,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use sqlbee_proto::v1::{annotate_server::AnnotateServer, ingest_server::IngestServer, query_server::QueryServer};
use sqlbee_vocabulary::clock::now_unix_ms;
use tonic::{
    codec::CompressionEncoding,
    service::interceptor::InterceptedService,
    transport::{Certificate, Identity, Server, ServerTlsConfig, server::TcpIncoming},
};

use super::{
    CollectorError,
    admission::Admit,
    annotate::AnnotateService,
    auth::{Auth, Role},
    decode_status::DecodeErrorsAsInvalid,
    detect,
    http::{HttpServer, Ui},
    ingest::IngestService,
    live::LiveActivity,
    otlp,
    ownership::Owners,
    query_api::QueryService,
    quota::Quotas,
    store::{Retention, Store, retention, rollup_pass},
};

/// Largest request accepted (after gzip decompression; tonic stops
/// inflating there, so a gzip bomb costs at most this much).
pub const MAX_MESSAGE: usize = 32 * 1024 * 1024;

/// Pushes decoded at once by default: with `MAX_MESSAGE`, what a burst of
/// large pushes can make the collector hold.
pub const INGEST_IN_FLIGHT: usize = 8;

/// Queries answered at once by default: each holds a blocking thread, and
/// ingest must always find one.
pub const QUERIES_IN_FLIGHT: usize = 4;

/// Largest answer sent; `limit` bounds the rows, this the bytes.
pub const MAX_ANSWER: usize = 64 * 1024 * 1024;

/// A request still running after this is answered DEADLINE_EXCEEDED and
/// its handler dropped (a client's shorter `grpc-timeout` wins).
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(120);

pub struct Tls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Require client certificates signed by this CA (mTLS).
    pub client_ca: Option<PathBuf>,
}

pub struct Settings {
    pub listen: SocketAddr,
    pub tls: Option<Tls>,
    pub auth: Auth,
    pub retention: Retention,
    pub prune_interval: Duration,
    pub ready_file: Option<PathBuf>,
    /// The web UI's bound listener; None: `--http-listen none`.
    pub http: Option<HttpServer>,
    pub http_ready_file: Option<PathBuf>,
    /// Admission limits (`admission::Admit`).
    pub pushes_in_flight: usize,
    pub pushes_per_address: usize,
    pub pushes_per_token: usize,
    pub queries_in_flight: usize,
    /// How long an instance's agent may be silent before another agent
    /// may take it over (`ownership`).
    pub instance_handover: Duration,
    /// Windows only of instances a token pins (`--require-instance-pins`).
    pub require_instance_pins: bool,
    /// Per agent per hour (`quota`); 0: no limit.
    pub agent_quota_rows: u64,
    pub agent_quota_bytes: u64,
    pub detection: detect::Settings,
    /// `--webhook`: where each event is posted.
    pub webhook: Option<detect::webhook::Webhook>,
    /// `--otlp-endpoint`: the OTLP export and how it sends each signal.
    pub otlp: Option<(otlp::Settings, Vec<otlp::send::Transport>)>,
    /// The collector's Prometheus page; None: `--metrics-listen none`.
    pub metrics: Option<sqlbee_prometheus::MetricsServer>,
}

fn read(path: &Path) -> Result<Vec<u8>, CollectorError> {
    std::fs::read(path).map_err(|source| CollectorError::ReadFile { path: path.display().to_string(), source })
}

fn tls_config(tls: &Tls) -> Result<ServerTlsConfig, CollectorError> {
    let identity = Identity::from_pem(read(&tls.cert)?, read(&tls.key)?);
    let mut config = ServerTlsConfig::new().identity(identity);
    if let Some(ca) = &tls.client_ca {
        config = config.client_ca_root(Certificate::from_pem(read(ca)?));
    }
    Ok(config)
}

const OWNERS_AFRESH: &str = "cannot read the instances agents reported; their owners start from the next batches";

/// Serves until `shutdown` completes, then finishes the requests in flight.
pub async fn serve(
    settings: Settings,
    store: Arc<dyn Store>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), CollectorError> {
    let mut builder = Server::builder()
        .timeout(REQUEST_DEADLINE)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)));
    if let Some(tls) = &settings.tls {
        builder = builder.tls_config(tls_config(tls)?).map_err(|cause| CollectorError::Tls { cause })?;
    }

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<IngestServer<IngestService>>().await;
    health.set_serving::<QueryServer<QueryService>>().await;

    let owners = Arc::new(Owners::new(settings.instance_handover));
    let known = {
        let store = store.clone();
        tokio::task::spawn_blocking(move || store.instances()).await
    };
    match known {
        Ok(Ok(instances)) => owners.seed(&instances, now_unix_ms()),
        // The store may come back; owners then start from the batches
        // that arrive.
        Ok(Err(error)) => tracing::warn!(%error, "{OWNERS_AFRESH}"),
        Err(error) => tracing::warn!(%error, "{OWNERS_AFRESH}"),
    }
    let quotas = Arc::new(Quotas::new(settings.agent_quota_rows, settings.agent_quota_bytes));
    let live = Arc::new(LiveActivity::default());
    let ingest = IngestServer::new(
        IngestService::new(store.clone(), settings.retention.raw, settings.auth.clone(), owners, quotas.clone())
            .with_live(live.clone())
            .requiring_pins(settings.require_instance_pins),
    )
    .accept_compressed(CompressionEncoding::Gzip)
    .max_decoding_message_size(MAX_MESSAGE);
    let query = QueryServer::new(QueryService::new(store.clone(), quotas.clone()).with_live(live.clone()))
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip)
        .max_encoding_message_size(MAX_ANSWER);
    let annotate = AnnotateServer::new(AnnotateService::new(store.clone()));
    let router = builder
        .add_service(health_service)
        .add_service(InterceptedService::new(
            // Markers are rare and small: two at a time, one per caller.
            Admit::new(DecodeErrorsAsInvalid(annotate), 2, 1, 1),
            settings.auth.gate(Role::Annotate),
        ))
        .add_service(InterceptedService::new(
            Admit::new(
                DecodeErrorsAsInvalid(ingest),
                settings.pushes_in_flight,
                settings.pushes_per_address,
                settings.pushes_per_token,
            ),
            settings.auth.gate(Role::Ingest),
        ))
        .add_service(InterceptedService::new(
            // One address or token may hold half the query places: a
            // reader that loops cannot keep the others out.
            Admit::new(
                DecodeErrorsAsInvalid(query),
                settings.queries_in_flight,
                settings.queries_in_flight.div_ceil(2),
                settings.queries_in_flight.div_ceil(2),
            ),
            settings.auth.gate(Role::Read),
        ));

    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|source| CollectorError::Bind { addr: settings.listen, source })?;
    let local = listener.local_addr().map_err(|source| CollectorError::Bind { addr: settings.listen, source })?;
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true)).with_keepalive(Some(Duration::from_secs(60)));
    tracing::info!(
        %local,
        tls = settings.tls.is_some(),
        mtls = settings.tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
        tokens = settings.auth.token_count(),
        retention_s = settings.retention.raw.as_secs(),
        retention_minute_s = settings.retention.minute.as_secs(),
        retention_hour_s = settings.retention.hour.as_secs(),
        "collector listening"
    );
    if settings.tls.is_none() && settings.auth.token_count() > 0 {
        tracing::warn!("bearer tokens travel in clear text without --tls-cert/--tls-key");
    }
    if !local.ip().is_loopback() && settings.auth.token_count() == 0 {
        tracing::warn!(%local, "listening beyond this host without authentication: anyone who reaches it can \
            send batches and read every agent's data (give --tokens)");
    }
    let mut otlp_counts = Vec::new();
    let mut exporters = Vec::new();
    if let Some((otlp, transports)) = settings.otlp {
        let otlp = Arc::new(otlp);
        for (target, transport) in otlp.targets.iter().zip(transports) {
            let counts = Arc::new(otlp::Counts::new(target.signal));
            otlp_counts.push(counts.clone());
            exporters.push(tokio::spawn(otlp::run(store.clone(), otlp.clone(), transport, counts)));
        }
    }
    let (stop_ui, mut ui_stopping) = tokio::sync::watch::channel(false);
    let ui = match settings.http {
        Some(http) => {
            if !http.local_addr().ip().is_loopback() && settings.auth.token_count() == 0 && !http.is_tls() {
                tracing::warn!(addr = %http.local_addr(), "web UI served beyond this host without tokens or TLS: \
                    anyone who reaches it reads the fleet's data (give --tokens and --tls-cert)");
            }
            let url = http.url();
            let pages = Arc::new(
                Ui::new(
                    QueryService::new(store.clone(), quotas.clone()).with_live(live.clone()),
                    AnnotateService::new(store.clone()),
                    settings.auth.clone(),
                    http.is_tls(),
                )
                .answering(http.hosts())
                .exporting(export_status(otlp_counts.clone())),
            );
            let task = tokio::spawn(http.serve(pages, async move {
                let _ = ui_stopping.wait_for(|stop| *stop).await;
            }));
            if let Some(path) = &settings.http_ready_file {
                write_ready(path, &url)?;
            }
            Some(task)
        }
        None => None,
    };
    if let Some(path) = &settings.ready_file {
        write_ready(path, &local.to_string())?;
    }

    let open_events = Arc::new(detect::OpenEvents::default());
    let detector = tokio::spawn(detect::run(store.clone(), settings.detection, open_events.clone(), settings.webhook));
    let (stop_metrics, mut metrics_stopping) = tokio::sync::watch::channel(false);
    let metrics = settings.metrics.map(|server| {
        tracing::info!(addr = %server.local_addr(), "collector metrics at /metrics");
        tokio::spawn(server.serve(detect::exposition::render(open_events, otlp_counts.clone()), async move {
            let _ = metrics_stopping.wait_for(|stop| *stop).await;
        }))
    });
    let roller = tokio::spawn(rollup_pass::run(store.clone(), rollup_pass::EVERY));
    let pruner = tokio::spawn(retention::run(store, settings.retention, settings.prune_interval));
    let result = router
        .serve_with_incoming_shutdown(incoming, async move {
            shutdown.await;
            let _ = stop_ui.send(true);
            let _ = stop_metrics.send(true);
            tracing::info!("stopping: finishing requests in flight");
            health.set_not_serving::<IngestServer<IngestService>>().await;
            health.set_not_serving::<QueryServer<QueryService>>().await;
        })
        .await
        .map_err(|cause| CollectorError::Serve { cause });
    pruner.abort();
    roller.abort();
    detector.abort();
    for exporter in exporters {
        exporter.abort();
    }
    if let Some(metrics) = metrics
        && let Ok(Err(error)) = metrics.await
    {
        tracing::warn!(%error, "metrics endpoint stopped with an error");
    }
    if let Some(ui) = ui {
        match ui.await {
            Ok(Err(error)) => tracing::warn!(%error, "web UI stopped with an error"),
            Err(error) => tracing::warn!(%error, "web UI task failed"),
            Ok(Ok(())) => {}
        }
    }
    result
}

/// What the cost page shows of the OTLP export: a snapshot of its counts
/// per signal, read when the page is.
fn export_status(counts: Vec<Arc<otlp::Counts>>) -> crate::http::ExportStatusFn {
    use std::sync::atomic::Ordering::Relaxed;
    Arc::new(move || {
        counts
            .iter()
            .map(|c| crate::http::ExportStatus {
                signal: c.signal.name(),
                requests: c.requests.load(Relaxed),
                items: c.items.load(Relaxed),
                retries: c.retries.load(Relaxed),
                dropped_items: c.dropped_items.load(Relaxed),
                skipped_steps: c.skipped_steps.load(Relaxed),
                mark_unix_ms: c.mark_unix_ms.load(Relaxed),
            })
            .collect()
    })
}

/// Written whole (temp file, then rename) so a reader never sees half an
/// address. Holds the bound address (or the UI's URL): with `--listen
/// 127.0.0.1:0` this is how a caller learns the port.
fn write_ready(path: &Path, address: &str) -> Result<(), CollectorError> {
    let err = |source| CollectorError::ReadyFile { path: path.display().to_string(), source };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{address}\n")).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}
