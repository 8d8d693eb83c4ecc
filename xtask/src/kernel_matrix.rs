//! A matrix of real distribution kernels, booted under QEMU (TCG: no KVM
//! needed), each running the agent against a private MariaDB under a short
//! workload, so the tests learn whether the programs load and count
//! exactly on the kernels database hosts run, not only on this machine's.
//!
//! The guest is one initramfs: busybox, MariaDB's server and client,
//! sysbench, the agent, their libraries and a prepared datadir, with
//! `/init` running [`WORKLOAD`] and printing what it saw between `@@`
//! markers on the serial console. The same script runs on the host for
//! the host's own kernel, so every row of the matrix is judged alike.
use std::{
    collections::BTreeMap,
    fs,
    io::{BufWriter, Write},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, anyhow, bail};

use crate::{mariadb::PrivateServer, paths::tools_root, sysbench::Sysbench};

/// The kernels of the matrix besides the host's: Debian's meta packages,
/// resolved to their newest build at set-up.
pub const KERNELS: [(&str, &str); 2] = [
    ("Debian 12 (bookworm), its stock kernel", "linux-image-cloud-amd64"),
    ("Debian 12 (bookworm), the 6.12 build", "linux-image-6.12-cloud-amd64"),
];

/// One installed kernel of the matrix.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub label: &'static str,
    /// The versioned package it came from.
    pub package: String,
    pub vmlinuz: PathBuf,
}

fn kernels_dir() -> PathBuf {
    tools_root().join("kernels")
}

/// The versioned package a meta package stands for now.
fn resolve(meta: &str) -> anyhow::Result<String> {
    let out = Command::new("apt-cache").args(["depends", "--important", meta]).output().context("running apt-cache")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Depends: ").filter(|p| p.starts_with("linux-image-")).map(str::to_owned))
        .ok_or_else(|| anyhow!("apt-cache knows no kernel behind {meta} (apt-get update?)"))
}

/// Downloads the matrix's kernels (only the image, unpacked; nothing is
/// installed into the host's /boot). Quick when they are there.
pub fn install() -> anyhow::Result<()> {
    for (label, meta) in KERNELS {
        let package = match resolve(meta) {
            Ok(p) => p,
            Err(_) => {
                let status = Command::new("apt-get").args(["update", "-qq"]).status()?;
                if !status.success() {
                    bail!("apt-get update failed");
                }
                resolve(meta)?
            }
        };
        let dir = kernels_dir().join(&package);
        if dir.join("vmlinuz").exists() {
            println!("ok  kernel {package} ({label})");
            continue;
        }
        println!("==> downloading kernel {package} ({label})");
        let download = kernels_dir().join(".download");
        let _ = fs::remove_dir_all(&download);
        fs::create_dir_all(&download)?;
        // _apt cannot write into root's home: fetch as root.
        let status = Command::new("apt-get")
            .args(["download", "-qq", "-o", "APT::Sandbox::User=root", &package])
            .current_dir(&download)
            .status()
            .context("running apt-get download")?;
        if !status.success() {
            bail!("apt-get download {package} failed");
        }
        let deb = fs::read_dir(&download)?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
            .ok_or_else(|| anyhow!("apt-get download {package} left no .deb"))?;
        let unpacked = download.join("root");
        let status = Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked).status()?;
        if !status.success() {
            bail!("dpkg-deb -x {} failed", deb.display());
        }
        let vmlinuz = fs::read_dir(unpacked.join("boot"))?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-")))
            .ok_or_else(|| anyhow!("{package} holds no boot/vmlinuz-*"))?;
        fs::create_dir_all(&dir)?;
        fs::copy(&vmlinuz, dir.join("vmlinuz"))?;
        fs::remove_dir_all(&download)?;
        println!("ok  kernel {package} ({label})");
    }
    Ok(())
}

/// The matrix's kernels as set-up left them, in `KERNELS` order.
pub fn installed() -> anyhow::Result<Vec<Kernel>> {
    let mut out = Vec::new();
    for (label, meta) in KERNELS {
        let package = resolve(meta)?;
        let vmlinuz = kernels_dir().join(&package).join("vmlinuz");
        if !vmlinuz.exists() {
            bail!("kernel {package} is not downloaded: run `./x setup`");
        }
        out.push(Kernel { label, package, vmlinuz });
    }
    Ok(out)
}

/// What the guest does, as a POSIX shell script: start the server, pause a
/// sysbench workload around the status reads and the agent's start, run
/// it and a few statements of other kinds, stop the agent, and print it
/// all; then a second agent with the wait probes, over a few statements. Environment: `DATA` (a datadir of its own), `RUN` (a scratch
/// directory), `SQLBEE` (the agent's binary), `SECONDS_RUN`.
pub const WORKLOAD: &str = r#"
say() { echo "@@$1"; }
sql() { mariadb --no-defaults -S "$RUN/m.sock" -uroot -N -B -e "$1"; }
mariadbd --no-defaults --user=root --datadir="$DATA" --socket="$RUN/m.sock" --pid-file="$RUN/m.pid" \
  --skip-networking --skip-log-bin --innodb-buffer-pool-size=32M --innodb-use-native-aio=0 >"$RUN/mysqld.log" 2>&1 &
MPID=$!
i=0
until sql "SELECT 1" >/dev/null 2>&1; do
  sleep 0.5; i=$((i + 1))
  if [ $i -gt 240 ]; then say "error mariadbd did not start"; cat "$RUN/mysqld.log"; exit 1; fi
done
sysbench oltp_read_only --db-driver=mysql --mysql-socket="$RUN/m.sock" --mysql-user=root --mysql-db=sbtest \
  --tables=1 --table-size=1000 --threads=2 --time=600 --report-interval=0 --db-ps-mode=auto run >"$RUN/sysbench.log" 2>&1 &
SB=$!
sleep 3
kill -STOP $SB
say status-before
sql "SHOW GLOBAL STATUS"
sleep 0.3
"$SQLBEE" agent --pid $MPID --command-probe --window 2s --no-cgroup --output jsonl \
  --ready-file "$RUN/agent.ready" >"$RUN/agent.jsonl" 2>"$RUN/agent.log" &
AG=$!
i=0
while [ ! -e "$RUN/agent.ready" ] && kill -0 $AG 2>/dev/null; do
  sleep 0.5; i=$((i + 1))
  [ $i -gt 600 ] && break
done
if [ -e "$RUN/agent.ready" ]; then
  # At least SECONDS_RUN, and on until the server has run enough prepared
  # statements to judge the counts (an emulated CPU's speed varies by
  # two), at most a minute.
  executed() { sql "SHOW GLOBAL STATUS LIKE 'Com_stmt_execute'" | cut -f2; }
  base=$(executed)
  kill -CONT $SB
  i=0
  while :; do
    sleep 1; i=$((i + 1))
    [ $i -ge 60 ] && break
    [ $i -ge "$SECONDS_RUN" ] && [ $(($(executed) - base)) -ge 2000 ] && break
  done
  kill -STOP $SB
  for n in 1 2 3; do sql "CALL sbtest.touch()" >/dev/null; done
  for n in 1 2; do sql "SELECT * FROM sbtest.no_such_table" >/dev/null 2>&1; done
  sleep 0.5
  kill -INT $AG
fi
wait $AG
say "agent-exit $?"
say status-after
sql "SHOW GLOBAL STATUS"
say agent-jsonl
cat "$RUN/agent.jsonl"
say agent-log
cat "$RUN/agent.log"
kill -9 $SB 2>/dev/null
# A short agent run: NAME, a statement sent ten times (each over a new
# connection, so a login each), then the agent's command line, to which
# the server and the output are added. Prints NAME-exit, -jsonl and -log.
short_run() {
  name=$1; statement=$2; shift 2
  "$@" --pid $MPID --window 1s --no-cgroup --output jsonl \
    --ready-file "$RUN/$name.ready" >"$RUN/$name.jsonl" 2>"$RUN/$name.log" &
  AG=$!
  i=0
  while [ ! -e "$RUN/$name.ready" ] && kill -0 $AG 2>/dev/null; do
    sleep 0.5; i=$((i + 1))
    [ $i -gt 600 ] && break
  done
  if [ -e "$RUN/$name.ready" ]; then
    for n in 1 2 3 4 5 6 7 8 9 10; do sql "$statement" >/dev/null; done
    sleep 0.5
    kill -INT $AG
  fi
  wait $AG
  say "$name-exit $?"
  say "$name-jsonl"
  cat "$RUN/$name.jsonl"
  say "$name-log"
  cat "$RUN/$name.log"
}
# The wait probes turn the kernel's aggregation off: a second run loads
# them, with every THD field copied on its own (the path of a build that
# keeps them far apart).
short_run waits "SELECT 'with the wait probes'" env SQLBEE_TEST_FIELDS_ALONE=1 "$SQLBEE" agent --wait-probes
# The lean tier: its narrowed layout, verified on every kernel.
short_run lean "SELECT 'lean'" "$SQLBEE" agent --figures lean
# The send hook: its syscall tracepoints (perf events), the task's thread
# pointer from BTF; then its raw tracepoint, the fallback without tracefs.
# The procedure's result set leaves while it runs: the stack check.
short_run send "SELECT 'sent'; CALL sbtest.touch()" "$SQLBEE" agent --statement-hook send
short_run rawsend "SELECT 'sent raw'; CALL sbtest.touch()" "$SQLBEE" agent --statement-hook send-raw
kill $MPID
wait $MPID 2>/dev/null
"#;

const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/usr/sbin:/usr/bin:/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t tmpfs run /run
mount -t tracefs tracefs /sys/kernel/tracing
echo "@@kernel $(uname -r)"
DATA=/data RUN=/run SQLBEE=/bin/sqlbee SECONDS_RUN=5 sh /workload.sh
echo "@@end"
poweroff -f
"#;

/// What one row of the matrix printed, by section.
#[derive(Clone, Debug, Default)]
pub struct Run {
    /// `uname -r` where it ran.
    pub kernel: String,
    /// Each `@@name` section's lines; `agent-exit` holds the exit code.
    pub sections: BTreeMap<String, String>,
    /// Everything, for a failure to show.
    pub raw: String,
}

impl Run {
    fn parse(raw: &str) -> Run {
        let mut run = Run { raw: raw.to_owned(), ..Run::default() };
        let mut current: Option<String> = None;
        for line in raw.lines().map(|l| l.trim_end_matches('\r')) {
            // The console may start a line with terminal noise.
            if let Some(at) = line.find("@@") {
                let marker = &line[at + 2..];
                let (name, rest) = marker.split_once(' ').unwrap_or((marker, ""));
                match name {
                    "kernel" => run.kernel = rest.trim().to_owned(),
                    "agent-exit" | "waits-exit" | "lean-exit" | "send-exit" | "rawsend-exit" => {
                        run.sections.insert(name.to_owned(), rest.trim().to_owned());
                    }
                    _ => {
                        run.sections.entry(name.to_owned()).or_default();
                    }
                }
                current = Some(name.to_owned());
                continue;
            }
            if let Some(section) = current.as_ref().and_then(|c| run.sections.get_mut(c))
                && !matches!(
                    current.as_deref(),
                    Some("agent-exit" | "waits-exit" | "lean-exit" | "send-exit" | "rawsend-exit")
                )
            {
                section.push_str(line);
                section.push('\n');
            }
        }
        run
    }

    pub fn section(&self, name: &str) -> &str {
        self.sections.get(name).map_or("", String::as_str)
    }

    /// `SHOW GLOBAL STATUS` of a section, numbers only.
    pub fn status(&self, name: &str) -> BTreeMap<String, u64> {
        self.section(name)
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once('\t')?;
                Some((k.to_owned(), v.trim().parse().ok()?))
            })
            .collect()
    }
}

/// A datadir with sysbench's table and the procedure the workload calls,
/// shut down cleanly so a guest can start on a copy.
pub fn prepare_datadir(into: &Path) -> anyhow::Result<()> {
    let mut server = PrivateServer::start("kernel-matrix-data", &["--innodb-log-file-size=8M"])?;
    let bench = Sysbench {
        script: "oltp_read_only".into(),
        tables: 1,
        table_size: 1000,
        threads: 1,
        seconds: 1,
        ps_mode: "auto",
        rate: 0,
    };
    bench.prepare(&server)?;
    server.sql("CREATE PROCEDURE sbtest.touch() SELECT c FROM sbtest.sbtest1 WHERE id = 1")?;
    server.shut_down()?;
    copy_tree(&server.dir.join("data"), into)
}

fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    let status = Command::new("cp").arg("-a").arg(from).arg(to).status()?;
    if !status.success() {
        bail!("copying {} failed", from.display());
    }
    Ok(())
}

/// The workload on the host's own kernel, on a copy of `datadir`.
pub fn run_on_host(sqlbee: &Path, datadir: &Path, scratch: &Path) -> anyhow::Result<Run> {
    fs::create_dir_all(scratch)?;
    let data = scratch.join("data");
    let _ = fs::remove_dir_all(&data);
    copy_tree(datadir, &data)?;
    let run = scratch.join("run");
    fs::create_dir_all(&run)?;
    let out = Command::new("sh")
        .arg("-c")
        .arg(WORKLOAD)
        .env("DATA", &data)
        .env("RUN", &run)
        .env("SQLBEE", sqlbee)
        .env("SECONDS_RUN", "5")
        .stdin(Stdio::null())
        .output()
        .context("running the workload script")?;
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parsed = Run::parse(&String::from_utf8_lossy(&out.stdout));
    parsed.kernel = release.trim().to_owned();
    Ok(parsed)
}

/// Boots `kernel` with `initramfs` and returns what the guest printed;
/// gives up after `limit`. A guest whose kernel died before the workload
/// began (an emulator's fault, not the agent's) is booted once more.
pub fn boot(kernel: &Kernel, initramfs: &Path, limit: Duration) -> anyhow::Result<Run> {
    let run = boot_once(kernel, initramfs, limit)?;
    if run.kernel.is_empty() && (run.raw.contains("Oops") || run.raw.contains("Kernel panic")) {
        eprintln!("{}: the guest's kernel died before the workload began; booting it again", kernel.package);
        return boot_once(kernel, initramfs, limit);
    }
    Ok(run)
}

fn boot_once(kernel: &Kernel, initramfs: &Path, limit: Duration) -> anyhow::Result<Run> {
    let console = initramfs.with_extension(format!("{}.console", kernel.package));
    // One host thread for both vCPUs: with a thread per vCPU, a kernel that
    // patches its own code while the other vCPU runs it (static keys) hit
    // a stray int3 under load and died during boot.
    let mut child = Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg,thread=single", "-cpu", "max", "-smp", "2", "-m", "3072"])
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(initramfs)
        .args(["-append", "console=ttyS0 quiet loglevel=1 panic=-1 rdinit=/init"])
        .args(["-nographic", "-no-reboot", "-nodefaults", "-serial", "stdio"])
        .stdin(Stdio::null())
        .stdout(fs::File::create(&console)?)
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting qemu-system-x86_64 (`./x setup` installs qemu-system-x86)")?;
    let started = Instant::now();
    let timed_out = loop {
        if child.try_wait()?.is_some() {
            break false;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break true;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let raw = String::from_utf8_lossy(&fs::read(&console)?).into_owned();
    let _ = fs::remove_file(&console);
    if timed_out {
        bail!("{} did not finish within {limit:?}; its console:\n{raw}", kernel.package);
    }
    Ok(Run::parse(&raw))
}

/// Writes the guest's initramfs: an uncompressed cpio (the kernel unpacks
/// it without a decompressor, which under TCG is the slow part).
pub fn initramfs(sqlbee: &Path, datadir: &Path, out: &Path) -> anyhow::Result<()> {
    let mut archive = Archive::default();
    archive.bytes("init", INIT.as_bytes(), 0o755);
    archive.bytes("workload.sh", WORKLOAD.as_bytes(), 0o755);
    archive.bytes("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n", 0o644);
    archive.bytes("etc/group", b"root:x:0:\n", 0o644);
    for dir in ["proc", "sys", "dev", "tmp", "run", "root"] {
        archive.dir(dir);
    }
    archive.file("bin/busybox", Path::new("/bin/busybox"), 0o755)?;
    for binary in ["/usr/sbin/mariadbd", "/usr/bin/mariadb", "/usr/bin/sysbench"] {
        archive.binary(Path::new(binary))?;
    }
    // The agent without its debug sections: a third of the bytes.
    let stripped = out.with_extension("sqlbee");
    let strip = Command::new("strip").arg("--strip-debug").arg("-o").arg(&stripped).arg(sqlbee).status();
    let agent = if strip.is_ok_and(|s| s.success()) { stripped.as_path() } else { sqlbee };
    archive.file("bin/sqlbee", agent, 0o755)?;
    archive.libraries(sqlbee)?;
    for tree in ["/usr/share/mysql/english", "/usr/share/mysql/charsets", "/usr/share/sysbench"] {
        archive.tree(Path::new(tree), tree.trim_start_matches('/'))?;
    }
    archive.tree(datadir, "data")?;
    archive.write(out)?;
    let _ = fs::remove_file(&stripped);
    Ok(())
}

enum Entry {
    Dir,
    File { source: PathBuf, mode: u32 },
    Bytes { data: Vec<u8>, mode: u32 },
}

/// A cpio "newc" archive being assembled, by path inside the guest.
#[derive(Default)]
struct Archive {
    entries: BTreeMap<String, Entry>,
}

impl Archive {
    fn parents(&mut self, path: &str) {
        let mut at = String::new();
        for part in
            path.split('/').filter(|p| !p.is_empty()).collect::<Vec<_>>().split_last().map_or(&[][..], |(_, p)| p)
        {
            if !at.is_empty() {
                at.push('/');
            }
            at.push_str(part);
            self.entries.entry(at.clone()).or_insert(Entry::Dir);
        }
    }

    fn dir(&mut self, path: &str) {
        self.parents(path);
        self.entries.insert(path.to_owned(), Entry::Dir);
    }

    fn bytes(&mut self, path: &str, data: &[u8], mode: u32) {
        self.parents(path);
        self.entries.insert(path.to_owned(), Entry::Bytes { data: data.to_vec(), mode });
    }

    fn file(&mut self, path: &str, source: &Path, mode: u32) -> anyhow::Result<()> {
        if !source.exists() {
            bail!("{} is missing (run `./x setup`)", source.display());
        }
        self.parents(path);
        self.entries.insert(path.to_owned(), Entry::File { source: source.to_path_buf(), mode });
        Ok(())
    }

    /// A program at its own path, with the shared libraries it loads.
    fn binary(&mut self, path: &Path) -> anyhow::Result<()> {
        self.file(path.to_string_lossy().trim_start_matches('/'), path, 0o755)?;
        self.libraries(path)
    }

    /// The shared libraries `ldd` says `binary` loads, at the same paths.
    fn libraries(&mut self, binary: &Path) -> anyhow::Result<()> {
        let out = Command::new("ldd").arg(binary).output().context("running ldd")?;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some(library) = line.split_whitespace().find(|w| w.starts_with('/')) else { continue };
            let library = Path::new(library);
            let real = fs::canonicalize(library).unwrap_or_else(|_| library.to_path_buf());
            self.file(library.to_string_lossy().trim_start_matches('/'), &real, 0o755)?;
        }
        Ok(())
    }

    /// Every file under `source`, at `path`.
    fn tree(&mut self, source: &Path, path: &str) -> anyhow::Result<()> {
        self.dir(path);
        for entry in fs::read_dir(source).with_context(|| format!("reading {}", source.display()))? {
            let entry = entry?;
            let name = format!("{path}/{}", entry.file_name().to_string_lossy());
            let kind = entry.file_type()?;
            if kind.is_dir() {
                self.tree(&entry.path(), &name)?;
            } else {
                let real = fs::canonicalize(entry.path())?;
                let mode = fs::metadata(&real)?.permissions().mode() & 0o7777;
                self.file(&name, &real, mode)?;
            }
        }
        Ok(())
    }

    fn write(&self, out: &Path) -> anyhow::Result<()> {
        let mut w = BufWriter::new(fs::File::create(out).with_context(|| format!("creating {}", out.display()))?);
        let mut ino = 1u32;
        for (path, entry) in &self.entries {
            ino += 1;
            match entry {
                Entry::Dir => header(&mut w, ino, 0o040755, 2, 0, path)?,
                Entry::Bytes { data, mode } => {
                    header(&mut w, ino, 0o100000 | mode, 1, data.len(), path)?;
                    w.write_all(data)?;
                    pad(&mut w, data.len())?;
                }
                Entry::File { source, mode } => {
                    let data = fs::read(source).with_context(|| format!("reading {}", source.display()))?;
                    header(&mut w, ino, 0o100000 | mode, 1, data.len(), path)?;
                    w.write_all(&data)?;
                    pad(&mut w, data.len())?;
                }
            }
        }
        header(&mut w, 0, 0, 1, 0, "TRAILER!!!")?;
        w.flush()?;
        Ok(())
    }
}

/// One cpio "newc" header and name.
fn header(w: &mut impl Write, ino: u32, mode: u32, nlink: u32, size: usize, name: &str) -> std::io::Result<()> {
    let fields = [ino, mode, 0, 0, nlink, 0, size as u32, 0, 0, 0, 0, name.len() as u32 + 1, 0];
    let mut head = String::from("070701");
    for field in fields {
        head.push_str(&format!("{field:08x}"));
    }
    w.write_all(head.as_bytes())?;
    w.write_all(name.as_bytes())?;
    w.write_all(&[0])?;
    pad(w, head.len() + name.len() + 1)
}

fn pad(w: &mut impl Write, written: usize) -> std::io::Result<()> {
    let rest = (4 - written % 4) % 4;
    w.write_all(&[0u8; 3][..rest])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_are_read_between_markers_whatever_the_console_adds() {
        let raw = "\u{1b}c\u{1b}[?7l@@kernel 6.1.0-57-cloud-amd64\r\n@@status-before\r\nQuestions\t10\r\nUptime\t3\r\n\
                   @@agent-exit 0\r\n@@status-after\r\nQuestions\t25\r\n@@agent-jsonl\r\n{\"type\":\"summary\"}\r\n@@end\r\n";
        let run = Run::parse(raw);
        assert_eq!(run.kernel, "6.1.0-57-cloud-amd64");
        assert_eq!(run.status("status-before")["Questions"], 10);
        assert_eq!(run.status("status-after")["Questions"], 25);
        assert_eq!(run.section("agent-exit"), "0");
        assert_eq!(run.section("agent-jsonl"), "{\"type\":\"summary\"}\n");
    }

    #[test]
    fn the_archive_is_newc_with_parents_first_and_a_trailer() {
        let dir = std::env::temp_dir().join(format!("sqlbee-cpio-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let mut archive = Archive::default();
        archive.bytes("a/b/c.txt", b"hello", 0o644);
        let out = dir.join("x.cpio");
        archive.write(&out).unwrap();
        let bytes = fs::read(&out).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        let a = text.find("a\0").unwrap();
        let b = text.find("a/b\0").unwrap();
        let c = text.find("a/b/c.txt\0").unwrap();
        assert!(a < b && b < c, "{text:?}");
        assert!(text.contains("hello") && text.ends_with("TRAILER!!!\0\0\0\0") || text.contains("TRAILER!!!\0"));
        assert_eq!(bytes.len() % 4, 0);
        assert!(bytes.starts_with(b"070701"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
