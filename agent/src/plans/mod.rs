//! Why a digest is slow: its plan, asked of the server with `EXPLAIN
//! FORMAT=JSON` over an optional login (`--server-login`), on one raw
//! sample per digest that never leaves the agent's memory.
//!
//! Off the statement path: closed windows offer their digests (`offer`),
//! one thread of its own explains at most `explain_rate` statements per
//! second per server, and the plans it got ride with the next closed
//! window (`take`). Counting never depends on any of it: a login that
//! fails is a warning on the instance, retried with back-off.
mod explainer;
mod indexes;
mod plan;
mod settings;

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

pub use explainer::Explainer;
pub use indexes::{IndexDefinition, IndexReading, TableIndexes};
pub use plan::{Plan, PlanError, TableAccess};

use crate::{normalize::Samples, server_login::ServerLogin};

/// What the explainer may do, validated at start.
#[derive(Clone, Debug)]
pub struct PlanConfig {
    pub login: ServerLogin,
    /// EXPLAINs per second per server, at most.
    pub explain_rate: f64,
    /// A digest's plan is asked again after this long while it stays
    /// among the costliest.
    pub refresh: Duration,
    /// The shortest gap between two EXPLAINs of a digest whose latency or
    /// rows examined per statement changed.
    pub recheck: Duration,
    /// `raw` keeps the constants in plans; anything else replaces them.
    pub samples: Samples,
}

/// One EXPLAIN's outcome for one digest of one instance.
#[derive(Clone, Debug)]
pub struct PlanRecord {
    pub instance: String,
    pub schema: Option<Arc<str>>,
    pub digest: u64,
    pub explained_at: SystemTime,
    /// The plan, or why there is none (a statement EXPLAIN does not take,
    /// a missing grant, a text the capture cut).
    pub plan: Result<Plan, String>,
    /// The hash of the plan the agent saw before for this digest (0: none
    /// since it started); a different one is a plan change.
    pub previous_hash: u64,
    pub explain_ns: u64,
}

/// The state of the login to one instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoginState {
    /// Connected, or not yet needed.
    Ok,
    /// Why plans are missing (wrong password, missing grant, server gone);
    /// retried with back-off.
    Warning(String),
}

impl LoginState {
    /// "ok", or the warning.
    pub fn describe(&self) -> &str {
        match self {
            LoginState::Ok => "ok",
            LoginState::Warning(w) => w,
        }
    }
}

/// The explainer's ask for the values prepared statements ran with (the
/// servers whose prepared digests wait for them), and the probe stage's
/// answer (servers that cannot give them, and why). `pipeline.rs` hands
/// one to both.
#[derive(Debug, Default)]
pub struct ValueWants(Mutex<Wants>);

#[derive(Debug, Default)]
struct Wants {
    wanted: Vec<u32>,
    unavailable: HashMap<u32, &'static str>,
}

impl ValueWants {
    fn lock(&self) -> std::sync::MutexGuard<'_, Wants> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pids whose prepared statements' values are wanted now.
    pub fn wanted(&self) -> Vec<u32> {
        self.lock().wanted.clone()
    }

    pub fn want(&self, pids: Vec<u32>) {
        self.lock().wanted = pids;
    }

    pub fn set_unavailable(&self, unavailable: HashMap<u32, &'static str>) {
        self.lock().unavailable = unavailable;
    }

    /// Why this server cannot give its prepared statements' values.
    pub fn unavailable(&self, pid: u32) -> Option<&'static str> {
        self.lock().unavailable.get(&pid).copied()
    }
}

/// `name` as a quoted identifier.
fn quoted(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// Plans per instance per window the agent sends; the rest wait.
pub const MAX_PLANS_PER_WINDOW: usize = 1_000;

/// What the explainer finished since the last `take`.
#[derive(Clone, Debug, Default)]
pub struct Explained {
    pub plans: Vec<PlanRecord>,
    /// Per instance the explainer knows.
    pub logins: BTreeMap<String, LoginState>,
    pub explains: u64,
    /// Wall time spent waiting for EXPLAIN answers.
    pub explain_ns: u64,
    /// Settings changed, by instance: `SET GLOBAL` statements seen before,
    /// again with their values, and values that changed with none seen.
    pub changes: Vec<(String, crate::aggregate::ChangeRecord)>,
    /// Tables' indexes read (new or changed, or due again), by instance.
    pub indexes: Vec<(String, IndexReading)>,
}

impl Explained {
    /// Keeps the plans of `instances` (those with a window now), at most
    /// `MAX_PLANS_PER_WINDOW` each, and returns the others for later.
    pub fn keep_for(&mut self, instances: &[&str]) -> Vec<PlanRecord> {
        let mut kept: BTreeMap<&str, usize> = BTreeMap::new();
        let (keep, later) = std::mem::take(&mut self.plans).into_iter().partition(|plan: &PlanRecord| match instances
            .iter()
            .find(|i| **i == plan.instance)
        {
            Some(instance) => {
                let n = kept.entry(instance).or_default();
                *n += 1;
                *n <= MAX_PLANS_PER_WINDOW
            }
            None => false,
        });
        self.plans = keep;
        later
    }
}
