//! Where mysqld's CPU goes, sampled (`bench-rate --profile`): `perf record
//! -e cpu-clock` on the server's threads for the length of a run, and each
//! sample's function sorted into a few places: the BPF programs, the
//! uprobe's kernel path (the trap, the uprobe's way in and out, the
//! helpers and maps the programs call), the rest of the kernel (system
//! calls, scheduling), mysqld's own code and its libraries. A place's
//! share of a run's samples times the run's schedstat ns per statement is
//! its ns per statement. cpu-clock is a software timer, so this works in a
//! VM that exposes no hardware counters; it costs every arm alike.
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use std::collections::BTreeMap;

use anyhow::Context;

/// The places, in the order `ArmRun::profile` counts them.
pub const PLACES: [&str; 5] = ["BPF programs", "uprobe path", "other kernel", "mysqld", "libraries"];

/// Samples per second of mysqld's CPU time.
const FREQUENCY: &str = "1999";

/// Kernel functions of a uprobe's way from the trap to the program and
/// back, and of what the programs call (names as 6.x kernels spell them).
const UPROBE_PATH: [&str; 10] =
    ["uprobe", "int3", "swbp", "bpf", "htab", "ringbuf", "nofault", "srcu", "task_storage", "pcpu_freelist"];

/// What one run's samples say.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    /// Samples in each of `PLACES`.
    pub places: [u64; PLACES.len()],
    /// Samples by function (`[k] name` in the kernel, `dso name` in user
    /// space), for the functions behind a place's change.
    pub functions: BTreeMap<String, u64>,
}

/// A `perf record` running on a server's threads.
pub struct Recording {
    child: Child,
    path: PathBuf,
}

/// Starts sampling `pid`'s threads into `path`.
pub fn start(pid: u32, path: &Path) -> anyhow::Result<Recording> {
    let child = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock", "-F", FREQUENCY, "-p", &pid.to_string(), "-o"])
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting perf record (Debian's linux-perf; ./x setup installs it)")?;
    Ok(Recording { child, path: path.to_path_buf() })
}

impl Recording {
    /// Stops sampling and counts the samples of each place and function.
    pub fn finish(mut self) -> anyhow::Result<Samples> {
        // SIGINT: perf writes out what it holds and exits.
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        // A perf still starting up dies of the signal instead; its file
        // then fails the report below.
        self.child.wait().context("waiting for perf record")?;
        let out = Command::new("perf")
            .args([
                "report",
                "--stdio",
                "-q",
                "--sort",
                "dso,sym",
                "-F",
                "sample,dso,sym",
                "--percent-limit",
                "0",
                "-i",
            ])
            .arg(&self.path)
            .stderr(Stdio::null())
            .output()
            .context("running perf report")?;
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_file(self.path.with_extension("data.old"));
        if !out.status.success() {
            anyhow::bail!("perf report ended with {} (did perf record start?)", out.status);
        }
        Ok(sorted(&String::from_utf8_lossy(&out.stdout)))
    }
}

/// `perf report -F sample,dso,sym` lines ("  120  mariadbd  [.] do_command")
/// added up by place and by function.
fn sorted(report: &str) -> Samples {
    let mut out = Samples::default();
    for line in report.lines() {
        let mut words = line.split_whitespace();
        let (Some(samples), Some(dso), Some(mark)) = (words.next(), words.next(), words.next()) else { continue };
        let Ok(samples) = samples.parse::<u64>() else { continue };
        let symbol: String = words.collect::<Vec<_>>().join(" ");
        out.places[place(dso, mark, &symbol)] += samples;
        let function = if mark == "[k]" { format!("[k] {symbol}") } else { format!("{dso} {symbol}") };
        *out.functions.entry(function).or_default() += samples;
    }
    out
}

/// Which of `PLACES` a sample's function is in.
fn place(dso: &str, mark: &str, symbol: &str) -> usize {
    if symbol.starts_with("bpf_prog_") || dso.starts_with("bpf_prog_") {
        0
    } else if mark == "[k]" {
        if UPROBE_PATH.iter().any(|part| symbol.contains(part)) { 1 } else { 2 }
    } else if dso.contains("mariadbd") || dso.contains("mysqld") {
        3
    } else {
        4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_sorted_by_where_their_function_is() {
        let report = "\
     900  mariadbd               [.] do_command(THD*, bool)
      40  [kernel.kallsyms]      [k] asm_exc_int3
      30  [kernel.kallsyms]      [k] uprobe_notify_resume
      20  bpf_prog_6deef7357e7b4530_statement_end  [k] bpf_prog_6deef7357e7b4530_statement_end
      10  [kernel.kallsyms]      [k] bpf_probe_read_user
      70  [kernel.kallsyms]      [k] tcp_sendmsg_locked
      25  libc.so.6              [.] __memmove_avx_unaligned_erms
  garbage line
";
        let samples = sorted(report);
        assert_eq!(samples.places, [20, 80, 70, 900, 25]);
        assert_eq!(samples.functions["[k] asm_exc_int3"], 40);
        assert_eq!(samples.functions["mariadbd do_command(THD*, bool)"], 900);
    }

    #[test]
    fn perf_records_and_reports_on_this_kernel() {
        if Command::new("perf").arg("--version").output().is_err() {
            eprintln!("skipped: no perf (./x setup installs linux-perf)");
            return;
        }
        // A busy child of our own, sampled for half a second.
        let mut busy = Command::new("sh").args(["-c", "while :; do :; done"]).spawn().unwrap();
        let path = std::env::temp_dir().join(format!("sqlbee-profile-test-{}.data", std::process::id()));
        let recording = start(busy.id(), &path).unwrap();
        std::thread::sleep(std::time::Duration::from_secs(2));
        let counts = recording.finish();
        let _ = busy.kill();
        let _ = busy.wait();
        let counts = counts.unwrap();
        assert!(counts.places.iter().sum::<u64>() > 50, "{counts:?}");
    }
}
