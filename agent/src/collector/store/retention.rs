//! Deletes data older than the retention, every prune interval, starting
//! at once. Never stops the collector: a failed prune is logged and tried
//! again at the next tick.
use std::{sync::Arc, time::Duration};

use sqlbee_common::clock::now_unix_ms;

use super::Store;

pub async fn run(store: Arc<dyn Store>, retention: Duration, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let cutoff = now_unix_ms().saturating_sub(retention.as_millis() as i64);
        let store = store.clone();
        match tokio::task::spawn_blocking(move || store.prune(cutoff)).await {
            Ok(Ok(pruned)) => tracing::debug!(?pruned, cutoff, "pruned"),
            Ok(Err(error)) => tracing::warn!(%error, "prune failed; trying again at the next interval"),
            Err(error) => tracing::warn!(%error, "prune task failed"),
        }
    }
}
