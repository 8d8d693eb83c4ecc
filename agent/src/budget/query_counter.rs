//! The server's own count of the queries it started (`global_query_id`),
//! read from its memory with `process_vm_readv`: no trap, no stop, nothing
//! the server notices. Budget mode uses it to know how many statements ran
//! while the probes were off.
use std::{fs, os::unix::fs::MetadataExt};

use crate::discover::StaticVariable;

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
        let inode = fs::metadata(format!("/proc/{pid}/exe")).ok()?.ino();
        let maps = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
        let start = image_start(&maps, inode)?;
        let address = start.checked_sub(variable.first_segment)?.checked_add(variable.address)?;
        let counter = Self { pid, address };
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
mod tests {
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

    /// A variable of this very process, located the way a server's is.
    static PROBE_ME: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    #[test]
    fn reads_a_live_process() {
        use std::sync::atomic::Ordering;
        let pid = std::process::id();
        let maps = fs::read_to_string("/proc/self/maps").unwrap();
        let inode = fs::metadata("/proc/self/exe").unwrap().ino();
        let start = image_start(&maps, inode).unwrap();
        // Link-time addresses of a PIE image are offsets from its start.
        let address = &PROBE_ME as *const _ as u64 - start;
        let counter = QueryCounter::locate(pid, StaticVariable { address, first_segment: 0 }).unwrap();
        PROBE_ME.store(41, Ordering::SeqCst);
        assert_eq!(counter.read(), Some(41));
        PROBE_ME.store(42, Ordering::SeqCst);
        assert_eq!(counter.read(), Some(42));
        assert!(QueryCounter::locate(u32::MAX, StaticVariable { address, first_segment: 0 }).is_none());
    }
}
