//! Reads of another process's memory with `process_vm_readv`: the server
//! is neither stopped nor trapped, and a page it freed meanwhile fails the
//! read instead of faulting anyone.

/// Bytes one call may gather: a read past it is refused, never split.
const MAX_GATHER: usize = 64 * 1024;

#[derive(Clone, Copy, Debug)]
pub struct Memory {
    pid: libc::pid_t,
}

impl Memory {
    pub fn of(pid: u32) -> Memory {
        Memory { pid: pid as libc::pid_t }
    }

    /// Reads every `(address, length)` span in one call into one buffer,
    /// spans back to back; None unless all of it was read.
    pub fn gather(&self, spans: &[(u64, usize)]) -> Option<Vec<u8>> {
        let total: usize = spans.iter().map(|s| s.1).sum();
        if total == 0 || total > MAX_GATHER || spans.iter().any(|s| s.0 == 0) {
            return None;
        }
        let mut buffer = vec![0u8; total];
        let local = libc::iovec { iov_base: buffer.as_mut_ptr().cast(), iov_len: total };
        let remote: Vec<libc::iovec> = spans
            .iter()
            .filter(|s| s.1 > 0)
            .map(|&(address, len)| libc::iovec { iov_base: address as *mut libc::c_void, iov_len: len })
            .collect();
        // The kernel caps one call at IOV_MAX spans.
        if remote.len() > 1024 {
            return None;
        }
        // SAFETY: one valid local buffer of `total` bytes; the remote spans
        // are only read, by the kernel, and a bad address fails the call.
        let read =
            unsafe { libc::process_vm_readv(self.pid, &local, 1, remote.as_ptr(), remote.len() as libc::c_ulong, 0) };
        (read >= 0 && read as usize == total).then_some(buffer)
    }

    pub fn u64(&self, address: u64) -> Option<u64> {
        self.gather(&[(address, 8)]).map(|b| le_u64(&b, 0))
    }

    /// A NUL-terminated string of at most `max` bytes; a string that runs
    /// to the end of its page is read up to there.
    pub fn c_string(&self, address: u64, max: usize) -> Option<Vec<u8>> {
        if address == 0 {
            return None;
        }
        let to_page_end = (4096 - (address % 4096) as usize).min(max);
        let mut bytes = self.gather(&[(address, to_page_end)])?;
        if !bytes.contains(&0) && to_page_end < max {
            bytes.extend(self.gather(&[(address + to_page_end as u64, max - to_page_end)]).unwrap_or_default());
        }
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        bytes.truncate(end);
        Some(bytes)
    }
}

pub fn le_u64(bytes: &[u8], at: usize) -> u64 {
    bytes.get(at..at + 8).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
}

pub fn le_u32(bytes: &[u8], at: usize) -> u32 {
    bytes.get(at..at + 4).map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathers_spans_of_this_process() {
        let a = 0x1122_3344_5566_7788u64;
        let b = *b"stage\0rest";
        let memory = Memory::of(std::process::id());
        let both = memory.gather(&[(&a as *const u64 as u64, 8), (b.as_ptr() as u64, 5)]).unwrap();
        assert_eq!(le_u64(&both, 0), a);
        assert_eq!(&both[8..], b"stage");
        assert_eq!(memory.c_string(b.as_ptr() as u64, 64).unwrap(), b"stage");
        assert!(memory.gather(&[(0, 8)]).is_none());
        assert!(memory.gather(&[(8, 8)]).is_none(), "an unmapped page fails the read");
    }
}
