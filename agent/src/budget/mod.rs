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
mod cgroup;
mod cgroup_v2;
mod cost;
mod shedding;

pub use cgroup::{Applied, SelfLimit};
pub use cost::{CostMeter, CostSample};
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

/// Starts `SQLBEE_TEST_BURN_THREADS` threads that spin for the agent's
/// whole life: real CPU pressure inside the agent, for the tests that
/// check the cgroup quota holds and that shedding reacts. Not a flag: no
/// user should want it.
pub fn burn_cpu_if_asked() {
    let threads: usize = std::env::var("SQLBEE_TEST_BURN_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    for i in 0..threads.min(8) {
        let spawned = std::thread::Builder::new().name(format!("burn-{i}")).spawn(|| {
            let mut x = 0u64;
            loop {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "could not start a CPU burner");
        }
    }
}
