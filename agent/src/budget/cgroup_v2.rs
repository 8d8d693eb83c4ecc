//! Where the agent's limits can go on cgroup v2. v2 hands a controller to
//! a child only from a cgroup that holds no processes of its own ("no
//! internal processes"), and the agent is a process of its current cgroup,
//! so a child of it with a quota cannot exist unless that cgroup is the
//! root. What works instead, in order:
//!
//! - the current cgroup already has a limit (a container, a systemd unit
//!   with `CPUQuota=`/`MemoryMax=`): keep it, only read it;
//! - the agent runs in the root cgroup: a child `sqlbee-<pid>` (see
//!   `cgroup`);
//! - the agent is alone in its cgroup and the parent hands that cgroup
//!   `cpu` and `memory` (a systemd service, a delegated cgroup): write the
//!   limits into it and put back what was there on exit;
//! - it shares its cgroup (a shell's session scope) or gets no controllers
//!   there, but the root hands `cpu` and `memory` to its children (every
//!   systemd host): a child of the root, `/sqlbee-<pid>`, which the root
//!   may have since the root is exempt from "no internal processes"; the
//!   agent moves there, leaving the others where they are;
//! - otherwise refuse with what to change: never limit other processes.
//!
//! Every decision reads files below a root passed in, so tests run on
//! fixture trees; this machine's v2 hierarchy has no cpu controller.
use std::path::{Path, PathBuf};

use super::{
    BudgetConfig, BudgetError,
    cgroup_files::{PERIOD_US, quota_us, usage_ns},
};

#[derive(Debug, PartialEq)]
pub enum Plan {
    /// Already limited here: leave it, read it.
    Inherit,
    /// The root cgroup: a child can take the limits.
    Child,
    /// Not the root, but the root can give a child of its own the limits.
    RootChild,
    /// Alone in this cgroup, which can take limits: write them here.
    Current(PathBuf),
    /// None of the above; the reason says what to change.
    Refuse(String),
}

fn read(dir: &Path, file: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(file)).ok()
}

/// `relative`: this process's v2 path (`/system.slice/sqlbee.service`),
/// below `root` (normally /sys/fs/cgroup).
pub fn plan(root: &Path, relative: &str, own_pid: u32) -> Plan {
    let relative = relative.trim_matches('/');
    if relative.is_empty() {
        return Plan::Child;
    }
    let dir = root.join(relative);
    let limited = |file: &str| read(&dir, file).is_some_and(|v| !v.trim().starts_with("max"));
    if limited("cpu.max") || limited("memory.max") {
        return Plan::Inherit;
    }
    let procs: Vec<u32> =
        read(&dir, "cgroup.procs").unwrap_or_default().split_whitespace().filter_map(|p| p.parse().ok()).collect();
    let others: Vec<u32> = procs.iter().copied().filter(|p| *p != own_pid).collect();
    let root_hands_out = read(root, "cgroup.subtree_control")
        .is_some_and(|c| ["cpu", "memory"].iter().all(|want| c.split_whitespace().any(|x| x == *want)));
    if !others.is_empty() {
        if root_hands_out {
            return Plan::RootChild;
        }
        return Plan::Refuse(format!(
            "cgroup v2: {} also holds other processes ({}), and v2 cannot give a child of it limits while it \
             holds processes; start the agent in a cgroup of its own (systemd: its own service, or \
             Delegate=yes), set CPUQuota=/MemoryMax= on its unit, or use --no-cgroup",
            dir.display(),
            others.iter().take(5).map(u32::to_string).collect::<Vec<_>>().join(", ")
        ));
    }
    let controllers = read(&dir, "cgroup.controllers").unwrap_or_default();
    let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
    if !has("cpu") || !has("memory") {
        if root_hands_out {
            return Plan::RootChild;
        }
        return Plan::Refuse(format!(
            "cgroup v2: the parent of {} does not hand it the cpu and memory controllers (it has: {:?}); \
             enable them in the parent's cgroup.subtree_control, or use --no-cgroup",
            dir.display(),
            controllers.trim()
        ));
    }
    Plan::Current(dir)
}

/// Limits written into the agent's own v2 cgroup, put back on drop.
pub struct CurrentLimit {
    pub dir: PathBuf,
    pub config: BudgetConfig,
    /// What the files held before, restored on drop.
    saved: Vec<(&'static str, String)>,
}

impl CurrentLimit {
    pub fn apply(dir: PathBuf, config: BudgetConfig) -> Result<CurrentLimit, BudgetError> {
        let mut saved = Vec::new();
        for file in ["cpu.max", "memory.max"] {
            if let Some(value) = read(&dir, file) {
                saved.push((file, value.trim().to_string()));
            }
        }
        let limit = CurrentLimit { dir, config, saved };
        let quota = quota_us(config.cpu_cores);
        limit.write("cpu.max", &format!("{quota} {PERIOD_US}"))?;
        limit.write("memory.max", &config.memory_bytes.to_string())?;
        tracing::info!(dir = %limit.dir.display(), cpu_cores = config.cpu_cores, memory_bytes = config.memory_bytes,
            "agent limits written into its own cgroup (cgroup v2)");
        Ok(limit)
    }

    fn write(&self, file: &'static str, value: &str) -> Result<(), BudgetError> {
        std::fs::write(self.dir.join(file), value).map_err(|e| BudgetError::Cgroup {
            what: "writing a limit",
            path: self.dir.join(file).display().to_string(),
            detail: e.to_string(),
        })
    }

    /// CPU time of the cgroup (the agent alone), ns.
    pub fn cpu_usage_ns(&self) -> Option<u64> {
        usage_ns(&read(&self.dir, "cpu.stat")?)
    }
}

impl Drop for CurrentLimit {
    fn drop(&mut self) {
        for (file, value) in &self.saved {
            if let Err(e) = std::fs::write(self.dir.join(file), value) {
                tracing::warn!(file, dir = %self.dir.display(), error = %e, "could not restore a cgroup setting");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A made-up cgroup tree, removed when the test is done with it.
    struct Tree(PathBuf);

    impl std::ops::Deref for Tree {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tree(name: &str, files: &[(&str, &str)]) -> Tree {
        let root = std::env::temp_dir().join(format!("sqlbee-cgv2-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let dir = root.join("system.slice/sqlbee.service");
        std::fs::create_dir_all(&dir).unwrap();
        for (file, text) in files {
            std::fs::write(dir.join(file), text).unwrap();
        }
        Tree(root)
    }

    const UNIT: &str = "/system.slice/sqlbee.service";

    #[test]
    fn root_gets_a_child_and_limits_are_kept() {
        assert_eq!(plan(Path::new("/nonexistent"), "/", 7), Plan::Child);
        let root =
            tree("limited", &[("cpu.max", "50000 100000\n"), ("memory.max", "max\n"), ("cgroup.procs", "7\n9\n")]);
        assert_eq!(plan(&root, UNIT, 7), Plan::Inherit);
        let root = tree("memlimited", &[("cpu.max", "max 100000\n"), ("memory.max", "1073741824\n")]);
        assert_eq!(plan(&root, UNIT, 7), Plan::Inherit);
    }

    #[test]
    fn a_shared_cgroup_gets_a_child_of_the_root_where_the_root_hands_out_cpu_and_memory() {
        let files =
            [("cpu.max", "max 100000\n"), ("memory.max", "max\n"), ("cgroup.controllers", "cpu io memory pids\n")];
        let root = tree("session", &[files[0], files[1], files[2], ("cgroup.procs", "7\n1234\n")]);
        std::fs::write(root.join("cgroup.subtree_control"), "cpuset cpu io memory pids\n").unwrap();
        assert_eq!(plan(&root, UNIT, 7), Plan::RootChild);
        let root = tree("undelegated-root", &[("cgroup.controllers", "pids\n"), ("cgroup.procs", "7\n")]);
        std::fs::write(root.join("cgroup.subtree_control"), "cpu memory\n").unwrap();
        assert_eq!(plan(&root, UNIT, 7), Plan::RootChild);
        std::fs::write(root.join("cgroup.subtree_control"), "memory pids\n").unwrap();
        assert!(matches!(plan(&root, UNIT, 7), Plan::Refuse(_)), "no cpu controller at the root");
    }

    #[test]
    fn shared_or_undelegated_cgroups_are_refused() {
        let files =
            [("cpu.max", "max 100000\n"), ("memory.max", "max\n"), ("cgroup.controllers", "cpu io memory pids\n")];
        let root = tree("shared", &[files[0], files[1], files[2], ("cgroup.procs", "7\n1234\n")]);
        match plan(&root, UNIT, 7) {
            Plan::Refuse(why) => assert!(why.contains("1234") && why.contains("--no-cgroup"), "{why}"),
            other => panic!("{other:?}"),
        }
        let root = tree("undelegated", &[("cgroup.controllers", "pids\n"), ("cgroup.procs", "7\n")]);
        match plan(&root, UNIT, 7) {
            Plan::Refuse(why) => assert!(why.contains("subtree_control"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn alone_and_delegated_writes_limits_and_restores_them() {
        let root = tree(
            "alone",
            &[
                ("cpu.max", "max 100000\n"),
                ("memory.max", "max\n"),
                ("cgroup.controllers", "cpu io memory pids\n"),
                ("cgroup.procs", "7\n"),
                ("cpu.stat", "usage_usec 1500\nuser_usec 1000\n"),
            ],
        );
        let Plan::Current(dir) = plan(&root, UNIT, 7) else { panic!("expected Current") };
        let limit =
            CurrentLimit::apply(dir.clone(), BudgetConfig { cpu_cores: 0.25, memory_bytes: 256 << 20 }).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("cpu.max")).unwrap(), "25000 100000");
        assert_eq!(std::fs::read_to_string(dir.join("memory.max")).unwrap(), (256u64 << 20).to_string());
        assert_eq!(limit.cpu_usage_ns(), Some(1_500_000));
        drop(limit);
        assert_eq!(std::fs::read_to_string(dir.join("cpu.max")).unwrap(), "max 100000");
        assert_eq!(std::fs::read_to_string(dir.join("memory.max")).unwrap(), "max");
    }
}
