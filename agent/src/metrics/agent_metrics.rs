//! The agent's own Prometheus metrics, rendered once per window from what
//! the window produced: its cost, the host, and a bounded top of digests.
//! Digest labels are limited to `TOP_DIGESTS` per instance so a workload
//! with unbounded distinct statements cannot blow up series cardinality.
//!
//! Two kinds of series: gauges of the last window (kept as they were, for
//! the dashboards built on them), and counters and a latency histogram
//! that add every window up since the agent started, for `rate()` and
//! `histogram_quantile()`. The counters live here, in `AgentMetrics`, and
//! nowhere else: they restart at zero with the agent, as Prometheus
//! counters may.
use std::collections::{BTreeMap, HashMap};

use sqlbee_kernel_abi::wait_class;
use sqlbee_vocabulary::histogram::{Histogram, bucket_high, bucket_of};

use crate::{
    aggregate::{DigestRow, WindowReport},
    budget::CostSample,
    host::HostMetrics,
    probe::UntracedServer,
    ship::ShipTotals,
};

use super::{Encoder, MetricType};

/// Digests exported per instance (by statements in the window).
pub const TOP_DIGESTS: usize = 20;

/// Digests per instance that keep a counter: each digest that made a
/// window's top `TOP_DIGESTS` counts from then on, and the ones longest out
/// of the top are forgotten past this many (their series end).
pub const TRACKED_DIGESTS: usize = 5 * TOP_DIGESTS;

/// The latency histogram's `le` bounds, as asked for (ns): 100 us to 10 s.
const NOMINAL_BOUNDS_NS: [u64; 16] = [
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// The replica lag histogram's `le` bounds, as asked for (ns): 100 ms to
/// 10 min.
const NOMINAL_LAG_BOUNDS_NS: [u64; 12] = [
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
    30_000_000_000,
    60_000_000_000,
    120_000_000_000,
    300_000_000_000,
    600_000_000_000,
];

/// The lag's `le` bounds as scheme bucket edges (see `LATENCY_BOUNDS`).
const LAG_BOUNDS: [usize; NOMINAL_LAG_BOUNDS_NS.len()] = nearest_edges(NOMINAL_LAG_BOUNDS_NS);

/// The `le` bounds actually exported, as scheme bucket indices: each is the
/// scheme bucket edge nearest its nominal bound, and the label says that
/// edge exactly (`bucket_high` of the index, in seconds), never the round
/// number. The agent keeps latencies only as scheme buckets, so a count
/// "at or below 100 us" could not be told when 100 us falls inside a
/// bucket; at an edge it is exact. The price is bounds like
/// `0.000098303` for 100 us and `1.006632959` for 1 s: within 6.25% of the nominal value (half a
/// bucket, which is an eighth of its power of two).
pub const LATENCY_BOUNDS: [usize; NOMINAL_BOUNDS_NS.len()] = nearest_edges(NOMINAL_BOUNDS_NS);

/// Each nominal bound's nearest scheme bucket edge.
const fn nearest_edges<const N: usize>(nominal_ns: [u64; N]) -> [usize; N] {
    let mut bounds = [0; N];
    let mut i = 0;
    while i < N {
        bounds[i] = nearest_edge(nominal_ns[i]);
        i += 1;
    }
    bounds
}

/// The bucket whose upper edge is nearest to `ns`: the one holding it, or
/// the one before when `ns` is nearer that bucket's low end.
const fn nearest_edge(ns: u64) -> usize {
    let holding = bucket_of(ns);
    if holding == 0 || ns - bucket_high(holding - 1) > bucket_high(holding) - ns { holding } else { holding - 1 }
}

/// The `le` label value of a bound (seconds).
pub fn latency_bound_seconds(index: usize) -> f64 {
    bucket_high(index) as f64 / 1e9
}

/// Everything the counters have added up since the agent started, and
/// what the page needs to render them.
pub struct AgentMetrics {
    /// The wait-class probes are attached: without them a wait counter
    /// would say 0 for "not measured".
    wait_probes: bool,
    windows: u64,
    instances: BTreeMap<String, InstanceTotals>,
}

/// One server instance's totals. Counted from client statements at the
/// top level, as `statements` (the kernel's exact count) is: statements
/// stored programs, the replica applier and the event scheduler ran are
/// not in these, so the histogram and the errors answer for the same
/// statements as the statement counter.
#[derive(Default)]
struct InstanceTotals {
    statements: u64,
    errors: u64,
    /// Statements whose duration the agent has, and their sum.
    latency: Histogram,
    latency_sum_ns: u128,
    waits_ns: [u128; wait_class::COUNT],
    dropped_events: u64,
    unmatched: u64,
    read_failures: u64,
    overflow_statements: u64,
    shed_statements: u64,
    /// None until a kernel that counts them was read.
    skipped_runs: Option<u64>,
    /// None until the probes' cost was first measured (not in every mode).
    probe_cpu_s: Option<f64>,
    digests: HashMap<DigestKey, DigestTotals>,
    /// What it applied as a replica; None until it applied something.
    /// By replication channel; empty on a primary.
    replica: BTreeMap<String, ReplicaTotals>,
}

#[derive(Default)]
struct ReplicaTotals {
    transactions: u64,
    lag: Histogram,
    lag_sum_ns: u128,
    /// By event class: events applied and their apply time.
    classes: BTreeMap<&'static str, (u64, u128)>,
    lost_events: u64,
}

/// A digest row's identity on the page: schema and digest id.
type DigestKey = (Option<std::sync::Arc<str>>, u64);

struct DigestTotals {
    text: String,
    statements: u64,
    errors: u64,
    sum_ns: u128,
    /// The last window (`AgentMetrics::windows`) it was in the top.
    last_top: u64,
}

/// Client statements at the top level, the ones `statements` counts.
fn client_top_level(d: &DigestRow) -> bool {
    !d.lineage.nested && d.lineage.source == sqlbee_kernel_abi::source::CLIENT
}

impl AgentMetrics {
    pub fn new(wait_probes: bool) -> AgentMetrics {
        AgentMetrics { wait_probes, windows: 0, instances: BTreeMap::new() }
    }

    /// Adds one closed window to the totals.
    fn add(&mut self, reports: &[WindowReport]) {
        self.windows += 1;
        for r in reports {
            let t = self.instances.entry(r.instance.clone()).or_default();
            let s = &r.summary;
            t.statements += s.statements;
            t.dropped_events += s.dropped_events;
            t.unmatched += s.unmatched;
            t.read_failures += s.read_failures;
            t.overflow_statements += s.overflow_statements;
            t.shed_statements += s.shed_statements;
            if let Some(skipped) = s.skipped_runs {
                *t.skipped_runs.get_or_insert(0) += skipped;
            }
            if let Some(c) = &s.probe_cost {
                *t.probe_cpu_s.get_or_insert(0.0) += c.probe_cpu_s();
            }
            for (channel, window) in &r.replication {
                let replica = t.replica.entry(channel.clone()).or_default();
                replica.transactions += window.transactions;
                replica.lag.merge(&window.lag);
                replica.lag_sum_ns += window.lag_sum_ns;
                replica.lost_events += window.lost_events;
                for (class, applied) in &window.classes {
                    let total = replica.classes.entry(class).or_default();
                    total.0 += applied.events;
                    total.1 += u128::from(applied.apply_ns);
                }
            }
            let mut window_digests: HashMap<DigestKey, (u64, u64, u64, &str)> = HashMap::new();
            for d in r.digests.iter().filter(|d| client_top_level(d)) {
                t.errors += d.errors;
                t.latency.merge(&d.histogram);
                t.latency_sum_ns += d.sum_ns as u128;
                for (total, w) in t.waits_ns.iter_mut().zip(&d.waits) {
                    *total += w.sum_ns as u128;
                }
                // A digest can have several rows (one per lineage); on the
                // page it is one series.
                let e = window_digests.entry((d.schema.clone(), d.digest)).or_insert((0, 0, 0, &*d.digest_text));
                e.0 += d.count;
                e.1 += d.errors;
                e.2 += d.sum_ns;
            }
            let mut top: Vec<_> = window_digests.iter().collect();
            top.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.0.cmp(b.0)));
            for (key, (_, _, _, text)) in top.into_iter().take(TOP_DIGESTS) {
                t.digests
                    .entry(key.clone())
                    .or_insert_with(|| DigestTotals {
                        text: short(text),
                        statements: 0,
                        errors: 0,
                        sum_ns: 0,
                        last_top: 0,
                    })
                    .last_top = self.windows;
            }
            for (key, (count, errors, sum_ns, _)) in &window_digests {
                if let Some(d) = t.digests.get_mut(key) {
                    d.statements += count;
                    d.errors += errors;
                    d.sum_ns += *sum_ns as u128;
                }
            }
            if t.digests.len() > TRACKED_DIGESTS {
                let mut by_age: Vec<(u64, DigestKey)> =
                    t.digests.iter().map(|(k, d)| (d.last_top, k.clone())).collect();
                by_age.sort();
                for (_, key) in by_age.into_iter().take(t.digests.len() - TRACKED_DIGESTS) {
                    t.digests.remove(&key);
                }
            }
        }
    }

    /// Adds the window up, then renders the page: the window's gauges and
    /// the totals. `ship`: the ship path's totals, when the agent ships.
    pub fn render(
        &mut self,
        cost: &CostSample,
        host: Option<&HostMetrics>,
        reports: &[WindowReport],
        untraced: &[UntracedServer],
        ship: Option<ShipTotals>,
    ) -> String {
        self.add(reports);
        let mut enc = Encoder::new();
        self.encode_totals(&mut enc, cost, ship);
        encode_window(&mut enc, cost, host, reports, untraced);
        enc.finish()
    }

    /// Replicas' transactions, lag at commit and apply time; no family on
    /// an agent that watches no replica.
    fn encode_replicas(&self, enc: &mut Encoder) {
        let replicas: Vec<(&String, &String, &ReplicaTotals)> =
            self.instances.iter().flat_map(|(i, t)| t.replica.iter().map(move |(c, r)| (i, c, r))).collect();
        if replicas.is_empty() {
            return;
        }
        let mut f = enc.family(
            "sqlbee_replica_transactions_total",
            "Transactions the replica applied (one GTID event each), exact.",
            MetricType::Counter,
        );
        for (instance, channel, r) in &replicas {
            f.sample(&[("instance", instance), ("channel", channel)], r.transactions);
        }
        let mut f = enc.family(
            "sqlbee_replica_lag_seconds",
            "Each applied transaction's lag at its commit: the replica's clock less the second the primary wrote it. \
             Each le is a bucket edge of the agent's histogram scheme, near 0.1s..10min, so every count is exact.",
            MetricType::Histogram,
        );
        for (instance, channel, r) in &replicas {
            let buckets = cumulative(&r.lag, &LAG_BOUNDS);
            f.histogram(
                &[("instance", instance), ("channel", channel)],
                &buckets,
                r.lag_sum_ns as f64 / 1e9,
                r.lag.total(),
            );
        }
        let mut f = enc.family(
            "sqlbee_replica_events_total",
            "Replication events the replica applied, by class (gtid, xid, query, table_map, rows, other).",
            MetricType::Counter,
        );
        for (instance, channel, r) in &replicas {
            for (class, (events, _)) in &r.classes {
                f.sample(&[("instance", instance), ("channel", channel), ("class", class)], *events);
            }
        }
        let mut f = enc.family(
            "sqlbee_replica_apply_seconds_total",
            "Time the replica spent applying events, by class.",
            MetricType::Counter,
        );
        for (instance, channel, r) in &replicas {
            for (class, (_, ns)) in &r.classes {
                f.sample(&[("instance", instance), ("channel", channel), ("class", class)], *ns as f64 / 1e9);
            }
        }
        let mut f = enc.family(
            "sqlbee_replica_events_lost_total",
            "Events the replica applied that the agent could not time (its ring was full, or two appliers shared a \
             slot): the counts above are short by this many.",
            MetricType::Counter,
        );
        for (instance, channel, r) in &replicas {
            f.sample(&[("instance", instance), ("channel", channel)], r.lost_events);
        }
    }

    fn encode_totals(&self, enc: &mut Encoder, cost: &CostSample, ship: Option<ShipTotals>) {
        enc.family(
            "sqlbee_agent_windows_total",
            "Windows the agent closed; the page changes once per window.",
            MetricType::Counter,
        )
        .sample(&[], self.windows);
        enc.family(
            "sqlbee_agent_cpu_seconds_total",
            "CPU time the agent used, seconds (source: its cgroup, counted since the cgroup began, or the process).",
            MetricType::Counter,
        )
        .sample(&[("source", cost.cpu_source)], cost.cpu_seconds_total);
        let per_instance: [(&str, &str, fn(&InstanceTotals) -> u64); 7] = [
            (
                "sqlbee_statements_total",
                "Statements clients ran, exact (the kernel counts each one, whatever was dropped or sampled).",
                |t| t.statements,
            ),
            ("sqlbee_statement_errors_total", "Client statements that ended with an error.", |t| t.errors),
            (
                "sqlbee_dropped_events_total",
                "Statement records lost in the kernel ring buffer (their statements stay counted, without a duration).",
                |t| t.dropped_events,
            ),
            (
                "sqlbee_unmatched_statements_total",
                "Statements counted without a duration: their start was not seen (they began before the probes attached).",
                |t| t.unmatched,
            ),
            (
                "sqlbee_shed_statements_total",
                "Statement records sent without their text while the agent was shedding load.",
                |t| t.shed_statements,
            ),
            (
                "sqlbee_overflow_statements_total",
                "Statements counted in the overflow row because a window reached its digest limit.",
                |t| t.overflow_statements,
            ),
            ("sqlbee_read_failures_total", "Reads of server memory by the probes that failed.", |t| t.read_failures),
        ];
        for (name, help, value) in per_instance {
            let mut f = enc.family(name, help, MetricType::Counter);
            for (instance, t) in &self.instances {
                f.sample(&[("instance", instance)], value(t));
            }
        }
        {
            let mut f = enc.family(
                "sqlbee_skipped_program_runs_total",
                "Runs of the agent's kernel programs that the kernel skipped because another BPF program or a bpf() \
                 call was in progress on that CPU: statements_total may be short by up to this many (absent where \
                 the kernel would skip uncounted: the send hook's tracepoints before 6.7, uprobes before 6.0).",
                MetricType::Counter,
            );
            for (instance, t) in &self.instances {
                if let Some(skipped) = t.skipped_runs {
                    f.sample(&[("instance", instance)], skipped);
                }
            }
        }
        {
            let mut f = enc.family(
                "sqlbee_statement_latency_seconds",
                "Latency of client statements that have one (statements_total less dropped and unmatched). Each le is a \
                 bucket edge of the agent's histogram scheme, near 100us..10s, so every count is exact.",
                MetricType::Histogram,
            );
            for (instance, t) in &self.instances {
                let buckets = cumulative(&t.latency, &LATENCY_BOUNDS);
                f.histogram(&[("instance", instance)], &buckets, t.latency_sum_ns as f64 / 1e9, t.latency.total());
            }
        }
        self.encode_replicas(enc);
        if self.wait_probes {
            let mut f = enc.family(
                "sqlbee_wait_seconds_total",
                "Time client statements waited, by wait class (row_lock, metadata_lock and table_lock are lock waits).",
                MetricType::Counter,
            );
            for (instance, t) in &self.instances {
                for (class, ns) in wait_class::NAMES.iter().zip(t.waits_ns) {
                    f.sample(&[("instance", instance), ("class", class)], ns as f64 / 1e9);
                }
            }
        }
        {
            let mut f = enc.family(
                "sqlbee_mysqld_probe_cpu_seconds_total",
                "CPU the probes took from mysqld (program time plus one trap per run), seconds.",
                MetricType::Counter,
            );
            for (instance, t) in &self.instances {
                if let Some(s) = t.probe_cpu_s {
                    f.sample(&[("instance", instance)], s);
                }
            }
        }
        let digest_families: [(&str, &str, fn(&DigestTotals) -> f64); 3] = [
            (
                "sqlbee_digest_statements_total",
                "Client statements of a digest, counted from the first window it was in the top 20 of its instance.",
                |d| d.statements as f64,
            ),
            ("sqlbee_digest_errors_total", "Client statements of a top digest that ended with an error.", |d| {
                d.errors as f64
            }),
            (
                "sqlbee_digest_latency_seconds_total",
                "Total latency of a top digest's client statements, seconds.",
                |d| d.sum_ns as f64 / 1e9,
            ),
        ];
        for (name, help, value) in digest_families {
            let mut f = enc.family(name, help, MetricType::Counter);
            for (instance, t) in &self.instances {
                for ((schema, digest), d) in &t.digests {
                    let digest = format!("{digest:016x}");
                    let labels = [
                        ("instance", instance.as_str()),
                        ("schema", schema.as_deref().unwrap_or("")),
                        ("digest", &digest),
                        ("text", &d.text),
                    ];
                    f.sample(&labels, value(d));
                }
            }
        }
        if let Some(ship) = ship {
            let counters: [(&str, &str, u64); 8] = [
                (
                    "sqlbee_ship_batches_spooled_total",
                    "Batches written to the spool (fsync'd) to be shipped.",
                    ship.spooled,
                ),
                ("sqlbee_ship_batches_delivered_total", "Batches a collector acknowledged.", ship.delivered),
                (
                    "sqlbee_ship_push_failures_total",
                    "Pushes to a collector that failed; the batch stays spooled and is sent again.",
                    ship.push_failures,
                ),
                (
                    "sqlbee_ship_batches_rejected_total",
                    "Batches a collector refused as invalid (kept in the spool's rejected/).",
                    ship.rejected,
                ),
                (
                    "sqlbee_ship_batches_lost_total",
                    "Batches dropped before shipping (full spool, free-space floor, failed write); the collector learns of them as gaps.",
                    ship.lost_batches,
                ),
                (
                    "sqlbee_ship_lost_statements_total",
                    "Statements in the batches dropped before shipping.",
                    ship.lost_statements,
                ),
                (
                    "sqlbee_ship_sender_restarts_total",
                    "Times the sender task had to be restarted.",
                    ship.sender_restarts,
                ),
                (
                    "sqlbee_ship_spool_io_errors_total",
                    "Spool disk errors the ship path lived through.",
                    ship.spool_io_errors,
                ),
            ];
            for (name, help, value) in counters {
                enc.family(name, help, MetricType::Counter).sample(&[], value);
            }
            enc.family(
                "sqlbee_ship_backlog_batches",
                "Batches in the spool waiting for a collector.",
                MetricType::Gauge,
            )
            .sample(&[], ship.backlog);
        }
    }
}

/// The last window's gauges.
fn encode_window(
    enc: &mut Encoder,
    cost: &CostSample,
    host: Option<&HostMetrics>,
    reports: &[WindowReport],
    untraced: &[UntracedServer],
) {
    enc.family("sqlbee_agent_cpu_cores", "CPU the agent used over the last window, cores.", MetricType::Gauge)
        .sample(&[("source", cost.cpu_source)], cost.cpu_cores);
    enc.family("sqlbee_agent_rss_bytes", "Resident memory of the agent.", MetricType::Gauge)
        .sample(&[], cost.rss_bytes);
    enc.family(
        "sqlbee_agent_cores_per_10k_qps",
        "Agent CPU per 10,000 statements per second over the last window.",
        MetricType::Gauge,
    )
    .sample(&[], cost.cores_per_10k_qps);
    enc.family(
        "sqlbee_agent_shedding_step",
        "Shedding step in force: 0 exact, 1 no samples, 2 known texts only.",
        MetricType::Gauge,
    )
    .sample(&[], cost.shedding as u32 as f64);
    {
        let mut f = enc.family(
            "sqlbee_mysqld_probe_cores",
            "CPU the probes took from mysqld over the last window (program time plus one trap per run), cores.",
            MetricType::Gauge,
        );
        for r in reports {
            if let Some(c) = r.summary.probe_cost.as_ref().filter(|c| c.window_s > 0.0) {
                f.sample(&[("instance", &r.instance)], c.probe_cpu_s() / c.window_s);
            }
        }
    }
    if let Some(limit) = cost.cpu_limit_cores {
        enc.family("sqlbee_agent_cpu_limit_cores", "CPU limit the agent runs under.", MetricType::Gauge)
            .sample(&[], limit);
    }
    if let Some(limit) = cost.memory_limit_bytes {
        enc.family("sqlbee_agent_memory_limit_bytes", "Memory limit the agent runs under.", MetricType::Gauge)
            .sample(&[], limit);
    }
    {
        let mut f =
            enc.family("sqlbee_statements_per_second", "Statements per second per instance.", MetricType::Gauge);
        for r in reports {
            let seconds = r.window_end.duration_since(r.window_start).map(|d| d.as_secs_f64()).unwrap_or(0.0);
            let rate = if seconds > 0.0 { r.summary.statements as f64 / seconds } else { 0.0 };
            f.sample(&[("instance", &r.instance)], rate);
        }
    }
    {
        let mut f = enc.family(
            "sqlbee_probe_program_loaded",
            "Kernel programs per instance: 1 loaded, 0 left out because the kernel refused it (the agent's log and \
             jsonl say why and what the instance lacks).",
            MetricType::Gauge,
        );
        for r in reports {
            for l in &r.summary.programs.loaded {
                f.sample(&[("instance", &r.instance), ("program", l.program)], 1u64);
            }
            for l in &r.summary.programs.left_out {
                f.sample(&[("instance", &r.instance), ("program", l.program)], 0u64);
            }
        }
    }
    enc.family(
        "sqlbee_servers_untraced",
        "Servers the agent found but does not trace (see sqlbee_server_untraced for why).",
        MetricType::Gauge,
    )
    .sample(&[], untraced.len() as u64);
    {
        let mut f = enc.family(
            "sqlbee_server_untraced",
            "1 for each server the agent found but cannot trace; kind says why, the agent's log and jsonl say it in full.",
            MetricType::Gauge,
        );
        for u in untraced {
            let pid = u.server.pid.to_string();
            f.sample(
                &[
                    ("instance", &u.server.instance),
                    ("pid", &pid),
                    ("kind", u.kind),
                    ("version", u.binary.version.as_deref().unwrap_or("")),
                    ("build_id", u.binary.build_id.as_deref().unwrap_or("")),
                ],
                1u64,
            );
        }
    }
    {
        let mut f = enc.family(
            "sqlbee_dropped_events",
            "Statement records lost in the kernel ring buffer in the last window (counts stay exact).",
            MetricType::Gauge,
        );
        for r in reports {
            f.sample(&[("instance", &r.instance)], r.summary.dropped_events);
        }
    }
    {
        struct Top<'a> {
            instance: &'a str,
            digest: String,
            text: String,
            schema: &'a str,
            d: &'a crate::aggregate::DigestRow,
            readable: crate::probe::Readable,
        }
        let mut top_rows = Vec::new();
        for r in reports {
            let mut top: Vec<_> = r.digests.iter().collect();
            top.sort_by_key(|d| std::cmp::Reverse(d.count));
            for d in top.into_iter().take(TOP_DIGESTS) {
                top_rows.push(Top {
                    instance: r.instance.as_str(),
                    digest: format!("{:016x}", d.digest),
                    text: short(&d.digest_text),
                    schema: d.schema.as_deref().unwrap_or(""),
                    d,
                    readable: r.summary.readable,
                });
            }
        }
        // A digest has one row per lineage: a client's, a replica's or an
        // event's statements, or a stored program's for one calling digest.
        // The lineage and the calling digest tell its series apart.
        let labels = |t: &Top<'_>| -> [(&'static str, String); 6] {
            let l = &t.d.lineage;
            let lineage = match &l.program {
                Some(p) if l.nested => format!("{} {} {}", l.source_name(), p.kind, p.name),
                _ if l.nested => format!("{} program", l.source_name()),
                _ => l.source_name().to_string(),
            };
            [
                ("instance", t.instance.to_string()),
                ("schema", t.schema.to_string()),
                ("digest", t.digest.clone()),
                ("text", t.text.clone()),
                ("lineage", lineage),
                ("parent_digest", l.parent_digest.map(|p| format!("{p:016x}")).unwrap_or_default()),
            ]
        };
        let figure = |name: &str| figure_index(name).expect("DIGEST_FIGURE_METRICS names a figure");
        let mut families: Vec<(&str, &str, Box<dyn Fn(&crate::aggregate::DigestRow) -> f64>, u32)> = vec![
            (
                "sqlbee_digest_statements",
                "Statements of a top digest in the last window (top 20 per instance).",
                Box::new(|d| d.count as f64),
                0,
            ),
            (
                "sqlbee_digest_latency_seconds_sum",
                "Total latency of a top digest's statements in the last window.",
                Box::new(|d| d.sum_ns as f64 / 1e9),
                0,
            ),
        ];
        for (figure_name, name, help, scale) in DIGEST_FIGURE_METRICS {
            let at = figure(figure_name);
            let value = move |d: &crate::aggregate::DigestRow| d.stats.values()[at] as f64 * scale;
            families.push((name, help, Box::new(value), sqlbee_figures::FIGURES[at].needs));
        }
        for (name, help, value, needs) in families {
            let mut family = enc.family(name, help, MetricType::Gauge);
            for t in top_rows.iter().filter(|t| t.readable.knows(needs)) {
                let labels = labels(t);
                let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
                family.sample(&labels, value(t.d));
            }
        }
    }
    if let Some(host) = host {
        enc.family("sqlbee_host_cores", "Online CPU cores.", MetricType::Gauge).sample(&[], host.cpu.online_cores);
        if let Some(busy) = &host.cpu.busy {
            let mut f =
                enc.family("sqlbee_host_cpu_cores", "Host CPU by mode over the last window, cores.", MetricType::Gauge);
            for (mode, v) in [
                ("user", busy.user),
                ("nice", busy.nice),
                ("system", busy.system),
                ("idle", busy.idle),
                ("iowait", busy.iowait),
                ("irq", busy.irq),
                ("softirq", busy.softirq),
                ("steal", busy.steal),
            ] {
                f.sample(&[("mode", mode)], v);
            }
        }
        enc.family("sqlbee_host_memory_total_bytes", "Host memory.", MetricType::Gauge)
            .sample(&[], host.memory.total_bytes);
        if let Some(available) = host.memory.available_bytes {
            enc.family("sqlbee_host_memory_available_bytes", "Host memory available.", MetricType::Gauge)
                .sample(&[], available);
        }
        enc.family("sqlbee_host_load1", "Host load average, 1 minute.", MetricType::Gauge).sample(&[], host.load.one);
        let mut f = enc.family("sqlbee_mysqld_cpu_cores", "CPU of each watched server process.", MetricType::Gauge);
        for p in &host.processes {
            if let Some(cores) = p.cpu_cores {
                f.sample(&[("pid", &p.pid.to_string())], cores);
            }
        }
        let mut f = enc.family("sqlbee_mysqld_rss_bytes", "RSS of each watched server process.", MetricType::Gauge);
        for p in &host.processes {
            if let Some(rss) = p.rss_bytes {
                f.sample(&[("pid", &p.pid.to_string())], rss);
            }
        }
    }
}

/// Digest texts can be long; a label keeps the head.
fn short(text: &str) -> String {
    text.chars().take(120).collect()
}

/// The figures exported per top digest: (figure, metric, help, scale).
const DIGEST_FIGURE_METRICS: [(&str, &str, &str, f64); 4] = [
    (
        "rows_examined",
        "sqlbee_digest_rows_examined",
        "Rows a top digest's statements examined in the last window (the server's count).",
        1.0,
    ),
    ("rows_sent", "sqlbee_digest_rows_sent", "Rows a top digest's statements sent in the last window.", 1.0),
    ("cpu_ns", "sqlbee_digest_cpu_seconds_sum", "On-CPU time of a top digest's statements in the last window.", 1e-9),
    (
        "tmp_disk_tables",
        "sqlbee_digest_tmp_disk_tables",
        "Temporary tables a top digest's statements created on disk in the last window.",
        1.0,
    ),
];

/// A histogram's cumulative counts at `bounds` (scheme bucket indices),
/// each with its edge in seconds: Prometheus's `le` buckets, exact.
fn cumulative(histogram: &Histogram, bounds: &[usize]) -> Vec<(f64, u64)> {
    let mut scheme = histogram.buckets().peekable();
    let mut total = 0u64;
    bounds
        .iter()
        .map(|&bound| {
            while let Some((_, count)) = scheme.next_if(|(index, _)| *index <= bound) {
                total = total.saturating_add(count);
            }
            (latency_bound_seconds(bound), total)
        })
        .collect()
}

/// A figure's place in `sqlbee_figures::FIGURES`.
fn figure_index(name: &str) -> Option<usize> {
    sqlbee_figures::FIGURES.iter().position(|f| f.name == name)
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::SystemTime};

    use super::*;
    use crate::aggregate::{Lineage, Summary};

    #[test]
    fn every_exported_figure_is_in_the_list() {
        for (figure, ..) in DIGEST_FIGURE_METRICS {
            assert!(figure_index(figure).is_some(), "{figure} is not in sqlbee_figures::FIGURES");
        }
    }

    fn row(digest: u64, latencies_ns: &[u64], errors: u64, lineage: Lineage) -> DigestRow {
        let mut histogram = Histogram::default();
        latencies_ns.iter().for_each(|ns| histogram.record(*ns));
        DigestRow {
            digest,
            digest_text: Arc::from(format!("SELECT {digest}")),
            schema: Some(Arc::from("app")),
            lineage,
            stats: Default::default(),
            accounts: Default::default(),
            clients: Default::default(),
            tags: Default::default(),
            count: latencies_ns.len() as u64,
            errors,
            error_codes: Default::default(),
            sum_ns: latencies_ns.iter().sum(),
            min_ns: latencies_ns.iter().copied().min().unwrap_or(0),
            max_ns: latencies_ns.iter().copied().max().unwrap_or(0),
            histogram,
            sample: String::new(),
            raw_sample: None,
            tables: None,
            truncated: 0,
            waits: Default::default(),
            error_messages: Default::default(),
        }
    }

    fn report(instance: &str, statements: u64, digests: Vec<DigestRow>) -> WindowReport {
        let now = SystemTime::now();
        WindowReport {
            instance: instance.into(),
            window_start: now,
            window_end: now,
            digests,
            summary: Summary { statements, ..Summary::default() },
            lock_waits: Vec::new(),
            long_statements: Vec::new(),
            long_statements_dropped: 0,
            changes: Vec::new(),
            changes_dropped: 0,
            replication: Default::default(),
        }
    }

    /// The value of the one line that starts with `series ` (name and
    /// labels exactly as written).
    fn value(page: &str, series: &str) -> f64 {
        let values: Vec<f64> =
            page.lines().filter_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok()).collect();
        assert_eq!(values.len(), 1, "{series} in:\n{page}");
        values[0]
    }

    #[test]
    fn a_replicas_transactions_lag_and_apply_time_add_up_across_windows() {
        use crate::aggregate::replication::{ApplyTotals, ReplicationWindow};
        let mut metrics = AgentMetrics::new(false);
        let window = |lags_ns: &[u64]| {
            let mut replication = ReplicationWindow { transactions: lags_ns.len() as u64, ..Default::default() };
            for ns in lags_ns {
                replication.lag.record(*ns);
                replication.lag_sum_ns += u128::from(*ns);
            }
            replication.classes.insert(
                "xid",
                ApplyTotals { events: lags_ns.len() as u64, apply_ns: 500_000_000, rows: None, ..Default::default() },
            );
            let replication = [(String::new(), replication)].into();
            [WindowReport { replication, ..report("db2:3306", 0, Vec::new()) }, report("db1:3306", 1, Vec::new())]
        };
        metrics.render(&CostSample::default(), None, &window(&[200_000_000, 4_000_000_000]), &[], None);
        let page = metrics.render(&CostSample::default(), None, &window(&[900_000_000_000]), &[], None);
        assert_eq!(value(&page, "sqlbee_replica_transactions_total{instance=\"db2:3306\",channel=\"\"}"), 3.0);
        assert_eq!(value(&page, "sqlbee_replica_lag_seconds_count{instance=\"db2:3306\",channel=\"\"}"), 3.0);
        assert_eq!(value(&page, "sqlbee_replica_lag_seconds_sum{instance=\"db2:3306\",channel=\"\"}"), 904.2);
        // 0.2 s and 4 s are at or below the 5 s bound; 15 min is past 10.
        let le = |bound: usize| latency_bound_seconds(LAG_BOUNDS[bound]);
        let bucket = |i| {
            value(
                &page,
                &format!("sqlbee_replica_lag_seconds_bucket{{instance=\"db2:3306\",channel=\"\",le=\"{}\"}}", le(i)),
            )
        };
        assert_eq!((bucket(1), bucket(5), bucket(11)), (1.0, 2.0, 2.0));
        assert_eq!(
            value(&page, "sqlbee_replica_apply_seconds_total{instance=\"db2:3306\",channel=\"\",class=\"xid\"}"),
            1.0
        );
        assert!(!page.contains("sqlbee_replica_transactions_total{instance=\"db1:3306\""), "a primary has none");
    }

    #[test]
    fn latency_bounds_are_scheme_edges_near_their_nominal_values() {
        for (i, (&bound, &nominal)) in LATENCY_BOUNDS.iter().zip(&NOMINAL_BOUNDS_NS).enumerate() {
            let edge = bucket_high(bound);
            // The edge closes its bucket: the next nanosecond is in the next one.
            assert_eq!((bucket_of(edge), bucket_of(edge + 1)), (bound, bound + 1));
            let off = (edge as f64 - nominal as f64).abs() / nominal as f64;
            assert!(off <= 0.0625, "{nominal} ns exported as {edge} ns ({:.1}% off)", off * 100.0);
            assert!(i == 0 || LATENCY_BOUNDS[i - 1] < bound);
        }
        assert_eq!(latency_bound_seconds(LATENCY_BOUNDS[0]), 0.000098303);
        assert_eq!(latency_bound_seconds(LATENCY_BOUNDS[12]), 1.006632959);
    }

    #[test]
    fn counters_add_windows_up_and_the_histogram_is_cumulative_and_exact() {
        let mut metrics = AgentMetrics::new(false);
        let cost = CostSample { cpu_source: "process", cpu_seconds_total: 1.25, ..Default::default() };
        let first = bucket_high(LATENCY_BOUNDS[0]);
        let nested = Lineage { nested: true, ..Lineage::default() };
        let replica = Lineage { source: sqlbee_kernel_abi::source::REPLICA, ..Lineage::default() };
        // At the first edge, one past it, far past the last; errors; and
        // rows of nested and replica statements, which are not counted.
        let window = [
            report(
                "db1:3306",
                4,
                vec![
                    row(1, &[first, first + 1, 20_000_000_000], 1, Lineage::default()),
                    row(2, &[1_000], 0, Lineage::default()),
                    row(3, &[5, 5, 5], 3, nested),
                    row(4, &[7], 0, replica),
                ],
            ),
            report("db2:3306", 0, vec![]),
        ];
        metrics.render(&cost, None, &window, &[], None);
        let page = metrics.render(&cost, None, &window, &[], None);
        let db1 = "{instance=\"db1:3306\"}";
        assert_eq!(value(&page, &format!("sqlbee_statements_total{db1}")), 8.0);
        assert_eq!(value(&page, &format!("sqlbee_statement_errors_total{db1}")), 2.0);
        assert_eq!(value(&page, "sqlbee_agent_windows_total"), 2.0);
        assert_eq!(value(&page, "sqlbee_agent_cpu_seconds_total{source=\"process\"}"), 1.25);
        let bucket = |le: &str| {
            value(&page, &format!("sqlbee_statement_latency_seconds_bucket{{instance=\"db1:3306\",le=\"{le}\"}}"))
        };
        assert_eq!(bucket("0.000098303"), 4.0, "1 us and the edge itself, twice");
        assert_eq!(bucket("0.000245759"), 6.0, "one past the edge");
        assert_eq!(bucket("9.663676415"), 6.0);
        assert_eq!(bucket("+Inf"), 8.0);
        assert_eq!(value(&page, &format!("sqlbee_statement_latency_seconds_count{db1}")), 8.0);
        let sum = 2.0 * (2 * first + 1 + 20_000_000_000 + 1_000) as f64 / 1e9;
        assert_eq!(value(&page, &format!("sqlbee_statement_latency_seconds_sum{db1}")), sum);
        assert_eq!(value(&page, "sqlbee_statement_latency_seconds_count{instance=\"db2:3306\"}"), 0.0);
        assert_eq!(page.matches("sqlbee_statement_latency_seconds_bucket{instance=\"db2:3306\"").count(), 17);
        assert!(!page.contains("sqlbee_wait_seconds_total{"), "no wait probes, no wait counter:\n{page}");
        assert!(!page.contains("sqlbee_ship_"), "no shipping, no ship counters:\n{page}");
        let digest =
            |id: u64| format!("{{instance=\"db1:3306\",schema=\"app\",digest=\"{id:016x}\",text=\"SELECT {id}\"}}");
        assert_eq!(value(&page, &format!("sqlbee_digest_statements_total{}", digest(1))), 6.0);
        assert_eq!(value(&page, &format!("sqlbee_digest_errors_total{}", digest(1))), 2.0);
        assert!(
            !page.contains(&format!("sqlbee_digest_statements_total{}", digest(3))),
            "nested rows are not client statements:\n{page}"
        );
    }

    #[test]
    fn a_digest_run_by_a_client_and_by_a_program_is_two_series() {
        let mut metrics = AgentMetrics::new(false);
        let program = Arc::new(crate::probe::Program { name: "app.p".into(), kind: "procedure" });
        let nested = Lineage { nested: true, program: Some(program), parent_digest: Some(9), ..Lineage::default() };
        let window =
            [report("db1:3306", 2, vec![row(1, &[1_000, 2_000], 0, Lineage::default()), row(1, &[5], 0, nested)])];
        let page = metrics.render(&CostSample::default(), None, &window, &[], None);
        let series: Vec<&str> = page.lines().filter(|l| l.starts_with("sqlbee_digest_statements{")).collect();
        let labels = "instance=\"db1:3306\",schema=\"app\",digest=\"0000000000000001\",text=\"SELECT 1\"";
        assert_eq!(
            series,
            [
                format!("sqlbee_digest_statements{{{labels},lineage=\"client\",parent_digest=\"\"}} 2.0"),
                format!(
                    "sqlbee_digest_statements{{{labels},lineage=\"client procedure app.p\",parent_digest=\"0000000000000009\"}} 1.0"
                ),
            ]
        );
    }

    #[test]
    fn digest_counters_stay_bounded_and_count_from_entering_the_top() {
        let mut metrics = AgentMetrics::new(true);
        let cost = CostSample::default();
        // Digest 7 leads every window; new digests fill the rest of each
        // top; digest 1 is in the top of the first window only, digest 2
        // only in the last, though both run in every window.
        let windows = TRACKED_DIGESTS / TOP_DIGESTS + 1;
        let mut page = String::new();
        for w in 0..windows as u64 {
            let last = w + 1 == windows as u64;
            let mut rows: Vec<_> = (0..TOP_DIGESTS as u64 - 1)
                .map(|i| row(1000 + w * 100 + i, &[1_000; 3], 0, Lineage::default()))
                .collect();
            rows.push(row(7, &[1_000; 9], 0, Lineage::default()));
            rows.push(row(1, &vec![1_000; if w == 0 { 4 } else { 1 }], 0, Lineage::default()));
            rows.push(row(2, &vec![1_000; if last { 5 } else { 1 }], 0, Lineage::default()));
            page = metrics.render(&cost, None, &[report("db1:3306", 0, rows)], &[], None);
        }
        let counter = |id: u64| {
            page.lines()
                .find(|l| {
                    l.starts_with("sqlbee_digest_statements_total{") && l.contains(&format!("digest=\"{id:016x}\""))
                })
                .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        };
        assert_eq!(page.lines().filter(|l| l.starts_with("sqlbee_digest_statements_total{")).count(), TRACKED_DIGESTS);
        assert_eq!(counter(7), Some(9.0 * windows as f64), "in the top from the start");
        assert_eq!(counter(2), Some(5.0), "counted from the window it entered the top");
        assert_eq!(counter(1), None, "longest out of the top, forgotten first");
        assert_eq!(
            page.lines().filter(|l| l.starts_with("sqlbee_wait_seconds_total{instance=\"db1:3306\"")).count(),
            wait_class::COUNT
        );
    }
}
