//! The fleet collector's own build: `sqlbee` with the `collector` feature
//! only. Built in a target directory of its own, with the eBPF tools off
//! PATH, so a green run shows it needs none of them; the suite then runs
//! this binary as a real collector (`SQLBEE_COLLECTOR_ONLY_BIN`). The
//! collector crate's own tests run with the tools off PATH too
//! (`without_ebpf_tools`), and its dependency graph, dev-dependencies
//! included, is checked for eBPF crates here.
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use xtask::{cargo, paths};

const FEATURES: [&str; 4] = ["-p", "sqlbee", "--no-default-features", "--features=collector"];

/// The collector's crate: its tests need no eBPF toolchain and no root.
pub const CRATE: &str = "sqlbee-collector";

/// PATH without the eBPF tools `./x setup` installs (bpf-linker).
pub fn without_ebpf_tools() -> anyhow::Result<std::ffi::OsString> {
    let tools = paths::tools_dir().join("bin");
    let path = std::env::var_os("PATH").unwrap_or_default();
    Ok(std::env::join_paths(std::env::split_paths(&path).filter(|p| *p != tools))?)
}

/// Fails when the packages `selection` names depend on an eBPF crate
/// (along the edges `edges`).
fn check_no_ebpf(selection: &[&str], edges: &str) -> anyhow::Result<()> {
    let tree = cargo()
        .args(["tree", "-e", edges, "--prefix", "none"])
        .args(selection)
        .env("PATH", without_ebpf_tools()?)
        .output()
        .context("running cargo tree")?;
    if !tree.status.success() {
        bail!("cargo tree {} failed: {}", selection.join(" "), String::from_utf8_lossy(&tree.stderr));
    }
    let ebpf: Vec<String> = String::from_utf8_lossy(&tree.stdout)
        .lines()
        .filter(|l| l.starts_with("aya") || l.starts_with("agent-ebpf") || l.starts_with("sqlbee-kernel-abi"))
        .map(str::to_string)
        .collect();
    if !ebpf.is_empty() {
        bail!("{} depends on eBPF crates: {ebpf:?}", selection.join(" "));
    }
    Ok(())
}

/// Builds it and returns the binary's path.
pub fn build() -> anyhow::Result<PathBuf> {
    let target = paths::workspace_root().join("target/collector-only");
    let without_tools = without_ebpf_tools()?;
    check_no_ebpf(&FEATURES, "normal,build")?;
    check_no_ebpf(&["-p", CRATE], "normal,build,dev")?;

    println!("==> cargo build {} (no bpf-linker on PATH)", FEATURES.join(" "));
    let status = cargo()
        .args(["build"])
        .args(FEATURES)
        .arg("--target-dir")
        .arg(&target)
        .env("PATH", &without_tools)
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("the collector-only build failed");
    }
    Ok(target.join("debug/sqlbee"))
}
