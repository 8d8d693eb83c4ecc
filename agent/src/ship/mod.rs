//! Ship stage: closed windows -> batches -> disk spool -> collector.
//!
//! Every batch is spooled (fsync'd) before it is sent and deleted only
//! after the collector acknowledged it; batch sequence numbers are per
//! agent, persisted, and never reused, so the collector can store each
//! batch exactly once. This stage never blocks the stages before it for
//! longer than a local fsync.
//!
//! The disk never blocks the runtime thread that delivers batches: the
//! batcher (sequence counter, spool append, fsync) runs on tokio's
//! blocking pool, and the sender does its spool reads and deletes there
//! too (`on_disk`), so a slow disk does not stall a push in flight.
pub mod disk_floor;
mod health;
mod identity;
mod live;
mod sender;
pub mod spool;
mod state_lock;
mod wire;

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

pub use disk_floor::DiskFloor;
use health::ShipHealth;
pub use health::ShipTotals;
use identity::Identity;
use prost::Message;
pub use sender::{Backoff, Verdict, verdict};
use spool::Spool;
use sqlbee_proto::v1::{AgentIdentity, Batch};
use state_lock::StateLock;
use tokio::sync::{Notify, mpsc, watch};
pub use wire::{activity_report, agent_window, instance_window};

use crate::{aggregate::WindowReport, budget::CostSample, host::HostMetrics, probe::UntracedServer};

/// Everything one window close hands this stage: each server's window and
/// the agent's own (its cost and its host).
pub struct ClosedWindows {
    pub reports: Vec<WindowReport>,
    pub start: SystemTime,
    pub end: SystemTime,
    pub cost: CostSample,
    pub host: Option<HostMetrics>,
    /// Servers found but not traced, as of `end`.
    pub untraced: Vec<UntracedServer>,
    /// Plans and login states (empty without `--server-login`).
    pub explained: crate::plans::Explained,
}

#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    #[error("no collector to ship to (--collector is empty)")]
    NoCollector,
    #[error("agent state file {path}: {source} (is --state-dir writable?)")]
    State {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("spool {path}: {source} (disk full or not writable?)")]
    Spool {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Client(#[from] sqlbee_proto::client::ClientError),
    #[error("the spool lock was poisoned by a panic")]
    Poisoned,
    #[error("starting the ship runtime failed: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    StateLock(#[from] state_lock::StateLockError),
    #[error("a spool task did not finish: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Locks the spool or the identity even after a panic while it was held:
/// the sender is restarted after a panic, and it must not find the spool
/// locked for good. Every change to either is a whole file written
/// atomically, so what a panic interrupted is at worst not done.
fn relock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `op` on the spool on tokio's blocking pool: file writes, fsyncs,
/// reads and deletes, and waiting for the lock while the batcher fsyncs,
/// must not stall the runtime thread that drives the pushes in flight.
async fn on_disk<T, F>(spool: &Arc<Mutex<Spool>>, op: F) -> Result<T, ShipError>
where
    T: Send + 'static,
    F: FnOnce(&mut Spool) -> Result<T, ShipError> + Send + 'static,
{
    let spool = spool.clone();
    tokio::task::spawn_blocking(move || op(&mut relock(&spool))).await?
}

#[derive(Clone, Debug)]
pub struct ShipConfig {
    /// The collectors, in the order they are tried (at least one).
    pub targets: Vec<sqlbee_proto::client::ClientOptions>,
    pub state_dir: PathBuf,
    /// Spool, `rejected/` and `corrupt/` together.
    pub spool_limit_bytes: u64,
    /// Free space the spool always leaves on its filesystem.
    pub disk_floor: DiskFloor,
    /// Largest encoded batch; larger window sets are split.
    pub max_batch_bytes: usize,
    /// Pause between replayed batches when there is a backlog.
    pub replay_interval: Duration,
    /// How long shutdown waits for the collector before leaving batches spooled.
    pub shutdown_grace: Duration,
    pub host: String,
}

/// Builds batches from window reports and spools them.
struct Batcher {
    /// Shared with the sender, which starts a new epoch on a conflict.
    /// Locked after the spool, never before.
    identity: Arc<Mutex<Identity>>,
    spool: Arc<Mutex<Spool>>,
    health: Arc<ShipHealth>,
    agent: AgentIdentity,
    max_batch_bytes: usize,
}

impl Batcher {
    fn spool_windows(&mut self, closed: &ClosedWindows) -> Result<(), ShipError> {
        let mut windows: Vec<_> = closed.reports.iter().map(|r| instance_window(r, closed.host.as_ref())).collect();
        wire::attach_plans(&mut windows, &closed.explained);
        // The agent's window rides in the first batch of the set.
        let health = self.health.take();
        let mut agent_windows =
            vec![agent_window(closed.start, closed.end, &closed.cost, closed.host.as_ref(), health, &closed.untraced)];
        // Split so no batch grows past the size limit (one window at least).
        let mut chunks: Vec<Vec<_>> = vec![Vec::new()];
        let mut size = agent_windows[0].encoded_len();
        for window in windows {
            let len = window.encoded_len();
            if size + len > self.max_batch_bytes && !chunks.last().unwrap().is_empty() {
                chunks.push(Vec::new());
                size = 0;
            }
            size += len;
            chunks.last_mut().unwrap().push(window);
        }
        for windows in chunks {
            let mut spool = relock(&self.spool);
            let gaps = spool.pending_gaps();
            if windows.is_empty() && gaps.is_empty() && agent_windows.is_empty() {
                continue;
            }
            let carried: Vec<(u64, u64)> = gaps.iter().map(|g| (g.first_sequence, g.last_sequence)).collect();
            let mut identity = relock(&self.identity);
            let (sequence, unsaved) = identity.take_sequence();
            if let Some(err) = unsaved {
                self.health.io_error();
                tracing::error!(error = %err, sequence, "could not persist the batch counter; going on");
            }
            let carries_health = !agent_windows.is_empty();
            let mut batch = Batch {
                agent: Some(self.agent.clone()),
                sequence,
                created_unix_ms: sqlbee_vocabulary::clock::now_unix_ms(),
                epoch: identity.epoch,
                windows,
                gaps,
                agent_windows: std::mem::take(&mut agent_windows),
                content_hash: 0,
            };
            // Taken once here, where the batch is made, so the collector
            // need not encode it again to hash it; every copy sent later
            // (a replay, a renumbered batch) carries it unchanged.
            batch.content_hash = sqlbee_proto::content_hash(&batch);
            drop(identity);
            // Appending may drop older batches and so add new gaps: only
            // the gaps this batch carries leave the pending list. A batch
            // that could not be written is a gap itself, and the gaps it
            // carried are pending again.
            spool.append(sequence, &batch.encode_to_vec())?;
            if spool.holds(sequence) {
                self.health.spooled();
                spool.forget_pending_gaps(&carried)?;
            } else if carries_health {
                self.health.give_back(health);
            }
        }
        Ok(())
    }
}

/// Handle of the running ship stage.
pub struct ShipStage {
    tx: Option<mpsc::Sender<ClosedWindows>>,
    /// The newest activity snapshot, which the live task sends.
    activity: watch::Sender<Option<sqlbee_proto::v1::ActivityReport>>,
    thread: Option<std::thread::JoinHandle<Result<(), ShipError>>>,
    health: Arc<ShipHealth>,
    /// Held until the stage is dropped: one agent per state directory.
    _lock: StateLock,
}

impl ShipStage {
    pub fn start(config: ShipConfig) -> Result<Self, ShipError> {
        // Before anything in the directory is read or written.
        identity::private_dir(&config.state_dir)?;
        let lock = StateLock::acquire(&config.state_dir)?;
        let health = Arc::new(ShipHealth::default());
        let mut spool = Spool::open(&config.state_dir, config.spool_limit_bytes)?
            .with_floor(config.disk_floor)
            .with_health(health.clone());
        let identity = Identity::load(&config.state_dir, spool.highest_sequence() + 1)?;
        let backlog = spool.len();
        tracing::info!(agent_id = %identity.agent_id, collectors = %config.targets.iter().map(|t| t.url.as_str()).collect::<Vec<_>>().join(","), backlog, "shipping to collector");
        spool.corrupt_records = 0;
        let spool = Arc::new(Mutex::new(spool));
        let identity = Arc::new(Mutex::new(identity));
        health.backlog(backlog as u64);
        let mut batcher = Batcher {
            agent: AgentIdentity {
                host: config.host.clone(),
                agent_id: identity.lock().map_err(|_| ShipError::Poisoned)?.agent_id.clone(),
                version: env!("CARGO_PKG_VERSION").to_string(),
            },
            identity: identity.clone(),
            spool: spool.clone(),
            health: health.clone(),
            max_batch_bytes: config.max_batch_bytes,
        };
        let (tx, mut rx) = mpsc::channel::<ClosedWindows>(64);
        let (activity, snapshots) = watch::channel(None);
        let live_agent = batcher.agent.clone();
        let sender_health = health.clone();
        let thread = std::thread::Builder::new()
            .name("ship".into())
            .spawn(move || {
                let runtime =
                    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(ShipError::Runtime)?;
                runtime.block_on(async move {
                    let wake = Arc::new(Notify::new());
                    let (stopping, stop) = watch::channel(false);
                    let sender = sender::Sender {
                        spool,
                        identity,
                        health: sender_health,
                        wake: wake.clone(),
                        targets: config.targets.clone(),
                        replay_interval: config.replay_interval,
                    };
                    let sending = tokio::spawn(sender.supervise(stop, config.shutdown_grace));
                    let live = tokio::spawn(live::push_activity(config.targets.clone(), live_agent, snapshots));
                    // Spooling blocks on the disk (two fsyncs per batch), so
                    // the batcher waits for windows on the blocking pool.
                    let batching = tokio::task::spawn_blocking(move || {
                        while let Some(closed) = rx.blocking_recv() {
                            if let Err(err) = batcher.spool_windows(&closed) {
                                tracing::error!(error = %err, "could not spool a batch; its windows are lost");
                            }
                            wake.notify_one();
                        }
                    });
                    if let Err(err) = batching.await {
                        tracing::error!(error = %err, "the batcher stopped; windows after this are not shipped");
                    }
                    let _ = stopping.send(true);
                    live.abort();
                    sending.await.unwrap_or(Ok(()))
                })
            })
            .map_err(ShipError::Runtime)?;
        Ok(Self { tx: Some(tx), activity, thread: Some(thread), health, _lock: lock })
    }

    /// What the ship path did since start, for the Prometheus page.
    pub fn totals(&self) -> ShipTotals {
        self.health.totals()
    }

    /// Hands closed windows over; waits only if 64 window sets are queued.
    pub fn send(&self, closed: ClosedWindows) {
        if let Some(tx) = &self.tx
            && tx.blocking_send(closed).is_err()
        {
            tracing::error!("ship stage stopped; windows not shipped");
        }
    }

    /// Replaces the activity snapshot waiting to be sent; never waits.
    pub fn send_activity(&self, report: sqlbee_proto::v1::ActivityReport) {
        self.activity.send_replace(Some(report));
    }

    /// Spools what is queued, tries to deliver within the grace period, stops.
    pub fn finish(mut self) -> Result<(), ShipError> {
        drop(self.tx.take());
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(ShipError::Poisoned),
            None => Ok(()),
        }
    }
}
