//! Shared by `cargo xtask` and the integration tests: the things a test or
//! demo needs around sqlbee (a private MariaDB, sysbench, tool paths).
pub mod mariadb;
pub mod paths;
pub mod sysbench;
