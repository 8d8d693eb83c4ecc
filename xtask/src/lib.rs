//! Shared by `cargo xtask` and the integration tests: the things a test or
//! demo needs around sqlbee (a private MariaDB, a private ClickHouse, pinned Python packages, sysbench, tool paths) and
//! the overhead benchmark, which a smoke test drives through this library.
pub mod bench;
pub mod chdb;
pub mod clickhouse;
pub mod clickhouse_cluster;
pub mod image;
pub mod kernel_matrix;
pub mod mariadb;
pub mod otelcol;
pub mod paths;
pub mod ports;
pub mod python_venv;
pub mod sysbench;

use std::process::Command;

/// `cargo` with the project's tools on PATH, run from the workspace root.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.env("PATH", paths::path_with_tools()).current_dir(paths::workspace_root());
    cmd
}
