//! Prometheus exposition, for every role: a text-format encoder and the
//! HTTP endpoint that serves it (the agent's `--metrics-listen`, the
//! collector's own).
//!
//! Owns no metric values: the caller hands the server a `Render` that
//! formats a snapshot with the `Encoder`; this module only encodes and
//! serves. It must never gather data on a scrape, so a slow or frequent
//! scraper cannot slow its process down.
mod encode;
mod server;

pub use encode::{Encoder, Family, MetricType, SampleValue};
pub use server::{CONTENT_TYPE, MetricsServer, Render};

use std::net::SocketAddr;

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("invalid metrics listen address {addr:?}: expected IP:PORT, such as 127.0.0.1:9104 or [::]:9104")]
    InvalidAddress { addr: String },
    #[error(
        "cannot serve metrics on {addr}: the address is already in use; choose another port or stop the \
         process holding it"
    )]
    AddressInUse { addr: SocketAddr },
    #[error("cannot serve metrics on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}
