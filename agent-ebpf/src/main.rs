//! Kernel programs of sqlbee. They read what the server already keeps and
//! never write to it, never loop without a bound and never wake user space
//! per statement: records go to the ring buffer with `BPF_RB_NO_WAKEUP` and
//! the agent drains them on a timer.
#![no_std]
#![no_main]

mod aggregate;
mod calibrate;
mod errors;
mod layout;
mod maps;
mod statements;
mod waits;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // Unreachable in a verified program; the verifier rejects real panics.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
