//! Whether this kernel attaches multi-uprobe links filtered by process
//! (6.6 and later with the pid-filter fix): what `probe::link_mode` picks
//! its programs by, and what tells `privileges` whether perf events (and
//! so CAP_SYS_ADMIN on older kernels) are needed at all.
use std::sync::OnceLock;

use aya::sys::{UProbeMultiFeature, is_uprobe_multi_supported};
use tracing::info;

/// Whether the multi programs are used; probed once per agent.
pub fn multi_links() -> bool {
    static MULTI: OnceLock<bool> = OnceLock::new();
    *MULTI.get_or_init(|| {
        let multi = is_uprobe_multi_supported(UProbeMultiFeature::ProcessScopedPidFilter).unwrap_or_else(|e| {
            info!(error = %e, "could not probe for multi-uprobe links; using classic uprobes");
            false
        });
        info!(multi_links = multi, "uprobe attach mode");
        multi
    })
}
