//! Store calls from the gRPC services and the UI: run on tokio's blocking
//! pool (a store call blocks), with store failures mapped to statuses a
//! client can act on. Every store failure is the collector's problem, not
//! the request's: UNAVAILABLE and RESOURCE_EXHAUSTED say "retry later".
//!
//! A store call outlives the request that started it unless told: a
//! dropped request cancels its call (`store::cancel`), and the admission
//! places the request held ([`HELD`]) stay held until the call has ended,
//! so requests given up by their clients cannot pile work onto the
//! blocking threads that ingest needs.
use std::{future::Future, sync::Arc};

use tonic::Status;

use super::store::{StoreError, cancel::Cancel};

/// What a request was admitted with (semaphore permits, places per
/// address or token): given back when its last holder is dropped.
type Held = Arc<dyn std::any::Any + Send + Sync>;

tokio::task_local! {
    /// The admission places of the request being served, if it was given
    /// any: a store call it starts keeps them until the call ends.
    static HELD: Held;
}

/// Runs `request` holding `places` for it and for every store call it
/// starts, however long those outlive it.
pub async fn holding<F: Future>(places: impl Send + Sync + 'static, request: F) -> F::Output {
    HELD.scope(Arc::new(places) as Held, request).await
}

/// A full store and an unavailable one are told apart for the operator;
/// a client retries both.
pub fn status(error: StoreError) -> Status {
    match error {
        StoreError::Full { .. } => Status::resource_exhausted(format!("{error}; retry later")),
        StoreError::Corrupt { .. } => Status::data_loss(error.to_string()),
        // Final for this batch: sending it again cannot change the answer.
        StoreError::Conflict { .. } => Status::already_exists(error.to_string()),
        StoreError::Cancelled => Status::cancelled(error.to_string()),
        _ => Status::unavailable(format!("{error}; retry later")),
    }
}

/// Cancels the store call when the request awaiting it is dropped.
struct CancelOnDrop(Option<Arc<Cancel>>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(cancel) = self.0.take() {
            cancel.cancel();
        }
    }
}

/// A read: cancelled when the request awaiting it is dropped.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, Status> {
    on_the_pool(work, Some(Arc::new(Cancel::default()))).await
}

/// A write (a batch stored): runs to its end even when its request is
/// dropped, so a store is never left half done by a client's timeout; the
/// agent's retry then finds it stored. It keeps its admission place.
pub async fn blocking_to_the_end<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, Status> {
    on_the_pool(work, None).await
}

async fn on_the_pool<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
    cancel: Option<Arc<Cancel>>,
) -> Result<T, Status> {
    let held = HELD.try_with(Arc::clone).ok();
    let mut on_drop = CancelOnDrop(cancel.clone());
    let outcome = tokio::task::spawn_blocking(move || {
        let _held = held;
        match cancel {
            Some(cancel) => Cancel::run(cancel, work),
            None => work(),
        }
    })
    .await;
    on_drop.0 = None;
    outcome.map_err(|e| Status::unavailable(format!("store task failed: {e}; retry later")))?.map_err(status)
}
