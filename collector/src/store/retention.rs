//! Deletes data older than its level's retention, every prune interval,
//! starting at once. Never stops the collector: a failed prune is logged and tried
//! again at the next tick.
use std::{sync::Arc, time::Duration};

use sqlbee_vocabulary::clock::now_unix_ms;

use super::{Retention, Store};

pub async fn run(store: Arc<dyn Store>, retention: Retention, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let cutoffs = retention.cutoffs(now_unix_ms());
        let store = store.clone();
        match tokio::task::spawn_blocking(move || store.prune(&cutoffs)).await {
            Ok(Ok(pruned)) => tracing::debug!(?pruned, ?cutoffs, "pruned"),
            Ok(Err(error)) => tracing::warn!(%error, "prune failed; trying again at the next interval"),
            Err(error) => tracing::warn!(%error, "prune task failed"),
        }
    }
}
