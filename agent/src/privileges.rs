//! Least privilege. The agent needs root's powers for a few things only:
//! to load and attach eBPF programs, and to read a server's binary and
//! memory through `/proc/PID`. At start, before its first thread and before
//! any server is attached (once the one-time steps that need more, such as
//! switching on BPF run-time statistics, are done), it keeps exactly the
//! capabilities in `KEPT`,
//! drops every other one from all its sets (bounding set included, so no
//! later exec can get them back), clears the ambient set and sets
//! no_new_privs.
use std::{io, os::fd::OwnedFd};

/// What the one-time steps before the drop set up, for the agent to hold.
pub struct Prepared {
    /// Keeps the kernel's BPF run-time statistics on while it is open
    /// (switching them on takes CAP_SYS_ADMIN, which the agent then drops).
    pub stats: Option<OwnedFd>,
}

/// The steps that need more than `KEPT`, then the drop (unless `keep_all`).
/// `perf_events`: the agent will open perf events even on a kernel with
/// multi-uprobe links (the send hook's tracepoints).
/// Call before the agent starts any thread: capabilities belong to each
/// thread, and threads inherit them from the thread that starts them.
pub fn prepare(keep_all: bool, perf_events: bool) -> Result<Prepared, PrivilegeError> {
    let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .map_err(|e| tracing::warn!(error = %e, "BPF run-time statistics unavailable; probe run time reads as 0"))
        .ok();
    if keep_all {
        tracing::warn!("--keep-privileges: the agent keeps every capability it was started with");
    } else {
        let extra = match (crate::discover::multi_links(), perf_events) {
            (true, false) => 0,
            (false, _) => {
                perf_events_need_sys_admin("this kernel has no multi-uprobe links, so every probe is a perf event")?
            }
            (true, true) => perf_events_need_sys_admin("the send hook's syscall tracepoints are perf events")?,
        };
        drop_to_needed(extra)?;
    }
    Ok(Prepared { stats })
}

/// Whether opening a perf event takes CAP_SYS_ADMIN here: the bit to keep
/// beside `KEPT`, or 0. Classic uprobes are perf events, and a kernel
/// without multi-uprobe links (before 6.6) attaches every probe as one;
/// the send hook's tracepoints are perf events on every kernel.
/// Debian's and Ubuntu's kernels refuse every `perf_event_open` without
/// CAP_SYS_ADMIN while `kernel.perf_event_paranoid` is above 2, their
/// default (CAP_PERFMON is not enough there). Tried, not guessed: with
/// only `KEPT` effective (CAP_SYS_ADMIN still permitted, so it comes
/// back), one software event is opened.
fn perf_events_need_sys_admin(why: &str) -> Result<u64, PrivilegeError> {
    let (effective, permitted) = capget()?;
    if permitted & 1 << CAP_SYS_ADMIN == 0 {
        return Ok(0);
    }
    capset(effective & kept_mask(), permitted)?;
    let refused = open_dummy_perf_event() == Some(libc::EACCES);
    capset(effective, permitted)?;
    if !refused {
        return Ok(0);
    }
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").unwrap_or_default();
    tracing::info!(
        perf_event_paranoid = paranoid.trim(),
        "keeping CAP_SYS_ADMIN: {why}, and this kernel opens perf events only for CAP_SYS_ADMIN (see the \
         manual's page \"Privileges the agent keeps\")"
    );
    Ok(1 << CAP_SYS_ADMIN)
}

/// Opens and closes a software event counting nothing on this thread; the
/// errno when the kernel refuses it.
fn open_dummy_perf_event() -> Option<i32> {
    // struct perf_event_attr as of PERF_ATTR_SIZE_VER0: type, size, config,
    // and the rest zero.
    let mut attr = [0u8; 64];
    const PERF_TYPE_SOFTWARE: u32 = 1;
    const PERF_COUNT_SW_DUMMY: u64 = 9;
    attr[0..4].copy_from_slice(&PERF_TYPE_SOFTWARE.to_ne_bytes());
    let size = attr.len() as u32;
    attr[4..8].copy_from_slice(&size.to_ne_bytes());
    attr[8..16].copy_from_slice(&PERF_COUNT_SW_DUMMY.to_ne_bytes());
    // Disabled (bit 0 of the flags word) and excluding the kernel (bit 5)
    // and the hypervisor (bit 6): the least a perf event can ask for.
    let flags: u64 = 1 | 1 << 5 | 1 << 6;
    attr[40..48].copy_from_slice(&flags.to_ne_bytes());
    const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;
    // SAFETY: a valid attr of the size it states; pid 0, any CPU.
    let fd = unsafe { libc::syscall(libc::SYS_perf_event_open, attr.as_ptr(), 0, -1, -1, PERF_FLAG_FD_CLOEXEC) };
    if fd < 0 {
        return io::Error::last_os_error().raw_os_error();
    }
    // SAFETY: the fd just opened.
    unsafe { libc::close(fd as libc::c_int) };
    None
}

/// Capability numbers (linux/capability.h).
pub const CAP_SYS_PTRACE: u32 = 19;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// What the agent keeps for its whole life, and why.
pub const KEPT: [(u32, &str, &str); 3] = [
    (CAP_BPF, "CAP_BPF", "create BPF maps and load programs: servers that start or restart later are attached then"),
    (
        CAP_PERFMON,
        "CAP_PERFMON",
        "attach uprobes (perf events and uprobe-multi links), and let the programs read server memory",
    ),
    (
        CAP_SYS_PTRACE,
        "CAP_SYS_PTRACE",
        "read a server's binary, memory and sockets through /proc/PID (exe, mem, fd) when it runs as another user or in another container",
    ),
];

/// Loading eBPF programs before kernel 5.8 split the powers up.
pub const CAP_SYS_ADMIN: u32 = 21;

#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    #[error("{what} failed: {source}")]
    Call {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error(
        "the agent cannot trace any server: it runs as uid {uid} without {}, which loading and attaching \
         its eBPF programs needs (or CAP_SYS_ADMIN). Run it as root; in a container, as user 0 with the \
         capabilities added: `podman run --user 0 --cap-drop ALL --cap-add BPF,PERFMON,SYS_PTRACE,SYS_ADMIN ...` \
         (Kubernetes: `securityContext: {{runAsUser: 0, capabilities: {{add: [BPF, PERFMON, SYS_PTRACE, \
         SYS_ADMIN]}}}}`). The images run as user 65534 unless told otherwise. See the manual's page \
         \"Privileges the agent keeps\"", missing.join(" and ")
    )]
    CannotTrace { uid: u32, missing: Vec<String> },
}

fn check(what: &'static str, result: libc::c_int) -> Result<(), PrivilegeError> {
    if result < 0 { Err(PrivilegeError::Call { what, source: io::Error::last_os_error() }) } else { Ok(()) }
}

/// Refuses to start an agent that could never attach a program: without
/// this it would log that no server was found and wait for ever.
pub fn check_can_trace() -> Result<(), PrivilegeError> {
    let (effective, _) = capget()?;
    let loads = 1 << CAP_BPF | 1 << CAP_PERFMON;
    if effective & 1 << CAP_SYS_ADMIN != 0 || effective & loads == loads {
        return Ok(());
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    Err(PrivilegeError::CannotTrace { uid, missing: names(loads & !effective) })
}

/// The mask of `KEPT`.
pub fn kept_mask() -> u64 {
    KEPT.iter().fold(0, |mask, (cap, _, _)| mask | 1 << cap)
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

fn capget() -> Result<(u64, u64), PrivilegeError> {
    let mut header = CapHeader { version: CAPABILITY_VERSION_3, pid: 0 };
    let mut data = [CapData::default(); 2];
    // SAFETY: version 3 takes two data structs, both valid for writes.
    check("capget", unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) } as libc::c_int)?;
    let join = |low: u32, high: u32| low as u64 | (high as u64) << 32;
    Ok((join(data[0].effective, data[1].effective), join(data[0].permitted, data[1].permitted)))
}

fn capset(effective: u64, permitted: u64) -> Result<(), PrivilegeError> {
    let mut header = CapHeader { version: CAPABILITY_VERSION_3, pid: 0 };
    let data = [
        CapData { effective: effective as u32, permitted: permitted as u32, inheritable: 0 },
        CapData { effective: (effective >> 32) as u32, permitted: (permitted >> 32) as u32, inheritable: 0 },
    ];
    // SAFETY: version 3 takes two data structs, both valid for reads.
    check("capset", unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) } as libc::c_int)
}

fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(40)
}

/// Names of the capabilities in `mask`.
pub fn names(mask: u64) -> Vec<String> {
    (0..64)
        .filter(|cap| mask & 1 << cap != 0)
        .map(|cap| match KEPT.iter().find(|k| k.0 == cap) {
            Some(k) => k.1.to_string(),
            None if cap == CAP_SYS_ADMIN => "CAP_SYS_ADMIN".to_string(),
            None => format!("cap {cap}"),
        })
        .collect()
}

/// Drops every capability not in `mask` from every set of this thread
/// (and of the threads it starts), and sets no_new_privs.
pub fn keep_only(mask: u64) -> Result<u64, PrivilegeError> {
    let (_, permitted) = capget()?;
    let keep = mask & permitted;
    // The bounding set first: dropping from it needs CAP_SETPCAP, which the
    // capset below gives up. Without CAP_SETPCAP (a container that never
    // had it) the bounding set is already the container's.
    for cap in (0..=last_cap()).filter(|cap| mask & 1 << cap == 0) {
        // SAFETY: prctl with integer arguments only.
        unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
    }
    // SAFETY: prctl with integer arguments only.
    let _ = unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong, 0, 0, 0) };
    capset(keep, keep)?;
    // SAFETY: prctl with integer arguments only.
    check("prctl(PR_SET_NO_NEW_PRIVS)", unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) })?;
    Ok(keep)
}

/// The bounding set as the kernel reports it.
fn bounding_set() -> u64 {
    std::fs::read_to_string("/proc/thread-self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("CapBnd:").and_then(|v| u64::from_str_radix(v.trim(), 16).ok()))
        })
        .unwrap_or(u64::MAX)
}

/// Drops every capability but `KEPT` (and `extra`, which this kernel
/// needs, see `perf_events_need_sys_admin`) for good. Capabilities in
/// `KEPT` the agent does not hold are not gained, of course; what it lacks
/// is logged. Returns the effective set it keeps.
pub fn drop_to_needed(extra: u64) -> Result<u64, PrivilegeError> {
    let keep = keep_only(kept_mask() | extra)?;
    let missing = kept_mask() & !keep;
    if missing != 0 {
        tracing::warn!(missing = ?names(missing), "the agent lacks capabilities it needs to attach servers that start later");
    }
    let bounded = bounding_set() & !(kept_mask() | extra) == 0;
    tracing::info!(kept = ?names(keep), bounding_set_narrowed = bounded, "dropped every other capability; no_new_privs set");
    Ok(keep)
}
