//! The agent role of sqlbee: eBPF statement observability for MySQL and
//! MariaDB, next to the server.
//!
//! Data flows one way: `probe` -> `normalize` -> `aggregate` -> `ship`
//! (gRPC, spooled to disk) or `output` (stdout), wired together only in
//! `pipeline`. `discover` tells `probe` what to attach to. The collector
//! and the query tools are crates of their own; see ARCHITECTURE.md at the
//! repository root.
pub mod activity;
pub mod aggregate;
pub mod budget;
pub mod config;
pub mod discover;
pub mod host;
pub mod metrics;
pub mod normalize;
pub mod output;
pub mod pipeline;
pub mod plans;
pub mod privileges;
pub mod probe;
pub mod procfs;
pub mod server_login;
pub mod ship;
