//! sqlbee: eBPF statement observability for MySQL and MariaDB.
//!
//! Data flows one way: `probe` -> `normalize` -> `aggregate` -> `ship`
//! (gRPC, spooled to disk) or `output` (stdout), wired together only in
//! `pipeline`. `discover` tells `probe` what to attach to. `collector`
//! receives and stores batches; `query` asks a collector. See
//! ARCHITECTURE.md at the repository root.
//!
//! Features pick the roles: `agent` (needs the eBPF toolchain to build)
//! and `collector` (the collector and the query tools); both by default.
#[cfg(feature = "agent")]
pub mod activity;
#[cfg(feature = "agent")]
pub mod aggregate;
#[cfg(feature = "agent")]
pub mod budget;
pub mod cli;
pub mod client;
#[cfg(feature = "collector")]
pub mod collector;
#[cfg(feature = "agent")]
pub mod config;
#[cfg(feature = "agent")]
pub mod discover;
#[cfg(feature = "agent")]
pub mod host;
#[cfg(feature = "agent")]
pub mod metrics;
#[cfg(feature = "agent")]
pub mod normalize;
#[cfg(feature = "agent")]
pub mod output;
#[cfg(feature = "agent")]
pub mod pipeline;
#[cfg(feature = "agent")]
pub mod plans;
#[cfg(feature = "agent")]
pub mod privileges;
#[cfg(feature = "agent")]
pub mod probe;
#[cfg(feature = "agent")]
pub mod procfs;
pub mod prometheus;
#[cfg(feature = "collector")]
pub mod query;
#[cfg(all(test, feature = "agent", feature = "collector"))]
mod seam_tests;
#[cfg(feature = "agent")]
pub mod ship;
