//! The fleet collector's own build: `sqlbee` with the `collector` feature
//! only. Built in a target directory of its own, with the eBPF tools off
//! PATH, so a green run shows it needs none of them; the suite then runs
//! this binary as a real collector (`SQLBEE_COLLECTOR_ONLY_BIN`).
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use xtask::{cargo, paths};

const FEATURES: [&str; 4] = ["-p", "sqlbee", "--no-default-features", "--features=collector"];

/// Builds it and returns the binary's path.
pub fn build() -> anyhow::Result<PathBuf> {
    let target = paths::workspace_root().join("target/collector-only");
    let tools = paths::tools_dir().join("bin");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let without_tools = std::env::join_paths(std::env::split_paths(&path).filter(|p| *p != tools))?;

    let tree = cargo()
        .args(["tree", "-e", "normal,build", "--prefix", "none"])
        .args(FEATURES)
        .env("PATH", &without_tools)
        .output()
        .context("running cargo tree")?;
    if !tree.status.success() {
        bail!("cargo tree of the collector-only build failed: {}", String::from_utf8_lossy(&tree.stderr));
    }
    let ebpf: Vec<String> = String::from_utf8_lossy(&tree.stdout)
        .lines()
        .filter(|l| l.starts_with("aya") || l.starts_with("agent-ebpf"))
        .map(str::to_string)
        .collect();
    if !ebpf.is_empty() {
        bail!("the collector-only build depends on eBPF crates: {ebpf:?}");
    }

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
