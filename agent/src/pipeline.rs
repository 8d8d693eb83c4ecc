//! The only place that creates channels and wires the stages:
//!
//! probe thread --(bounded channel; a full one pauses draining)--> aggregate
//! thread --> output (stdout) and/or ship thread (spool, then collector).
//!
//! The probe thread owns the attached servers: it rescans /proc, drains
//! ring buffers on a short timer and, at each window end, reads the exact
//! kernel counters and tells the aggregate thread to close the window.
use std::{
    io::Write,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc::{Receiver, SyncSender, sync_channel},
    },
    thread,
    time::{Instant, SystemTime},
};

use tracing::{debug, info, warn};

use crate::{
    activity::{self, BlockersSeen},
    aggregate::Aggregator,
    budget::{Applied, BudgetError, CostMeter, CostSample, SelfLimit, Shedder},
    config::{AgentConfig, OutputFormat},
    discover::{self, DiscoverError, ServerProcess},
    host::{HostMetrics, HostSampler},
    metrics::{MetricsError, MetricsServer, agent_metrics},
    normalize::{Describer, Normalizer},
    output,
    plans::{Explained, Explainer, ValueWants},
    privileges::{self, PrivilegeError},
    probe::{ProbeBatch, ProbeConfig, ProbeError, Supervisor, UntracedServer},
    ship::{ClosedWindows, ShipStage},
};

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Discover(#[from] DiscoverError),
    #[error(transparent)]
    Privileges(#[from] PrivilegeError),
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error("writing output failed: {0}")]
    Output(#[from] std::io::Error),
    #[error("the {0} thread panicked")]
    Panicked(&'static str),
    #[error(transparent)]
    Ship(#[from] crate::ship::ShipError),
    #[error(transparent)]
    Budget(#[from] BudgetError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error(
        "--statement-hook send finds each thread's THD through the task's thread pointer, whose place the kernel's BTF gives: {0}"
    )]
    SendHook(#[source] discover::BtfError),
}

enum Message {
    Batch(ProbeBatch),
    WindowEnd(WindowEnd),
}

/// What the probe thread measured when it closed a window.
struct WindowEnd {
    at: SystemTime,
    cost: CostSample,
    host: Option<HostMetrics>,
    /// Servers found but not traced, as of the window's end.
    untraced: Vec<UntracedServer>,
}

/// The latest rendered Prometheus page; scrapes read it, never compute.
type MetricsPage = Arc<std::sync::Mutex<String>>;

/// Batches in flight between the probe and aggregate threads.
const CHANNEL_BATCHES: usize = 256;

/// Runs the agent until `stop` is set (or `config.options.duration` passes).
/// `signalled`: set by the SIGINT/SIGTERM handler.
pub fn run_agent(config: AgentConfig, signalled: &'static AtomicBool) -> Result<(), PipelineError> {
    privileges::check_can_trace()?;
    let host = crate::procfs::hostname();
    if config.options.samples == crate::normalize::Samples::Raw {
        warn!(
            "--samples raw: statement samples and error messages keep their literal values (passwords and keys \
            excepted) and leave this host as they are; the default, redacted, replaces them with ?"
        );
    }
    // First, before any thread exists: the cgroup then holds all of them.
    // Dropped when this function returns, which leaves and removes it.
    let budget = config.budget.map(SelfLimit::apply).transpose()?;
    // Still before the first thread: each thread holds its own
    // capabilities, and threads inherit them from the one that starts them.
    // The send hook's tracepoints are perf events, as classic uprobes are
    // (without tracefs it takes the raw tracepoint, which is not one).
    let perf_events = config.options.statement_hook == crate::probe::StatementHook::Send
        && crate::probe::syscall_tracepoints_available();
    let prepared = privileges::prepare(config.options.keep_privileges, perf_events)?;
    let stop = Arc::new(AtomicBool::new(false));
    let watcher_stop = stop.clone();
    thread::Builder::new().name("signals".into()).spawn(move || {
        while !signalled.load(Ordering::Relaxed) {
            thread::sleep(std::time::Duration::from_millis(50));
        }
        watcher_stop.store(true, Ordering::Relaxed);
    })?;
    // Before any probe is attached: a state directory another agent holds
    // stops this one before it touches the server.
    let ship = config.ship.clone().map(ShipStage::start).transpose()?.map(Arc::new);
    let metrics_page = MetricsPage::default();
    let metrics = config
        .options
        .metrics_listen
        .as_deref()
        .map(|addr| serve_metrics(addr, metrics_page.clone(), stop.clone()))
        .transpose()?;
    // CPU time per statement reads one field of the current task, at the
    // offset this kernel's BTF gives.
    let task_runtime_offset = match discover::task_runtime_offset(std::path::Path::new("/sys/kernel/btf/vmlinux")) {
        Ok(offset) => offset,
        Err(e) => {
            warn!(error = %e, "no CPU time per statement (cpu_ns is left out)");
            0
        }
    };
    // The send hook finds the server's THD below each thread's pointer.
    let task_fsbase_offset = if config.options.statement_hook.at_send() {
        discover::task_fsbase_offset(std::path::Path::new("/sys/kernel/btf/vmlinux"))
            .map_err(PipelineError::SendHook)?
    } else {
        0
    };
    let mut supervisor = Supervisor::new(
        ProbeConfig {
            text_limit: config.options.text_limit,
            ring_bytes: config.options.ring_bytes,
            waits: config.wait_probes,
            commands: config.command_probe,
            long_wait_us: config.long_wait_us,
            long_statement_ms: config.options.long_statement.as_millis().min(u32::MAX as u128) as u32,
            digest_slots: config.kernel_digests,
            overhead_budget: config.options.mysqld_overhead_budget,
            duty_period: config.options.duty_period,
            task_runtime_offset,
            task_btf: discover::has_current_task_btf(),
            clients: !config.options.no_clients,
            replica: !config.options.no_replica_probes,
            client_login: config.plans.as_ref().map(|p| p.login.clone()),
            values: config.plans.is_some(),
            figures: config.figures,
            statement_hook: config.options.statement_hook,
            task_fsbase_offset,
        },
        prepared.stats,
    );

    // Explicit pids must work at start: a wrong pid or binary is an error.
    let mut watched_instances = Vec::new();
    for &pid in &config.options.pids {
        let server = discover::server_by_pid(pid, &host)?;
        watched_instances.push(server.instance.clone());
        supervisor.attach(server)?;
    }
    let scan_host = host.clone();
    let scan = move || -> Vec<ServerProcess> {
        let all = discover::find_servers(&scan_host);
        if watched_instances.is_empty() {
            all
        } else {
            all.into_iter().filter(|s| watched_instances.contains(&s.instance)).collect()
        }
    };
    let mut initial = Vec::new();
    supervisor.reconcile(&scan(), &mut initial);
    if supervisor.attached().next().is_none() {
        warn!("no mariadbd/mysqld found yet; waiting for one to start");
    }
    if let Some(path) = &config.options.ready_file {
        let pids: Vec<String> = supervisor.attached().map(|s| s.pid.to_string()).collect();
        std::fs::write(path, pids.join("\n"))?;
    }

    let (tx, rx) = sync_channel(CHANNEL_BATCHES);
    let aggregate_config = config.clone();
    let page = metrics.is_some().then(|| metrics_page.clone());
    let aggregate_ship = ship.clone();
    // Who the activity reads saw blocking a statement, for the long ones.
    let blockers_seen = Arc::new(BlockersSeen::default());
    let aggregate_seen = blockers_seen.clone();
    // The explainer asks for prepared statements' values; the probe stage
    // attaches the value probes.
    let value_wants = Arc::new(ValueWants::default());
    let explainer_wants = value_wants.clone();
    let aggregator = thread::Builder::new()
        .name("aggregate".into())
        .spawn(move || aggregate_loop(aggregate_config, rx, aggregate_ship, page, &aggregate_seen, explainer_wants))?;
    for batch in initial {
        let _ = tx.send(Message::Batch(batch));
    }
    let activity = match (&config.activity, &ship) {
        (Some(activity), Some(ship)) => {
            let ship = ship.clone();
            let deliver: crate::activity::Deliver =
                Box::new(move |at, snapshots| ship.send_activity(crate::ship::activity_report(at, &snapshots)));
            Some(crate::activity::Watcher::start(activity.clone(), deliver, blockers_seen.clone())?)
        }
        _ => None,
    };
    // From here the aggregate thread and the activity thread hold it.
    drop(ship);
    let beside = Beside {
        budget: budget.as_ref(),
        activity: activity.as_ref(),
        value_wants: config.plans.is_some().then_some(value_wants.as_ref()),
    };
    probe_loop(&config, &mut supervisor, &scan, &tx, &stop, &beside);
    drop(activity);
    drop(tx);
    aggregator.join().map_err(|_| PipelineError::Panicked("aggregate"))??;
    stop.store(true, Ordering::Relaxed);
    if let Some(metrics) = metrics {
        let _ = metrics.join();
    }
    drop(budget);
    info!("stopped");
    Ok(())
}

/// What the probe loop serves besides the aggregate thread.
struct Beside<'a> {
    budget: Option<&'a Applied>,
    activity: Option<&'a crate::activity::Watcher>,
    /// With plans on: which servers' prepared statements' values are wanted.
    value_wants: Option<&'a ValueWants>,
}

fn probe_loop(
    config: &AgentConfig,
    supervisor: &mut Supervisor,
    scan: &dyn Fn() -> Vec<ServerProcess>,
    tx: &SyncSender<Message>,
    stop: &AtomicBool,
    beside: &Beside<'_>,
) {
    let Beside { budget, activity, value_wants } = *beside;
    let mut cost = CostMeter::new();
    let mut shedder = Shedder::with_floor(config.options.shedding_floor);
    let mut host_sampler = HostSampler::new("/proc", "/sys");
    // `pids`: the servers watched in the window, including any detached
    // just before it closed (at exit).
    let mut close_window = |supervisor: &mut Supervisor, pids: &[u32]| {
        let host = host_sampler.sample(pids).map_err(|e| warn!(error = %e, "host metrics unavailable")).ok();
        let mut cost = cost.sample(budget);
        let share = cost.cpu_limit_cores.filter(|l| *l > 0.0).map(|limit| cost.cpu_cores / limit);
        let before = shedder.step();
        cost.shedding = shedder.update(share, supervisor.take_dropped());
        if cost.shedding != before {
            warn!(from = ?before, to = ?cost.shedding, cpu_share = share, "shedding step changed");
        }
        supervisor.set_shedding(cost.shedding as u32);
        WindowEnd { at: SystemTime::now(), cost, host, untraced: supervisor.untraced() }
    };
    let watched = |supervisor: &Supervisor| -> Vec<u32> { supervisor.attached().map(|s| s.pid).collect() };
    // Baselines, so the first window already has rates.
    let _ = close_window(supervisor, &watched(supervisor));
    let started = Instant::now();
    let mut next_window = started + config.options.window;
    let mut next_scan = started + config.rescan_interval;
    let mut batches = Vec::new();
    loop {
        let stopping = stop.load(Ordering::Relaxed) || config.options.duration.is_some_and(|d| started.elapsed() >= d);
        let now = Instant::now();
        let closing = stopping || now >= next_window;
        let pids = if closing { watched(supervisor) } else { Vec::new() };
        if stopping {
            supervisor.detach_all(&mut batches);
        } else {
            if now >= next_scan {
                supervisor.reconcile(&scan(), &mut batches);
                if let Some(activity) = activity {
                    activity.set_targets(activity_targets(supervisor));
                }
                next_scan = now + config.rescan_interval;
            }
            supervisor.drain(now >= next_window, &mut batches);
            if let Some(wants) = value_wants {
                wants.set_unavailable(supervisor.capture_values(&wants.wanted()));
            }
        }
        for batch in batches.drain(..) {
            // When aggregation falls behind, wait here rather than drop:
            // the records stay in the kernel ring buffer meanwhile, which
            // absorbs the burst, and if it overflows the kernel counts
            // exactly what was lost. The server is never made to wait.
            if tx.send(Message::Batch(batch)).is_err() {
                return;
            }
        }
        if closing {
            if tx.send(Message::WindowEnd(close_window(supervisor, &pids))).is_err() || stopping {
                return;
            }
            next_window += config.options.window;
            if next_window < now {
                next_window = now + config.options.window;
            }
        }
        supervisor.wait_naming_clients(config.options.drain_interval);
    }
}

fn aggregate_loop(
    config: AgentConfig,
    rx: Receiver<Message>,
    ship: Option<Arc<ShipStage>>,
    metrics_page: Option<MetricsPage>,
    blockers_seen: &BlockersSeen,
    value_wants: Arc<ValueWants>,
) -> Result<(), PipelineError> {
    let mut metrics = metrics_page.map(|page| (page, agent_metrics::AgentMetrics::new(config.wait_probes)));
    let mut aggregator =
        Aggregator::new(Normalizer::new(config.normalize_cache), config.options.max_digests, SystemTime::now())
            .with_samples(config.options.samples)
            .with_raw_samples(config.plans.is_some())
            .with_long_statements(config.options.long_statement)
            .with_query_tags(config.tag_reader());
    let explainer = config.plans.clone().map(|plans| Explainer::start(plans, value_wants)).transpose()?;
    let mut describer = Describer::default();
    let mut namer =
        Namer { held: Vec::new(), reports_deadlocks: config.activity.as_ref().is_some_and(|a| a.login.is_some()) };
    let stdout = std::io::stdout();
    let mut window_start = SystemTime::now();
    while let Ok(message) = rx.recv() {
        match message {
            Message::Batch(batch) => aggregator.ingest(batch),
            Message::WindowEnd(WindowEnd { at, mut cost, host, untraced }) => {
                let mut reports = aggregator.flush(at);
                describe_tables(&mut describer, &mut reports);
                namer.name(blockers_seen, &mut reports);
                let sum = |f: fn(&crate::aggregate::Summary) -> u64| reports.iter().map(|r| f(&r.summary)).sum();
                cost.attribute(sum(|s| s.statements), sum(|s| s.events), sum(|s| s.dropped_events));
                let mut explained = match &explainer {
                    None => Explained::default(),
                    Some(explainer) => {
                        explainer.offer(&reports);
                        let mut explained = explainer.take();
                        let instances: Vec<&str> = reports.iter().map(|r| r.instance.as_str()).collect();
                        explainer.put_back(explained.keep_for(&instances));
                        cost.explains = explained.explains;
                        cost.explain_ns = explained.explain_ns;
                        explained
                    }
                };
                // Settings read over the login: a `SET GLOBAL` of an
                // earlier window again, now with its values, or values
                // that changed with no statement seen.
                for (instance, change) in std::mem::take(&mut explained.changes) {
                    match reports.iter_mut().find(|r| r.instance == instance) {
                        Some(report) => report.changes.push(change),
                        None => debug!(%instance, "a settings change for an instance without a window; dropped"),
                    }
                }
                if let Some((page, metrics)) = &mut metrics {
                    let text = metrics.render(
                        &cost,
                        host.as_ref(),
                        &reports,
                        &untraced,
                        ship.as_deref().map(ShipStage::totals),
                    );
                    *page.lock().unwrap_or_else(|e| e.into_inner()) = text;
                }
                let mut out = stdout.lock();
                if config.output == Some(OutputFormat::Jsonl) {
                    output::write_agent_jsonl(&mut out, &cost, host.as_ref())?;
                    output::write_untraced_jsonl(&mut out, &untraced, at)?;
                    output::write_plans_jsonl(&mut out, &explained, at)?;
                } else if config.output == Some(OutputFormat::Table) {
                    output::write_untraced_table(&mut out, &untraced)?;
                }
                for report in &reports {
                    match config.output {
                        Some(OutputFormat::Jsonl) => output::write_jsonl(&mut out, report)?,
                        Some(OutputFormat::Table) => output::write_table(&mut out, report, config.options.table_rows)?,
                        None => {}
                    }
                }
                out.flush()?;
                if let Some(ship) = &ship {
                    ship.send(ClosedWindows { reports, start: window_start, end: at, cost, host, untraced, explained });
                }
                window_start = at;
            }
        }
    }
    if let Some(ship) = ship {
        // The activity thread, stopped before this, held the only other
        // reference.
        match Arc::try_unwrap(ship) {
            Ok(ship) => ship.finish()?,
            Err(_) => warn!("the ship stage is still shared at shutdown; queued windows stay spooled"),
        }
    }
    Ok(())
}

/// Sets the tables of the digests whose description goes out this window.
fn describe_tables(describer: &mut Describer, reports: &mut [crate::aggregate::WindowReport]) {
    describer.begin_window();
    let now = Instant::now();
    for row in reports.iter_mut().flat_map(|r| r.digests.iter_mut()) {
        if row.digest != crate::aggregate::OVERFLOW_DIGEST {
            row.tables = describer.describe(&row.schema, row.digest, &row.digest_text, now);
        }
    }
}

/// Names what the activity reads saw of each long statement: the blocker
/// it waited on while it ran, and a deadlock victim's other side. The
/// deadlock report is read up to a second after the victim ends, so with
/// a login a victim not named yet waits one window (`held`) for it.
struct Namer {
    held: Vec<(String, crate::aggregate::LongStatement)>,
    /// Whether deadlock reports are read at all (a login).
    reports_deadlocks: bool,
}

impl Namer {
    fn name(&mut self, seen: &BlockersSeen, reports: &mut [crate::aggregate::WindowReport]) {
        let held = std::mem::take(&mut self.held);
        for (instance, mut event) in held {
            let end_ns = event.start_ns + event.duration_ns;
            event.deadlock_with = seen.deadlock_partner(&instance, event.connection_id, end_ns);
            match reports.iter_mut().find(|r| r.instance == instance) {
                Some(report) => report.long_statements.push(event),
                // Its server is gone since (every traced server has a
                // window each time): nothing is left to attach it to.
                None => warn!(instance, "a deadlock victim's server has no window now; its event is dropped"),
            }
        }
        for report in reports.iter_mut() {
            let mut keep = Vec::with_capacity(report.long_statements.len());
            for mut event in std::mem::take(&mut report.long_statements) {
                let end_ns = event.start_ns + event.duration_ns;
                event.blocked_by = seen.blocker_of(&report.instance, event.connection_id, event.start_ns, end_ns);
                if event.outcome == crate::aggregate::Outcome::Deadlock && event.deadlock_with.is_none() {
                    event.deadlock_with = seen.deadlock_partner(&report.instance, event.connection_id, end_ns);
                    if event.deadlock_with.is_none() && self.reports_deadlocks {
                        self.held.push((report.instance.clone(), event));
                        continue;
                    }
                }
                keep.push(event);
            }
            report.long_statements = keep;
        }
    }
}

/// Binds now (a taken port is an error at start) and serves from a thread
/// with its own small runtime until `stop` is set.
fn serve_metrics(
    addr: &str,
    page: MetricsPage,
    stop: Arc<AtomicBool>,
) -> Result<thread::JoinHandle<()>, PipelineError> {
    let server = MetricsServer::bind(addr)?;
    info!(addr = %server.local_addr(), "serving Prometheus metrics");
    let handle = thread::Builder::new().name("metrics".into()).spawn(move || {
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(runtime) => runtime,
            Err(e) => return warn!(error = %e, "metrics endpoint could not start"),
        };
        let render: crate::metrics::Render = Arc::new(move || page.lock().unwrap_or_else(|e| e.into_inner()).clone());
        let shutdown = async move {
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        };
        if let Err(e) = runtime.block_on(server.serve(render, shutdown)) {
            warn!(error = %e, "metrics endpoint stopped");
        }
    })?;
    Ok(handle)
}

/// The traced servers, as the activity reader needs them.
fn activity_targets(supervisor: &Supervisor) -> Vec<activity::Target> {
    supervisor
        .traced()
        .map(|(server, binary)| activity::Target {
            server: server.clone(),
            build_id: binary.build_id.clone(),
            version: binary.version.clone(),
            layout: binary.layout,
            activity: binary.activity.clone(),
        })
        .collect()
}
