//! Fixture procfs/sysfs trees with hand-computed deltas, and one sanity
//! check against this machine's real /proc.
use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use super::*;

/// A proc root and a sys root under a directory removed when dropped.
struct Fixture {
    dir: PathBuf,
}

impl Fixture {
    fn new(name: &str) -> Fixture {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "sqlbee-host-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("proc/net")).unwrap();
        Fixture { dir }
    }

    fn proc(&self) -> PathBuf {
        self.dir.join("proc")
    }

    fn sys(&self) -> PathBuf {
        self.dir.join("sys")
    }

    fn write(&self, path: &str, text: &str) {
        let path = self.dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// The host files of one sample.
    fn host(&self, stat: &str, diskstats: &str, net_dev: &str) {
        self.write("proc/stat", stat);
        self.write("proc/meminfo", MEMINFO);
        self.write("proc/loadavg", "0.52 0.58 0.59 2/345 12345\n");
        self.write("proc/diskstats", diskstats);
        self.write("proc/net/dev", net_dev);
    }

    fn sampler(&self) -> HostSampler {
        let mut sampler = HostSampler::new(self.proc(), self.sys());
        sampler.ticks_per_second = 100;
        sampler.processes.set_units(100, 4096);
        sampler
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

const STAT_1: &str = "\
cpu  10000 200 3000 50000 400 50 60 10 0 0
cpu0 5000 100 1500 25000 200 25 30 5 0 0
cpu1 5000 100 1500 25000 200 25 30 5 0 0
intr 123456 0 0 0
ctxt 987654
btime 1700000000
processes 4321
procs_running 2
procs_blocked 0
softirq 1000 0 1 2
";

// 2 cores x 2 s x 100 ticks = 400 ticks spread over the modes.
const STAT_2: &str = "\
cpu  10150 210 3050 50170 410 54 64 12 0 0
cpu0 5075 105 1525 25085 205 27 32 6 0 0
cpu1 5075 105 1525 25085 205 27 32 6 0 0
intr 123999 0 0 0
ctxt 999999
btime 1700000000
processes 4330
procs_running 1
procs_blocked 0
softirq 1100 0 1 2
";

const MEMINFO: &str = "\
MemTotal:       16303428 kB
MemFree:         1234567 kB
MemAvailable:    8765432 kB
Buffers:          234567 kB
Cached:          5432100 kB
SwapCached:            0 kB
Active:          7000000 kB
SwapTotal:       2097148 kB
SwapFree:        2000000 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
";

const DISKSTATS_1: &str = "\
   7       0 loop0 10 0 20 0 0 0 0 0 0 0 0 0 0 0 0 0 0
   1       0 ram0 0 0 0 0 0 0 0 0 0 0 0
   8       0 sda 1000 10 80000 500 2000 20 160000 900 0 1500 1400 0 0 0 0 0 0
   8       1 sda1 900 10 70000 450 1900 20 150000 850 0 1400 1300 0 0 0 0 0 0
 259       0 nvme0n1 500 0 4000 100 600 0 8000 200 0 300 300 0 0 0 0
 259       1 nvme0n1p1 500 0 4000 100 600 0 8000 200 0 300 300 0 0 0 0
 253       0 zram0 5 0 40 0 5 0 40 0 0 0 0 0 0 0 0 0 0
";

// sda: 150 reads of 2048 sectors (1 MiB), 300 writes of 4096 sectors
// (2 MiB), 750 ms busy. nvme0n1: idle.
const DISKSTATS_2: &str = "\
   7       0 loop0 99 0 990 0 0 0 0 0 0 0 0 0 0 0 0 0 0
   1       0 ram0 0 0 0 0 0 0 0 0 0 0 0
   8       0 sda 1150 12 82048 600 2300 25 164096 1000 1 2250 2000 0 0 0 0 0 0
   8       1 sda1 1050 12 72048 550 2200 25 154096 950 1 2150 1900 0 0 0 0 0 0
 259       0 nvme0n1 500 0 4000 100 600 0 8000 200 0 300 300 0 0 0 0
 259       1 nvme0n1p1 500 0 4000 100 600 0 8000 200 0 300 300 0 0 0 0
 253       0 zram0 9 0 80 0 9 0 80 0 0 0 0 0 0 0 0 0 0
";

const NET_HEADER: &str = "\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
";

fn net_dev(lines: &str) -> String {
    format!("{NET_HEADER}{lines}")
}

const NET_1: &str = "\
    lo: 1000 10 0 0 0 0 0 0 1000 10 0 0 0 0 0 0
  eth0: 500000 4000 1 2 0 0 0 10 250000 3000 0 1 0 0 0 0
 wlan0:100 1 0 0 0 0 0 0 200 2 0 0 0 0 0 0
";

// eth0: +1 MB in 800 packets, +1 error, +3 drops; +64 KiB out in 100
// packets, +2 drops. wlan0 (name glued to its first number): +50/+1, +70/+1.
const NET_2: &str = "\
    lo: 9000 90 0 0 0 0 0 0 9000 90 0 0 0 0 0 0
  eth0: 1500000 4800 2 5 0 0 0 10 315536 3100 0 3 0 0 0 0
 wlan0:150 2 0 0 0 0 0 0 270 3 0 0 0 0 0 0
";

/// /proc/PID/stat with the fields the sampler reads set; the rest are
/// plausible constants.
fn proc_stat(pid: u32, comm: &str, utime: u64, stime: u64, threads: u64, start: u64, rss_pages: u64) -> String {
    format!(
        "{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 8812 0 3 0 {utime} {stime} 0 0 20 0 {threads} 0 {start} \
         2147483648 {rss_pages} 18446744073709551615 1 1 0 0 0 0 0 4096 1 0 0 0 17 1 0 0 0 0 0\n"
    )
}

fn proc_io(read_bytes: u64, write_bytes: u64) -> String {
    format!(
        "rchar: 99999999\nwchar: 88888888\nsyscr: 1000\nsyscw: 2000\nread_bytes: {read_bytes}\n\
         write_bytes: {write_bytes}\ncancelled_write_bytes: 0\n"
    )
}

fn sys_block(fixture: &Fixture, partitions: &[&str], disks: &[&str]) {
    for disk in disks {
        std::fs::create_dir_all(fixture.sys().join("class/block").join(disk)).unwrap();
    }
    for part in partitions {
        fixture.write(&format!("sys/class/block/{part}/partition"), "1\n");
    }
}

#[test]
fn first_sample_has_gauges_but_no_deltas() {
    let fixture = Fixture::new("first");
    fixture.host(STAT_1, DISKSTATS_1, &net_dev(NET_1));
    let metrics = fixture.sampler().sample(&[]).unwrap();
    assert_eq!(metrics.interval_seconds, None);
    assert_eq!(metrics.cpu, CpuMetrics { online_cores: 2, busy: None });
    assert_eq!(
        metrics.memory,
        MemoryInfo {
            total_bytes: 16303428 * 1024,
            available_bytes: Some(8765432 * 1024),
            free_bytes: 1234567 * 1024,
            buffers_bytes: 234567 * 1024,
            cached_bytes: 5432100 * 1024,
            swap_total_bytes: 2097148 * 1024,
            swap_free_bytes: 2000000 * 1024,
        }
    );
    assert_eq!(metrics.load, LoadAverage { one: 0.52, five: 0.58, fifteen: 0.59 });
    assert!(metrics.disks.is_empty() && metrics.interfaces.is_empty());
    assert_eq!(metrics.truncated, Truncated::default());
    assert_eq!(metrics.skipped_lines, 0);
}

#[test]
fn second_sample_reports_exact_deltas() {
    let fixture = Fixture::new("deltas");
    sys_block(&fixture, &["sda1", "nvme0n1p1"], &["sda", "nvme0n1", "loop0", "ram0", "zram0"]);
    let mut sampler = fixture.sampler();
    let t0 = Instant::now();
    fixture.host(STAT_1, DISKSTATS_1, &net_dev(NET_1));
    sampler.sample_at(t0, &[]).unwrap();
    fixture.host(STAT_2, DISKSTATS_2, &net_dev(NET_2));
    let metrics = sampler.sample_at(t0 + Duration::from_secs(2), &[]).unwrap();

    assert_eq!(metrics.interval_seconds, Some(2.0));
    let busy = metrics.cpu.busy.expect("cpu rates on the second sample");
    let expected = [
        (busy.user, 0.75),
        (busy.nice, 0.05),
        (busy.system, 0.25),
        (busy.idle, 0.85),
        (busy.iowait, 0.05),
        (busy.irq, 0.02),
        (busy.softirq, 0.02),
        (busy.steal, 0.01),
    ];
    for (i, (got, want)) in expected.iter().enumerate() {
        assert!(close(*got, *want), "mode {i}: {got} != {want}");
    }

    assert_eq!(
        metrics.disks,
        vec![
            DiskIo {
                device: "sda".into(),
                reads: 150,
                writes: 300,
                read_bytes: 1 << 20,
                write_bytes: 2 << 20,
                io_time_ms: 750
            },
            DiskIo { device: "nvme0n1".into(), reads: 0, writes: 0, read_bytes: 0, write_bytes: 0, io_time_ms: 0 },
        ]
    );
    assert_eq!(
        metrics.interfaces,
        vec![
            NetIo {
                interface: "eth0".into(),
                rx_bytes: 1_000_000,
                rx_packets: 800,
                rx_errors: 1,
                rx_drops: 3,
                tx_bytes: 65536,
                tx_packets: 100,
                tx_errors: 0,
                tx_drops: 2
            },
            NetIo {
                interface: "wlan0".into(),
                rx_bytes: 50,
                rx_packets: 1,
                rx_errors: 0,
                rx_drops: 0,
                tx_bytes: 70,
                tx_packets: 1,
                tx_errors: 0,
                tx_drops: 0
            },
        ]
    );
}

#[test]
fn partitions_are_recognised_by_name_without_sysfs() {
    let fixture = Fixture::new("nosys");
    // No sys/class/block in this fixture.
    let kept: Vec<String> = disk::read(DISKSTATS_1, &fixture.sys()).kept.into_iter().map(|(n, _)| n).collect();
    assert_eq!(kept, ["sda", "nvme0n1"]);
}

#[test]
fn malformed_lines_are_skipped_and_counted() {
    let fixture = Fixture::new("malformed");
    let stat = format!("{STAT_1}cpu2 12 x 3\n");
    let diskstats = format!("{DISKSTATS_1}   8      16 sdb 1 2 x 4\n\n   8  32\n");
    let net = net_dev(&format!("{NET_1}  eth1: 1 2 3\nnonsense\n"));
    fixture.host(&stat, &diskstats, &net);
    fixture.write("proc/meminfo", &format!("{MEMINFO}Broken: 12 MB\nno colon\n"));
    let metrics = fixture.sampler().sample(&[]).unwrap();
    assert_eq!(metrics.cpu.online_cores, 2);
    assert_eq!(metrics.memory.total_bytes, 16303428 * 1024);
    // cpu2, 2 diskstats lines, eth1 and `nonsense`, 2 meminfo lines.
    assert_eq!(metrics.skipped_lines, 7);
}

#[test]
fn unusable_or_missing_files_name_the_file() {
    let fixture = Fixture::new("unusable");
    fixture.host("intr 1 2 3\n", DISKSTATS_1, &net_dev(NET_1));
    let err = fixture.sampler().sample(&[]).unwrap_err();
    assert!(matches!(&err, HostError::Unusable { path, .. } if path.ends_with("stat")), "{err}");

    fixture.host(STAT_1, DISKSTATS_1, &net_dev(NET_1));
    std::fs::remove_file(fixture.proc().join("loadavg")).unwrap();
    let err = fixture.sampler().sample(&[]).unwrap_err();
    assert!(err.to_string().contains("loadavg"), "{err}");

    fixture.host(STAT_1, DISKSTATS_1, &net_dev(NET_1));
    fixture.write("proc/meminfo", "MemFree: 12 kB\n");
    let err = fixture.sampler().sample(&[]).unwrap_err();
    assert!(err.to_string().contains("meminfo") && err.to_string().contains("MemTotal"), "{err}");
}

#[test]
fn devices_and_interfaces_are_capped() {
    let fixture = Fixture::new("caps");
    let disks: String = (0..MAX_DISKS + 6).map(|i| format!("   8 {i} vd{i}x 1 0 8 0 1 0 8 0 0 1 1\n")).collect();
    let nets: String =
        (0..MAX_INTERFACES + 3).map(|i| format!("  veth{i}: 1 1 0 0 0 0 0 0 1 1 0 0 0 0 0 0\n")).collect();
    fixture.host(STAT_1, &disks, &net_dev(&nets));
    let mut sampler = fixture.sampler();
    let t0 = Instant::now();
    sampler.sample_at(t0, &[]).unwrap();
    let metrics = sampler.sample_at(t0 + Duration::from_secs(1), &[]).unwrap();
    assert_eq!(metrics.disks.len(), MAX_DISKS);
    assert_eq!(metrics.interfaces.len(), MAX_INTERFACES);
    assert_eq!(metrics.truncated, Truncated { disks: 6, interfaces: 3 });
    assert_eq!(sampler.disks.tracked(), MAX_DISKS);
}

#[test]
fn process_deltas_reuse_and_exit() {
    let fixture = Fixture::new("process");
    let pid = 4242;
    let dir = format!("proc/{pid}");
    fixture.write(&format!("{dir}/stat"), &proc_stat(pid, "my (odd) d", 1200, 300, 37, 123456, 51200));
    fixture.write(&format!("{dir}/io"), &proc_io(1_000_000, 5_000_000));
    for fd in 0..5 {
        fixture.write(&format!("{dir}/fd/{fd}"), "");
    }
    let mut sampler = ProcessSampler::new(fixture.proc());
    sampler.set_units(100, 4096);
    let t0 = Instant::now();

    let [first] = sampler.sample_at(t0, &[pid]).try_into().unwrap();
    assert_eq!(
        first,
        ProcessMetrics {
            pid,
            status: ProcessStatus::Running,
            start_ticks: Some(123456),
            cpu_cores: None,
            rss_bytes: Some(51200 * 4096),
            threads: Some(37),
            open_fds: Some(5),
            open_fds_capped: false,
            read_bytes: None,
            write_bytes: None,
        }
    );

    // 400 ticks in 2 s at 100 Hz: two cores.
    fixture.write(&format!("{dir}/stat"), &proc_stat(pid, "my (odd) d", 1500, 400, 38, 123456, 60000));
    fixture.write(&format!("{dir}/io"), &proc_io(1_040_960, 5_024_576));
    let [second] = sampler.sample_at(t0 + Duration::from_secs(2), &[pid]).try_into().unwrap();
    assert_eq!(second.cpu_cores, Some(2.0));
    assert_eq!((second.read_bytes, second.write_bytes), (Some(40_960), Some(24_576)));
    assert_eq!((second.rss_bytes, second.threads), (Some(60000 * 4096), Some(38)));

    // Same pid, another process: its counters start over.
    fixture.write(&format!("{dir}/stat"), &proc_stat(pid, "mariadbd", 10, 5, 8, 999999, 1000));
    fixture.write(&format!("{dir}/io"), &proc_io(4096, 0));
    let [reused] = sampler.sample_at(t0 + Duration::from_secs(4), &[pid]).try_into().unwrap();
    assert_eq!(reused.start_ticks, Some(999999));
    assert_eq!((reused.cpu_cores, reused.read_bytes), (None, None));

    // Unreadable io: the rest is still reported.
    std::fs::remove_file(fixture.proc().join(format!("{pid}/io"))).unwrap();
    fixture.write(&format!("{dir}/stat"), &proc_stat(pid, "mariadbd", 60, 5, 8, 999999, 1000));
    let [no_io] = sampler.sample_at(t0 + Duration::from_secs(5), &[pid]).try_into().unwrap();
    assert_eq!((no_io.cpu_cores, no_io.read_bytes), (Some(0.5), None));

    std::fs::remove_dir_all(fixture.proc().join(pid.to_string())).unwrap();
    let [gone] = sampler.sample_at(t0 + Duration::from_secs(6), &[pid]).try_into().unwrap();
    assert_eq!(gone.status, ProcessStatus::Gone);
    assert_eq!(gone.cpu_cores, None);
    assert_eq!(sampler.tracked(), 0, "a gone process is forgotten");

    fixture.write("proc/77/stat", "77 (truncated");
    let [bad] = sampler.sample_at(t0, &[77]).try_into().unwrap();
    assert_eq!(bad.status, ProcessStatus::Unreadable);
}

#[test]
fn host_sample_includes_processes_in_order() {
    let fixture = Fixture::new("host-processes");
    fixture.host(STAT_1, DISKSTATS_1, &net_dev(NET_1));
    fixture.write("proc/10/stat", &proc_stat(10, "mariadbd", 1, 1, 4, 50, 10));
    let metrics = fixture.sampler().sample(&[11, 10]).unwrap();
    let statuses: Vec<_> = metrics.processes.iter().map(|p| (p.pid, p.status)).collect();
    assert_eq!(statuses, [(11, ProcessStatus::Gone), (10, ProcessStatus::Running)]);
}

#[test]
fn real_proc_of_this_machine() {
    let mut sampler = HostSampler::new("/proc", "/sys");
    let me = std::process::id();
    let first = sampler.sample(&[me]).unwrap_or_else(|e| panic!("reading /proc: {e}"));
    std::thread::sleep(Duration::from_millis(100));
    let second = sampler.sample(&[me]).unwrap_or_else(|e| panic!("reading /proc: {e}"));

    assert!(second.cpu.online_cores >= 1, "{:?}", second.cpu);
    assert!(first.cpu.busy.is_none());
    let busy = second.cpu.busy.as_ref().expect("rates on the second sample");
    let total = busy.user + busy.nice + busy.system + busy.idle + busy.iowait + busy.irq + busy.softirq + busy.steal;
    assert!(total > 0.0 && total <= second.cpu.online_cores as f64 * 1.5, "{busy:?}");
    assert!(second.memory.total_bytes > 0);
    assert!(second.memory.available_bytes.is_some_and(|a| a <= second.memory.total_bytes));
    assert!(second.interval_seconds.is_some_and(|s| s >= 0.1));

    let [own] = second.processes.try_into().unwrap();
    assert_eq!(own.status, ProcessStatus::Running);
    assert!(own.rss_bytes.is_some_and(|r| r > 0), "{own:?}");
    assert!(own.threads.is_some_and(|t| t >= 1), "{own:?}");
    assert!(own.open_fds.is_some_and(|n| n >= 1), "{own:?}");
    assert!(own.cpu_cores.is_some(), "{own:?}");
}
