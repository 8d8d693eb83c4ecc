//! What one uprobe trap costs the traced process on this host, measured at
//! start: a function of the agent itself is called in a loop without and
//! then with the cheapest program attached, on thread CPU time (the trap
//! is charged to the trapping thread, as it is to mysqld's threads). The
//! difference per call is the trap; BPF run-time statistics do not see it,
//! they time only the program body.
use std::{num::NonZeroU32, time::Duration};

use aya::{
    EbpfLoader,
    programs::{UProbe, uprobe::{UProbeAttachLocation, UProbeScope}},
};

use super::{ProbeError, attach::EBPF_OBJECT, link_mode::object_name};

/// Calls per timed loop: long enough to dwarf the clock reads, short
/// enough that calibration takes well under a second.
const CALLS: u32 = 50_000;
const ROUNDS: usize = 3;

/// The function the calibration program traps on. Exported unmangled so
/// the agent finds it in its own symbol table, and written out so that it
/// starts like the server's functions do, with `push %rbp`, an instruction
/// the kernel emulates (one it had to single-step would cost ~15x more).
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub extern "C" fn sqlbee_calibration_target() {
    core::arch::naked_asm!("push rbp", "mov rbp, rsp", "pop rbp", "ret")
}

/// Thread CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out pointer; this clock always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn time_calls() -> Duration {
    let start = thread_cpu();
    for _ in 0..CALLS {
        sqlbee_calibration_target();
    }
    thread_cpu().saturating_sub(start)
}

/// Keeps one per-task perf event open for the agent's life. The kernel
/// waits for an RCU grace period whenever the first per-task perf event on
/// the host is created (it switches on its scheduling hooks then), and on a
/// saturated host that wait took 25 s here: with this event open, attaching
/// uprobes (at start, to a restarted server, in budget mode) skips it.
pub fn hold_task_events_on() -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    /// The first fields of `struct perf_event_attr` (`PERF_ATTR_SIZE_VER0`).
    #[repr(C)]
    struct PerfEventAttr {
        kind: u32,
        size: u32,
        config: u64,
        rest: [u64; 6],
    }
    const PERF_TYPE_SOFTWARE: u32 = 1;
    const PERF_COUNT_SW_DUMMY: u64 = 9;
    let attr = PerfEventAttr {
        kind: PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: PERF_COUNT_SW_DUMMY,
        rest: [0; 6],
    };
    // SAFETY: a valid attr of the size it states; pid 0 (this thread), any
    // cpu, no group, no flags.
    let fd = unsafe { libc::syscall(libc::SYS_perf_event_open, &attr as *const PerfEventAttr, 0, -1, -1, 0u64) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Median over a few rounds of (with probe - without) per call.
pub fn trap_cost() -> Result<Duration, ProbeError> {
    let pid = std::process::id();
    let mut ebpf = EbpfLoader::new()
        .map_max_entries("EVENTS", 4096)
        .map_max_entries("KNOWN", 1)
        .map_max_entries("DIGEST_SLOTS", 2)
        .load(EBPF_OBJECT)
        .map_err(|source| ProbeError::Load { pid, source })?;
    let program = "calibrate";
    let prog: &mut UProbe = ebpf
        .program_mut(object_name(program))
        .ok_or_else(|| ProbeError::Map { map: program, detail: "program not in object".into() })?
        .try_into()
        .map_err(|source| ProbeError::Program { pid, program, source })?;
    prog.load().map_err(|source| ProbeError::Program { pid, program, source })?;
    let symbol = "sqlbee_calibration_target";
    let scope = UProbeScope::OneProcess(NonZeroU32::new(pid).expect("pids are positive"));
    let mut costs = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let bare = time_calls();
        let link = prog
            .attach([UProbeAttachLocation::Symbol(symbol)], "/proc/self/exe", scope)
            .map_err(|source| ProbeError::Attach { pid, program, symbol, binary: "/proc/self/exe".into(), source })?;
        let trapped = time_calls();
        prog.detach(link).map_err(|source| ProbeError::Program { pid, program, source })?;
        costs.push(trapped.saturating_sub(bare) / CALLS);
    }
    costs.sort();
    Ok(costs[ROUNDS / 2])
}
