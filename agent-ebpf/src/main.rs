//! Kernel programs of sqlbee. They read what the server already keeps and
//! never write to it, never loop without a bound and never wake user space
//! per statement: records go to the ring buffer with `BPF_RB_NO_WAKEUP` and
//! the agent drains them on a timer.
#![no_std]
#![no_main]

/// Defines each program twice from one body: `$multi` in a `uprobe.multi`
/// section, attached through one BPF link that filters on the process, and
/// `$perf` as a classic uprobe for kernels before 6.6 (or whose multi-link
/// pid filter matches one thread only). The classic attach makes a
/// per-task perf event, which switches on the scheduler's perf hooks for
/// every context switch on the host as long as it exists, so the agent
/// loads the multi programs wherever the kernel has them.
macro_rules! uprobe_pair {
    ($($multi:ident, $perf:ident => $body:path;)+) => {
        $(
            #[aya_ebpf::macros::uprobe(multi)]
            pub fn $multi(ctx: aya_ebpf::programs::ProbeContext) -> u32 {
                $body(ctx)
            }

            #[aya_ebpf::macros::uprobe]
            pub fn $perf(ctx: aya_ebpf::programs::ProbeContext) -> u32 {
                $body(ctx)
            }
        )+
    };
}

mod bounds;
mod calibrate;
mod errors;
mod kernel_digests;
mod layout;
mod maps;
mod names;
mod query_stats;
mod replication;
mod send;
mod statements;
mod stored_programs;
mod values;
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
