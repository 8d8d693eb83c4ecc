//! One agent per state directory. Two agents sharing one would hand out
//! the same batch numbers for different windows, and the collector would
//! keep the first and drop the other's as a duplicate. An exclusive
//! `flock` on `lock` is held for the agent's life; the kernel releases it
//! when the process ends, however it ends, so a crash never leaves the
//! directory locked. The file names the holder for the error message.
use std::{
    fs,
    io::{Read, Seek, Write},
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    path::{Path, PathBuf},
};

use super::identity::FILE_MODE;

#[derive(Debug, thiserror::Error)]
pub enum StateLockError {
    #[error("the state directory {dir} is in use by another agent ({holder}); give each agent its own --state-dir")]
    InUse { dir: PathBuf, holder: String },
    #[error("cannot lock the state directory {dir}: {source}")]
    Io {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Held while the agent runs; dropping it (or the process ending) unlocks.
#[derive(Debug)]
pub struct StateLock {
    _file: fs::File,
}

impl StateLock {
    pub fn acquire(dir: &Path) -> Result<StateLock, StateLockError> {
        let io = |source| StateLockError::Io { dir: dir.to_path_buf(), source };
        let mut file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(FILE_MODE)
            .open(dir.join("lock"))
            .map_err(io)?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(io(error));
            }
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            let holder = if holder.is_empty() { "pid unknown".to_string() } else { holder.to_string() };
            return Err(StateLockError::InUse { dir: dir.to_path_buf(), holder });
        }
        let me = format!("pid {} on {}\n", std::process::id(), crate::procfs::hostname());
        file.set_len(0).and_then(|()| file.rewind()).and_then(|()| file.write_all(me.as_bytes())).map_err(io)?;
        Ok(StateLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_until_the_first_lets_go() {
        let dir = std::env::temp_dir().join(format!("sqlbee-state-lock-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let first = StateLock::acquire(&dir).unwrap();
        // flock locks belong to the open file, so a second open in this
        // process conflicts as another process would.
        let err = StateLock::acquire(&dir).unwrap_err().to_string();
        assert!(
            err.contains("in use by another agent") && err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        drop(first);
        StateLock::acquire(&dir).unwrap();
        fs::remove_dir_all(dir).ok();
    }
}
