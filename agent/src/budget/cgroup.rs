//! Creating, joining, reading and leaving the agent's own cgroup.
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use cgroups_rs::CgroupPid;
use cgroups_rs::fs::{
    Cgroup, cgroup::get_cgroups_relative_paths, cpu::CpuController, cpuacct::CpuAcctController, hierarchies,
    memory::MemController,
};

use sqlbee_vocabulary::error_chain;

use super::{
    BudgetConfig, BudgetError,
    cgroup_files::{PERIOD_US, parse_cpu_max, quota_us, usage_ns},
    cgroup_keeper,
    cgroup_v2::{self, CurrentLimit, Plan},
};

/// A dead agent's cgroup this old is left over, not being set up.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// What `SelfLimit::apply` did.
pub enum Applied {
    /// The agent runs in its own cgroup with the configured limits, removed
    /// when this value drops.
    Own(SelfLimit),
    /// cgroup v2: the limits were written into the agent's own cgroup and
    /// are put back when this value drops (see `cgroup_v2`).
    Current(CurrentLimit),
    /// The agent already runs under a container's limits: left alone, read.
    Inherited { cpu_cores: Option<f64>, memory_bytes: Option<u64> },
}

impl Applied {
    /// The CPU limit in force, in cores.
    pub fn cpu_cores(&self) -> Option<f64> {
        match self {
            Applied::Own(own) => Some(own.config.cpu_cores),
            Applied::Current(current) => Some(current.config.cpu_cores),
            Applied::Inherited { cpu_cores, .. } => *cpu_cores,
        }
    }

    pub fn memory_bytes(&self) -> Option<u64> {
        match self {
            Applied::Own(own) => Some(own.config.memory_bytes),
            Applied::Current(current) => Some(current.config.memory_bytes),
            Applied::Inherited { memory_bytes, .. } => *memory_bytes,
        }
    }

    /// CPU time of everything in the agent's cgroup (the agent), ns; None
    /// when the agent has no cgroup of its own.
    pub fn cpu_usage_ns(&self) -> Option<u64> {
        match self {
            Applied::Own(own) => own.cpu_usage_ns(),
            Applied::Current(current) => current.cpu_usage_ns(),
            Applied::Inherited { .. } => None,
        }
    }
}

/// The agent's own cgroup while it lives.
pub struct SelfLimit {
    cgroup: Cgroup,
    pub config: BudgetConfig,
    /// One directory per controller hierarchy (v1) or the one directory (v2).
    pub paths: Vec<PathBuf>,
    /// Removes the cgroup once the agent is gone (it cannot itself after
    /// dropping its capabilities).
    keeper: Option<cgroup_keeper::Keeper>,
}

impl SelfLimit {
    /// Moves this process into `sqlbee-<pid>` under its current cgroup with
    /// the configured limits, or, inside a container that is already
    /// limited, only reads those limits.
    pub fn apply(config: BudgetConfig) -> Result<Applied, BudgetError> {
        if in_container() {
            let (cpu_cores, memory_bytes) = current_limits();
            if cpu_cores.is_some() || memory_bytes.is_some() {
                tracing::info!(?cpu_cores, ?memory_bytes, "running under a container's limits; only reading them");
                return Ok(Applied::Inherited { cpu_cores, memory_bytes });
            }
        }
        let name = format!("sqlbee-{}", std::process::id());
        let hierarchy = hierarchies::auto();
        let v2 = hierarchy.v2();
        let relative = get_cgroups_relative_paths().map_err(|e| BudgetError::Cgroup {
            what: "reading /proc/self/cgroup",
            path: name.clone(),
            detail: e.to_string(),
        })?;
        // v2: where the agent's own cgroup goes (below its current one, or
        // below the root).
        let mut v2_parent = relative.get("").cloned().unwrap_or_default();
        if v2 {
            let current = relative.get("").cloned().unwrap_or_default();
            match cgroup_v2::plan(Path::new(cgroups_rs::fs::cgroup::UNIFIED_MOUNTPOINT), &current, std::process::id()) {
                Plan::Child => {}
                Plan::RootChild => {
                    tracing::info!(cgroup = %current, "the agent's cgroup holds other processes or no controllers; it moves to a cgroup of its own under the root");
                    v2_parent = String::new();
                }
                Plan::Inherit => {
                    let (cpu_cores, memory_bytes) = current_limits();
                    tracing::info!(?cpu_cores, ?memory_bytes, cgroup = %current, "the agent's cgroup is limited already; only reading it");
                    return Ok(Applied::Inherited { cpu_cores, memory_bytes });
                }
                Plan::Current(dir) => return Ok(Applied::Current(CurrentLimit::apply(dir, config)?)),
                Plan::Refuse(reason) => return Err(BudgetError::Unsupported { reason }),
            }
        }
        let cgroup = if v2 {
            let path = format!("{}/{name}", v2_parent.trim_matches('/'));
            Cgroup::new(hierarchy, path.trim_start_matches('/'))
        } else {
            Cgroup::new_with_relative_paths(hierarchy, &name, only_needed(relative))
        };
        let cgroup = match cgroup {
            Ok(cgroup) => cgroup,
            // A container's cgroup file system is read-only: its limits are
            // the budget, and one without limits is the operator's choice.
            Err(e) if in_container() => {
                tracing::warn!(error = %error_chain(&e),
                    "in a container with no CPU or memory limit and no writable cgroup: the agent runs without a budget; give its container limits (cpu 1, memory 1Gi)");
                return Ok(Applied::Inherited { cpu_cores: None, memory_bytes: None });
            }
            Err(e) => return Err(create_error(&name, e)),
        };
        let paths: Vec<PathBuf> = cgroup.subsystems().iter().map(|s| s.to_controller().path().to_path_buf()).collect();
        remove_stale_siblings(&paths);
        // Forked outside the cgroup, before the agent joins it.
        let keeper = cgroup_keeper::spawn(paths.clone())
            .map_err(|e| tracing::warn!(error = %e, "no cgroup keeper; the agent's cgroup may outlive it"))
            .ok();
        let own = SelfLimit { cgroup, config, paths, keeper };
        own.set_limits()?;
        own.cgroup.add_task_by_tgid(CgroupPid::from(std::process::id() as u64)).map_err(|e| own.error("joining", e))?;
        tracing::info!(cpu_cores = config.cpu_cores, memory_bytes = config.memory_bytes, paths = ?own.paths, "agent runs in its own cgroup");
        Ok(Applied::Own(own))
    }

    fn set_limits(&self) -> Result<(), BudgetError> {
        let cpu: &CpuController = self.cgroup.controller_of().ok_or(BudgetError::NoController { controller: "cpu" })?;
        let quota = quota_us(self.config.cpu_cores) as i64;
        cpu.set_cfs_quota_and_period(Some(quota), Some(PERIOD_US))
            .map_err(|e| self.error("setting the CPU quota", e))?;
        // A new cgroup weighs as much as one thread of its parent: next to
        // a busy mysqld (dozens of threads at the parent's level) the agent
        // got 0.013 cores here where it used 0.07 outside a cgroup, and its
        // ring buffer overflowed. The quota is the cap; the weight must not
        // starve it below that, so the group weighs like 8 threads.
        let weight = if hierarchies::is_cgroup2_unified_mode() { 800 } else { 8192 };
        cpu.set_shares(weight).map_err(|e| self.error("setting the CPU weight", e))?;
        let memory: &MemController =
            self.cgroup.controller_of().ok_or(BudgetError::NoController { controller: "memory" })?;
        memory.set_limit(self.config.memory_bytes as i64).map_err(|e| self.error("setting the memory limit", e))?;
        Ok(())
    }

    /// CPU time used by everything in the cgroup (the agent), ns.
    pub fn cpu_usage_ns(&self) -> Option<u64> {
        if self.cgroup.v2() {
            let cpu: &CpuController = self.cgroup.controller_of()?;
            usage_ns(&cpu.cpu().stat)
        } else {
            let acct: &CpuAcctController = self.cgroup.controller_of()?;
            Some(acct.cpuacct().usage)
        }
    }

    /// Memory charged to the cgroup, bytes.
    pub fn memory_usage(&self) -> Option<u64> {
        let memory: &MemController = self.cgroup.controller_of()?;
        Some(memory.memory_stat().usage_in_bytes)
    }

    fn error(&self, what: &'static str, e: cgroups_rs::fs::error::Error) -> BudgetError {
        BudgetError::Cgroup { what, path: format!("{:?}", self.paths), detail: error_chain(&e) }
    }
}

impl Drop for SelfLimit {
    fn drop(&mut self) {
        // Leave first: a cgroup with a process in it cannot be removed.
        // Moving to the parent (not the hierarchy root) keeps whatever
        // limits the agent was started under.
        let pid = std::process::id().to_string();
        for path in &self.paths {
            if let Some(parent) = path.parent()
                && let Err(e) = std::fs::write(parent.join("cgroup.procs"), &pid)
            {
                tracing::warn!(path = %parent.display(), error = %e, "could not leave the agent cgroup");
            }
        }
        if self.keeper.take().is_some() {
            // Dropped: the keeper removes the cgroup now.
            return;
        }
        if let Err(e) = self.cgroup.delete() {
            tracing::warn!(paths = ?self.paths, error = %error_chain(&e), "could not remove the agent cgroup");
        }
    }
}

/// Removes `sqlbee-<pid>` cgroups next to ours that an agent killed with
/// SIGKILL left behind: only those whose pid is not alive here, which hold
/// no process (the kernel refuses to remove any other) and are older than
/// a minute, so an agent in another pid namespace that created its group
/// but has not joined it yet keeps it. A failure is logged, never fatal:
/// a stale empty cgroup costs nothing but clutter.
fn remove_stale_siblings(paths: &[PathBuf]) {
    let own = std::process::id();
    for parent in paths.iter().filter_map(|p| p.parent()) {
        let Ok(entries) = std::fs::read_dir(parent) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("sqlbee-")).and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            if pid == own || Path::new(&format!("/proc/{pid}")).exists() {
                continue;
            }
            let dir = entry.path();
            let age = entry.metadata().ok().and_then(|m| m.modified().ok()).and_then(|t| t.elapsed().ok());
            if age.is_none_or(|a| a < STALE_AFTER) {
                continue;
            }
            let empty = std::fs::read_to_string(dir.join("cgroup.procs")).is_ok_and(|procs| procs.trim().is_empty());
            if !empty {
                continue;
            }
            match std::fs::remove_dir(&dir) {
                Ok(()) => {
                    tracing::info!(path = %dir.display(), "removed the cgroup of an agent that did not exit cleanly")
                }
                Err(e) => tracing::warn!(path = %dir.display(), error = %e, "could not remove a stale agent cgroup"),
            }
        }
    }
}

/// cgroups-rs wants a relative path for every mounted controller it
/// manages; the agent needs cpu, cpuacct and memory only.
fn only_needed(relative: HashMap<String, String>) -> HashMap<String, String> {
    relative.into_iter().filter(|(controller, _)| matches!(controller.as_str(), "cpu" | "cpuacct" | "memory")).collect()
}

fn create_error(name: &str, e: cgroups_rs::fs::error::Error) -> BudgetError {
    let detail = error_chain(&e);
    if detail.contains("ermission denied") || detail.contains("Read-only file system") {
        BudgetError::Permission { path: name.to_string(), detail }
    } else {
        BudgetError::Cgroup { what: "creation", path: name.to_string(), detail }
    }
}

/// Container runtimes leave a marker; Kubernetes puts pods under kubepods.
fn in_container() -> bool {
    Path::new("/run/.containerenv").exists()
        || Path::new("/.dockerenv").exists()
        || std::env::var_os("container").is_some()
        || std::fs::read_to_string("/proc/1/cgroup").is_ok_and(|c| c.contains("kubepods"))
}

/// The directory of cgroup `path` under a hierarchy mounted at `mount`.
/// A container sees only its own cgroup, mounted as the hierarchy's root,
/// while /proc/self/cgroup may still name the host's path (cgroup v1, or
/// no cgroup namespace): then the mount itself is the process's cgroup.
fn cgroup_dir(mount: &Path, path: &str) -> PathBuf {
    let full = mount.join(path);
    if full.exists() || !in_container() { full } else { mount.to_path_buf() }
}

/// Limits of the cgroup this process is in now (v2 `cpu.max`/`memory.max`,
/// v1 `cpu.cfs_quota_us`/`memory.limit_in_bytes`); None when unlimited.
pub fn current_limits() -> (Option<f64>, Option<u64>) {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut cpu = None;
    let mut memory = None;
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next().unwrap_or(""), parts.next().unwrap_or("/"));
        let path = path.trim_start_matches('/');
        if controllers.is_empty() {
            let dir = cgroup_dir(Path::new("/sys/fs/cgroup"), path);
            if let Ok(max) = std::fs::read_to_string(dir.join("cpu.max")) {
                cpu = cpu.or_else(|| parse_cpu_max(&max));
            }
            if let Ok(max) = std::fs::read_to_string(dir.join("memory.max")) {
                memory = memory.or_else(|| max.trim().parse::<u64>().ok());
            }
        }
        for controller in controllers.split(',') {
            let dir = cgroup_dir(&Path::new("/sys/fs/cgroup").join(controllers), path);
            match controller {
                "cpu" => {
                    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok()?.trim().parse::<i64>().ok();
                    if let (Some(quota), Some(period)) = (read("cpu.cfs_quota_us"), read("cpu.cfs_period_us"))
                        && quota > 0
                        && period > 0
                    {
                        cpu = Some(quota as f64 / period as f64);
                    }
                }
                "memory" => {
                    let limit = std::fs::read_to_string(dir.join("memory.limit_in_bytes")).ok();
                    // v1 reports "unlimited" as a huge page-aligned number.
                    memory = limit.and_then(|l| l.trim().parse::<u64>().ok()).filter(|l| *l < 1 << 60).or(memory);
                }
                _ => {}
            }
        }
    }
    (cpu, memory)
}
