//! sqlbee: eBPF statement observability for MySQL and MariaDB.
//!
//! Data flows one way: `probe` -> `normalize` -> `aggregate` -> `output`,
//! wired together only in `pipeline`. `discover` tells `probe` what to
//! attach to.
pub mod aggregate;
pub mod config;
pub mod discover;
pub mod normalize;
pub mod output;
pub mod pipeline;
pub mod probe;
