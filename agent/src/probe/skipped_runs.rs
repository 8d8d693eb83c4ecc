//! Runs of a program the kernel skipped: its `recursion_misses`.
//!
//! The kernel runs a tracepoint's programs only when no other BPF program,
//! and no map read or update through the `bpf` call, is in progress on that
//! CPU (`bpf_prog_active`); otherwise it skips them and, from 6.7, counts
//! the skip in the program's `recursion_misses` (a field since 5.12, for
//! other kinds of program). A statement whose end falls in a skipped run
//! is not counted, so the count is what says how short an exact figure may
//! be. aya 0.16 reads the program's info but not this field, hence the
//! call of our own.
use std::{io, os::fd::BorrowedFd};

/// `BPF_OBJ_GET_INFO_BY_FD`.
const OBJ_GET_INFO_BY_FD: libc::c_long = 15;

/// `struct bpf_prog_info` up to and including `verified_insns`, the field
/// after `recursion_misses`, rounded up to its 8-byte alignment. The kernel
/// fills what it knows and says how much that was.
const INFO_LEN: usize = 232;
const RECURSION_MISSES_AT: usize = 208;

/// `bpf_attr` for `BPF_OBJ_GET_INFO_BY_FD`.
#[repr(C)]
struct InfoByFd {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The program's skipped runs so far; None on kernels before 5.12, whose
/// program info has no such field.
pub fn of_program(program: BorrowedFd<'_>) -> io::Result<Option<u64>> {
    use std::os::fd::AsRawFd as _;
    #[repr(C, align(8))]
    struct Info([u8; INFO_LEN]);
    let mut info = Info([0; INFO_LEN]);
    let mut attr =
        InfoByFd { bpf_fd: program.as_raw_fd() as u32, info_len: INFO_LEN as u32, info: info.0.as_mut_ptr() as u64 };
    // SAFETY: `attr` is a valid `bpf_attr` prefix for this command, its
    // size passed with it; the kernel writes at most `info_len` bytes to
    // `info`, which outlives the call.
    let rc = unsafe {
        libc::syscall(libc::SYS_bpf, OBJ_GET_INFO_BY_FD, &mut attr as *mut InfoByFd, std::mem::size_of::<InfoByFd>())
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let field = &info.0[RECURSION_MISSES_AT..RECURSION_MISSES_AT + 8];
    let filled = attr.info_len as usize >= RECURSION_MISSES_AT + 8;
    Ok(filled.then(|| u64::from_ne_bytes(field.try_into().expect("8 bytes"))))
}
