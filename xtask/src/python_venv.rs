//! Python packages from PyPI that the tests use, each pinned and in a
//! virtualenv of its own under the tools directory, made by Debian's
//! python3 so that no other Python on the machine decides what runs.
//! `./x setup` installs them; a test asks `installed` for the python.
use std::{path::PathBuf, process::Command};

use crate::paths::tools_dir;

/// One pinned package and the module that proves it imports.
pub struct Package {
    /// Its name on PyPI (and its virtualenv's folder).
    pub name: &'static str,
    pub version: &'static str,
    /// The module whose `__version__`, or whose distribution's version,
    /// must be `version`.
    pub module: &'static str,
}

#[derive(Debug, thiserror::Error)]
#[error("{name} {version} is not installed in {venv}: run `./x setup` ({why})")]
pub struct Missing {
    pub name: &'static str,
    pub version: &'static str,
    pub venv: String,
    pub why: String,
}

impl Package {
    pub fn venv(&self) -> PathBuf {
        tools_dir().join(self.name)
    }

    pub fn python(&self) -> PathBuf {
        self.venv().join("bin/python")
    }

    /// The virtualenv's python, when the package imports there at the
    /// pinned version.
    pub fn installed(&self) -> Result<PathBuf, Missing> {
        let python = self.python();
        let missing = |why: String| Missing {
            name: self.name,
            version: self.version,
            venv: self.venv().display().to_string(),
            why,
        };
        let check = format!(
            "import importlib.metadata, {module}; print(importlib.metadata.version({name:?}))",
            module = self.module,
            name = self.name
        );
        let out = Command::new(&python)
            .args(["-c", &check])
            .output()
            .map_err(|e| missing(format!("{}: {e}", python.display())))?;
        let found = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() || found != self.version {
            return Err(missing(format!("found {found:?}: {}", String::from_utf8_lossy(&out.stderr).trim())));
        }
        Ok(python)
    }

    /// Makes the virtualenv and installs the package, unless it is there.
    pub fn install(&self) -> anyhow::Result<PathBuf> {
        if let Ok(python) = self.installed() {
            println!("ok  {} {} ({})", self.name, self.version, python.display());
            return Ok(python);
        }
        let venv = self.venv();
        println!("==> python3 -m venv {} and pip install {}=={}", venv.display(), self.name, self.version);
        run(Command::new("/usr/bin/python3").args(["-m", "venv", "--clear"]).arg(&venv), "python3 -m venv")?;
        run(
            Command::new(venv.join("bin/pip"))
                .args(["install", "--quiet", "--disable-pip-version-check"])
                .arg(format!("{}=={}", self.name, self.version)),
            "pip install",
        )?;
        let python = self.installed()?;
        println!("ok  {} {}", self.name, self.version);
        Ok(python)
    }

    /// The python for a test named `test`, or None after saying why it
    /// skips; under SQLBEE_REQUIRE_PRIVILEGED (CI, `./x test`) a missing
    /// package is a failure instead.
    pub fn for_test(&self, test: &str) -> Option<PathBuf> {
        match self.installed() {
            Ok(python) => Some(python),
            Err(why) => {
                if std::env::var_os("SQLBEE_REQUIRE_PRIVILEGED").is_some() {
                    panic!("{test}: needs {}, and SQLBEE_REQUIRE_PRIVILEGED is set: {why}", self.name);
                }
                eprintln!("skipping {test}: {why}");
                None
            }
        }
    }
}

fn run(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let status = cmd.status().map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
    anyhow::ensure!(status.success(), "{what} failed ({status})");
    Ok(())
}

/// chdb: current ClickHouse in-process (the ClickHouse store's tests
/// replay their SQL on it).
pub const CHDB: Package = Package { name: "chdb", version: "4.4.0", module: "chdb" };

/// The Model Context Protocol's Python SDK: the real client the tests of
/// `sqlbee mcp` speak to the binary with.
pub const MCP: Package = Package { name: "mcp", version: "2.3.0", module: "mcp.client.stdio" };
