//! sqlbee where users run it: the image `./x image` builds, under podman
//! (runc), beside MariaDB in a container of its own. Needs root: rootful
//! podman, and the agent in the container loads eBPF programs. The images
//! come from `./x test`, which builds them before the suite runs.
mod common;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, Instant},
};

use serde_json::Value;
use xtask::image::{MARIADB_IMAGE, SQLBEE_IMAGE, podman};

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("starting podman");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    out
}

/// The images exist, or the test says why it cannot run.
fn images_ready(test: &str) -> bool {
    if !common::privileged(test) {
        return false;
    }
    for image in [SQLBEE_IMAGE, MARIADB_IMAGE] {
        let exists = podman().args(["image", "exists", image]).status().is_ok_and(|s| s.success());
        if !exists {
            assert!(
                std::env::var_os("SQLBEE_REQUIRE_PRIVILEGED").is_none(),
                "{image} is missing: run the suite through ./x test, which builds the images (or ./x image)"
            );
            eprintln!("skipping {test}: {image} is missing (./x image builds it)");
            return false;
        }
    }
    true
}

/// A container removed (with its anonymous volumes) when dropped.
struct Container {
    name: String,
}

impl Container {
    fn run(name: &str, args: &[&str], image: &str, command: &[&str]) -> Container {
        let name = format!("{name}-{}", std::process::id());
        let _ = podman().args(["rm", "-f", "-v", &name]).output();
        run(podman().args(["run", "-d", "--name", &name]).args(args).arg(image).args(command));
        Container { name }
    }

    /// Runs SQL as root over the server's socket, tab-separated output.
    fn sql(&self, sql: &str) -> String {
        let out = run(podman().args(["exec", &self.name, "mariadb", "-N", "-B", "-e", sql]));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn wait_for_server(&self) {
        let started = Instant::now();
        loop {
            let ok = podman()
                .args(["exec", &self.name, "mariadb", "-e", "SELECT 1"])
                .output()
                .is_ok_and(|o| o.status.success());
            if ok {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "MariaDB in {} did not start:\n{}",
                self.name,
                self.logs().1
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn status(&self) -> HashMap<String, u64> {
        self.sql("SHOW GLOBAL STATUS")
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once('\t')?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect()
    }

    fn logs(&self) -> (String, String) {
        let out = podman().args(["logs", &self.name]).output().unwrap();
        (String::from_utf8_lossy(&out.stdout).into_owned(), common::strip_ansi(&String::from_utf8_lossy(&out.stderr)))
    }

    /// SIGTERM, then what the container wrote.
    fn stop(&self) -> (String, String) {
        run(podman().args(["stop", "--time", "30", &self.name]));
        self.logs()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman().args(["rm", "-f", "-v", &self.name]).output();
    }
}

fn jsonl(stdout: &str) -> Vec<Value> {
    stdout.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn digest_count(lines: &[Value], needle: &str) -> u64 {
    lines
        .iter()
        .filter(|l| l["type"] == "digest" && l["digest_text"].as_str().is_some_and(|t| t.contains(needle)))
        .map(|l| l["count"].as_u64().unwrap())
        .sum()
}

/// Every agent line reports the container's cpu 1 and memory 1 GiB.
fn assert_limits_are_the_containers(lines: &[Value], stderr: &str) {
    let limits: Vec<(f64, u64)> = lines
        .iter()
        .filter(|l| l["type"] == "agent")
        .map(|l| (l["cpu_limit_cores"].as_f64().unwrap_or(0.0), l["memory_limit_bytes"].as_u64().unwrap_or(0)))
        .collect();
    assert!(!limits.is_empty(), "no agent line:\n{stderr}");
    assert!(limits.iter().all(|&(cpu, memory)| (cpu - 1.0).abs() < 0.01 && memory == 1 << 30), "{limits:?}\n{stderr}");
}

fn wait_for_file(path: &Path, agent: &Container) {
    let started = Instant::now();
    while !path.exists() {
        assert!(started.elapsed() < Duration::from_secs(60), "the agent never attached:\n{}", agent.logs().1);
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A directory the containers share with the test, removed once the test
/// is done with it (declared before the containers that mount it, it is
/// dropped after them).
struct StateDir(PathBuf);

impl std::ops::Deref for StateDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn state_dir(name: &str) -> StateDir {
    let dir = std::env::temp_dir().join(format!("sqlbee-containers-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    StateDir(dir)
}

/// MariaDB in one container, the agent in another that shares only its pid
/// namespace, with cpu 1 and memory 1 GiB and the documented capabilities.
/// The agent counts a known workload exactly, as the server's own counters
/// do, and reports the container's limits as its own.
#[test]
fn sidecar_counts_exactly_under_the_containers_limits() {
    if !images_ready("sidecar_counts_exactly_under_the_containers_limits") {
        return;
    }
    let _serial = common::one_at_a_time();
    let db = Container::run("sqlbee-db", &[], MARIADB_IMAGE, &[]);
    db.wait_for_server();
    let state = state_dir("sidecar");
    let pid_ns = format!("container:{}", db.name);
    let volume = format!("{}:/state", state.display());
    // As the manifests give them (the manual's privileges page says why each); never
    // --privileged.
    let capabilities = common::agent_capabilities().join(",");
    let agent = Container::run(
        "sqlbee-sidecar",
        &[
            "--pid",
            &pid_ns,
            "--cpus",
            "1",
            "--memory",
            "1g",
            "--user",
            "0",
            "--cap-drop",
            "all",
            "--cap-add",
            &capabilities,
            "-v",
            &volume,
        ],
        SQLBEE_IMAGE,
        &["agent", "--output", "jsonl", "--window", "1s", "--ready-file", "/state/ready"],
    );
    wait_for_file(&state.join("ready"), &agent);
    let before = db.status();
    const EXECUTED: u64 = 300;
    let statements: String = (0..EXECUTED).map(|i| format!("SELECT {i} AS sidecar_probe;")).collect();
    db.sql(&statements);
    let after = db.status();
    std::thread::sleep(Duration::from_millis(1500));
    let (stdout, stderr) = agent.stop();
    let lines = jsonl(&stdout);
    assert_eq!(common::delta(&before, &after, "Com_select"), EXECUTED, "the server's own count");
    assert_eq!(digest_count(&lines, "sidecar_probe"), EXECUTED, "agent stderr:\n{stderr}");
    assert_limits_are_the_containers(&lines, &stderr);
}

/// The image as a new user runs it first: `--privileged`, but as the
/// image's default user 65534, which holds no capability. The agent must
/// not wait for ever for a server it could never attach: it exits at once
/// and says what it lacks and the flags that give it.
#[test]
fn an_agent_without_capabilities_says_what_it_lacks_and_exits() {
    if !images_ready("an_agent_without_capabilities_says_what_it_lacks_and_exits") {
        return;
    }
    let started = Instant::now();
    let out = podman()
        .args(["run", "--rm", "--privileged", SQLBEE_IMAGE, "agent", "--output", "jsonl", "--duration", "60s"])
        .output()
        .expect("starting podman");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the agent must fail: {stderr}");
    assert!(started.elapsed() < Duration::from_secs(30), "it failed at once, not after --duration: {stderr}");
    for needed in ["uid 65534", "CAP_BPF", "CAP_PERFMON", "--user 0", "--cap-add"] {
        assert!(stderr.contains(needed), "the error names {needed}: {stderr}");
    }
}

/// One agent for the node (the image, with the host's pid namespace): two
/// MariaDB containers that both listen on 3306, and one mariadbd on the
/// host. Three instances, each named as an operator knows it (the
/// container's name, or host:port), each counted exactly.
#[test]
fn node_agent_tells_two_containers_on_3306_and_the_host_apart() {
    if !images_ready("node_agent_tells_two_containers_on_3306_and_the_host_apart") {
        return;
    }
    let _serial = common::one_at_a_time();
    let a = Container::run("sqlbee-node-a", &[], MARIADB_IMAGE, &[]);
    let b = Container::run("sqlbee-node-b", &[], MARIADB_IMAGE, &[]);
    let host = common::PrivateServer::start("node-host", &[]).unwrap();
    a.wait_for_server();
    b.wait_for_server();
    let state = state_dir("node");
    let volume = format!("{}:/state", state.display());
    let capabilities = common::agent_capabilities().join(",");
    let agent = Container::run(
        "sqlbee-node-agent",
        &[
            "--pid",
            "host",
            "--cpus",
            "1",
            "--memory",
            "1g",
            "--user",
            "0",
            "--cap-drop",
            "all",
            "--cap-add",
            &capabilities,
            "-v",
            &volume,
        ],
        SQLBEE_IMAGE,
        &["agent", "--output", "jsonl", "--window", "1s", "--ready-file", "/state/ready"],
    );
    wait_for_file(&state.join("ready"), &agent);
    // The three servers (a node agent traces every server on the host:
    // others that happen to run too are no concern of this test).
    let attached = std::fs::read_to_string(state.join("ready")).unwrap();
    let pid_of = |c: &Container| {
        String::from_utf8_lossy(&run(podman().args(["inspect", "--format", "{{.State.Pid}}", &c.name])).stdout)
            .trim()
            .to_string()
    };
    for pid in [pid_of(&a), pid_of(&b), host.pid().to_string()] {
        assert!(attached.lines().any(|l| l.trim() == pid), "server {pid} attached: {attached}\n{}", agent.logs().1);
    }

    let (na, nb, nh) = (120u64, 70u64, 45u64);
    a.sql(&(0..na).map(|i| format!("SELECT {i} AS node_probe;")).collect::<String>());
    b.sql(&(0..nb).map(|i| format!("SELECT {i} AS node_probe;")).collect::<String>());
    for i in 0..nh {
        host.sql(&format!("SELECT {i} AS node_probe")).unwrap();
    }
    std::thread::sleep(Duration::from_millis(1500));
    let (stdout, stderr) = agent.stop();
    let lines = jsonl(&stdout);
    let mut per_instance: HashMap<String, u64> = HashMap::new();
    for l in lines
        .iter()
        .filter(|l| l["type"] == "digest" && l["digest_text"].as_str().is_some_and(|t| t.contains("node_probe")))
    {
        *per_instance.entry(l["instance"].as_str().unwrap().to_string()).or_default() += l["count"].as_u64().unwrap();
    }
    let host_name = std::fs::read_to_string("/etc/hostname").unwrap().trim().to_string();
    let expected: HashMap<String, u64> = [
        (format!("{}:3306", a.name), na),
        (format!("{}:3306", b.name), nb),
        (format!("{host_name}:{}", host.port), nh),
    ]
    .into_iter()
    .collect();
    assert_eq!(per_instance, expected, "agent stderr:\n{stderr}");
    // Container and id travel as fields of their own.
    for (container, instance) in [(&a, format!("{}:3306", a.name)), (&b, format!("{}:3306", b.name))] {
        let id =
            String::from_utf8_lossy(&run(podman().args(["inspect", "--format", "{{.Id}}", &container.name])).stdout)
                .trim()
                .to_string();
        let summary = lines
            .iter()
            .find(|l| l["type"] == "summary" && l["instance"] == instance.as_str())
            .expect("a summary line");
        assert_eq!(
            (summary["container"].as_str(), summary["container_id"].as_str()),
            (Some(container.name.as_str()), Some(id.as_str()))
        );
    }
    let on_host = lines
        .iter()
        .find(|l| l["type"] == "summary" && l["instance"].as_str().is_some_and(|i| i.starts_with(&host_name)))
        .unwrap();
    assert_eq!(on_host["container_id"], "", "the host's server is in no container");
}

/// `podman kube play` runs the sidecar manifest as written (its images are
/// the local ones the manifest names), and its agent counts a workload
/// exactly, under the manifest's limits.
#[test]
fn the_kubernetes_sidecar_manifest_runs_as_written() {
    if !images_ready("the_kubernetes_sidecar_manifest_runs_as_written") {
        return;
    }
    let _serial = common::one_at_a_time();
    let manifest = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docker/k8s/sidecar.yaml");
    struct Pod(PathBuf);
    impl Drop for Pod {
        fn drop(&mut self) {
            let _ = podman().args(["kube", "down"]).arg(&self.0).output();
        }
    }
    let _ = podman().args(["kube", "down"]).arg(&manifest).output();
    run(podman().args(["kube", "play"]).arg(&manifest));
    let _pod = Pod(manifest);
    // Containers of a pod are named <pod>-<container>.
    let db = Container { name: "sqlbee-sidecar-mariadb".into() };
    let agent = Container { name: "sqlbee-sidecar-sqlbee".into() };
    db.wait_for_server();
    // The image's first start runs a bootstrap mariadbd before the server;
    // the agent follows from one to the other within its rescan interval.
    let started = Instant::now();
    loop {
        let log = agent.logs().1;
        let last = log.lines().rev().find(|l| l.contains("attached pid=") || l.contains("went away"));
        if last.is_some_and(|l| l.contains("attached pid=")) && started.elapsed() > Duration::from_secs(2) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the sidecar never attached:\n{log}");
        std::thread::sleep(Duration::from_millis(200));
    }
    const EXECUTED: u64 = 150;
    let before = db.status();
    db.sql(&(0..EXECUTED).map(|i| format!("SELECT {i} AS kube_probe;")).collect::<String>());
    let after = db.status();
    assert_eq!(common::delta(&before, &after, "Com_select"), EXECUTED);
    // The agent's container alone: stopping the pod stops its infra
    // container, the pid namespace's init, which kills everyone at once.
    let (stdout, stderr) = agent.stop();
    let lines = jsonl(&stdout);
    assert_eq!(digest_count(&lines, "kube_probe"), EXECUTED, "agent stderr:\n{stderr}");
    assert_limits_are_the_containers(&lines, &stderr);
}

/// The compose file's three services, started with podman the way the file
/// says (podman-compose 1.0.3, Debian 12's, drops `pid: service:...`, so
/// this test reads the file and starts them itself): MariaDB; a collector
/// from the image, as user 65534; the agent as MariaDB's sidecar, with the
/// file's capabilities and limits, shipping to the collector by name. The
/// collector's `top` counts the workload exactly.
#[test]
fn the_compose_services_count_exactly_through_the_collector() {
    if !images_ready("the_compose_services_count_exactly_through_the_collector") {
        return;
    }
    let _serial = common::one_at_a_time();
    let compose = common::docker("compose.yaml");
    let caps = &common::lists(&compose, "cap_add:")[0];
    let value = |key: &str| {
        compose.lines().find_map(|l| l.trim().strip_prefix(key)).unwrap().trim().trim_matches('"').to_string()
    };
    let network = format!("sqlbee-compose-{}", std::process::id());
    struct Network(String);
    impl Drop for Network {
        fn drop(&mut self) {
            let _ = podman().args(["network", "rm", "-f", &self.0]).output();
        }
    }
    let _ = podman().args(["network", "rm", "-f", &network]).output();
    run(podman().args(["network", "create", &network]));
    let _network = Network(network.clone());
    let net = format!("--network={network}");
    let db = Container::run("sqlbee-compose-db", &[&net], MARIADB_IMAGE, &[]);
    let collector = Container::run(
        "sqlbee-compose-collector",
        &[&net, "--network-alias=collector", "-p", "127.0.0.1::7878"],
        SQLBEE_IMAGE,
        &["collector", "--listen", "0.0.0.0:7878"],
    );
    db.wait_for_server();
    let pid_ns = format!("container:{}", db.name);
    let mut args: Vec<String> = vec![net.clone(), "--pid".into(), pid_ns, "--user".into(), value("user:")];
    args.extend([
        "--cpus".into(),
        value("cpus:"),
        "--memory".into(),
        value("mem_limit:"),
        "--cap-drop".into(),
        "all".into(),
    ]);
    for cap in caps {
        args.extend(["--cap-add".into(), cap.clone()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Container::run(
        "sqlbee-compose-agent",
        &args,
        SQLBEE_IMAGE,
        &["agent", "--collector", "http://collector:7878", "--state-dir", "/var/lib/sqlbee", "--window", "1s"],
    );
    let started = Instant::now();
    while !agent.logs().1.contains("attached pid=") {
        assert!(started.elapsed() < Duration::from_secs(60), "the agent never attached:\n{}", agent.logs().1);
        std::thread::sleep(Duration::from_millis(200));
    }
    const EXECUTED: u64 = 90;
    db.sql(&(0..EXECUTED).map(|i| format!("SELECT {i} AS compose_probe;")).collect::<String>());
    let (_, agent_log) = agent.stop();

    // The collector runs as nobody, and holds every statement.
    let collector_pid =
        String::from_utf8_lossy(&run(podman().args(["inspect", "--format", "{{.State.Pid}}", &collector.name])).stdout)
            .trim()
            .to_string();
    let status = std::fs::read_to_string(format!("/proc/{collector_pid}/status")).unwrap();
    let uid =
        status.lines().find_map(|l| l.strip_prefix("Uid:")).unwrap().split_whitespace().next().unwrap().to_string();
    assert_eq!(uid, "65534", "the collector runs unprivileged");
    let port = String::from_utf8_lossy(&run(podman().args(["port", &collector.name, "7878"])).stdout)
        .trim()
        .rsplit(':')
        .next()
        .unwrap()
        .to_string();
    let url = format!("http://127.0.0.1:{port}");
    let top = common::collector::top_json(&url, &["--limit", "100"]);
    let stored: u64 = top
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["digest_text"].as_str().is_some_and(|t| t.contains("compose_probe")))
        .map(|d| d["count"].as_u64().unwrap())
        .sum();
    assert_eq!(stored, EXECUTED, "agent:\n{agent_log}\ncollector:\n{}", collector.logs().1);
}

/// A chrooted mariadbd (the test image's root file system, unpacked, with
/// /dev and /proc mounted in it): `--pid` attaches to it, and it is
/// counted exactly. Its /proc/PID/exe names the host's path of the binary;
/// the agent reads and attaches through that link itself.
#[test]
fn a_chrooted_server_attaches_and_counts_exactly() {
    if !images_ready("a_chrooted_server_attaches_and_counts_exactly") {
        return;
    }
    let _serial = common::one_at_a_time();
    let dir = std::env::temp_dir().join(format!("sqlbee-containers-chroot-{}", std::process::id()));
    let root = dir.join("root");
    // Never delete through a mount a killed run may have left behind: that
    // would be the host's /dev.
    for m in ["dev", "proc"] {
        let _ = Command::new("umount").arg("-l").arg(root.join(m)).output();
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&dir.display().to_string()), "{} still has mounts under it", dir.display());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&root).unwrap();
    let id = String::from_utf8_lossy(&run(podman().args(["create", MARIADB_IMAGE])).stdout).trim().to_string();
    let mut export = podman().args(["export", &id]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let untar =
        Command::new("tar").arg("-x").arg("-C").arg(&root).stdin(export.stdout.take().unwrap()).status().unwrap();
    assert!(export.wait().unwrap().success() && untar.success(), "unpacking the image");
    let _ = podman().args(["rm", &id]).output();
    struct Mounted(Vec<PathBuf>, Option<std::process::Child>);
    impl Drop for Mounted {
        fn drop(&mut self) {
            if let Some(mut server) = self.1.take() {
                let _ = server.kill();
                let _ = server.wait();
            }
            for m in self.0.iter().rev() {
                let _ = Command::new("umount").arg("-l").arg(m).status();
            }
        }
    }
    let mut mounted = Mounted(Vec::new(), None);
    for (what, args) in [("dev", vec!["--bind", "/dev"]), ("proc", vec!["-t", "proc", "proc"])] {
        let target = root.join(what);
        std::fs::create_dir_all(&target).unwrap();
        run(Command::new("mount").args(&args).arg(&target));
        mounted.0.push(target);
    }
    let in_root = |args: &[&str]| Command::new("chroot").arg(&root).args(args).output().unwrap();
    // No resolver in the chroot: the install script's host name check
    // would stop it.
    let init = in_root(&[
        "mariadb-install-db",
        "--user=mysql",
        "--datadir=/var/lib/mysql",
        "--skip-test-db",
        "--skip-name-resolve",
        "--force",
    ]);
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
    std::fs::create_dir_all(root.join("run/mysqld")).unwrap();
    let chown = in_root(&["chown", "mysql:mysql", "/run/mysqld"]);
    assert!(chown.status.success());
    let server = Command::new("chroot")
        .arg(&root)
        .args([
            "mariadbd",
            "--user=mysql",
            "--datadir=/var/lib/mysql",
            "--socket=/run/mysqld/mysqld.sock",
            "--skip-networking",
            "--skip-name-resolve",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = server.id();
    mounted.1 = Some(server);
    let sql = |sql: &str| in_root(&["mariadb", "-N", "-B", "-e", sql]);
    let started = Instant::now();
    while !sql("SELECT 1").status.success() {
        assert!(started.elapsed() < Duration::from_secs(60), "the chrooted server did not start");
        std::thread::sleep(Duration::from_millis(250));
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert!(exe.starts_with(&root), "a chrooted server's exe names the host's path: {exe:?}");

    let agent = common::Agent::start(&dir, &[format!("--pid={pid}"), "--window=500ms".into()]);
    const EXECUTED: u64 = 60;
    let out = sql(&(0..EXECUTED).map(|i| format!("SELECT {i} AS chroot_probe;")).collect::<String>());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::thread::sleep(Duration::from_millis(800));
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
    let counted: u64 = out.digest_counts(None).iter().filter(|(t, _)| t.contains("chroot_probe")).map(|(_, n)| n).sum();
    assert_eq!(counted, EXECUTED, "{}", out.stderr);
    drop(mounted);
    if !std::fs::read_to_string("/proc/self/mountinfo").unwrap().contains(&dir.display().to_string()) {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// MariaDB 11.8 (Debian 13's, the newest LTS) in its container, traced by
/// the host's agent beside the suite's 10.11: text and binary protocol, a
/// statement prepared before the agent attached, errors, and a restart the
/// agent follows, each compared with the server's own counters; and a
/// prepared statement's plan, explained with the values it ran with.
#[test]
fn mariadb_11_8_is_counted_exactly_through_a_restart() {
    if !images_ready("mariadb_11_8_is_counted_exactly_through_a_restart") {
        return;
    }
    let exists =
        podman().args(["image", "exists", xtask::image::MARIADB_11_8_IMAGE]).status().is_ok_and(|s| s.success());
    assert!(exists, "{} is missing: ./x image builds it", xtask::image::MARIADB_11_8_IMAGE);
    let _serial = common::one_at_a_time();
    let db = Container::run("sqlbee-mariadb-11-8", &["-p", "127.0.0.1::3306"], xtask::image::MARIADB_11_8_IMAGE, &[]);
    db.wait_for_server();
    let version = db.sql("SELECT VERSION()");
    assert!(version.starts_with("11.8."), "{version}");
    db.sql("CREATE USER sqlbee@'%' IDENTIFIED BY 'sqlbee'; GRANT ALL ON *.* TO sqlbee@'%'; CREATE USER plans@'%' IDENTIFIED BY 'plans'; GRANT SELECT ON app.* TO plans@'%'; CREATE DATABASE app; CREATE TABLE app.t (id INT PRIMARY KEY, v INT); INSERT INTO app.t VALUES (1, 0), (2, 0), (3, 0)");
    let port: u16 = String::from_utf8_lossy(&run(podman().args(["port", &db.name, "3306"])).stdout)
        .trim()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let connect = || {
        let opts = mysql::OptsBuilder::new()
            .ip_or_hostname(Some("127.0.0.1"))
            .tcp_port(port)
            .user(Some("sqlbee"))
            .pass(Some("sqlbee"));
        mysql::Conn::new(opts).unwrap()
    };
    use mysql::prelude::Queryable;
    let mut conn = connect();
    // Prepared before the agent attaches: still named by its text.
    let early = conn.prep("UPDATE app.t SET v = v + ? WHERE id = ?").unwrap();
    let pid = || {
        String::from_utf8_lossy(&run(podman().args(["inspect", "--format", "{{.State.Pid}}", &db.name])).stdout)
            .trim()
            .to_string()
    };
    let dir = state_dir("mariadb-11-8");
    // This session's own count: the agent's EXPLAINs are prepared
    // statements too, and count in the server's global one.
    let session_executes = |conn: &mut mysql::Conn| -> u64 {
        let row: Option<(String, u64)> = conn.query_first("SHOW SESSION STATUS LIKE 'Com_stmt_execute'").unwrap();
        row.unwrap().1
    };
    let executed_before = session_executes(&mut conn);
    // Activity goes to a collector: this build's connections are read too.
    let collector = common::collector::Collector::start(&[]);
    let url = collector.http_url();
    // With the wait probes: on this CET build every probe point sits past
    // an endbr64, which the kernel would otherwise single-step.
    let agent = common::Agent::start(
        &dir,
        &[
            format!("--pid={}", pid()),
            "--window=500ms".into(),
            "--wait-probes".into(),
            format!("--collector={url}"),
            format!("--state-dir={}", dir.join("ship").display()),
            // Through the server's socket, inside the container; a login of
            // its own (the agent does not explain its own statements).
            format!("--server-login={}", common::login_file(&dir, "plans", "plans").display()),
            "--explain-rate=20".into(),
        ],
    );
    const TEXT: u64 = 80;
    const PREPARED: u64 = 65;
    const ERRORS: u64 = 7;
    let late = conn.prep("SELECT v FROM app.t WHERE id = ?").unwrap();
    for i in 0..TEXT {
        conn.query_drop(format!("SELECT {i} AS text_118")).unwrap();
    }
    for i in 0..PREPARED {
        conn.exec_drop(&early, (1, i % 3 + 1)).unwrap();
        let _: Vec<i64> = conn.exec(&late, (i % 3 + 1,)).unwrap();
    }
    for _ in 0..ERRORS {
        assert!(conn.query_drop("SELECT * FROM app.no_such_table").is_err());
    }
    // What runs now, read from this build's memory: a sleeping statement.
    let mut sleeper = connect();
    let sleeping = std::thread::spawn(move || sleeper.query_drop("SELECT SLEEP(3) AS live_118").unwrap());
    let started = Instant::now();
    loop {
        let out = common::collector::sqlbee_query(&["activity", "--format", "json", "--collector", &url]);
        let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
        let live = answer["activity"].as_array().into_iter().flatten().find(|c| {
            c["digest_text"].as_str().is_some_and(|t| t.contains("live_118")) && c["running_ms"].as_u64() >= Some(500)
        });
        if let Some(live) = live {
            assert_eq!(
                (live["command"].as_str(), live["state"].as_str()),
                (Some("Query"), Some("User sleep")),
                "{live}"
            );
            assert_eq!(live["user"], "sqlbee", "{live}");
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "11.8's activity: {answer}");
        std::thread::sleep(Duration::from_millis(300));
    }
    sleeping.join().unwrap();
    let executed = session_executes(&mut conn) - executed_before;

    // This build decodes prepared statements' values where 10.11 does: the
    // plan of the prepared SELECT is explained with the key's value.
    let mut explained_runs = 0;
    let started = Instant::now();
    loop {
        for i in 0..10 {
            let _: Vec<i64> = conn.exec(&late, (i % 3 + 1,)).unwrap();
            explained_runs += 1;
        }
        let lines = agent.lines_so_far();
        let plan = lines.iter().find(|l| {
            l["type"] == "plan"
                && l["access"].as_array().is_some_and(|a| a.iter().any(|t| t["table"] == "t" && t["key"] == "PRIMARY"))
        });
        if plan.is_some() {
            break;
        }
        let plans: Vec<&Value> = lines.iter().filter(|l| l["type"] == "plan").collect();
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no plan of the prepared SELECT on 11.8: {plans:?}\n{}",
            agent.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(conn);

    // A restart (new process, same container): the agent follows it.
    run(podman().args(["restart", "--time", "30", &db.name]));
    db.wait_for_server();
    // The agent rescans every second; on a loaded machine attaching takes
    // longer still. Statements before it attaches are not the agent's.
    let restarted = pid();
    let started = Instant::now();
    while !common::strip_ansi(&agent.stderr_text()).contains(&format!("attached pid={restarted} ")) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the restarted server was not attached:\n{}",
            agent.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    const AFTER_RESTART: u64 = 33;
    let mut conn = connect();
    for i in 0..AFTER_RESTART {
        conn.query_drop(format!("SELECT {i} AS text_118")).unwrap();
    }
    drop(conn);
    std::thread::sleep(Duration::from_millis(800));
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
    // The agent's own EXPLAINs name the statements too.
    let count = |needle: &str| -> u64 {
        let counts = out.digest_counts(None);
        counts.iter().filter(|(t, _)| t.contains(needle) && !t.starts_with("EXPLAIN")).map(|(_, n)| n).sum()
    };
    assert_eq!(executed, 2 * PREPARED, "the server's own count");
    assert_eq!(count("text_118"), TEXT + AFTER_RESTART, "{}", out.stderr);
    assert_eq!(count("SET `v` = `v` + ?"), PREPARED, "prepared before the attach: {}", out.stderr);
    assert_eq!(count("SELECT `v` FROM `app`.`t`"), PREPARED + explained_runs, "{}", out.stderr);
    let errors: u64 = out
        .of_type("digest")
        .filter(|l| l["digest_text"].as_str().is_some_and(|t| t.contains("no_such_table")))
        .map(|l| l["errors"].as_u64().unwrap())
        .sum();
    assert_eq!(errors, ERRORS, "{}", out.stderr);
    let attaches = common::strip_ansi(&out.stderr).lines().filter(|l| l.contains("attached pid=")).count();
    assert!(attaches >= 2, "the restarted server was attached again:\n{}", out.stderr);
    assert!(!out.stderr.contains("single-step"), "every probe point is emulated:\n{}", out.stderr);
    // This build's figures are read too: each point select sends and
    // examines one row, and each update changes one.
    let sum = |needle: &str, field: &str| -> u64 {
        out.of_type("digest")
            .filter(|d| d["digest_text"].as_str().is_some_and(|t| t.contains(needle) && !t.starts_with("EXPLAIN")))
            .map(|d| d[field].as_u64().unwrap_or_else(|| panic!("{field} missing in {d:#}")))
            .sum()
    };
    let selects = PREPARED + explained_runs;
    assert_eq!(sum("SELECT `v` FROM `app`.`t`", "rows_sent"), selects, "{}", out.stderr);
    assert_eq!(sum("SELECT `v` FROM `app`.`t`", "rows_examined"), selects, "{}", out.stderr);
    assert_eq!(sum("SET `v` = `v` + ?", "rows_affected"), PREPARED, "{}", out.stderr);
    assert!(sum("text_118", "cpu_statements") >= TEXT - 1, "{}", out.stderr);
    assert!(!out.stderr.contains("left out of every record"), "{}", out.stderr);
}
