//! Builds the kernel programs (agent-ebpf) for the BPF target; the object
//! lands in OUT_DIR, where `probe::attach` embeds it. Only this crate
//! needs the eBPF toolchain: the collector and the query tools never
//! depend on it.
fn main() -> anyhow::Result<()> {
    use anyhow::{Context as _, anyhow};

    let manifest_dir = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let ebpf_dir =
        manifest_dir.parent().ok_or_else(|| anyhow!("agent crate has no parent directory"))?.join("agent-ebpf");
    let root_dir = ebpf_dir.to_str().ok_or_else(|| anyhow!("non UTF-8 path {}", ebpf_dir.display()))?;
    // aya-build watches the eBPF crate only; the types and functions it
    // shares with the agent change the programs as well.
    for shared in ["kernel-abi", "figures"] {
        println!("cargo:rerun-if-changed={}", ebpf_dir.with_file_name(shared).display());
    }
    aya_build::build_ebpf(
        [aya_build::Package { name: "agent-ebpf", root_dir, ..Default::default() }],
        aya_build::Toolchain::Custom("nightly-2026-10-30"),
    )
    .context("building the eBPF programs failed (is bpf-linker on PATH? `./x setup` installs it)")
}
