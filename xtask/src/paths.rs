//! Where the project's tools live, outside any checkout so that a fresh
//! clone on the same machine reuses them.
use std::path::PathBuf;

pub const TOOLCHAIN: &str = "nightly-2026-10-30";

fn home() -> PathBuf {
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"))
}

/// Root of sqlbee's installed tools (`SQLBEE_TOOLS_DIR` overrides).
pub fn tools_root() -> PathBuf {
    std::env::var_os("SQLBEE_TOOLS_DIR").map(PathBuf::from).unwrap_or_else(|| home().join(".local/share/sqlbee"))
}

/// Directory whose `bin/` holds bpf-linker.
pub fn tools_dir() -> PathBuf {
    tools_root().join("tools")
}

/// Prefix holding a copy of rustc's own libLLVM for bpf-linker.
pub fn llvm_prefix() -> PathBuf {
    tools_root().join("llvm")
}

/// PATH with the tools directory in front.
pub fn path_with_tools() -> std::ffi::OsString {
    let mut paths = vec![tools_dir().join("bin")];
    if let Some(current) = std::env::var_os("PATH") {
        paths.extend(std::env::split_paths(&current));
    }
    std::env::join_paths(paths).unwrap_or_default()
}

/// The workspace root (this crate lives one level below it).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().map(PathBuf::from).unwrap_or_default()
}
