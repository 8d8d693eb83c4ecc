//! The probe side of trap calibration (`budget::calibrate`): loads the
//! cheapest program and attaches it to the agent's own calibration target.
//! Also holds the per-task perf event that keeps classic uprobe attaches
//! from waiting on the kernel.
use std::num::NonZeroU32;

use aya::{
    Ebpf, EbpfLoader,
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeLinkId, UProbeScope},
    },
};

use super::{ProbeError, attach::EBPF_OBJECT, link_mode::object_name};
use crate::budget::calibrate::{TARGET_SYMBOL, TrapProbe};

const PROGRAM: &str = "calibrate";

/// The calibration program, loaded, attached or not.
pub struct CalibrationProbe {
    ebpf: Ebpf,
    link: Option<UProbeLinkId>,
}

impl CalibrationProbe {
    pub fn load() -> Result<Self, ProbeError> {
        let pid = std::process::id();
        let mut ebpf = EbpfLoader::new()
            .map_max_entries("EVENTS", 4096)
            .map_max_entries("KNOWN", 1)
            .map_max_entries("DIGEST_SLOTS", 2)
            .load(EBPF_OBJECT)
            .map_err(|source| ProbeError::Load { pid, source })?;
        program(&mut ebpf)?.load().map_err(|source| ProbeError::Program { pid, program: PROGRAM, source })?;
        Ok(Self { ebpf, link: None })
    }
}

fn program(ebpf: &mut Ebpf) -> Result<&mut UProbe, ProbeError> {
    ebpf.program_mut(object_name(PROGRAM))
        .ok_or_else(|| ProbeError::Map { map: PROGRAM, detail: "program not in object".into() })?
        .try_into()
        .map_err(|source| ProbeError::Program { pid: std::process::id(), program: PROGRAM, source })
}

impl TrapProbe for CalibrationProbe {
    type Error = ProbeError;

    fn attach(&mut self) -> Result<(), ProbeError> {
        let pid = std::process::id();
        let scope = UProbeScope::OneProcess(NonZeroU32::new(pid).expect("pids are positive"));
        let link = program(&mut self.ebpf)?
            .attach([UProbeAttachLocation::Symbol(TARGET_SYMBOL)], "/proc/self/exe", scope)
            .map_err(|source| ProbeError::Attach {
                pid,
                program: PROGRAM,
                symbol: TARGET_SYMBOL,
                binary: "/proc/self/exe".into(),
                source,
            })?;
        self.link = Some(link);
        Ok(())
    }

    fn detach(&mut self) -> Result<(), ProbeError> {
        let Some(link) = self.link.take() else { return Ok(()) };
        program(&mut self.ebpf)?.detach(link).map_err(|source| ProbeError::Program {
            pid: std::process::id(),
            program: PROGRAM,
            source,
        })
    }
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
