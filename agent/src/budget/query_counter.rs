//! The server's own count of the queries it started (`global_query_id`),
//! read from its memory with `process_vm_readv`: no trap, no stop, nothing
//! the server notices. Budget mode uses it to know how many statements ran
//! while the probes were off.
use crate::discover::{StaticVariable, runtime_address};

#[derive(Clone, Copy, Debug)]
pub struct QueryCounter {
    pid: u32,
    address: u64,
}

impl QueryCounter {
    /// Finds the variable in the running server: the executable's mapping
    /// from file offset 0 gives the load bias. None when the process or its
    /// mapping cannot be read, or the value does not read back.
    pub fn locate(pid: u32, variable: StaticVariable) -> Option<Self> {
        let counter = Self { pid, address: runtime_address(pid, variable)? };
        counter.read()?;
        Some(counter)
    }

    pub fn read(&self) -> Option<u64> {
        let mut value = 0u64;
        let local = libc::iovec { iov_base: (&mut value as *mut u64).cast(), iov_len: 8 };
        let remote = libc::iovec { iov_base: self.address as *mut libc::c_void, iov_len: 8 };
        // SAFETY: one valid local buffer of 8 bytes; the remote range is
        // only read, by the kernel, and a bad address fails the call.
        let read = unsafe { libc::process_vm_readv(self.pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        (read == 8).then_some(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A variable of this very process, located the way a server's is.
    static PROBE_ME: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    #[test]
    fn reads_a_live_process() {
        use std::sync::atomic::Ordering;
        let pid = std::process::id();
        // Link-time addresses of a PIE image are offsets from its start.
        let start = runtime_address(pid, StaticVariable { address: 0, first_segment: 0 }).unwrap();
        let address = &PROBE_ME as *const _ as u64 - start;
        let counter = QueryCounter::locate(pid, StaticVariable { address, first_segment: 0 }).unwrap();
        PROBE_ME.store(41, Ordering::SeqCst);
        assert_eq!(counter.read(), Some(41));
        PROBE_ME.store(42, Ordering::SeqCst);
        assert_eq!(counter.read(), Some(42));
        assert!(QueryCounter::locate(u32::MAX, StaticVariable { address, first_segment: 0 }).is_none());
    }
}
