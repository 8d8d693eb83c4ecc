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
    let kept = format!("{:016x}", sqlbee::privileges::kept_mask());
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
