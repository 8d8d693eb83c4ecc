//! Headless Chromium (Debian's `chromium`) opening the collector's pages as
//! a user's browser does: it runs the page, logs every console message to
//! stderr, and can dump the DOM after load or save a screenshot.
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use super::collector::TempDir;

const CHROMIUM: &str = "/usr/bin/chromium";

/// Whether the browser is installed; without it a test says why it skips,
/// unless SQLBEE_REQUIRE_PRIVILEGED is set (as `./x test` does, after
/// `./x setup` installed it), in which case a missing browser fails.
pub fn available(test: &str) -> bool {
    if Path::new(CHROMIUM).exists() {
        return true;
    }
    if std::env::var_os("SQLBEE_REQUIRE_PRIVILEGED").is_some() {
        panic!("{test}: {CHROMIUM} is missing; `./x setup` installs Debian's chromium");
    }
    eprintln!("skipping {test}: {CHROMIUM} is missing (`./x setup` installs it)");
    false
}

/// What the browser saw of one page.
pub struct Loaded {
    pub dom: String,
    /// Console messages: script errors, refused resources (CSP), logs.
    pub console: Vec<String>,
}

impl Loaded {
    /// Milliseconds from navigation start to the end of the load event, as
    /// the page's script reads them from the browser's navigation timing.
    pub fn load_ms(&self) -> Option<u64> {
        attribute(&self.dom, "data-load-ms").and_then(|v| v.parse().ok())
    }
}

pub fn attribute(text: &str, name: &str) -> Option<String> {
    let start = text.find(&format!("{name}=\""))? + name.len() + 2;
    let end = start + text[start..].find('"')?;
    Some(text[start..end].to_string())
}

fn chromium(profile: &Path) -> Command {
    let mut cmd = Command::new(CHROMIUM);
    cmd.args([
        "--headless",
        // Root in CI: Chromium refuses its sandbox as root.
        "--no-sandbox",
        "--disable-gpu",
        "--disable-extensions",
        "--no-first-run",
        "--hide-scrollbars",
        "--enable-logging=stderr",
        "--v=0",
        // Let the load handler's timer run before the DOM is dumped.
        "--virtual-time-budget=3000",
        "--window-size=1400,1100",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    cmd
}

fn run(mut cmd: Command, what: &str) -> std::process::Output {
    let child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting chromium");
    let pid = child.id();
    // A hung browser must not hang the suite.
    let watchdog = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(90));
        // SAFETY: kill(2) on a pid we started; harmless if it already exited.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    });
    let out = child.wait_with_output().expect("waiting for chromium");
    drop(watchdog);
    assert!(out.status.success(), "chromium {what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    out
}

fn console(stderr: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stderr).lines().filter(|l| l.contains(":CONSOLE")).map(str::to_string).collect()
}

/// Opens `url` and returns the DOM after load and the console's messages.
pub fn load(url: &str) -> Loaded {
    let profile = TempDir::new("chromium");
    let mut cmd = chromium(profile.path());
    cmd.arg("--dump-dom").arg(url);
    let out = run(cmd, &format!("--dump-dom {url}"));
    Loaded { dom: String::from_utf8_lossy(&out.stdout).into_owned(), console: console(&out.stderr) }
}

/// Saves a screenshot of `url` at `path` and returns the console's messages.
pub fn screenshot(url: &str, path: &Path) -> Vec<String> {
    let profile = TempDir::new("chromium");
    let mut cmd = chromium(profile.path());
    cmd.arg(format!("--screenshot={}", path.display())).arg(url);
    let out = run(cmd, &format!("--screenshot {url}"));
    assert!(path.exists(), "no screenshot at {}", path.display());
    console(&out.stderr)
}

/// Where screenshots go for review: `target/ui-screenshots/`.
pub fn screenshot_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap().join("ui-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
