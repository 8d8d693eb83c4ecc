//! Installs what the project needs and is quick when nothing is missing.
//! Every step says what it does and fails with a message naming the step.
use std::{fs, path::Path, process::Command};

use anyhow::{Context as _, bail};
use xtask::{
    paths::{TOOLCHAIN, llvm_prefix, tools_dir},
    python_venv,
};

const BPF_LINKER_VERSION: &str = "0.13.0";
/// The manual's builder (`./x docs`); search only, no server or watcher.
const MDBOOK_VERSION: &str = "0.5.4";
/// Containers: podman with runc (crun refuses this host's hybrid cgroup
/// layout), buildah behind `podman build`, debootstrap for base images (no
/// registry is reachable), podman-compose for the compose file.
/// mariadb-test: MariaDB's own test suite, the statements the digest
/// agreement test samples.
const DEBIAN_PACKAGES: [&str; 28] = [
    "mariadb-server",
    "mariadb-client",
    "sysbench",
    "mariadb-test",
    "protobuf-compiler",
    "bpftool",
    "bpftrace",
    // perf record: where mysqld's CPU goes (`bench-rate --profile`).
    "linux-perf",
    // prometheus and promtool: what the metrics tests scrape and parse with.
    "prometheus",
    "podman",
    "buildah",
    "runc",
    "debootstrap",
    "podman-compose",
    "containernetworking-plugins",
    // The pause binary of the pods `podman kube play` makes.
    "catatonit",
    // Containers on one podman network find each other by name (CNI).
    "golang-github-containernetworking-plugin-dnsname",
    // The ClickHouse store's tests start a private server (18.16).
    "clickhouse-server",
    "clickhouse-client",
    // The cluster store's tests start four servers and the ZooKeeper their
    // replicated tables and ON CLUSTER DDL need (3.8, Java).
    "zookeeper",
    // What xtask::clickhouse runs checks with over the HTTP interface.
    "curl",
    // The web UI's tests open every page in headless Chromium.
    "chromium",
    // Debian's python3 makes the virtualenvs of the Python packages.
    "python3-venv",
    // A Python client program, one of those the client attribution test
    // tells apart.
    "python3-pymysql",
    // The send hook's TLS test makes its server a throwaway certificate.
    "openssl",
    // `ip netns` and veth pairs: the client attribution test's client in a
    // network namespace of its own.
    "iproute2",
    // The kernel matrix: distribution kernels booted under QEMU, with a
    // static busybox as the guest's shell (xtask::kernel_matrix).
    "qemu-system-x86",
    "busybox-static",
];

pub fn run() -> anyhow::Result<()> {
    toolchain().context("setup step 1/7 (pinned nightly toolchain)")?;
    bpf_linker().context("setup step 2/7 (bpf-linker)")?;
    mdbook().context("setup step 3/7 (mdbook)")?;
    debian_packages().context("setup step 4/7 (Debian packages)")?;
    python_packages().context("setup step 5/7 (Python packages: chdb, mcp)")?;
    xtask::kernel_matrix::install().context("setup step 6/7 (the kernel matrix's kernels)")?;
    xtask::otelcol::install().context("setup step 7/7 (the OpenTelemetry Collector the OTLP tests send to)")?;
    Ok(())
}

/// Whether the tool `name` in the tools directory says it is `version`
/// (and says so when it is).
fn installed(name: &str, version: &str) -> bool {
    let binary = tools_dir().join("bin").join(name);
    let answer = Command::new(&binary).arg("--version").output();
    let ok = answer.is_ok_and(|out| out.status.success() && String::from_utf8_lossy(&out.stdout).contains(version));
    if ok {
        println!("ok  {name} {version} ({})", binary.display());
    }
    ok
}

fn mdbook() -> anyhow::Result<()> {
    if installed("mdbook", MDBOOK_VERSION) {
        return Ok(());
    }
    println!("==> building mdbook {MDBOOK_VERSION} (about 2 min)");
    run_checked(
        Command::new("cargo")
            .arg(format!("+{TOOLCHAIN}"))
            .args(["install", "--locked", &format!("mdbook@{MDBOOK_VERSION}")])
            .args(["--no-default-features", "--features", "search", "--force", "--root"])
            .arg(tools_dir()),
        "cargo install mdbook",
    )
}

fn run_checked(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("could not start: {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

fn toolchain() -> anyhow::Result<()> {
    let installed = Command::new("rustup")
        .args(["component", "list", "--installed", "--toolchain", TOOLCHAIN])
        .output()
        .context("rustup not found: install rustup first")?;
    let list = String::from_utf8_lossy(&installed.stdout);
    if installed.status.success() && list.lines().any(|l| l.starts_with("rust-src")) {
        println!("ok  toolchain {TOOLCHAIN} with rust-src");
        return Ok(());
    }
    println!("==> installing toolchain {TOOLCHAIN} with rust-src");
    run_checked(
        Command::new("rustup").args([
            "toolchain",
            "install",
            TOOLCHAIN,
            "--profile",
            "minimal",
            "--component",
            "rust-src",
            "--component",
            "clippy",
            "--component",
            "rustfmt",
            "--no-self-update",
        ]),
        "rustup toolchain install",
    )
}

fn bpf_linker() -> anyhow::Result<()> {
    if installed("bpf-linker", BPF_LINKER_VERSION) {
        return Ok(());
    }
    // bpf-linker must use the very LLVM of the rustc that emits the bitcode;
    // Debian has no LLVM 23, but rustc ships its own libLLVM.
    let sysroot = Command::new("rustc").args([&format!("+{TOOLCHAIN}"), "--print", "sysroot"]).output()?;
    let sysroot = String::from_utf8(sysroot.stdout)?.trim().to_string();
    let lib = Path::new(&sysroot).join("lib");
    let libllvm = fs::read_dir(&lib)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("libLLVM.so."))
        .with_context(|| format!("no libLLVM.so.* in {}", lib.display()))?;
    let prefix_lib = llvm_prefix().join("lib");
    fs::create_dir_all(&prefix_lib)?;
    println!("==> copying {libllvm} into {}", prefix_lib.display());
    fs::copy(lib.join(&libllvm), prefix_lib.join(&libllvm))?;
    let link = prefix_lib.join("libLLVM.so");
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink(&libllvm, &link)?;
    println!("==> building bpf-linker {BPF_LINKER_VERSION} against it (about 90 s)");
    run_checked(
        Command::new("cargo")
            .arg(format!("+{TOOLCHAIN}"))
            .args(["install", "--locked", &format!("bpf-linker@{BPF_LINKER_VERSION}")])
            .args(["--no-default-features", "--features", "llvm-23", "--force", "--root"])
            .arg(tools_dir())
            .env("LLVM_PREFIX", llvm_prefix()),
        "cargo install bpf-linker",
    )
}

fn debian_packages() -> anyhow::Result<()> {
    let missing: Vec<&str> = DEBIAN_PACKAGES
        .into_iter()
        .filter(|p| {
            let out = Command::new("dpkg-query").args(["-W", "-f=${Status}", p]).output();
            !out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        println!("ok  Debian packages {}", DEBIAN_PACKAGES.join(", "));
        return Ok(());
    }
    println!("==> apt-get install {}", missing.join(" "));
    run_checked(Command::new("apt-get").args(["update", "-qq"]), "apt-get update")?;
    run_checked(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
        "apt-get install",
    )
}

/// The pinned Python packages the tests use (chdb, the MCP client), each
/// in a virtualenv of its own.
fn python_packages() -> anyhow::Result<()> {
    for package in [python_venv::CHDB, python_venv::MCP] {
        package.install().with_context(|| format!("{} {}", package.name, package.version))?;
    }
    Ok(())
}
