//! What one uprobe trap costs the traced process on this host, measured at
//! start: a function of the agent itself is called in a loop without and
//! then with the cheapest program attached, on thread CPU time (the trap
//! is charged to the trapping thread, as it is to mysqld's threads). The
//! difference per call is the trap; BPF run-time statistics do not see it,
//! they time only the program body.
//!
//! The probe stage loads and attaches the program (`TrapProbe`); this
//! module owns the measurement and what it means.
use std::time::Duration;

/// Calls per timed loop: long enough to dwarf the clock reads, short
/// enough that calibration takes well under a second.
const CALLS: u32 = 50_000;
const ROUNDS: usize = 3;

/// Trap price assumed until (or unless) calibration measured it: platform
/// measurements put a trap in a loaded mysqld at 2-3x the 0.9 us of an
/// idle one.
pub const FALLBACK_TRAP: Duration = Duration::from_nanos(2000);

/// The symbol of [`sqlbee_calibration_target`] in the agent's own binary.
pub const TARGET_SYMBOL: &str = "sqlbee_calibration_target";

/// The function the calibration program traps on. Exported unmangled so
/// the agent finds it in its own symbol table, and written out so that it
/// starts like the server's functions do, with `push %rbp`, an instruction
/// the kernel emulates (one it had to single-step would cost ~15x more).
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub extern "C" fn sqlbee_calibration_target() {
    core::arch::naked_asm!("push rbp", "mov rbp, rsp", "pop rbp", "ret")
}

/// The cheapest program, ready to attach to [`TARGET_SYMBOL`] in this
/// process and to come off again.
pub trait TrapProbe {
    type Error;
    fn attach(&mut self) -> Result<(), Self::Error>;
    fn detach(&mut self) -> Result<(), Self::Error>;
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

/// Median over a few rounds of (with probe - without) per call.
pub fn trap_cost<P: TrapProbe>(probe: &mut P) -> Result<Duration, P::Error> {
    let mut costs = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let bare = time_calls();
        probe.attach()?;
        let trapped = time_calls();
        probe.detach()?;
        costs.push(trapped.saturating_sub(bare) / CALLS);
    }
    costs.sort();
    Ok(costs[ROUNDS / 2])
}
