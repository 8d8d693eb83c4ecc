//! chdb, the current ClickHouse engine in-process (a Python package), in a
//! virtualenv of its own under the tools directory (`./x setup` installs
//! it). Debian packages only ClickHouse 18.16, so the ClickHouse store's
//! tests record every statement they send it and replay them here
//! (`replay`): the store's SQL must run on a current version too.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::python_venv;

/// The chdb release `./x setup` installs (ClickHouse 26.9 inside).
pub const VERSION: &str = python_venv::CHDB.version;

#[derive(Debug, thiserror::Error)]
pub enum ChdbError {
    #[error(transparent)]
    Missing(#[from] python_venv::Missing),
    #[error("cannot write the statements to replay under {dir}: {source}")]
    Write {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot run {python}: {source}")]
    Run {
        python: String,
        #[source]
        source: std::io::Error,
    },
    #[error("current ClickHouse (chdb) refused statement {index} of {total}, which 18.16 took:\n{sql}\nchdb: {error}")]
    Refused { index: usize, total: usize, sql: String, error: String },
    #[error("the chdb replay failed ({status}):\n{output}")]
    Failed { status: std::process::ExitStatus, output: String },
}

/// The python to replay with, when chdb {VERSION} imports there.
pub fn installed() -> Result<PathBuf, ChdbError> {
    Ok(python_venv::CHDB.installed()?)
}

/// chdb's python for a test named `test`, or None after saying why it
/// skips (a failure under SQLBEE_REQUIRE_PRIVILEGED).
pub fn for_test(test: &str) -> Option<PathBuf> {
    python_venv::CHDB.for_test(test)
}

/// One statement as 18.16 took it.
pub struct Statement {
    /// The database it ran in (None: the server's default).
    pub database: Option<String>,
    pub sql: String,
    /// An INSERT's rows, in the format its `FORMAT` clause names.
    pub rows: Option<Vec<u8>>,
    /// A SELECT's answer length in bytes, which chdb's must equal.
    pub answer_len: Option<usize>,
}

/// Runs `statements` in order in a fresh chdb session. Ok(chdb's ClickHouse
/// version), or the first statement chdb refused or answered with another
/// length, with its error.
pub fn replay(python: &Path, statements: &[Statement]) -> Result<String, ChdbError> {
    static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("sqlbee-chdb-replay-{}-{n}", std::process::id()));
    let write_err = |source| ChdbError::Write { dir: dir.display().to_string(), source };
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(write_err)?;
    let mut lines = String::new();
    for (i, s) in statements.iter().enumerate() {
        let rows = match &s.rows {
            Some(bytes) => {
                let name = format!("{i:05}.bin");
                std::fs::write(dir.join(&name), bytes).map_err(write_err)?;
                Some(name)
            }
            None => None,
        };
        let line = serde_json::json!({"database": s.database, "sql": s.sql, "rows": rows, "answer_len": s.answer_len});
        lines.push_str(&line.to_string());
        lines.push('\n');
    }
    std::fs::write(dir.join("statements.jsonl"), lines).map_err(write_err)?;
    let script = dir.join("chdb_replay.py");
    std::fs::write(&script, include_str!("chdb_replay.py")).map_err(write_err)?;
    let out = Command::new(python)
        .arg(&script)
        .arg(&dir)
        .output()
        .map_err(|source| ChdbError::Run { python: python.display().to_string(), source })?;
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    // The script's word is its last line; chdb may print before it.
    let last = stdout.lines().last().unwrap_or_default();
    let result = if out.status.success() {
        Ok(last.to_string())
    } else if let Ok(refused) = serde_json::from_str::<serde_json::Value>(last)
        && let Some(index) = refused["index"].as_u64()
    {
        Err(ChdbError::Refused {
            index: index as usize,
            total: statements.len(),
            sql: refused["sql"].as_str().unwrap_or_default().to_string(),
            error: refused["error"].as_str().unwrap_or_default().to_string(),
        })
    } else {
        Err(ChdbError::Failed {
            status: out.status,
            output: format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr)),
        })
    };
    let _ = std::fs::remove_dir_all(&dir);
    result
}
