//! Removes the agent's cgroup once the agent is gone. The directories of a
//! cgroup v1 hierarchy are 0555 and owned by root, so removing one takes
//! CAP_DAC_OVERRIDE, which the agent drops after start (`privileges`).
//! Before it does, and before any thread exists, it forks this keeper: a
//! process that holds CAP_DAC_OVERRIDE and nothing else, sets
//! no_new_privs, ignores the signals meant for the agent, and only waits
//! for the agent's end of a pipe to close. Then (after a clean exit, a
//! crash or SIGKILL alike) it removes the agent's cgroup directories and
//! exits.
use std::{
    io,
    os::fd::{FromRawFd, OwnedFd},
    path::PathBuf,
    time::Duration,
};

use crate::privileges;

/// CAP_DAC_OVERRIDE (linux/capability.h).
const CAP_DAC_OVERRIDE: u32 = 1;

/// Held by the agent; dropping it (or the agent's death) lets the keeper
/// remove the cgroup.
pub struct Keeper {
    _agent_end: OwnedFd,
}

pub fn spawn(paths: Vec<PathBuf>) -> io::Result<Keeper> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned here.
    let (keeper_end, agent_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: called before the agent starts any thread, so the child is a
    // whole copy of a single-threaded process.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            drop(agent_end);
            keep(keeper_end, &paths)
        }
        _ => Ok(Keeper { _agent_end: agent_end }),
    }
}

/// The keeper's whole life; never returns.
fn keep(keeper_end: OwnedFd, paths: &[PathBuf]) -> ! {
    // SAFETY: plain libc calls on this process's own state.
    unsafe {
        // Whoever waits for the agent's output must not wait for the keeper.
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            for fd in 0..3 {
                libc::dup2(null, fd);
            }
        }
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
        libc::prctl(libc::PR_SET_NAME, c"sqlbee-cgroup".as_ptr() as libc::c_ulong, 0, 0, 0);
    }
    let _ = privileges::keep_only(1 << CAP_DAC_OVERRIDE);
    let mut byte = [0u8; 1];
    // Returns 0 at EOF: the agent closed its end or died.
    // SAFETY: reading one byte into a valid buffer from an owned descriptor.
    while unsafe { libc::read(std::os::fd::AsRawFd::as_raw_fd(&keeper_end), byte.as_mut_ptr().cast(), 1) } != 0 {
        if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            break;
        }
    }
    // The agent may still be leaving (its last threads exiting): try for a
    // few seconds, children first.
    for _ in 0..100 {
        let mut left = false;
        for path in paths.iter().rev() {
            match std::fs::remove_dir(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => left = true,
                _ => {}
            }
        }
        if !left {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: ends the forked child without running the agent's exit
    // handlers or destructors.
    unsafe { libc::_exit(0) }
}
