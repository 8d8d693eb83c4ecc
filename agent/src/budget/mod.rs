//! The agent's own resource budget: at start it moves itself into a child
//! cgroup with a CPU quota and a memory limit (default 1 core, 1 GiB), so
//! the kernel, not good intentions, keeps it inside the budget; it removes
//! that cgroup on exit. Inside a container that already has limits it only
//! reads them.
//!
//! The child is created under the agent's *current* cgroup of each
//! controller, not at the hierarchy root: on hosts where the agent already
//! sits in a service or session cgroup (this machine, systemd hosts) the
//! root may be off limits, and nesting keeps the outer limits in force.
//! cgroup v2 allows that child only below the root cgroup; elsewhere the
//! agent limits the cgroup it is alone in, or says why it cannot (see
//! `cgroup_v2`).
pub mod calibrate;
mod cgroup;
mod cgroup_files;
mod cgroup_keeper;
mod cgroup_v2;
mod cost;
mod duty;
mod overhead;
mod phases;
mod query_counter;
mod shedding;

pub use cgroup::{Applied, SelfLimit};
pub use cost::{CostMeter, CostSample};
pub use duty::{DutyConfig, MIN_DUTY};
pub use overhead::{Overhead, ProbeCost};
pub use query_counter::QueryCounter;
pub use shedding::{Shedder, Step};

use std::path::PathBuf;

/// What the agent allows itself.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BudgetConfig {
    /// CPU quota in cores (e.g. 1.0, 0.1).
    pub cpu_cores: f64,
    /// Memory limit in bytes.
    pub memory_bytes: u64,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        Self { cpu_cores: 1.0, memory_bytes: 1 << 30 }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    #[error(
        "cannot create the agent's cgroup {path}: permission denied; run as root, \
         delegate a cgroup to the agent, or start it with --no-cgroup ({detail})"
    )]
    Permission { path: String, detail: String },
    #[error("cgroup {what} failed for {path}: {detail}")]
    Cgroup { what: &'static str, path: String, detail: String },
    #[error("no cgroup hierarchy with the {controller} controller is mounted; use --no-cgroup")]
    NoController { controller: &'static str },
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{reason}")]
    Unsupported { reason: String },
}
