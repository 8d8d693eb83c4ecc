//! The cheapest program there is, for measuring what the uprobe trap
//! itself costs: the agent attaches it to a function of its own and times
//! calls with and without it.
use aya_ebpf::programs::ProbeContext;
use sqlbee_kernel_abi::stat;

use crate::maps::bump_stat;

uprobe_pair! {
    calibrate, calibrate_perf => on_calibrate;
}

#[inline(always)]
fn on_calibrate(_ctx: ProbeContext) -> u32 {
    bump_stat(stat::CALIBRATION_HITS);
    0
}
