//! `./x image`: the sqlbee image and the MariaDB image the container tests
//! and the compose demo run, built with podman and no registry.
//!
//! - `localhost/sqlbee:latest`: `docker/Containerfile` over a staged root
//!   holding the stripped release binary and the C runtime files `ldd`
//!   names (it is not static: glibc, libm, libgcc_s and the loader).
//! - `localhost/sqlbee-test-mariadb:latest` (10.11, Debian 12's) and
//!   `localhost/sqlbee-test-mariadb:11.8` (Debian 13's, the newest LTS):
//!   mariadb-server on a debootstrap root file system, imported with
//!   `podman import`. Slow (a minute or two each) and rebuilt only when
//!   its recipe changes: the image carries a label with the recipe's hash.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, bail};

use crate::{cargo, paths::workspace_root};

pub const SQLBEE_IMAGE: &str = "localhost/sqlbee:latest";
pub const MARIADB_IMAGE: &str = "localhost/sqlbee-test-mariadb:latest";
pub const MARIADB_11_8_IMAGE: &str = "localhost/sqlbee-test-mariadb:11.8";
/// Each test MariaDB image and the Debian release it comes from.
const MARIADB_IMAGES: [(&str, &str); 2] = [(MARIADB_IMAGE, "bookworm"), (MARIADB_11_8_IMAGE, "trixie")];
const DEBIAN_MIRROR: &str = "http://deb.debian.org/debian";
/// Everything that shapes the MariaDB image; its hash labels the image.
const MARIADB_ENTRYPOINT: &str = r#"#!/bin/sh
# Starts mariadbd in the foreground on port 3306 and the default socket,
# on a datadir it initialises at the first start. root@localhost logs in
# over the socket (unix_socket), so `podman exec NAME mariadb -e ...` works.
set -e
mkdir -p /run/mysqld
chown mysql:mysql /run/mysqld
if [ ! -d /var/lib/mysql/mysql ]; then
    mariadb-install-db --user=mysql --datadir=/var/lib/mysql --skip-test-db >/dev/null
fi
exec mariadbd --user=mysql --datadir=/var/lib/mysql --port=3306 --bind-address=0.0.0.0 \
    --socket=/run/mysqld/mysqld.sock --skip-name-resolve --max-connections=200 "$@"
"#;
const MARIADB_RECIPE_VERSION: &str = "bookworm minbase + mariadb-server, PATH, v2";

/// podman with the project's engine settings (`docker/podman/containers.conf`:
/// runc, whose cgroup handling works on this host's hybrid layout).
pub fn podman() -> Command {
    let mut cmd = Command::new("podman");
    cmd.env("CONTAINERS_CONF", containers_conf());
    cmd
}

pub fn containers_conf() -> PathBuf {
    workspace_root().join("docker/podman/containers.conf")
}

fn run(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("could not start: {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.stderr(Stdio::null()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Builds both images; returns nothing but says what it built and how long
/// each took.
pub fn build() -> anyhow::Result<()> {
    let started = Instant::now();
    sqlbee_image().context("building the sqlbee image")?;
    println!("ok  {SQLBEE_IMAGE} in {:.0} s ({})", started.elapsed().as_secs_f64(), size(SQLBEE_IMAGE));
    for (image, suite) in MARIADB_IMAGES {
        let started = Instant::now();
        mariadb_image(image, suite).with_context(|| format!("building the test MariaDB image {image}"))?;
        println!("ok  {image} in {:.0} s ({})", started.elapsed().as_secs_f64(), size(image));
    }
    Ok(())
}

fn size(image: &str) -> String {
    output(podman().args(["image", "inspect", "--format", "{{.Size}}", image]))
        .and_then(|s| s.parse::<f64>().ok())
        .map_or("size unknown".into(), |b| format!("{:.1} MiB", b / (1 << 20) as f64))
}

fn sqlbee_image() -> anyhow::Result<()> {
    println!("==> cargo build --release -p sqlbee");
    run(cargo().args(["build", "--release", "-p", "sqlbee"]), "cargo build --release")?;
    let root = workspace_root();
    let context = root.join("target/image");
    let _ = fs::remove_dir_all(&context);
    let rootfs = context.join("rootfs");
    let binary = root.join("target/release/sqlbee");
    let bin_dir = rootfs.join("usr/local/bin");
    fs::create_dir_all(&bin_dir)?;
    // The release profile keeps debug info for profiling; the image does
    // not need it (166 MiB -> about 20).
    run(
        Command::new("objcopy").arg("--strip-debug").arg(&binary).arg(bin_dir.join("sqlbee")),
        "objcopy --strip-debug",
    )?;
    for library in linked_files(&binary)? {
        let target = rootfs.join(library.strip_prefix("/").unwrap_or(&library));
        fs::create_dir_all(target.parent().unwrap())?;
        fs::copy(&library, &target).with_context(|| format!("copying {}", library.display()))?;
    }
    let etc = rootfs.join("etc");
    fs::create_dir_all(&etc)?;
    fs::write(
        etc.join("passwd"),
        "root:x:0:0:root:/:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n",
    )?;
    fs::write(etc.join("group"), "root:x:0:\nnogroup:x:65534:\n")?;
    for dir in ["tmp", "var/lib/sqlbee", "run"] {
        fs::create_dir_all(rootfs.join(dir))?;
    }
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(rootfs.join("tmp"), fs::Permissions::from_mode(0o1777))?;
    fs::set_permissions(rootfs.join("var/lib/sqlbee"), fs::Permissions::from_mode(0o700))?;
    fs::create_dir_all(context.join("collector-data"))?;
    fs::set_permissions(context.join("collector-data"), fs::Permissions::from_mode(0o700))?;
    println!("==> podman build {SQLBEE_IMAGE}");
    run(
        podman()
            .args(["build", "--quiet", "-t", SQLBEE_IMAGE, "-f"])
            .arg(root.join("docker/Containerfile"))
            .arg(&context),
        "podman build",
    )
}

/// The loader and the shared libraries `binary` needs, as absolute paths.
fn linked_files(binary: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let listing = output(Command::new("ldd").arg(binary)).context("ldd failed")?;
    let files: Vec<PathBuf> = listing
        .lines()
        .filter_map(|line| {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
            // "/lib64/ld-linux-x86-64.so.2 (0x...)"; the vDSO has no file.
            let path = line.split("=>").last()?.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect();
    if files.is_empty() {
        bail!("ldd named no library: {listing}");
    }
    Ok(files)
}

fn recipe_hash(suite: &str) -> String {
    // FNV-1a: only has to change when the recipe does.
    let recipe = MARIADB_ENTRYPOINT.bytes().chain(MARIADB_RECIPE_VERSION.bytes()).chain(suite.bytes());
    let hash = recipe.fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
    format!("{hash:016x}")
}

fn mariadb_image(image: &str, suite: &str) -> anyhow::Result<()> {
    let recipe = recipe_hash(suite);
    let label = output(podman().args(["image", "inspect", "--format", "{{index .Labels \"sqlbee.recipe\"}}", image]));
    if label.as_deref() == Some(recipe.as_str()) {
        println!("ok  {image} is up to date (recipe {recipe})");
        return Ok(());
    }
    let rootfs = workspace_root().join(format!("target/image-mariadb-{suite}/rootfs"));
    let _ = fs::remove_dir_all(&rootfs);
    fs::create_dir_all(&rootfs)?;
    println!("==> debootstrap {suite} with mariadb-server (a minute or two)");
    run(
        Command::new("debootstrap")
            .args(["--variant=minbase", "--include=mariadb-server", suite])
            .arg(&rootfs)
            .arg(DEBIAN_MIRROR)
            .stdout(Stdio::null()),
        "debootstrap",
    )?;
    // Nothing of apt's caches belongs in the image.
    for dir in ["var/cache/apt/archives", "var/lib/apt/lists"] {
        let path = rootfs.join(dir);
        for entry in fs::read_dir(&path).into_iter().flatten().flatten() {
            if entry.path().is_file() {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
    // A datadir from the package's postinst would be a stranger's: every
    // container initialises its own.
    let _ = fs::remove_dir_all(rootfs.join("var/lib/mysql"));
    fs::create_dir_all(rootfs.join("var/lib/mysql"))?;
    let entrypoint = rootfs.join("usr/local/bin/run-mariadb");
    fs::write(&entrypoint, MARIADB_ENTRYPOINT)?;
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&entrypoint, fs::Permissions::from_mode(0o755))?;
    println!("==> podman import {image}");
    let mut tar = Command::new("tar").arg("-C").arg(&rootfs).args(["-c", "."]).stdout(Stdio::piped()).spawn()?;
    let status = podman()
        .args(["import", "--quiet"])
        .args(["--change", r#"ENTRYPOINT ["/usr/local/bin/run-mariadb"]"#])
        .args(["--change", "EXPOSE 3306"])
        // `podman run` supplies a PATH, `podman kube play` does not.
        .args(["--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"])
        .args(["--change", &format!("LABEL sqlbee.recipe={recipe}")])
        .args(["-", image])
        .stdin(tar.stdout.take().context("tar stdout")?)
        .stdout(Stdio::null())
        .status()?;
    let tar_status = tar.wait()?;
    if !status.success() || !tar_status.success() {
        bail!("podman import failed ({status}, tar {tar_status})");
    }
    let _ = fs::remove_dir_all(&rootfs);
    Ok(())
}
