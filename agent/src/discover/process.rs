//! Server processes from procfs.
use std::{
    fs,
    path::{Path, PathBuf},
};

use super::DiscoverError;
use crate::procfs::{PidStat, boot_time_unix_ms, clock_ticks_per_second};

const SERVER_NAMES: [&str; 2] = ["mariadbd", "mysqld"];

/// One running server, identified across restarts by `instance` and within
/// one life by (`pid`, `start_ticks`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerProcess {
    pub pid: u32,
    /// Start time in clock ticks since boot (field 22 of /proc/PID/stat):
    /// tells a restarted server from a reused pid.
    pub start_ticks: u64,
    /// The same instant as milliseconds since the Unix epoch.
    pub start_unix_ms: i64,
    pub comm: String,
    /// The running binary: `/proc/PID/exe`, which names the same file
    /// however the server is rooted.
    pub binary: PathBuf,
    /// Stable name: `host:port` from the server's command line, or its
    /// socket path when it listens on no TCP port; for a server in a
    /// container, the container's name instead of the host.
    pub instance: String,
    /// The container the server runs in, if any.
    pub container: Option<Container>,
}

/// A container as the host sees it: its id from the server's cgroup, and
/// the name an operator knows it by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Container {
    pub id: String,
    /// podman's name (from the container's `/run/.containerenv`), or else
    /// the container's hostname and short id (Kubernetes: the pod's name).
    pub name: String,
}

/// A 64-hex-digit container id in a cgroup path (`libpod-ID.scope`,
/// `docker-ID.scope`, `cri-containerd-ID.scope`, `crio-ID.scope`,
/// `/docker/ID`, `/kubepods/.../ID`).
fn container_id(cgroup: &str) -> Option<String> {
    cgroup.lines().flat_map(|l| l.rsplit(':').next().unwrap_or("").split('/')).rev().find_map(|segment| {
        let segment = segment.strip_suffix(".scope").unwrap_or(segment);
        let id = segment.rsplit(['-', ':']).next()?;
        (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_string())
    })
}

/// The container process `pid` runs in, unless it is this agent's own.
pub(super) fn container_of(proc_dir: &Path) -> Option<Container> {
    let id = container_id(&fs::read_to_string(proc_dir.join("cgroup")).ok()?)?;
    let own = fs::read_to_string("/proc/self/cgroup").ok().and_then(|c| container_id(&c));
    if own.as_deref() == Some(id.as_str()) {
        return None;
    }
    let root = proc_dir.join("root");
    let podman_name = fs::read_to_string(root.join("run/.containerenv"))
        .ok()
        .and_then(|env| env.lines().find_map(|l| l.strip_prefix("name=\"")?.strip_suffix('"').map(str::to_string)))
        .or_else(|| conmon_name(proc_dir))
        .filter(|n| !n.is_empty());
    let name = podman_name.unwrap_or_else(|| {
        let hostname = fs::read_to_string(root.join("etc/hostname")).unwrap_or_default();
        match hostname.trim() {
            // Docker's and podman's default hostname is the short id.
            "" => id[..12].to_string(),
            host if id.starts_with(host) => id[..12].to_string(),
            // Kubernetes: the pod's name.
            host => format!("{host}/{}", &id[..12]),
        }
    });
    Some(Container { id, name })
}

/// The name podman gave the container: its monitor (conmon), an ancestor
/// of the server on the host, carries it on its command line (`-n NAME`).
/// Not visible from a container that shares only the server's pid
/// namespace (a sidecar): there the server's parent is outside it.
fn conmon_name(proc_dir: &Path) -> Option<String> {
    let mut pid: u32 = proc_dir.file_name()?.to_str()?.parse().ok()?;
    for _ in 0..8 {
        let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        pid = status.lines().find_map(|l| l.strip_prefix("PPid:"))?.trim().parse().ok()?;
        if pid <= 1 {
            return None;
        }
        if fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == "conmon") {
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<String> =
                cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
            return option_value(&args, "--name", Some("-n")).map(str::to_string);
        }
    }
    None
}

/// The name of the host a server runs on, as the agent should say it: its
/// own hostname, unless the agent runs in a container and the server on
/// the host (a node agent), whose name is then in the host's /etc/hostname.
fn host_of(proc_dir: &Path, agent_hostname: &str) -> String {
    let agent_in_container = fs::read_to_string("/proc/self/cgroup").ok().and_then(|c| container_id(&c)).is_some();
    if !agent_in_container {
        return agent_hostname.to_string();
    }
    fs::read_to_string(proc_dir.join("root/etc/hostname"))
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| agent_hostname.to_string())
}

fn read(path: &Path) -> Result<String, DiscoverError> {
    fs::read_to_string(path).map_err(|source| DiscoverError::Proc { path: path.to_path_buf(), source })
}

/// Every mariadbd/mysqld visible in /proc. Processes that vanish while we
/// look are skipped.
pub fn find_servers(hostname: &str) -> Vec<ServerProcess> {
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    let me = std::process::id();
    let mut found: Vec<ServerProcess> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| SERVER_NAMES.contains(&c.trim_end()))
        })
        .filter_map(|pid| server_by_pid(pid, hostname).ok())
        .collect();
    found.sort_by_key(|s| s.pid);
    found
}

/// The server with this pid, whatever its name (the binary check comes later).
pub fn server_by_pid(pid: u32, hostname: &str) -> Result<ServerProcess, DiscoverError> {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    if !proc_dir.exists() {
        return Err(DiscoverError::NoSuchProcess { pid });
    }
    let stat = read(&proc_dir.join("stat"))?;
    let start_ticks = PidStat::parse(&stat).map(|s| s.start_ticks).ok_or_else(|| DiscoverError::Proc {
        path: proc_dir.join("stat"),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "unexpected format"),
    })?;
    let comm = read(&proc_dir.join("comm"))?.trim_end().to_string();
    // /proc/PID/exe opens the running file itself, whatever the server's
    // root: a container's mount namespace, a chroot (whose exe link names
    // the host's path, so joining it to /proc/PID/root would name a file
    // twice inside the chroot), or a binary replaced on disk ("(deleted)").
    // A link this agent may not read (a server of another user without
    // CAP_SYS_PTRACE, an exited one not yet reaped) still names a server:
    // reading its binary fails at attach, and the server is reported as
    // untraced with why, not skipped in silence.
    let binary = proc_dir.join("exe");
    let cmdline = fs::read(proc_dir.join("cmdline")).unwrap_or_default();
    let args: Vec<String> =
        cmdline.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    let start_unix_ms = boot_time_unix_ms() + (start_ticks as i64 * 1000) / clock_ticks_per_second() as i64;
    let container = container_of(&proc_dir);
    let place = match &container {
        Some(c) => c.name.clone(),
        None => host_of(&proc_dir, hostname),
    };
    Ok(ServerProcess {
        pid,
        start_ticks,
        start_unix_ms,
        comm,
        binary,
        instance: instance_name(&args, &place),
        container,
    })
}

/// CPU time (user + system) a process has used so far, seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    Some(PidStat::read(pid)?.cpu_ticks as f64 / clock_ticks_per_second() as f64)
}

/// On-CPU time of a process's live threads so far, ns, from each
/// thread's schedstat: nanosecond resolution where /proc/PID/stat counts
/// 10 ms ticks, which is what telling apart phases a tenth of a second
/// long needs. Time of threads that already exited is not in it.
pub fn threads_cpu_ns(pid: u32) -> Option<u64> {
    let tasks = fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0u64;
    for task in tasks.flatten() {
        let Ok(text) = fs::read_to_string(task.path().join("schedstat")) else { continue };
        total += text.split_ascii_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    }
    Some(total)
}

fn option_value<'a>(args: &'a [String], long: &str, short: Option<&str>) -> Option<&'a str> {
    let mut value = None;
    let mut iter = args.iter().peekable();
    while let Some(arg) = iter.next() {
        if let Some(v) = arg.strip_prefix(long).and_then(|r| r.strip_prefix('=')) {
            value = Some(v);
        } else if arg == long || short.is_some_and(|s| arg == s) {
            value = iter.peek().map(|v| v.as_str());
        } else if let Some(v) = short.and_then(|s| arg.strip_prefix(s)).filter(|v| !v.is_empty()) {
            value = Some(v);
        }
    }
    value
}

/// `host:port`, or `host:socket-path` with `--skip-networking`, from the
/// command line; servers configured only by my.cnf get the default port.
pub fn instance_name(args: &[String], hostname: &str) -> String {
    let skip_networking = args.iter().any(|a| a == "--skip-networking" || a == "--skip_networking");
    if skip_networking && let Some(socket) = option_value(args, "--socket", Some("-S")) {
        return format!("{hostname}:{socket}");
    }
    let port = option_value(args, "--port", Some("-P")).unwrap_or("3306");
    format!("{hostname}:{port}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn container_ids_from_cgroup_paths() {
        let id = "f03e8ff8b36c5c1c1c2e8b9f0d8b5b0b6a3e5f6d7c8b9a0b1c2d3e4f5a6b7c8d";
        for cgroup in [
            format!("4:memory:/machine.slice/libpod-{id}.scope"),
            format!("0::/system.slice/docker-{id}.scope"),
            format!("5:cpu:/kubepods/burstable/pod1234/{id}"),
            format!("0::/kubepods.slice/kubepods-besteffort.slice/cri-containerd-{id}.scope"),
            format!("3:pids:/docker/{id}\n2:cpu:/docker/{id}"),
        ] {
            assert_eq!(container_id(&cgroup).as_deref(), Some(id), "{cgroup}");
        }
        assert_eq!(container_id("0::/user.slice/user-0.slice/session-1.scope"), None);
        assert_eq!(container_id("4:memory:/process_api/8678d771336db12b003d22415d319238"), None);
    }

    #[test]
    fn instance_from_port_forms() {
        assert_eq!(instance_name(&args(&["mariadbd", "--port=3310"]), "h"), "h:3310");
        assert_eq!(instance_name(&args(&["mariadbd", "--port", "3311"]), "h"), "h:3311");
        assert_eq!(instance_name(&args(&["mariadbd", "-P3312"]), "h"), "h:3312");
        assert_eq!(instance_name(&args(&["mariadbd"]), "h"), "h:3306");
        assert_eq!(instance_name(&args(&["mariadbd", "--skip-networking", "--socket=/s.sock"]), "h"), "h:/s.sock");
    }

    #[test]
    fn wrong_pid_is_a_clear_error() {
        let err = server_by_pid(u32::MAX - 1, "h").unwrap_err();
        assert!(err.to_string().contains("no process with pid"), "{err}");
    }
}

/// Where a static variable of a server's binary lives in its memory: the
/// executable's mapping from file offset 0 gives the load bias. None when
/// the process or its mapping cannot be read.
pub fn runtime_address(pid: u32, variable: super::StaticVariable) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let inode = fs::metadata(format!("/proc/{pid}/exe")).ok()?.ino();
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let start = image_start(&maps, inode)?;
    start.checked_sub(variable.first_segment)?.checked_add(variable.address)
}

/// Start of the mapping of file offset 0 of the file with this inode.
fn image_start(maps: &str, inode: u64) -> Option<u64> {
    maps.lines()
        .filter_map(|line| {
            let mut fields = line.split_ascii_whitespace();
            let range = fields.next()?;
            let _perms = fields.next()?;
            let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
            let _dev = fields.next()?;
            let ino: u64 = fields.next()?.parse().ok()?;
            let start = u64::from_str_radix(range.split('-').next()?, 16).ok()?;
            (offset == 0 && ino == inode).then_some(start)
        })
        .min()
}

#[cfg(test)]
mod image_tests {
    use super::*;

    #[test]
    fn finds_the_image_by_inode_and_offset() {
        let maps = "\
55d1c8a00000-55d1c8c00000 r--p 00000000 fe:01 1234 /usr/sbin/mariadbd
55d1c8c00000-55d1c9e00000 r-xp 00200000 fe:01 1234 /usr/sbin/mariadbd
7f0000000000-7f0000001000 r--p 00000000 fe:01 999 /usr/lib/libc.so.6
";
        assert_eq!(image_start(maps, 1234), Some(0x55d1c8a00000));
        assert_eq!(image_start(maps, 999), Some(0x7f0000000000));
        assert_eq!(image_start(maps, 5), None);
    }
}
