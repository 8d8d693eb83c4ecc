//! The agent's own budget: its cgroup, its cost accounting, host metrics
//! and the Prometheus endpoint, against a real server.
mod common;

use std::{io::Read, io::Write, net::TcpStream, time::Duration};

use common::{Agent, privileged};
use xtask::mariadb::PrivateServer;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn http_get(port: u16, path: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    body
}

/// `(controllers, path)` of each hierarchy the process is in.
fn cgroups_of(pid: u32) -> Vec<(String, String)> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap()
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            parts.next()?;
            Some((parts.next()?.to_string(), parts.next()?.to_string()))
        })
        .collect()
}

fn controller_dir(pid: u32, controller: &str) -> std::path::PathBuf {
    let (controllers, path) = cgroups_of(pid)
        .into_iter()
        .find(|(c, _)| c.split(',').any(|x| x == controller))
        .unwrap_or_else(|| panic!("no {controller} hierarchy: {:?}", cgroups_of(pid)));
    std::path::Path::new("/sys/fs/cgroup").join(controllers).join(path.trim_start_matches('/'))
}

#[test]
fn agent_runs_in_its_own_limited_cgroup_and_reports_its_cost() {
    if !privileged("agent_runs_in_its_own_limited_cgroup_and_reports_its_cost") {
        return;
    }
    // The assertions read cgroup v1 files (this machine is hybrid v1); v2
    // hosts run the same code through cgroups-rs.
    let v1 = ["/sys/fs/cgroup/cpu/cpu.cfs_period_us", "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us"]
        .iter()
        .any(|p| std::path::Path::new(p).exists());
    if !v1 {
        assert!(std::env::var_os("SQLBEE_REQUIRE_PRIVILEGED").is_none(), "cgroup v1 cpu hierarchy not mounted");
        eprintln!("skipping: cgroup v1 cpu hierarchy not mounted");
        return;
    }
    let server = PrivateServer::start("budget", &[]).unwrap();
    let port = free_port();
    let agent = Agent::start(
        server.dir(),
        &[
            format!("--pid={}", server.pid()),
            "--window=1s".into(),
            "--cpu-limit=0.5".into(),
            "--memory-limit-mib=256".into(),
            format!("--metrics-listen=127.0.0.1:{port}"),
        ],
    );
    let cpu_dir = controller_dir(agent.pid(), "cpu");
    let memory_dir = controller_dir(agent.pid(), "memory");
    let name = format!("sqlbee-{}", agent.pid());
    assert!(cpu_dir.ends_with(&name) && memory_dir.ends_with(&name), "{cpu_dir:?} {memory_dir:?}");
    let read = |dir: &std::path::Path, file: &str| std::fs::read_to_string(dir.join(file)).unwrap().trim().to_string();
    assert_eq!(read(&cpu_dir, "cpu.cfs_quota_us"), "50000");
    assert_eq!(read(&cpu_dir, "cpu.cfs_period_us"), "100000");
    assert_eq!(read(&memory_dir, "memory.limit_in_bytes"), (256u64 << 20).to_string());

    const STATEMENTS: u64 = 300;
    for i in 0..STATEMENTS {
        server.sql(&format!("SELECT {i} + 1 AS budget_probe")).unwrap();
    }
    std::thread::sleep(Duration::from_millis(2500));
    let page = http_get(port, "/metrics");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    for metric in [
        "sqlbee_agent_cpu_cores{source=\"cgroup\"}",
        "sqlbee_agent_rss_bytes",
        "sqlbee_agent_cpu_limit_cores 0.5",
        "sqlbee_host_cpu_cores{mode=\"user\"}",
        "sqlbee_mysqld_rss_bytes{pid=",
    ] {
        assert!(page.contains(metric), "{metric} missing:\n{page}");
    }
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
    assert!(!cpu_dir.exists() && !memory_dir.exists(), "the agent's cgroup must be gone after exit");

    let agents: Vec<_> = out.of_type("agent").collect();
    assert!(agents.len() >= 2, "{:#?}", out.lines);
    assert!(agents.iter().all(|a| a["cpu_source"] == "cgroup" && a["rss_bytes"].as_u64().unwrap() > 0));
    assert!(agents.iter().all(|a| a["cpu_cores"].as_f64().unwrap() <= 0.5 * 1.2), "{agents:#?}");
    // The statements the windows saw, as rates, add up to what ran.
    let seen: f64 = agents.iter().map(|a| a["statements_per_s"].as_f64().unwrap() * a["window_seconds"].as_f64().unwrap()).sum();
    assert!((seen - STATEMENTS as f64).abs() <= 3.0, "windows saw {seen} statements of {STATEMENTS}");
    assert!(agents.iter().any(|a| a["cores_per_10k_qps"].as_f64().unwrap() > 0.0), "{agents:#?}");
    let host: Vec<_> = out.of_type("host").collect();
    assert!(!host.is_empty());
    let server_pid = server.pid() as u64;
    assert!(
        host.iter().any(|h| h["processes"].as_array().unwrap().iter().any(|p| p["pid"].as_u64() == Some(server_pid)
            && p["rss_bytes"].as_u64().unwrap_or(0) > 0)),
        "{host:#?}"
    );
}

#[test]
fn a_taken_metrics_port_is_a_clear_error_at_start() {
    if !privileged("a_taken_metrics_port_is_a_clear_error_at_start") {
        return;
    }
    let server = PrivateServer::start("budget-port", &[]).unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sqlbee"))
        .args(["agent", &format!("--pid={}", server.pid()), &format!("--metrics-listen=127.0.0.1:{port}"), "--duration=1s"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("already in use"), "{stderr}");
}

/// Uprobe links the agent process holds (its fds' `link_type: perf` with
/// `event_type: uprobe`).
fn attached_uprobes(agent_pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{agent_pid}/fdinfo"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter(|info| info.contains("link_type:\tperf") && info.contains("event_type:\tuprobe"))
        .count()
}

/// Budget mode attaches the probes part of the time: they come and go on
/// a schedule while statements run, and every count made meanwhile says it
/// is a sample, with its estimate.
#[test]
fn budget_mode_detaches_and_reattaches_and_flags_estimates() {
    if !privileged("budget_mode_detaches_and_reattaches_and_flags_estimates") {
        return;
    }
    let server = PrivateServer::start("duty", &[]).unwrap();
    let bench = xtask::sysbench::Sysbench {
        script: "oltp_point_select".into(),
        tables: 1,
        table_size: 1000,
        threads: 2,
        seconds: 60,
        ps_mode: "auto",
    };
    bench.prepare(&server).unwrap();
    let run = common::Workload::new(bench.spawn(&server).unwrap());
    let agent = Agent::start(
        server.dir(),
        &[format!("--pid={}", server.pid()), "--window=1s".into(), "--mysqld-overhead-budget=0.5%".into()],
    );
    let (mut states, started) = (Vec::new(), std::time::Instant::now());
    while started.elapsed() < Duration::from_secs(8) {
        states.push(attached_uprobes(agent.pid()) > 0);
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = agent.stop();
    drop(run);
    assert!(out.success, "{}", out.stderr);
    let switches = states.windows(2).filter(|w| w[0] != w[1]).count();
    assert!(states.contains(&true) && states.contains(&false), "never switched: {states:?}");
    assert!(switches >= 4, "only {switches} switches in 8 s of 1 s duty periods: {states:?}");

    let sampled: Vec<_> = out.of_type("summary").filter(|s| s["sampled"] == true).collect();
    assert!(!sampled.is_empty(), "no window marked as sampled: {:#?}", out.lines);
    for s in &sampled {
        let fraction = s["probes"]["attached_fraction"].as_f64().unwrap();
        assert!((0.0..1.0).contains(&fraction), "{s}");
        assert!(s["estimated_statements"].as_u64().unwrap() >= s["statements"].as_u64().unwrap(), "{s}");
    }
    let rows: Vec<_> = out.of_type("digest").filter(|d| d["sampled"] == true).collect();
    assert!(!rows.is_empty(), "no digest marked as sampled");
    assert!(rows.iter().all(|d| d["estimated_count"].as_u64().unwrap() >= d["count"].as_u64().unwrap()));
}
