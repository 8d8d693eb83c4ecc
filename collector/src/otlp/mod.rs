//! `--otlp-endpoint`: the collector exports what it stores as OTLP
//! metrics, per instance and step (`--otlp-step`), to any OpenTelemetry
//! receiver.
//!
//! It reads through the store, as `sqlbee top` does, so a batch the store
//! holds twice (ClickHouse keeps both attempts of a retried batch) is
//! counted once, and a step is read only once its windows are in: when it
//! ended `--otlp-delay` ago. How far it has come is a mark in the store
//! (`Store::export_mark`), moved only after the receiver acknowledged a
//! request, so a restarted collector, or a receiver that was down, loses
//! nothing and repeats nothing acknowledged. Requests hold whole instances
//! and are kept under `MAX_REQUEST_BYTES`; the mark names the last
//! instance of the step that was sent.
//!
//! The queue is the store itself: while the receiver is away the mark
//! stays, and requests are retried with a pause that doubles up to a
//! minute. It is bounded by `--otlp-max-behind`: steps older than that are
//! skipped and counted as dropped, as are requests the receiver refuses for
//! good (a 400, say) and points it rejects in part. One collector of a
//! store should export: each one that does sends every step.
pub mod config;
pub mod metrics;
pub mod send;
pub mod wire;

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc,
        atomic::{AtomicI64, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use prost::Message as _;
use sqlbee_proto::v1::TopDigest;
use sqlbee_vocabulary::clock::now_unix_ms;

use self::{
    metrics::{Instance, Shape, Step},
    send::Transport,
    wire::{ExportMetricsServiceRequest, ResourceMetrics},
};
use crate::store::{DigestTables, ExportMark, OrderBy, Store, StoreError, TopQuery};

/// The mark's name in the store.
pub const MARK: &str = "otlp-metrics";
/// A request's encoded size at most, unless one instance alone is larger.
pub const MAX_REQUEST_BYTES: usize = 4 << 20;
/// Digests read per instance and step; those past `--otlp-max-digests`
/// go into the `other` point.
const MAX_DIGESTS_READ: usize = 10_000;
const FIRST_PAUSE: Duration = Duration::from_secs(1);
const LONGEST_PAUSE: Duration = Duration::from_secs(60);

#[derive(Clone, Debug)]
pub struct Settings {
    pub target: config::Target,
    pub step: Duration,
    pub delay: Duration,
    pub max_behind: Duration,
    pub max_digests: usize,
    pub query_text: bool,
}

/// What the export did since the collector started, for its `/metrics`.
#[derive(Default)]
pub struct Counts {
    pub requests: AtomicU64,
    pub points: AtomicU64,
    pub retries: AtomicU64,
    pub dropped_points: AtomicU64,
    pub skipped_steps: AtomicU64,
    /// The mark's time (ms since epoch); 0 before the first read of it.
    pub mark_unix_ms: AtomicI64,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

pub async fn run(store: Arc<dyn Store>, settings: Settings, transport: Transport, counts: Arc<Counts>) {
    let step = ms(settings.step).max(1_000);
    tracing::info!(
        url = %settings.target.url,
        protocol = ?settings.target.protocol,
        step_s = step / 1000,
        delay_s = ms(settings.delay) / 1000,
        "OTLP export on"
    );
    let mut pause = FIRST_PAUSE;
    loop {
        match pass(store.clone(), &settings, &transport, &counts).await {
            Ok(Some(wait)) => {
                pause = FIRST_PAUSE;
                tokio::time::sleep(wait).await;
            }
            Ok(None) => pause = FIRST_PAUSE,
            Err(error) => {
                counts.retries.fetch_add(1, Relaxed);
                tracing::warn!(%error, retry_in_s = pause.as_secs(), "OTLP export: will retry");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(LONGEST_PAUSE);
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the receiver did not take the request: {0}")]
    Send(send::SendError),
    #[error("store task failed: {0}")]
    Task(String),
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, PassError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| PassError::Task(e.to_string()))?.map_err(PassError::from)
}

/// Sends the next request that is due. Ok(Some(wait)): nothing is due
/// before `wait` has passed; Ok(None): go on at once.
async fn pass(
    store: Arc<dyn Store>,
    settings: &Settings,
    transport: &Transport,
    counts: &Counts,
) -> Result<Option<Duration>, PassError> {
    let step = ms(settings.step).max(1_000);
    let now = now_unix_ms();
    let ready = now - ms(settings.delay);
    let found = {
        let store = store.clone();
        blocking(move || store.export_mark(MARK)).await?
    };
    let mut mark = match found {
        // A changed step starts again at a boundary of the new one: at
        // most one step is sent twice.
        Some(m) if m.step_ms == step => m,
        Some(m) => ExportMark {
            step_ms: step,
            until_unix_ms: m.until_unix_ms.div_euclid(step) * step,
            instance: String::new(),
        },
        // A first run starts with the newest step that is in.
        None => {
            ExportMark { step_ms: step, until_unix_ms: ready.div_euclid(step) * step - step, instance: String::new() }
        }
    };
    let oldest = (ready - ms(settings.max_behind)).div_euclid(step) * step;
    if mark.until_unix_ms < oldest {
        let skipped = (oldest - mark.until_unix_ms) / step;
        counts.skipped_steps.fetch_add(skipped as u64, Relaxed);
        tracing::warn!(
            skipped_steps = skipped,
            from_unix_ms = mark.until_unix_ms,
            to_unix_ms = oldest,
            "OTLP export fell further behind than --otlp-max-behind: these steps are not exported"
        );
        mark = ExportMark { step_ms: step, until_unix_ms: oldest, instance: String::new() };
        let (store, m) = (store.clone(), mark.clone());
        blocking(move || store.set_export_mark(MARK, &m)).await?;
    }
    counts.mark_unix_ms.store(mark.until_unix_ms, Relaxed);
    let end = mark.until_unix_ms + step;
    if end > ready {
        return Ok(Some(Duration::from_millis((end - ready) as u64)));
    }
    let range = (mark.until_unix_ms, end);
    let shape = Shape { max_digests: settings.max_digests, query_text: settings.query_text };
    let after = mark.instance.clone();
    let (request, last, points) = {
        let store = store.clone();
        blocking(move || next_request(store.as_ref(), range, &after, &shape)).await?
    };
    if let Some(request) = request {
        match transport.export(request).await {
            Ok(accepted) => {
                counts.requests.fetch_add(1, Relaxed);
                counts.points.fetch_add(points.saturating_sub(accepted.rejected_points), Relaxed);
                if accepted.rejected_points > 0 {
                    counts.dropped_points.fetch_add(accepted.rejected_points, Relaxed);
                    tracing::warn!(rejected = accepted.rejected_points, message = %accepted.message,
                        "OTLP receiver rejected points of a request it took");
                }
            }
            Err(error) if !error.retryable => {
                counts.dropped_points.fetch_add(points, Relaxed);
                tracing::error!(%error, points, "OTLP receiver refused a request for good: its points are dropped");
            }
            Err(error) => return Err(PassError::Send(error)),
        }
    }
    let next = match last {
        Some(instance) => ExportMark { step_ms: step, until_unix_ms: mark.until_unix_ms, instance },
        None => ExportMark { step_ms: step, until_unix_ms: end, instance: String::new() },
    };
    blocking(move || store.set_export_mark(MARK, &next)).await?;
    Ok(None)
}

/// The next request of the step `range`: the instances after `after`, in
/// byte order, as many as fit `MAX_REQUEST_BYTES` (at least one). Also
/// the last instance it holds, None when the step has none left, and its
/// data points.
fn next_request(
    store: &dyn Store,
    range: (i64, i64),
    after: &str,
    shape: &Shape,
) -> Result<(Option<ExportMetricsServiceRequest>, Option<String>, u64), StoreError> {
    // Each instance once, with what names it, among those whose newest
    // window is not older than the step.
    let mut instances: BTreeMap<String, (String, String)> = BTreeMap::new();
    for info in store.instances()? {
        if info.last_window_end_unix_ms < range.0 || info.instance.as_str() <= after {
            continue;
        }
        let entry = instances.entry(info.instance.clone()).or_default();
        if entry.0.is_empty() {
            entry.0 = info.server_version.clone();
        }
        if entry.1.is_empty() {
            entry.1 = info.host.clone();
        }
    }
    let step = Step { since_unix_ms: range.0, until_unix_ms: range.1 };
    let mut request = ExportMetricsServiceRequest::default();
    let mut size = 0;
    let mut last = None;
    let mut points = 0;
    for (name, (server_version, host)) in &instances {
        let digests = store.top_lean(&TopQuery {
            instance: Some(name.clone()),
            digest: None,
            schema: None,
            nested: false,
            program: None,
            since_unix_ms: range.0,
            until_unix_ms: range.1,
            order_by: OrderBy::Total,
            limit: MAX_DIGESTS_READ,
        })?;
        let tables = tables_of(store, &digests, shape.max_digests)?;
        let instance = Instance { name, system: metrics::system_of(server_version), host };
        let resource = metrics::instance_metrics(&instance, &step, &digests, &tables, shape);
        let bytes = resource.as_ref().map(|r| r.encoded_len()).unwrap_or(0);
        if size > 0 && size + bytes > MAX_REQUEST_BYTES {
            break;
        }
        last = Some(name.clone());
        if let Some(resource) = resource {
            size += bytes;
            points += point_count(&resource);
            request.resource_metrics.push(resource);
        }
    }
    let request = (!request.resource_metrics.is_empty()).then_some(request);
    Ok((request, last, points))
}

fn tables_of(
    store: &dyn Store,
    digests: &[TopDigest],
    named: usize,
) -> Result<HashMap<(u64, String), DigestTables>, StoreError> {
    let mut ids: Vec<u64> = digests.iter().take(named).map(|d| d.digest).collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    Ok(store.digest_tables(&ids)?.into_iter().map(|t| ((t.digest, t.schema.clone()), t)).collect())
}

fn point_count(resource: &ResourceMetrics) -> u64 {
    use wire::MetricData;
    resource
        .scope_metrics
        .iter()
        .flat_map(|s| &s.metrics)
        .map(|m| match &m.data {
            Some(MetricData::Histogram(h)) => h.data_points.len() as u64,
            Some(MetricData::Sum(s)) => s.data_points.len() as u64,
            None => 0,
        })
        .sum()
}
