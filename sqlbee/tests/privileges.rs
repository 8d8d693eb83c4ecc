//! Least privilege: after start, the agent holds exactly the capabilities
//! it documents (`privileges::KEPT`), in every thread, with no_new_privs,
//! and those suffice to attach a server that starts later and count it
//! exactly. Needs root: it starts real servers and attaches eBPF programs.
mod common;

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use common::{Agent, PrivateServer, privileged};

/// The capability fields of a /proc status file.
fn capabilities(status: &str) -> HashMap<String, String> {
    status
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(k, _)| k.starts_with("Cap") || *k == "NoNewPrivs")
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

#[test]
fn the_agent_keeps_only_the_documented_capabilities() {
    if !privileged("the_agent_keeps_only_the_documented_capabilities") {
        return;
    }
    let _serial = common::one_at_a_time();
    let first = PrivateServer::start("caps-first", &[]).unwrap();
    let agent = Agent::start(first.dir(), &["--window=500ms".into()]);
    let kept = format!("{:016x}", sqlbee_agent::privileges::kept_mask());
    let expected: HashMap<String, String> = [
        ("CapInh", "0000000000000000"),
        ("CapPrm", kept.as_str()),
        ("CapEff", kept.as_str()),
        ("CapBnd", kept.as_str()),
        ("CapAmb", "0000000000000000"),
        ("NoNewPrivs", "1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    // The ready file is written once the servers are attached, a moment
    // before the last threads start: wait for the aggregate thread.
    let tasks_dir = format!("/proc/{}/task", agent.pid());
    let thread_named = |name: &str| {
        std::fs::read_dir(&tasks_dir)
            .unwrap()
            .flatten()
            .any(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name))
    };
    let started = Instant::now();
    while !thread_named("aggregate") {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the agent's threads did not start:\n{}",
            agent.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let tasks: Vec<_> = std::fs::read_dir(&tasks_dir).unwrap().flatten().collect();
    // main, signals and aggregate at least (calibrate may be done).
    assert!(tasks.len() >= 3, "the agent's threads are running");
    for task in tasks {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap();
        let name = status.lines().next().unwrap_or_default().to_string();
        assert_eq!(capabilities(&status), expected, "thread {name}:\n{}", agent.stderr_text());
    }

    // What it kept is enough for a server that starts after the drop.
    let second = PrivateServer::start("caps-second", &[]).unwrap();
    let started = Instant::now();
    while !common::strip_ansi(&agent.stderr_text()).contains(&format!("pid={}", second.pid())) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the later server was not attached:\n{}",
            agent.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    const EXECUTED: u64 = 25;
    for i in 0..EXECUTED {
        second.sql(&format!("SELECT {i} AS after_the_drop")).unwrap();
    }
    std::thread::sleep(Duration::from_millis(800));
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
    let counted: u64 =
        out.digest_counts(None).iter().filter(|(t, _)| t.contains("after_the_drop")).map(|(_, n)| n).sum();
    assert_eq!(counted, EXECUTED, "{}", out.stderr);
}

/// A server whose binary the agent may not read (another user's, with
/// CAP_SYS_PTRACE taken from the agent) is reported as untraced with
/// why, in every window, never skipped in silence.
#[test]
fn a_server_whose_binary_cannot_be_read_is_reported_untraced() {
    if !privileged("a_server_whose_binary_cannot_be_read_is_reported_untraced") {
        return;
    }
    let _serial = common::one_at_a_time();
    use std::{os::unix::fs::PermissionsExt, process::Command};
    let dir = std::env::temp_dir().join(format!("sqlbee-unreadable-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Any program will do: the agent finds servers by name, and this one
    // is never read.
    let fake = dir.join("mariadbd");
    std::fs::copy("/bin/sleep", &fake).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut server = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&fake)
        .arg("120")
        .spawn()
        .expect("setpriv (util-linux) runs the stand-in as nobody");
    let stdout = dir.join("agent.jsonl");
    let stderr = dir.join("agent.log");
    let mut agent = Command::new("setpriv")
        .arg("--bounding-set=-sys_ptrace")
        .arg(common::sqlbee())
        .args(["agent", "--no-cgroup", "--output", "jsonl", "--window", "500ms"])
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .expect("starting sqlbee");
    let pid = u64::from(server.id());
    let reports = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(&stdout)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|l| l["type"] == "untraced_server" && l["pid"].as_u64() == Some(pid))
            .collect()
    };
    let started = Instant::now();
    while reports().len() < 2 {
        let log = std::fs::read_to_string(&stderr).unwrap_or_default();
        assert!(started.elapsed() < Duration::from_secs(30), "not reported in two windows:\n{log}");
        assert!(agent.try_wait().unwrap().is_none(), "the agent exited:\n{log}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: kill(2) on our own children.
    unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
    let _ = agent.wait();
    let _ = server.kill();
    let _ = server.wait();
    for report in reports() {
        assert_eq!(report["kind"], "unreadable_binary", "{report:#}");
        let reason = report["reason"].as_str().unwrap();
        assert!(reason.contains("Permission denied") && reason.contains("CAP_SYS_PTRACE"), "{report:#}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
