//! sqlbee: eBPF statement observability for MySQL and MariaDB.
//!
//! Data flows one way: `probe` -> `normalize` -> `aggregate` -> `ship`
//! (gRPC, spooled to disk) or `output` (stdout), wired together only in
//! `pipeline`. `discover` tells `probe` what to attach to. `collector`
//! receives and stores batches; `query` asks a collector.
pub mod aggregate;
pub mod budget;
pub mod client;
pub mod collector;
pub mod config;
pub mod discover;
pub mod host;
pub mod metrics;
pub mod normalize;
pub mod output;
pub mod pipeline;
pub mod probe;
pub mod procfs;
pub mod query;
pub mod ship;
