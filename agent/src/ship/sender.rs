//! Sends spooled batches, oldest first, and decides by gRPC status what a
//! failure means:
//! - INVALID_ARGUMENT: the collector validated this batch and refused it;
//!   it will refuse it every time. The batch is kept in `rejected/` for
//!   inspection, with the reason beside it. Nothing else is final;
//! - ALREADY_EXISTS: the collector holds other content under this batch's
//!   key (a cloned or restored state directory). The batch is sent again
//!   under a new epoch, never dropped;
//! - everything else (UNAVAILABLE, RESOURCE_EXHAUSTED, UNAUTHENTICATED,
//!   NOT_FOUND, UNIMPLEMENTED, INTERNAL, a proxy's 404, ...): retried with
//!   exponential backoff and jitter, and logged, so a misconfigured proxy
//!   or token loses nothing once it is fixed.
//!
//! The sender never dies of a disk error: a failed spool read or delete is
//! counted, logged and retried. If its task ends anyway (a panic), it is
//! started again and the restart is reported in the next agent window.
//!
//! A backlog replays at a bounded rate so a fleet coming back at once does
//! not flood the collector.
//!
//! With several collectors, a batch a collector did not take is sent to
//! the next one at once; the backoff starts only when every collector
//! failed in a row. The sender stays with a collector while it takes
//! batches. Collectors that share a store keep exactly-once there, so a
//! batch sent to two of them is still stored once.
use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use prost::Message;
use sqlbee_proto::v1::{Batch, ingest_client::IngestClient};
use sqlbee_vocabulary::clock::now_unix_ms;
use tokio::sync::{Notify, watch};
use tonic::{Code, codec::CompressionEncoding, service::interceptor::InterceptedService, transport::Channel};
use tracing::{error, info, warn};

use super::{
    ShipError,
    health::ShipHealth,
    identity::Identity,
    on_disk, relock,
    spool::{Entry, Spool},
};
use sqlbee_proto::client::{BearerToken, ClientOptions, endpoint};

pub enum Verdict {
    Retry,
    Reject,
    /// The key is taken by other content: send again under a new epoch.
    Rekey,
}

pub fn verdict(code: Code) -> Verdict {
    match code {
        Code::InvalidArgument => Verdict::Reject,
        Code::AlreadyExists => Verdict::Rekey,
        _ => Verdict::Retry,
    }
}

/// A skew this large is worth a warning: windows land at the wrong time.
const SKEW_WARNING_MS: i64 = 2_000;

/// Exponential backoff with full jitter, capped.
pub struct Backoff {
    attempt: u32,
    base: Duration,
    cap: Duration,
    seed: u64,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        Self { attempt: 0, base, cap, seed: seed | 1 }
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.base.saturating_mul(1u32 << self.attempt.min(16)).min(self.cap);
        self.attempt += 1;
        // xorshift: jitter does not need a cryptographic generator.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let fraction = (self.seed % 1000) as f64 / 1000.0;
        ceiling.mul_f64(0.5 + fraction / 2.0)
    }
}

#[derive(Clone)]
pub struct Sender {
    pub spool: Arc<Mutex<Spool>>,
    pub identity: Arc<Mutex<Identity>>,
    pub health: Arc<ShipHealth>,
    pub wake: Arc<Notify>,
    pub targets: Vec<ClientOptions>,
    pub replay_interval: Duration,
}

pub(super) type Client = IngestClient<InterceptedService<Channel, BearerToken>>;

/// A lazily connecting Ingest client for one collector, as every push
/// (batches and activity) uses it.
pub(super) fn ingest_client(target: &ClientOptions) -> Result<Client, sqlbee_proto::client::ClientError> {
    let token = BearerToken::new(target.token.as_deref())?;
    Ok(IngestClient::with_interceptor(endpoint(target)?.connect_lazy(), token)
        .send_compressed(CompressionEncoding::Gzip)
        .max_encoding_message_size(64 << 20))
}

/// Waits `delay`, or less if a stop is requested meanwhile.
async fn pause(delay: Duration, stop: &mut watch::Receiver<bool>, stop_requested: &mut bool) {
    if *stop_requested {
        return tokio::time::sleep(delay).await;
    }
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = stop.wait_for(|s| *s) => *stop_requested = true,
    }
}

impl Sender {
    /// Runs the sender until it returns, and starts it again whenever its
    /// task ends before a stop was asked for.
    pub async fn supervise(self, stop: watch::Receiver<bool>, grace: Duration) -> Result<(), ShipError> {
        loop {
            let outcome = tokio::spawn(self.clone().run(stop.clone(), grace)).await;
            let why = match outcome {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(err)) => err.to_string(),
                Err(join) if join.is_panic() => format!("it panicked: {join}"),
                Err(join) => join.to_string(),
            };
            self.health.restarted();
            error!(why, "the sender stopped; starting it again");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Sends until the spool is empty and a stop is asked for (then it
    /// gives up after `grace`, leaving the rest spooled for the next start).
    pub async fn run(self, mut stop: watch::Receiver<bool>, grace: Duration) -> Result<(), ShipError> {
        let mut clients: Vec<Client> = self.targets.iter().map(ingest_client).collect::<Result<_, _>>()?;
        if clients.is_empty() {
            return Err(ShipError::NoCollector);
        }
        let mut current = 0usize;
        // Collectors that failed since the last batch one of them took.
        let mut failed_in_row = 0usize;
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
        let mut disk_backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut stop_requested = *stop.borrow();
        let mut deadline: Option<tokio::time::Instant> = None;
        let mut last_skew_warned = 0i64;
        loop {
            if stop_requested && deadline.is_none() {
                deadline = Some(tokio::time::Instant::now() + grace);
            }
            if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                let left = on_disk(&self.spool, |s| Ok(s.len())).await.unwrap_or(0);
                if left > 0 {
                    warn!(
                        batches = left,
                        "collector not reached before shutdown; batches stay spooled for the next start"
                    );
                }
                return Ok(());
            }
            let (next, backlog) = match on_disk(&self.spool, |s| Ok((s.next_batch()?, s.len()))).await {
                Ok(next) => next,
                Err(err) => {
                    self.disk_error(&err, "reading the next batch", &mut disk_backoff, &mut stop, &mut stop_requested)
                        .await;
                    continue;
                }
            };
            self.health.backlog(backlog as u64);
            let Some((entry, batch)) = next else {
                if stop_requested {
                    return Ok(());
                }
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = stop.wait_for(|s| *s), if !stop_requested => stop_requested = true,
                }
                continue;
            };
            let mut request = tonic::Request::new(batch.clone());
            request.set_timeout(Duration::from_secs(10));
            let sent_ms = now_unix_ms();
            // A batch once sent stays spared by the spool's limits until
            // it is deleted or set aside: a failed push may have been
            // stored all the same.
            let pushed = clients[current].push(request).await;
            match pushed {
                Ok(response) => {
                    self.health.delivered();
                    let ack = response.into_inner();
                    if ack.duplicate {
                        info!(sequence = ack.sequence, "collector already had this batch");
                    }
                    if ack.collector_unix_ms != 0 {
                        let skew = (sent_ms + now_unix_ms()) / 2 - ack.collector_unix_ms;
                        self.health.clock_skew(skew);
                        if skew.abs() > SKEW_WARNING_MS && (skew - last_skew_warned).abs() > SKEW_WARNING_MS {
                            warn!(
                                skew_ms = skew,
                                corrected_ms = ack.clock_correction_ms,
                                "this host's clock is off from the collector's; fix NTP (the collector corrects windows from the future)"
                            );
                            last_skew_warned = skew;
                        }
                    }
                    let removed = entry.clone();
                    while let Err(err) = on_disk(&self.spool, {
                        let entry = removed.clone();
                        move |s| s.remove(&entry)
                    })
                    .await
                    {
                        // Until it is deleted it would be sent again: the
                        // collector would take it as a duplicate, so this
                        // only costs time.
                        self.disk_error(
                            &err,
                            "deleting an acknowledged batch",
                            &mut disk_backoff,
                            &mut stop,
                            &mut stop_requested,
                        )
                        .await;
                        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                            break;
                        }
                    }
                    backoff.reset();
                    disk_backoff.reset();
                    failed_in_row = 0;
                    if backlog > 1 && !self.replay_interval.is_zero() {
                        // Bounded replay rate for a backlog.
                        pause(self.replay_interval, &mut stop, &mut stop_requested).await;
                    }
                }
                Err(status) => match verdict(status.code()) {
                    Verdict::Retry => {
                        self.health.push_failed();
                        failed_in_row += 1;
                        let from = current;
                        current = (current + 1) % clients.len();
                        // The next collector at once; a pause only once
                        // every one of them failed in a row.
                        let delay = if failed_in_row.is_multiple_of(clients.len()) {
                            backoff.next_delay()
                        } else {
                            Duration::ZERO
                        };
                        warn!(sequence = entry.sequence, collector = %self.targets[from].url, code = ?status.code(),
                            message = status.message(), next = %self.targets[current].url,
                            retry_in_ms = delay.as_millis() as u64, backlog, "collector did not take the batch; it stays spooled");
                        pause(delay, &mut stop, &mut stop_requested).await;
                    }
                    Verdict::Reject => {
                        self.health.rejected();
                        error!(sequence = entry.sequence, code = ?status.code(), message = status.message(),
                            "collector refused the batch as invalid; kept in rejected/ for inspection");
                        let reason = format!("{:?}: {}", status.code(), status.message());
                        if let Err(err) = on_disk(&self.spool, move |s| s.reject(&entry, &reason)).await {
                            self.disk_error(
                                &err,
                                "setting a refused batch aside",
                                &mut disk_backoff,
                                &mut stop,
                                &mut stop_requested,
                            )
                            .await;
                        }
                    }
                    Verdict::Rekey => {
                        error!(
                            sequence = entry.sequence,
                            epoch = batch.epoch,
                            message = status.message(),
                            "the collector holds other content under this batch's number (a copied or restored state directory?); sending it again in a new epoch"
                        );
                        let identity = self.identity.clone();
                        if let Err(err) = on_disk(&self.spool, move |s| rekey(s, &identity, &entry, batch)).await {
                            self.disk_error(
                                &err,
                                "renumbering a batch",
                                &mut disk_backoff,
                                &mut stop,
                                &mut stop_requested,
                            )
                            .await;
                        }
                    }
                },
            }
        }
    }

    async fn disk_error(
        &self,
        err: &ShipError,
        doing: &str,
        backoff: &mut Backoff,
        stop: &mut watch::Receiver<bool>,
        stop_requested: &mut bool,
    ) {
        self.health.io_error();
        let delay = backoff.next_delay();
        error!(error = %err, doing, retry_in_ms = delay.as_millis() as u64, "spool disk error; retrying");
        pause(delay, stop, stop_requested).await;
    }
}

/// Spools `batch` again under the current epoch, starting a new one if it
/// still carries the current one, and drops the old copy.
fn rekey(spool: &mut Spool, identity: &Mutex<Identity>, entry: &Entry, mut batch: Batch) -> Result<(), ShipError> {
    let mut identity = relock(identity);
    if batch.epoch == identity.epoch {
        let epoch = identity.new_epoch()?;
        warn!(epoch, "started a new epoch");
    }
    let (sequence, unsaved) = identity.take_sequence();
    if let Some(err) = unsaved {
        return Err(err);
    }
    batch.epoch = identity.epoch;
    batch.sequence = sequence;
    drop(identity);
    spool.append(sequence, &batch.encode_to_vec())?;
    if !spool.holds(sequence) {
        // Lost for want of disk, and reported as a gap; the gaps it
        // carried are not lost with it.
        spool.requeue_gaps(batch.gaps);
    }
    spool.remove(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_rules_follow_status_codes() {
        for code in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::ResourceExhausted,
            Code::Unauthenticated,
            Code::PermissionDenied,
            Code::NotFound,
            Code::Unimplemented,
            Code::FailedPrecondition,
            Code::Internal,
            Code::Unknown,
        ] {
            assert!(matches!(verdict(code), Verdict::Retry), "{code:?}");
        }
        assert!(matches!(verdict(Code::InvalidArgument), Verdict::Reject));
        assert!(matches!(verdict(Code::AlreadyExists), Verdict::Rekey));
    }

    #[test]
    fn backoff_grows_jitters_and_caps() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let delays: Vec<Duration> = (0..12).map(|_| b.next_delay()).collect();
        assert!(delays[0] <= Duration::from_millis(100) && delays[0] >= Duration::from_millis(50));
        assert!(delays.iter().all(|d| *d <= Duration::from_secs(2)));
        assert!(delays[11] >= Duration::from_secs(1));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
