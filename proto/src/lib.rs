//! The sqlbee.v1 wire protocol. See the .proto files for the compatibility
//! rules; domain <-> wire conversions live with the stages that use them.
#![allow(clippy::all)]

pub mod bounds;
pub mod codec;
mod content_hash;
pub mod figures;
pub mod limits;

pub use content_hash::content_hash;

pub mod v1 {
    tonic::include_proto!("sqlbee.v1");
}
