//! Why a page or an `/api/` answer could not be made, and the HTTP status
//! that says so: a bad parameter is the caller's to fix (400), a store that
//! is down is worth retrying (503).
use hyper::StatusCode;
use tonic::{Code, Status};

use super::params::BadParam;

/// Why a page or an answer could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    #[error(transparent)]
    Bad(#[from] BadParam),
    #[error("{path} takes no parameter {name:?}; it takes: {takes}")]
    UnknownParam { path: &'static str, name: String, takes: String },
    #[error("{}", .0.message())]
    Query(#[from] Status),
}

impl PageError {
    pub fn status(&self) -> StatusCode {
        match self {
            PageError::Bad(_) | PageError::UnknownParam { .. } => StatusCode::BAD_REQUEST,
            PageError::Query(status) => match status.code() {
                Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
                Code::NotFound => StatusCode::NOT_FOUND,
                Code::Unauthenticated => StatusCode::UNAUTHORIZED,
                Code::PermissionDenied => StatusCode::FORBIDDEN,
                Code::Unavailable | Code::ResourceExhausted => StatusCode::SERVICE_UNAVAILABLE,
                Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            },
        }
    }
}
