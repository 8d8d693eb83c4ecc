//! Runs the store's rollup pass now and then, for a store that rolls up
//! after the fact (ClickHouse); a pass that leaves buckets due is followed
//! by the next at once. Never stops the collector: a failed pass is logged
//! and tried again at the next tick, and reads stay exact meanwhile (an
//! unrolled bucket is read raw).
use std::{sync::Arc, time::Duration};

use super::Store;

/// How often a collector looks for buckets to roll up. Every replica does;
/// two rolling one bucket at once write the same rows twice, and reads take
/// one mark's rows only.
pub const EVERY: Duration = Duration::from_secs(30);

pub async fn run(store: Arc<dyn Store>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        loop {
            let store = store.clone();
            match tokio::task::spawn_blocking(move || store.roll_up()).await {
                Ok(Ok(0)) => break,
                Ok(Ok(left)) => tracing::debug!(left, "buckets still due; rolling up on"),
                Ok(Err(error)) => {
                    tracing::warn!(%error, "rollup pass failed; trying again at the next interval");
                    break;
                }
                Err(error) => {
                    tracing::warn!(%error, "rollup task failed");
                    break;
                }
            }
        }
    }
}
