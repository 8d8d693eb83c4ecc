//! `--otlp-endpoint`: the collector exports what it stores as OTLP, per
//! instance and step (`--otlp-step`), to any OpenTelemetry receiver: each
//! instance's statements as metrics (`metrics`), its events and long
//! statements as log records (`logs`).
//!
//! It reads through the store, as `sqlbee top` does, so a batch the store
//! holds twice (ClickHouse keeps both attempts of a retried batch) is
//! counted once, and a step is read only once what it holds is in: when it
//! ended `--otlp-delay` ago. How far each signal has come is a mark in the
//! store (`Store::export_mark`), moved only after the receiver
//! acknowledged a request, so a restarted collector, or a receiver that was
//! down, loses nothing and repeats nothing acknowledged. Requests hold
//! whole instances and are kept under `MAX_REQUEST_BYTES`; the mark names
//! the last instance of the step that was sent.
//!
//! The queue is the store itself: while the receiver is away the mark
//! stays, and requests are retried with a pause that doubles up to a
//! minute. It is bounded by `--otlp-max-behind`: steps older than that are
//! skipped and counted, as are requests the receiver refuses for good (a
//! 400, say) and items it rejects in part. One collector of a store should
//! export: each one that does sends every step.
pub mod config;
pub mod logs;
pub mod metrics;
pub mod resource;
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

use sqlbee_proto::v1::{Event, LongStatementRow, TopDigest};
use sqlbee_vocabulary::clock::now_unix_ms;

use self::{
    config::{Signal, Target},
    metrics::{Shape, Step},
    resource::Instance,
    send::{Request, Transport},
    wire::{ExportLogsServiceRequest, ExportMetricsServiceRequest},
};
use crate::store::{DigestTables, EventsQuery, ExportMark, LocksQuery, OrderBy, Store, StoreError, TopQuery};

/// A request's encoded size at most, unless one instance alone is larger.
pub const MAX_REQUEST_BYTES: usize = 4 << 20;
/// Digests read per instance and step; those past `--otlp-max-digests`
/// go into the `other` point.
const MAX_DIGESTS_READ: usize = 10_000;
/// Events and long statements read per step, fleet-wide.
const MAX_LOG_ROWS: usize = 10_000;
/// How long before a step a long statement may have started and still be
/// exported when it ends in the step.
const LONGEST_STATEMENT_MS: i64 = 6 * 3_600_000;
const FIRST_PAUSE: Duration = Duration::from_secs(1);
const LONGEST_PAUSE: Duration = Duration::from_secs(60);

/// How every signal is exported; each signal that has a target is.
#[derive(Clone, Debug)]
pub struct Settings {
    pub targets: Vec<Target>,
    pub step: Duration,
    pub delay: Duration,
    pub max_behind: Duration,
    pub max_digests: usize,
    pub query_text: bool,
}

/// What one signal's export did since the collector started, for its
/// `/metrics`.
pub struct Counts {
    pub signal: Signal,
    pub requests: AtomicU64,
    /// Data points or log records the receiver took.
    pub items: AtomicU64,
    pub retries: AtomicU64,
    pub dropped_items: AtomicU64,
    pub skipped_steps: AtomicU64,
    /// The mark's time (ms since epoch); 0 before the first read of it.
    pub mark_unix_ms: AtomicI64,
}

impl Counts {
    pub fn new(signal: Signal) -> Counts {
        Counts {
            signal,
            requests: AtomicU64::new(0),
            items: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            dropped_items: AtomicU64::new(0),
            skipped_steps: AtomicU64::new(0),
            mark_unix_ms: AtomicI64::new(0),
        }
    }
}

/// The name of a signal's mark in the store.
pub fn mark_name(signal: Signal) -> String {
    format!("otlp-{}", signal.name())
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Exports one signal until the collector stops.
pub async fn run(store: Arc<dyn Store>, settings: Arc<Settings>, transport: Transport, counts: Arc<Counts>) {
    let signal = counts.signal;
    tracing::info!(
        signal = signal.name(),
        url = %transport.url(),
        step_s = ms(settings.step) / 1000,
        delay_s = ms(settings.delay) / 1000,
        "OTLP export on"
    );
    let mut pause = FIRST_PAUSE;
    loop {
        match pass(store.clone(), &settings, signal, &transport, &counts).await {
            Ok(Some(wait)) => {
                pause = FIRST_PAUSE;
                tokio::time::sleep(wait).await;
            }
            Ok(None) => pause = FIRST_PAUSE,
            Err(error) => {
                counts.retries.fetch_add(1, Relaxed);
                tracing::warn!(signal = signal.name(), %error, retry_in_s = pause.as_secs(), "OTLP export: will retry");
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

/// Sends the signal's next request that is due. Ok(Some(wait)): nothing
/// is due before `wait` has passed; Ok(None): go on at once.
async fn pass(
    store: Arc<dyn Store>,
    settings: &Arc<Settings>,
    signal: Signal,
    transport: &Transport,
    counts: &Counts,
) -> Result<Option<Duration>, PassError> {
    let name = mark_name(signal);
    let step = ms(settings.step).max(1_000);
    let now = now_unix_ms();
    let ready = now - ms(settings.delay);
    let found = {
        let (store, name) = (store.clone(), name.clone());
        blocking(move || store.export_mark(&name)).await?
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
            signal = signal.name(),
            skipped_steps = skipped,
            from_unix_ms = mark.until_unix_ms,
            to_unix_ms = oldest,
            "OTLP export fell further behind than --otlp-max-behind: these steps are not exported"
        );
        mark = ExportMark { step_ms: step, until_unix_ms: oldest, instance: String::new() };
        let (store, name, m) = (store.clone(), name.clone(), mark.clone());
        blocking(move || store.set_export_mark(&name, &m)).await?;
    }
    counts.mark_unix_ms.store(mark.until_unix_ms, Relaxed);
    let end = mark.until_unix_ms + step;
    if end > ready {
        return Ok(Some(Duration::from_millis((end - ready) as u64)));
    }
    let range = (mark.until_unix_ms, end);
    let (request, last, items) = {
        let (store, settings, after) = (store.clone(), settings.clone(), mark.instance.clone());
        blocking(move || match signal {
            Signal::Metrics => metrics_request(store.as_ref(), range, &after, &settings),
            Signal::Logs => logs_request(store.as_ref(), range, &after, &settings, now),
        })
        .await?
    };
    if let Some(request) = request {
        match transport.export(request).await {
            Ok(accepted) => {
                counts.requests.fetch_add(1, Relaxed);
                counts.items.fetch_add(items.saturating_sub(accepted.rejected), Relaxed);
                if accepted.rejected > 0 {
                    counts.dropped_items.fetch_add(accepted.rejected, Relaxed);
                    tracing::warn!(signal = signal.name(), rejected = accepted.rejected, message = %accepted.message,
                        "OTLP receiver rejected part of a request it took");
                }
            }
            Err(error) if !error.retryable => {
                counts.dropped_items.fetch_add(items, Relaxed);
                tracing::error!(signal = signal.name(), %error, items,
                    "OTLP receiver refused a request for good: what it held is dropped");
            }
            Err(error) => return Err(PassError::Send(error)),
        }
    }
    let next = match last {
        Some(instance) => ExportMark { step_ms: step, until_unix_ms: mark.until_unix_ms, instance },
        None => ExportMark { step_ms: step, until_unix_ms: end, instance: String::new() },
    };
    blocking(move || store.set_export_mark(&name, &next)).await?;
    Ok(None)
}

/// What names each instance whose newest window is not older than
/// `since`, after `after` in byte order: (server version, host).
fn instances_after(
    store: &dyn Store,
    since: i64,
    after: &str,
) -> Result<BTreeMap<String, (String, String)>, StoreError> {
    let mut instances: BTreeMap<String, (String, String)> = BTreeMap::new();
    for info in store.instances()? {
        if info.last_window_end_unix_ms < since || info.instance.as_str() <= after {
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
    Ok(instances)
}

/// Resources of instances in order, as many as fit `MAX_REQUEST_BYTES`
/// (at least one instance), and the last instance taken (None when there
/// was none left).
fn fitting<R: prost::Message>(
    instances: impl Iterator<Item = Result<(String, Option<R>), StoreError>>,
) -> Result<(Vec<R>, Option<String>), StoreError> {
    let (mut taken, mut size, mut last) = (Vec::new(), 0, None);
    for item in instances {
        let (name, resource) = item?;
        let bytes = resource.as_ref().map_or(0, |r| r.encoded_len());
        if size > 0 && size + bytes > MAX_REQUEST_BYTES {
            break;
        }
        last = Some(name);
        if let Some(resource) = resource {
            size += bytes;
            taken.push(resource);
        }
    }
    Ok((taken, last))
}

type Next = (Option<Request>, Option<String>, u64);

/// The next metrics request of the step `range`, the last instance it
/// holds, and its data points.
fn metrics_request(store: &dyn Store, range: (i64, i64), after: &str, settings: &Settings) -> Result<Next, StoreError> {
    let shape = Shape { max_digests: settings.max_digests, query_text: settings.query_text };
    let step = Step { since_unix_ms: range.0, until_unix_ms: range.1 };
    let instances = instances_after(store, range.0, after)?;
    let resources = instances.iter().map(|(name, (server_version, host))| {
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
        let instance = Instance { name, system: resource::system_of(server_version), host };
        Ok((name.clone(), metrics::instance_metrics(&instance, &step, &digests, &tables, &shape)))
    });
    let (resource_metrics, last) = fitting(resources)?;
    let items = resource_metrics.iter().map(metrics::point_count).sum();
    let request =
        (!resource_metrics.is_empty()).then_some(Request::Metrics(ExportMetricsServiceRequest { resource_metrics }));
    Ok((request, last, items))
}

/// The next logs request of the step `range`, as `metrics_request`.
fn logs_request(
    store: &dyn Store,
    range: (i64, i64),
    after: &str,
    settings: &Settings,
    now: i64,
) -> Result<Next, StoreError> {
    let in_step = |t: i64| (range.0..range.1).contains(&t);
    let mut by_instance: BTreeMap<String, (Vec<Event>, Vec<LongStatementRow>)> = BTreeMap::new();
    // Every event whose version falls in the step is open at some time of
    // it (it opened before its version's time, and closed, if at all, at
    // or after the step's start).
    let events = store.events(&EventsQuery {
        instance: None,
        kind: None,
        since_unix_ms: range.0,
        until_unix_ms: range.1,
        open_only: false,
        limit: MAX_LOG_ROWS,
    })?;
    for event in events.into_iter().filter(|e| in_step(logs::event_time(e)) && e.instance.as_str() > after) {
        by_instance.entry(event.instance.clone()).or_default().0.push(event);
    }
    let statements = store.long_statements(&LocksQuery {
        instance: None,
        since_unix_ms: range.0 - LONGEST_STATEMENT_MS,
        limit: MAX_LOG_ROWS,
    })?;
    for row in statements.into_iter().filter(|s| in_step(logs::statement_time(s)) && s.instance.as_str() > after) {
        by_instance.entry(row.instance.clone()).or_default().1.push(row);
    }
    let names = instances_after(store, 0, after)?;
    let resources = by_instance.iter().map(|(name, (events, statements))| {
        let (server_version, host) = names.get(name).cloned().unwrap_or_default();
        let instance = Instance { name, system: resource::system_of(&server_version), host: &host };
        Ok((name.clone(), logs::instance_logs(&instance, events, statements, settings.query_text, now)))
    });
    let (resource_logs, last) = fitting(resources)?;
    let items = resource_logs.iter().flat_map(|r| &r.scope_logs).map(|s| s.log_records.len() as u64).sum();
    let request = (!resource_logs.is_empty()).then_some(Request::Logs(ExportLogsServiceRequest { resource_logs }));
    Ok((request, last, items))
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
