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

use tracing::{info, warn};

use crate::{
    aggregate::Aggregator,
    config::{AgentConfig, OutputFormat},
    discover::{self, DiscoverError, ServerProcess},
    normalize::Normalizer,
    output,
    probe::{ProbeBatch, ProbeConfig, ProbeError, Supervisor},
    ship::ShipStage,
};

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Discover(#[from] DiscoverError),
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error("writing output failed: {0}")]
    Output(#[from] std::io::Error),
    #[error("the {0} thread panicked")]
    Panicked(&'static str),
    #[error(transparent)]
    Ship(#[from] crate::ship::ShipError),
}

enum Message {
    Batch(ProbeBatch),
    WindowEnd(SystemTime),
}

/// Batches in flight between the probe and aggregate threads.
const CHANNEL_BATCHES: usize = 256;

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// Runs the agent until `stop` is set (or `config.duration` passes).
pub fn run_agent(config: AgentConfig, stop: Arc<AtomicBool>) -> Result<(), PipelineError> {
    let host = hostname();
    let mut supervisor = Supervisor::new(ProbeConfig {
        text_limit: config.text_limit,
        ring_bytes: config.ring_bytes,
        waits: config.wait_probes,
        commands: config.command_probe,
        long_wait_us: config.long_wait_us,
    });

    // Explicit pids must work at start: a wrong pid or binary is an error.
    let mut watched_instances = Vec::new();
    for &pid in &config.pids {
        let server = discover::server_by_pid(pid, &host)?;
        watched_instances.push(server.instance.clone());
        supervisor.attach(server)?;
    }
    let scan = move |host: &str| -> Vec<ServerProcess> {
        let all = discover::find_servers(host);
        if watched_instances.is_empty() {
            all
        } else {
            all.into_iter().filter(|s| watched_instances.contains(&s.instance)).collect()
        }
    };
    let mut initial = Vec::new();
    supervisor.reconcile(&scan(&host), &mut initial);
    if supervisor.attached().next().is_none() {
        warn!("no mariadbd/mysqld found yet; waiting for one to start");
    }
    if let Some(path) = &config.ready_file {
        let pids: Vec<String> = supervisor.attached().map(|s| s.pid.to_string()).collect();
        std::fs::write(path, pids.join("\n"))?;
    }

    let ship = config.ship.clone().map(ShipStage::start).transpose()?;
    let (tx, rx) = sync_channel(CHANNEL_BATCHES);
    let aggregate_config = config.clone();
    let aggregator = thread::Builder::new()
        .name("aggregate".into())
        .spawn(move || aggregate_loop(aggregate_config, rx, ship))?;
    for batch in initial {
        let _ = tx.send(Message::Batch(batch));
    }
    probe_loop(&config, &mut supervisor, &scan, &host, &tx, &stop);
    drop(tx);
    aggregator.join().map_err(|_| PipelineError::Panicked("aggregate"))??;
    info!("stopped");
    Ok(())
}

fn probe_loop(
    config: &AgentConfig,
    supervisor: &mut Supervisor,
    scan: &dyn Fn(&str) -> Vec<ServerProcess>,
    host: &str,
    tx: &SyncSender<Message>,
    stop: &AtomicBool,
) {
    let started = Instant::now();
    let mut next_window = started + config.window;
    let mut next_scan = started + config.rescan_interval;
    let mut batches = Vec::new();
    loop {
        let stopping = stop.load(Ordering::Relaxed) || config.duration.is_some_and(|d| started.elapsed() >= d);
        let now = Instant::now();
        if stopping {
            supervisor.detach_all(&mut batches);
        } else {
            if now >= next_scan {
                supervisor.reconcile(&scan(host), &mut batches);
                next_scan = now + config.rescan_interval;
            }
            supervisor.drain(now >= next_window, &mut batches);
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
        if stopping || now >= next_window {
            if tx.send(Message::WindowEnd(SystemTime::now())).is_err() || stopping {
                return;
            }
            next_window += config.window;
            if next_window < now {
                next_window = now + config.window;
            }
        }
        thread::sleep(config.drain_interval);
    }
}

fn aggregate_loop(config: AgentConfig, rx: Receiver<Message>, ship: Option<ShipStage>) -> Result<(), PipelineError> {
    let mut aggregator = Aggregator::new(Normalizer::new(config.normalize_cache), config.max_digests, SystemTime::now());
    let stdout = std::io::stdout();
    while let Ok(message) = rx.recv() {
        match message {
            Message::Batch(batch) => aggregator.ingest(batch),
            Message::WindowEnd(at) => {
                let reports = aggregator.flush(at);
                let mut out = stdout.lock();
                for report in &reports {
                    match config.output {
                        Some(OutputFormat::Jsonl) => output::write_jsonl(&mut out, report)?,
                        Some(OutputFormat::Table) => output::write_table(&mut out, report, config.table_rows)?,
                        None => {}
                    }
                }
                out.flush()?;
                if let Some(ship) = &ship
                    && !reports.is_empty()
                {
                    ship.send(reports);
                }
            }
        }
    }
    if let Some(ship) = ship {
        ship.finish()?;
    }
    Ok(())
}
