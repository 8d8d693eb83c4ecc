//! Collector load: many simulated agents push realistic batches to a real
//! `sqlbee collector` (SQLite store) over gRPC; then `top` is timed over
//! the stored data. Writes `benches/results/<date>-collector-load.md`.
//!
//! `cargo bench -p sqlbee --bench collector_load -- [AGENTS] [HOURS] [WINDOW_S] [DIGESTS] [REPEATS]`
//! (defaults 100 agents, 24 h of 60 s windows, 20 digests per window, each
//! query timed 3 times). The report is named after the span, for example
//! `<date>-collector-load-168h.md` for a week. `--synchronous=normal` runs
//! the store without durable acknowledgements (`-normal` in the name), to
//! measure what durability costs. `--senders=N` (default 8) pushes from N
//! connections at once and `--max-pushes=N` sets the collector's admission
//! limit (`-senders-N-max-pushes-M` in the name), to measure what
//! admission control costs when more agents push at once than it admits.
//! `--collectors=N` (ClickHouse only) spreads the senders over N
//! collectors sharing the store and reports each one's CPU
//! (`-collectors-N` in the name).
//! `--collector-cpus=C` caps each collector at C cores while it ingests
//! (its own cgroup v1 `cpu` group with a CFS quota), so that the
//! collectors, not ClickHouse or the load generator, set the rate: run it
//! with `--collectors=1` and `--collectors=2` to see what a second replica
//! adds (`-cpus-C` in the name).
//! `--gzip` sends every batch gzip-compressed, as the agent's shipper
//! does, so the collector inflates each one (`-gzip` in the name).
//! `--store=LOCATION` stores elsewhere than a fresh SQLite file (for
//! example `clickhouse://127.0.0.1:8123/bench`); the report names it.
//! `--store=clickhouse` starts a private ClickHouse server for the run
//! (`xtask::clickhouse`, rollups settling in 5 s), reports its CPU beside
//! the collector's, and waits for the rollups (ten minutes, hours, days)
//! to be written before the queries are timed.
//! `--store=clickhouse-cluster` starts a private cluster instead
//! (`xtask::clickhouse_cluster`: two shards of two replicas and a
//! ZooKeeper) and reports every server's CPU and disk, to measure what a
//! shard and a replica cost (`-clickhouse-cluster-2x2` in the name).
//! `SQLBEE_BENCH_COLLECTOR_BIN=PATH` runs another `sqlbee` binary as the
//! collector and the CLI (an older build, to compare two builds on the
//! same data); the report names it.
//! With Debian's `chromium` installed, each web UI page is then opened over
//! the whole span and its load time read from the browser's navigation
//! timing.
use std::{
    fmt::Write as _,
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use load_batch::window;
use sqlbee_proto::v1::{AgentIdentity, Batch, ingest_client::IngestClient};

mod load_batch;

fn arg(n: usize, default: u64) -> u64 {
    std::env::args().skip(1).filter(|a| !a.starts_with('-')).nth(n).and_then(|a| a.parse().ok()).unwrap_or(default)
}

fn proc_field(pid: u32, file: &str, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(key)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

/// The process whose command line holds `path` (a server started with its
/// own directory), if any.
fn pid_with_arg(path: &std::path::Path) -> Option<u32> {
    let wanted = path.to_string_lossy().into_owned();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        (String::from_utf8_lossy(&cmdline).contains(&wanted) && !cmdline.starts_with(b"/bin/sh")).then_some(pid)
    })
}

/// One detection round over the stored data, as a collector started on
/// the store runs it: (instances judged, its wall time in ms, events
/// written), from the collector's log line; None if no round ended within
/// five minutes.
fn detection_round(location: &str, dir: &std::path::Path) -> Option<(u64, u64, u64)> {
    let log = dir.join("detect.log");
    let mut collector = Command::new(sqlbee_bin())
        .args(["collector", "--listen", "127.0.0.1:0", "--http-listen", "none", "--retention", "30d"])
        .args(["--detect-every", "10s", "--detect-window", "1h"])
        .arg(format!("--store={location}"))
        .env("SQLBEE_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).ok()?)
        .spawn()
        .ok()?;
    let started = Instant::now();
    let found = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let field = |line: &str, name: &str| {
            line.split_whitespace().find_map(|w| w.strip_prefix(name)?.trim_end_matches(',').parse::<u64>().ok())
        };
        if let Some(line) = text.lines().find(|l| l.contains("detection round") && l.contains("elapsed_ms=")) {
            break Some((
                field(line, "instances=").unwrap_or(0),
                field(line, "elapsed_ms=").unwrap_or(0),
                field(line, "events_written=").unwrap_or(0),
            ));
        }
        if started.elapsed() > Duration::from_secs(300) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    unsafe { libc::kill(collector.id() as i32, libc::SIGTERM) };
    let _ = collector.wait();
    found
}

/// The ClickHouse the bench started for the run: one server, or a
/// cluster.
enum OwnClickHouse {
    Server(xtask::clickhouse::PrivateClickHouse),
    Cluster(xtask::clickhouse_cluster::ClickHouseCluster),
}

impl OwnClickHouse {
    fn nodes(&self) -> Vec<&xtask::clickhouse::PrivateClickHouse> {
        match self {
            OwnClickHouse::Server(server) => vec![server],
            OwnClickHouse::Cluster(cluster) => cluster.nodes.iter().collect(),
        }
    }

    /// Every server process, then ZooKeeper's (a cluster's), each with a
    /// name for the report.
    fn processes(&self) -> Vec<(String, u32)> {
        let mut out: Vec<(String, u32)> = self
            .nodes()
            .iter()
            .filter_map(|node| {
                let dir = node.dir.as_ref()?;
                let name = dir.file_name()?.to_string_lossy().into_owned();
                Some((name, pid_with_arg(dir)?))
            })
            .collect();
        if let OwnClickHouse::Cluster(cluster) = self {
            let zookeeper = cluster.nodes[0].dir.as_ref().and_then(|d| pid_with_arg(&d.parent()?.join("zookeeper")));
            out.extend(zookeeper.map(|pid| ("ZooKeeper".to_string(), pid)));
        }
        out
    }

    /// Bytes of active parts per server, of every table of the run's
    /// database (a cluster's shard tables included).
    /// Bytes and rows of active parts per table, over every server.
    fn tables_on_disk(&self) -> Vec<(String, u64, u64)> {
        let sql = "SELECT table, sum(bytes_on_disk), sum(rows) FROM system.parts
                   WHERE database IN ('load', 'load_shard') AND active GROUP BY table FORMAT TSV";
        let mut out: Vec<(String, u64, u64)> = Vec::new();
        for node in self.nodes() {
            for line in node.sql(sql).unwrap_or_default().lines() {
                let f: Vec<&str> = line.split('\t').collect();
                let (Some(table), Some(bytes), Some(rows)) = (f.first(), f.get(1), f.get(2)) else { continue };
                let (bytes, rows) = (bytes.parse().unwrap_or(0), rows.parse().unwrap_or(0));
                match out.iter_mut().find(|(t, _, _)| t == table) {
                    Some(entry) => (entry.1, entry.2) = (entry.1 + bytes, entry.2 + rows),
                    None => out.push((table.to_string(), bytes, rows)),
                }
            }
        }
        out.sort_by_key(|a| std::cmp::Reverse(a.1));
        out
    }

    fn bytes_on_disk(&self) -> Vec<(String, u64)> {
        let sql = "SELECT sum(bytes_on_disk) FROM system.parts WHERE database IN ('load', 'load_shard') AND active";
        self.nodes()
            .iter()
            .map(|node| {
                let name = node.dir.as_ref().and_then(|d| d.file_name()).map(|n| n.to_string_lossy().into_owned());
                let bytes = node.sql(sql).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
                (name.unwrap_or_else(|| node.host_port.clone()), bytes)
            })
            .collect()
    }
}

fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rfind(')').map(|i| &stat[i + 1..]).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15; `rest` starts at field 3.
    let field = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let ticks = field(11) + field(12);
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// One attribute of a dumped page.
fn attribute(dom: &str, name: &str) -> Option<f64> {
    let start = dom.find(&format!("{name}=\""))? + name.len() + 2;
    dom[start..start + dom[start..].find('"')?].parse().ok()
}

/// Opens each UI page over the whole span `repeats` times in headless
/// Chromium; table rows of response and load times.
fn page_timings(ui: &str, hours: u64, repeats: usize, dir: &std::path::Path) -> String {
    if ui.is_empty() || !std::path::Path::new("/usr/bin/chromium").exists() {
        return String::new();
    }
    let span = format!("since={hours}h");
    let mut rows = String::new();
    for (label, path) in [
        ("fleet", format!("?{span}")),
        ("top digests (50 rows, a sparkline each)", format!("top?{span}")),
        ("top digests by p99", format!("top?{span}&order=p99")),
        ("one digest", format!("digest?{span}&id=9e3779b97f4a7c15")),
        ("lock waits", format!("locks?{span}")),
        ("hosts", format!("hosts?{span}")),
        ("agent cost", format!("cost?{span}")),
    ] {
        let mut response = Vec::new();
        let mut load = Vec::new();
        for _ in 0..repeats {
            let out = Command::new("/usr/bin/chromium")
                .args(["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=120000", "--dump-dom"])
                .arg(format!("--user-data-dir={}", dir.join("chromium").display()))
                .arg(format!("{ui}{path}"))
                .stderr(Stdio::null())
                .output()
                .unwrap();
            let dom = String::from_utf8_lossy(&out.stdout);
            if let (Some(r), Some(l)) = (attribute(&dom, "data-response-ms"), attribute(&dom, "data-load-ms")) {
                response.push(r);
                load.push(l);
            }
        }
        if load.is_empty() {
            let _ = writeln!(rows, "| {label} | no timing (page did not load) | | |");
            continue;
        }
        response.sort_by(|a, b| a.total_cmp(b));
        load.sort_by(|a, b| a.total_cmp(b));
        let _ = writeln!(
            rows,
            "| {label} | {:.0} | {:.0} | {:.0} |",
            response[response.len() / 2],
            load[load.len() / 2],
            load[load.len() - 1]
        );
    }
    rows
}

/// A CPU cap on one process: a cgroup v1 `cpu` group of its own with a CFS
/// quota (this host has the v1 controller, see the shared platform notes).
/// Dropping it moves the process back and removes the group.
struct CpuCap {
    dir: std::path::PathBuf,
    parent: std::path::PathBuf,
    pid: u32,
}

impl CpuCap {
    const PERIOD_US: f64 = 100_000.0;

    /// The quota per period for `cores` (the kernel takes 1 ms at least).
    fn quota_us(cores: f64) -> f64 {
        (cores * Self::PERIOD_US).round().max(1000.0)
    }

    fn new(pid: u32, cores: f64, n: usize) -> CpuCap {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let relative = own
            .lines()
            .find_map(|line| {
                let mut fields = line.splitn(3, ':');
                let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
                controllers.split(',').any(|c| c == "cpu").then(|| path.trim_start_matches('/').to_string())
            })
            .expect("--collector-cpus needs the cgroup v1 cpu controller");
        let parent = std::path::Path::new("/sys/fs/cgroup/cpu").join(relative);
        let dir = parent.join(format!("sqlbee-collector-load-{}-{n}", std::process::id()));
        let write = |file: &str, value: String| {
            std::fs::write(dir.join(file), &value)
                .unwrap_or_else(|e| panic!("writing {value} to {file} in {}: {e}", dir.display()))
        };
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("creating {} (--collector-cpus needs root): {e}", dir.display()));
        write("cpu.cfs_period_us", format!("{}", Self::PERIOD_US));
        write("cpu.cfs_quota_us", format!("{}", Self::quota_us(cores)));
        write("cgroup.procs", pid.to_string());
        CpuCap { dir, parent, pid }
    }
}

impl Drop for CpuCap {
    fn drop(&mut self) {
        // An exited process has left already.
        let _ = std::fs::write(self.parent.join("cgroup.procs"), self.pid.to_string());
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The `sqlbee` binary the run measures: this build's unless
/// `SQLBEE_BENCH_COLLECTOR_BIN` names another.
fn sqlbee_bin() -> std::path::PathBuf {
    std::env::var_os("SQLBEE_BENCH_COLLECTOR_BIN").map_or_else(|| env!("CARGO_BIN_EXE_sqlbee").into(), Into::into)
}

fn main() {
    let (agents, hours, window_s, digests) = (arg(0, 100), arg(1, 24), arg(2, 60), arg(3, 20));
    let repeats = arg(4, 3).max(1) as usize;
    let normal = std::env::args().any(|a| a == "--synchronous=normal");
    let option = |name: &str| std::env::args().find_map(|a| a.strip_prefix(name)?.parse::<u64>().ok());
    let senders = option("--senders=").unwrap_or(8).max(1);
    let max_pushes = option("--max-pushes=");
    let collectors = option("--collectors=").unwrap_or(1).max(1) as usize;
    let gzip = std::env::args().any(|a| a == "--gzip");
    let cpu_cap =
        std::env::args().find_map(|a| a.strip_prefix("--collector-cpus=")?.parse::<f64>().ok()).filter(|c| *c > 0.0);
    let store_options = if normal { "?synchronous=normal" } else { "" };
    let mut store_location = std::env::args().find_map(|a| a.strip_prefix("--store=").map(str::to_string));
    let clickhouse = match store_location.as_deref() {
        Some("clickhouse") => {
            let server = xtask::clickhouse::PrivateClickHouse::private("collector_load").expect("a private ClickHouse");
            store_location = Some(format!("{}?rollup_settle_s=5", server.location("load")));
            Some(OwnClickHouse::Server(server))
        }
        Some("clickhouse-cluster") => {
            let cluster = xtask::clickhouse_cluster::ClickHouseCluster::private("collector_load")
                .expect("a private ClickHouse cluster");
            store_location = Some(format!("{}&rollup_settle_s=5", cluster.location("load")));
            Some(OwnClickHouse::Cluster(cluster))
        }
        _ => None,
    };
    let clickhouse_pids: Vec<(String, u32)> = clickhouse.as_ref().map(OwnClickHouse::processes).unwrap_or_default();
    let clickhouse_cpu_now = || -> Vec<f64> { clickhouse_pids.iter().map(|(_, pid)| cpu_seconds(*pid)).collect() };
    let dir = std::env::temp_dir().join(format!("sqlbee-collector-load-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // A collector on `location`; its gRPC URL and UI URL once it is ready.
    let start_collector = |location: &str| {
        let ready = dir.join("ready");
        let ui_ready = dir.join("ui-ready");
        let _ = std::fs::remove_file(&ready);
        let _ = std::fs::remove_file(&ui_ready);
        let collector = Command::new(sqlbee_bin())
            // Detection is timed on its own, after the ingest and the queries.
            .args(["collector", "--listen", "127.0.0.1:0", "--retention", "30d", "--detect-every", "off"])
            .arg(format!("--store={location}"))
            .arg("--ready-file")
            .arg(&ready)
            .args(["--http-listen", "127.0.0.1:0", "--http-ready-file"])
            .arg(&ui_ready)
            .args(max_pushes.map(|n| format!("--max-pushes-in-flight={n}")))
            // Every sender is on loopback: one address.
            .arg(format!("--max-pushes-per-address={}", max_pushes.unwrap_or(senders).max(senders)))
            .env("SQLBEE_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        while std::fs::read_to_string(&ready).map(|s| s.trim().is_empty()).unwrap_or(true) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let url = format!("http://{}", std::fs::read_to_string(&ready).unwrap().trim());
        let ui = std::fs::read_to_string(&ui_ready).unwrap_or_default().trim().to_string();
        (collector, url, ui)
    };
    let location =
        store_location.clone().unwrap_or_else(|| format!("sqlite:{}{store_options}", dir.join("store.db").display()));
    // On ClickHouse the rollup pass waits until the ingest is over (a day
    // arriving in minutes would be rolled again and again, as no live
    // fleet's is), so the ingest's cost and the rollups' are told apart.
    let ingest_location = match &clickhouse {
        Some(_) => location.replace("rollup_settle_s=5", "rollup_settle_s=4000000000"),
        None => {
            assert_eq!(
                collectors, 1,
                "--collectors=N shares one store among N collectors: use --store=clickhouse or clickhouse-cluster"
            );
            location.clone()
        }
    };
    let (mut collector, url, _) = start_collector(&ingest_location);
    let pid = collector.id();
    // With --collectors=N the senders are spread over N collectors of one
    // store, as agents would be; each one's CPU is read on its own.
    let others: Vec<(std::process::Child, String)> = (1..collectors)
        .map(|_| {
            let (child, url, _) = start_collector(&ingest_location);
            (child, url)
        })
        .collect();
    let urls: Vec<String> = std::iter::once(url.clone()).chain(others.iter().map(|(_, url)| url.clone())).collect();
    let pids: Vec<u32> = std::iter::once(pid).chain(others.iter().map(|(child, _)| child.id())).collect();
    let caps: Vec<CpuCap> = cpu_cap
        .map(|cores| pids.iter().enumerate().map(|(n, &pid)| CpuCap::new(pid, cores, n)).collect())
        .unwrap_or_default();
    let per_collector: Arc<Vec<AtomicU64>> = Arc::new((0..collectors).map(|_| AtomicU64::new(0)).collect());
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    let windows_per_agent = hours * 3600 / window_s;
    // Each batch carries 10 windows of one agent (about 100 s of a real
    // agent with 10 s windows).
    const WINDOWS_PER_BATCH: u64 = 10;
    let batches_per_agent = windows_per_agent.div_ceil(WINDOWS_PER_BATCH);
    println!("{agents} agents x {windows_per_agent} windows x {digests} digests -> {url}");

    let rows = Arc::new(AtomicU64::new(0));
    let batches = Arc::new(AtomicU64::new(0));
    let busy = Arc::new(AtomicU64::new(0));
    let cpu0: Vec<f64> = pids.iter().map(|&pid| cpu_seconds(pid)).collect();
    let clickhouse_cpu0 = clickhouse_cpu_now();
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let mut tasks = Vec::new();
        // Concurrent senders, each owning a slice of the agents.
        for lane in 0..senders {
            let target = lane as usize % collectors;
            let (url, rows, batches, busy) = (urls[target].clone(), rows.clone(), batches.clone(), busy.clone());
            let per_collector = per_collector.clone();
            tasks.push(tokio::spawn(async move {
                let mut client = IngestClient::connect(url).await.unwrap().max_encoding_message_size(64 << 20);
                if gzip {
                    client = client.send_compressed(tonic::codec::CompressionEncoding::Gzip);
                }
                let mut seed = 0x2545_f491_4f6c_dd1du64 ^ lane;
                for b in 0..batches_per_agent {
                    for agent in (lane..agents).step_by(senders as usize) {
                        let windows: Vec<_> = (0..WINDOWS_PER_BATCH)
                            .map(|w| b * WINDOWS_PER_BATCH + w)
                            .filter(|w| *w < windows_per_agent)
                            .map(|w| {
                                let end = now_ms - ((windows_per_agent - w) as i64) * window_s as i64 * 1000;
                                window(agent, end, window_s as i64 * 1000, digests, &mut seed)
                            })
                            .collect();
                        let n: u64 = windows.iter().map(|w| w.digests.len() as u64).sum();
                        let mut batch = Batch {
                            agent: Some(AgentIdentity {
                                host: format!("host{agent}"),
                                agent_id: format!("load-{agent}"),
                                version: "load".into(),
                            }),
                            sequence: b + 1,
                            created_unix_ms: now_ms,
                            epoch: 0,
                            windows,
                            gaps: vec![],
                            agent_windows: vec![],
                            content_hash: 0,
                        };
                        // As a current agent does (a collector from before
                        // the field ignores it and hashes the batch itself).
                        batch.content_hash = sqlbee_proto::content_hash(&batch);
                        // As an agent does: a busy collector is asked again.
                        loop {
                            match client.push(batch.clone()).await {
                                Ok(_) => break,
                                Err(s) if s.code() == tonic::Code::ResourceExhausted => {
                                    busy.fetch_add(1, Ordering::Relaxed);
                                    tokio::time::sleep(Duration::from_millis(5)).await
                                }
                                Err(s) => panic!("push failed: {s:?}"),
                            }
                        }
                        rows.fetch_add(n, Ordering::Relaxed);
                        batches.fetch_add(1, Ordering::Relaxed);
                        per_collector[target].fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let elapsed = started.elapsed().as_secs_f64();
    let cpus: Vec<f64> = pids.iter().zip(&cpu0).map(|(&pid, before)| cpu_seconds(pid) - before).collect();
    let cpu: f64 = cpus.iter().sum();
    // The rollups and the queries run uncapped.
    drop(caps);
    for (mut child, _) in others {
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let _ = child.wait();
    }
    let clickhouse_cpus: Vec<f64> = clickhouse_cpu_now().iter().zip(&clickhouse_cpu0).map(|(a, b)| a - b).collect();
    let clickhouse_cpu: f64 = clickhouse_cpus.iter().sum();
    // The hours that ended before the rollups' cutoff are rolled up by the
    // collector's pass; the queries are timed once they are.
    let (collector, url, ui, pid) = if clickhouse.is_some() {
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        let _ = collector.wait();
        let (collector, url, ui) = start_collector(&location);
        let pid = collector.id();
        (collector, url, ui, pid)
    } else {
        let ui = std::fs::read_to_string(dir.join("ui-ready")).unwrap_or_default().trim().to_string();
        (collector, url, ui, pid)
    };
    let mut collector = collector;
    // A cluster's replicas fetch their parts after the insert: the
    // queries are timed once every replica holds every part.
    if let Some(OwnClickHouse::Cluster(cluster)) = &clickhouse {
        cluster.wait_replicated(Duration::from_secs(600)).expect("the replicas catch up");
    }
    let rolled = clickhouse.as_ref().map(|server| {
        let waited = Instant::now();
        let (cpu_before, hours_due) = (cpu_seconds(pid), hours.saturating_sub(1));
        let server_before: f64 = clickhouse_cpu_now().iter().sum();
        let server = server.nodes()[0];
        // Buckets marked per level: ten minutes, hours, days.
        let marks = || -> [u64; 3] {
            let mut out = [0; 3];
            let answer = server
                .sql("SELECT level, uniqExact(bucket) FROM load.rollup_marks GROUP BY level FORMAT TSV")
                .unwrap_or_default();
            for line in answer.lines() {
                let mut fields = line.split('\t').map(|f| f.parse::<u64>().unwrap_or(0));
                let (level, n) = (fields.next().unwrap_or(0), fields.next().unwrap_or(0));
                if let Some(slot) = [600_000, 3_600_000, 86_400_000].iter().position(|&l| l == level) {
                    out[slot] = n;
                }
            }
            out
        };
        // Done once the hours are in and no mark came for longer than two
        // pass intervals (days are rolled last).
        let (mut seen, mut last_change) = (marks(), Instant::now());
        while waited.elapsed() < Duration::from_secs(1800) {
            std::thread::sleep(Duration::from_secs(2));
            let now = marks();
            if now != seen {
                (seen, last_change) = (now, Instant::now());
            } else if seen[1] >= hours_due && last_change.elapsed() > Duration::from_secs(65) {
                break;
            }
        }
        let server_cpu = clickhouse_cpu_now().iter().sum::<f64>() - server_before;
        (seen, (last_change - waited).as_secs_f64(), cpu_seconds(pid) - cpu_before, server_cpu)
    });
    let rss_kib = proc_field(pid, "status", "VmHWM:");
    let (rows, batches) = (rows.load(Ordering::Relaxed), batches.load(Ordering::Relaxed));
    let db_bytes: u64 =
        std::fs::read_dir(&dir).unwrap().flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum();

    let mut timings = String::new();
    for (label, extra) in [
        ("top, all instances, order by total", vec!["--order-by", "total"]),
        ("top, all instances, order by p99", vec!["--order-by", "p99"]),
        ("top, one instance", vec!["--instance", "db7:3306"]),
        ("top, last 7 days", vec!["--since", "7d"]),
        ("top, last 7 days, order by p99", vec!["--since", "7d", "--order-by", "p99"]),
        ("top, last 24 hours", vec!["--since", "24h"]),
        ("top, last hour", vec!["--since", "1h"]),
        ("diff, last 7 days against the 7 before", vec!["diff", "--after", "7d..now", "--before", "14d..7d"]),
        ("diff, last 84 h against the 84 before", vec!["diff", "--after", "84h..now", "--before", "168h..84h"]),
        ("diff, last hour against the hour a day before", vec!["diff"]),
        ("series, every statement, 7 days by the hour", vec!["series", "--since", "7d", "--step", "1h"]),
        (
            "series, one digest, 24 hours by the minute",
            vec!["series", "--since", "24h", "--step", "1m", "--digest", "9e3779b97f4a7c15"],
        ),
    ] {
        let mut runs = Vec::new();
        let mut failure = None;
        for _ in 0..repeats {
            let t = Instant::now();
            let (command, extra) = match extra.split_first() {
                Some((&"series", rest)) => ("series", rest),
                Some((&"diff", rest)) => ("diff", rest),
                _ => ("top", extra.as_slice()),
            };
            let mut args = vec![command, "--collector", &url, "--format", "json"];
            if command == "top" {
                args.extend(["--limit", "20"]);
            }
            if command != "diff" && !extra.contains(&"--since") {
                args.extend(["--since", "all"]);
            }
            args.extend(extra.iter().copied());
            let out = Command::new(sqlbee_bin()).args(&args).output().unwrap();
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            // A query past the client's deadline is a result too: say so
            // and go on with the others.
            if !out.status.success() {
                let stderr = String::from_utf8_lossy(&out.stderr);
                let why = stderr.lines().find(|l| l.contains("answered")).or(stderr.lines().next()).unwrap_or("");
                failure = Some(format!("failed after {ms:.0} ms: {}", why.trim()));
                break;
            }
            runs.push(ms);
        }
        runs.sort_by(|a, b| a.total_cmp(b));
        match failure {
            Some(why) => {
                let _ = writeln!(timings, "| {label} | {why} | |");
            }
            None => {
                let _ = writeln!(timings, "| {label} | {:.0} | {:.0} |", runs[runs.len() / 2], runs[runs.len() - 1]);
            }
        }
    }
    let pages = page_timings(&ui, hours, repeats, &dir);
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let _ = collector.wait();
    let detection = detection_round(&location, &dir);
    let _ = std::fs::remove_dir_all(&dir);

    let mut md = String::new();
    let _ = writeln!(md, "# Collector load\n");
    let _ = writeln!(
        md,
        "{agents} simulated agents, {hours} h of {window_s} s windows each ({windows_per_agent} windows per agent), \
         {digests} digests per window, {WINDOWS_PER_BATCH} windows per batch{}, {senders} concurrent gRPC senders, \
         admission limit {} pushes in flight, {}, {} cores shared by the load generator and the collector.\n",
        if gzip { " sent gzip-compressed as the agent sends them" } else { " sent uncompressed" },
        max_pushes.map_or("8 (default)".to_string(), |n| n.to_string()),
        match &store_location {
            Some(location) => format!("store `{}`", location.split('?').next().unwrap_or("")),
            None => format!(
                "SQLite store (WAL, synchronous={})",
                if normal { "NORMAL" } else { "FULL, durable acknowledgements" }
            ),
        },
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );
    if std::env::var_os("SQLBEE_BENCH_COLLECTOR_BIN").is_some() {
        let _ = writeln!(md, "Collector and CLI binary: `{}`.\n", sqlbee_bin().display());
    }
    if let Some(cores) = cpu_cap {
        let _ = writeln!(
            md,
            "Each collector was capped at {cores} cores while it ingested (a cgroup v1 CFS quota of {} us per {} us); \
             the rollups and the queries ran uncapped.\n",
            CpuCap::quota_us(cores),
            CpuCap::PERIOD_US
        );
    }
    let _ = writeln!(md, "| measure | value |\n|---|---|");
    let _ = writeln!(md, "| batches stored | {batches} |");
    let _ = writeln!(md, "| digest rows stored | {rows} |");
    let _ = writeln!(md, "| wall time | {elapsed:.1} s |");
    let _ = writeln!(md, "| batches/s | {:.0} |", batches as f64 / elapsed);
    let _ = writeln!(md, "| RESOURCE_EXHAUSTED answers (retried) | {} |", busy.load(Ordering::Relaxed));
    let _ = writeln!(md, "| batches per collector core-second | {:.0} |", batches as f64 / cpu.max(0.001));
    if collectors > 1 {
        let each: Vec<String> = cpus
            .iter()
            .zip(per_collector.iter())
            .map(|(cpu, n)| {
                let n = n.load(Ordering::Relaxed);
                format!("{n} batches, {cpu:.1} s CPU ({:.0} per core-second)", n as f64 / cpu.max(0.001))
            })
            .collect();
        let _ = writeln!(md, "| collectors sharing the store, each | {} |", each.join("; "));
    }
    let _ = writeln!(md, "| digest rows/s | {:.0} |", rows as f64 / elapsed);
    let _ = writeln!(md, "| collector CPU | {cpu:.1} s ({:.2} cores) |", cpu / elapsed);
    let _ = writeln!(md, "| digest rows/s per collector core-second | {:.0} |", rows as f64 / cpu.max(0.001));
    let _ = writeln!(md, "| collector peak RSS | {:.1} MiB |", rss_kib as f64 / 1024.0);
    match &clickhouse {
        Some(own) if !clickhouse_pids.is_empty() => {
            let _ = writeln!(
                md,
                "| ClickHouse server CPU | {clickhouse_cpu:.1} s ({:.2} cores) |",
                clickhouse_cpu / elapsed
            );
            if clickhouse_pids.len() > 1 {
                let each: Vec<String> = clickhouse_pids
                    .iter()
                    .zip(&clickhouse_cpus)
                    .map(|((name, _), cpu)| {
                        format!("{name} {cpu:.1} s ({:.2} ms per batch)", cpu * 1000.0 / batches as f64)
                    })
                    .collect();
                let _ = writeln!(md, "| ClickHouse CPU per process (s: shard, r: replica) | {} |", each.join("; "));
            }
            let _ = writeln!(
                md,
                "| batches per core-second, collector and ClickHouse together | {:.0} |",
                batches as f64 / (cpu + clickhouse_cpu).max(0.001)
            );
            let bytes = own.bytes_on_disk();
            let total: u64 = bytes.iter().map(|(_, b)| b).sum();
            let _ = writeln!(md, "| store size on disk | {:.1} MiB |", total as f64 / (1 << 20) as f64);
            if bytes.len() > 1 {
                let each: Vec<String> =
                    bytes.iter().map(|(name, b)| format!("{name} {:.1} MiB", *b as f64 / (1 << 20) as f64)).collect();
                let _ = writeln!(md, "| store size on disk per server | {} |", each.join("; "));
            }
            let tables: Vec<String> = own
                .tables_on_disk()
                .iter()
                .take(6)
                .map(|(table, bytes, rows)| {
                    format!(
                        "{table} {:.1} MiB, {rows} rows ({:.0} B/row)",
                        *bytes as f64 / (1 << 20) as f64,
                        *bytes as f64 / (*rows).max(1) as f64
                    )
                })
                .collect();
            let _ = writeln!(md, "| largest tables on disk, every server | {} |", tables.join("; "));
        }
        _ => {
            let _ = writeln!(md, "| store size on disk | {:.1} MiB |", db_bytes as f64 / (1 << 20) as f64);
        }
    }
    match detection {
        Some((instances, ms, events)) => {
            let _ = writeln!(
                md,
                "| one detection round (a collector started on the store, `--detect-window 1h`, the baseline a day \
                 earlier) | {ms} ms over {instances} instances, {events} events written |"
            );
        }
        None => {
            let _ = writeln!(md, "| one detection round | none within 5 minutes |");
        }
    }
    if let Some(([tens, hours, days], waited, cpu, server_cpu)) = rolled {
        let _ = writeln!(
            md,
            "| rollups written after the ingest (by a collector started then) | {tens} ten-minute, {hours} hour and \
             {days} day buckets in {waited:.0} s (collector CPU {cpu:.1} s, ClickHouse CPU {server_cpu:.1} s, \
             both until 65 s after the last mark) |"
        );
    }
    let _ = writeln!(
        md,
        "\n`sqlbee top` and `sqlbee series` wall time over the stored data (the CLI process included; median and max of {repeats}):\n"
    );
    let _ = writeln!(md, "| query | median ms | max ms |\n|---|---|---|\n{timings}");
    if !pages.is_empty() {
        let _ = writeln!(
            md,
            "Web UI pages over the whole span in headless Chromium: the browser's navigation timing, from \
             navigation start to the response's end and to the end of the load event (median and max of {repeats}):\n"
        );
        let _ = writeln!(
            md,
            "| page | response ms (median) | load ms (median) | load ms (max) |\n|---|---|---|---|\n{pages}"
        );
    }
    println!("{md}");
    let date = String::from_utf8(Command::new("date").arg("+%Y-%m-%d").output().unwrap().stdout).unwrap();
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/results");
    std::fs::create_dir_all(&out).unwrap();
    let mut mode = if normal { "-normal" } else { "" }.to_string();
    if let Some(location) = &store_location {
        mode += &format!("-{}", location.split(':').next().unwrap_or("store"));
        if let Some(OwnClickHouse::Cluster(_)) = &clickhouse {
            mode += &format!("-cluster-{}x{}", xtask::clickhouse_cluster::SHARDS, xtask::clickhouse_cluster::REPLICAS);
        }
        // A server the bench did not start has its own history: its results
        // never replace those of the bench's private server.
        if clickhouse.is_none() {
            mode += "-external";
        }
    }
    if collectors > 1 {
        mode += &format!("-collectors-{collectors}");
    }
    if senders != 8 || max_pushes.is_some() {
        mode += &format!("-senders-{senders}-max-pushes-{}", max_pushes.unwrap_or(8));
    }
    if let Some(cores) = cpu_cap {
        mode += &format!("-cpus-{cores}");
    }
    if gzip {
        mode += "-gzip";
    }
    std::fs::write(out.join(format!("{}-collector-load-{hours}h{mode}.md", date.trim())), md).unwrap();
}
