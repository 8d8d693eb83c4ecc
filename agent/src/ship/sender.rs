//! Sends spooled batches, oldest first, and decides by gRPC status what a
//! failure means:
//! - UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED (and transport
//!   errors, ABORTED, INTERNAL, UNKNOWN): the collector may take it later;
//!   retry with exponential backoff and jitter;
//! - INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED and anything
//!   else: retrying cannot help; log a clear error and keep the batch aside
//!   in `rejected/` for inspection.
//!
//! A backlog replays at a bounded rate so a fleet coming back at once does
//! not flood the collector.
use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use sqlbee_proto::v1::ingest_client::IngestClient;
use tokio::sync::Notify;
use tonic::{Code, codec::CompressionEncoding, service::interceptor::InterceptedService, transport::Channel};
use tracing::{error, info, warn};

use super::{ShipError, on_disk, spool::Spool};
use crate::client::{BearerToken, ClientOptions, endpoint};

pub enum Verdict {
    Retry,
    Reject,
}

pub fn verdict(code: Code) -> Verdict {
    match code {
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::ResourceExhausted
        | Code::Aborted
        | Code::Internal
        | Code::Unknown
        | Code::Cancelled => Verdict::Retry,
        _ => Verdict::Reject,
    }
}

/// Exponential backoff with full jitter, capped.
pub struct Backoff {
    attempt: u32,
    base: Duration,
    cap: Duration,
    seed: u64,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Self {
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
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

pub struct Sender {
    pub spool: Arc<Mutex<Spool>>,
    pub wake: Arc<Notify>,
    pub target: ClientOptions,
    pub replay_interval: Duration,
}

type Client = IngestClient<InterceptedService<Channel, BearerToken>>;

impl Sender {
    /// Sends until the spool is empty and `stopping` is set (then it gives
    /// up after `grace`, leaving the rest spooled for the next start).
    pub async fn run(self, stopping: Arc<Notify>, grace: Duration) -> Result<(), ShipError> {
        let token = BearerToken::new(self.target.token.as_deref())?;
        let mut client: Client = IngestClient::with_interceptor(endpoint(&self.target)?.connect_lazy(), token)
            .send_compressed(CompressionEncoding::Gzip)
            .max_encoding_message_size(64 << 20);
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
        let mut stop_requested = false;
        let stop = stopping.notified();
        tokio::pin!(stop);
        let mut deadline: Option<tokio::time::Instant> = None;
        loop {
            if stop_requested && deadline.is_none() {
                deadline = Some(tokio::time::Instant::now() + grace);
            }
            if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                let left = on_disk(&self.spool, |s| Ok(s.len())).await.unwrap_or(0);
                if left > 0 {
                    warn!(batches = left, "collector not reached before shutdown; batches stay spooled for the next start");
                }
                return Ok(());
            }
            let (next, backlog) = on_disk(&self.spool, |s| Ok((s.next_batch()?, s.len()))).await?;
            let Some((entry, batch)) = next else {
                if stop_requested {
                    return Ok(());
                }
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = &mut stop, if !stop_requested => stop_requested = true,
                }
                continue;
            };
            let mut request = tonic::Request::new(batch);
            request.set_timeout(Duration::from_secs(10));
            match client.push(request).await {
                Ok(response) => {
                    let ack = response.into_inner();
                    if ack.duplicate {
                        info!(sequence = ack.sequence, "collector already had this batch");
                    }
                    on_disk(&self.spool, move |s| s.remove(&entry)).await?;
                    backoff.reset();
                    if backlog > 1 && !self.replay_interval.is_zero() {
                        // Bounded replay rate for a backlog.
                        tokio::select! {
                            _ = tokio::time::sleep(self.replay_interval) => {}
                            _ = &mut stop, if !stop_requested => stop_requested = true,
                        }
                    }
                }
                Err(status) => match verdict(status.code()) {
                    Verdict::Retry => {
                        let delay = backoff.next_delay();
                        warn!(sequence = entry.sequence, code = ?status.code(), message = status.message(),
                            retry_in_ms = delay.as_millis() as u64, backlog, "collector unavailable; batch stays spooled");
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => {}
                            _ = &mut stop, if !stop_requested => stop_requested = true,
                        }
                    }
                    Verdict::Reject => {
                        error!(sequence = entry.sequence, code = ?status.code(), message = status.message(),
                            "collector refused the batch for good; kept in rejected/ for inspection");
                        let reason = format!("{:?}: {}", status.code(), status.message());
                        on_disk(&self.spool, move |s| s.reject(&entry, &reason)).await?;
                    }
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_rules_follow_status_codes() {
        for code in [Code::Unavailable, Code::DeadlineExceeded, Code::ResourceExhausted] {
            assert!(matches!(verdict(code), Verdict::Retry), "{code:?}");
        }
        for code in [Code::InvalidArgument, Code::Unauthenticated, Code::PermissionDenied] {
            assert!(matches!(verdict(code), Verdict::Reject), "{code:?}");
        }
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
