//! Store calls from the gRPC services: run on tokio's blocking pool (a
//! store call blocks), with store failures mapped to statuses a client can
//! act on. Every store failure is the collector's problem, not the
//! request's: UNAVAILABLE and RESOURCE_EXHAUSTED say "retry later".
use tonic::Status;

use super::store::StoreError;

/// A full store and an unavailable one are told apart for the operator;
/// a client retries both.
pub fn status(error: StoreError) -> Status {
    match error {
        StoreError::Full { .. } => Status::resource_exhausted(format!("{error}; retry later")),
        StoreError::Corrupt { .. } => Status::data_loss(error.to_string()),
        // Final for this batch: sending it again cannot change the answer.
        StoreError::Conflict { .. } => Status::already_exists(error.to_string()),
        _ => Status::unavailable(format!("{error}; retry later")),
    }
}

pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Status::unavailable(format!("store task failed: {e}; retry later")))?
        .map_err(status)
}
