//! The sqlbee.v1 wire protocol. See the .proto files for the compatibility
//! rules; domain <-> wire conversions live with the stages that use them.
//!
//! Besides the generated types it holds what both ends of a call must agree
//! on: a channel to a collector (`client`: TLS, tokens), the Query
//! service as its callers reach it (`query_client`: order keys, event
//! kinds, answer size) and its answers as JSON (`json`: what the web UI's
//! `/api/` serves and the query tools' `--json` prints), and those answers'
//! schemas, learned from the same functions (`json_schema`).
#![allow(clippy::all)]

pub mod bounds;
pub mod client;
pub mod codec;
mod content_hash;
pub mod figures;
pub mod json;
pub mod json_schema;
pub mod limits;
pub mod query_client;

pub use content_hash::content_hash;

pub mod v1 {
    tonic::include_proto!("sqlbee.v1");
}
