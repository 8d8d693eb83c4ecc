//! Who this agent is across restarts, and which batch number comes next.
//! Both live in the state directory: the id is created once, the next
//! sequence is written (fsync + rename) before a batch with that number is
//! spooled, so a number is never handed out twice, even after a crash.
//!
//! The epoch is random per incarnation of the counter: when `next-sequence`
//! is lost or unreadable, numbering starts again in a new epoch, and the
//! collector, which keys batches by (agent id, epoch, sequence), stores
//! the new batches instead of taking them for ones it has.
use std::{
    fs,
    io::Write,
    os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use super::ShipError;

pub struct Identity {
    pub agent_id: String,
    pub epoch: u64,
    next_sequence: u64,
    sequence_file: PathBuf,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ShipError + '_ {
    move |source| ShipError::State { path: path.to_path_buf(), source }
}

/// Files the agent writes hold statement data and its identity: only its
/// own user reads them.
pub const FILE_MODE: u32 = 0o600;
pub const DIR_MODE: u32 = 0o700;

/// Creates `dir` (and its parents) readable by the agent's user only, or
/// narrows an existing one to that.
pub fn private_dir(dir: &Path) -> Result<(), ShipError> {
    fs::DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir).map_err(io(dir))?;
    let mode = fs::metadata(dir).map_err(io(dir))?.permissions().mode() & 0o777;
    if mode != DIR_MODE {
        tracing::info!(dir = %dir.display(), from = format!("{mode:o}"), to = format!("{DIR_MODE:o}"),
            "narrowing the permissions of the agent's state directory");
        fs::set_permissions(dir, fs::Permissions::from_mode(DIR_MODE)).map_err(io(dir))?;
    }
    Ok(())
}

/// Writes `bytes` to `path` (mode 0600) so that a crash leaves either the
/// old or the new content, never a torn file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ShipError> {
    let tmp = path.with_extension("tmp");
    // A leftover from a crash keeps its mode when truncated: start afresh.
    let _ = fs::remove_file(&tmp);
    let written = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .open(&tmp)
        .and_then(|mut file| {
            file.write_all(bytes)?;
            file.sync_all()
        })
        .map_err(io(&tmp))
        .and_then(|()| fs::rename(&tmp, path).map_err(io(path)));
    if written.is_err() {
        // A full disk must not be left fuller by a torn temp file.
        let _ = fs::remove_file(&tmp);
    }
    written?;
    if let Some(dir) = path.parent() {
        fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))?;
    }
    Ok(())
}

fn random<const N: usize>() -> Result<[u8; N], ShipError> {
    let mut bytes = [0u8; N];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(io(Path::new("/dev/urandom")))?;
    Ok(bytes)
}

impl Identity {
    /// Loads or creates the identity; `min_next` is one past the highest
    /// sequence found on disk (the spool may be ahead of the counter file
    /// only if the counter was lost).
    pub fn load(state_dir: &Path, min_next: u64) -> Result<Self, ShipError> {
        private_dir(state_dir)?;
        let id_file = state_dir.join("agent-id");
        let agent_id = match fs::read_to_string(&id_file) {
            Ok(id) if !id.trim().is_empty() => id.trim().to_string(),
            _ => {
                let id: String = random::<16>()?.iter().map(|b| format!("{b:02x}")).collect();
                write_atomic(&id_file, id.as_bytes())?;
                id
            }
        };
        let sequence_file = state_dir.join("next-sequence");
        let stored = fs::read_to_string(&sequence_file).ok().and_then(|s| s.trim().parse::<u64>().ok());
        let epoch_file = state_dir.join("epoch");
        let epoch = match (stored, fs::read_to_string(&epoch_file).ok().and_then(|s| s.trim().parse::<u64>().ok())) {
            (Some(_), Some(epoch)) => epoch,
            (lost, _) => {
                let epoch = u64::from_le_bytes(random::<8>()?).max(1);
                if lost.is_none() && min_next > 1 {
                    tracing::warn!(epoch, "the batch counter was lost; numbering goes on in a new epoch");
                }
                write_atomic(&epoch_file, epoch.to_string().as_bytes())?;
                epoch
            }
        };
        let next_sequence = stored.unwrap_or(1).max(min_next).max(1);
        Ok(Self { agent_id, epoch, next_sequence, sequence_file })
    }

    /// Hands out the next sequence number, persisted before it is used.
    /// When that write fails (a full disk) the number is handed out all
    /// the same, with the error: a batch that cannot be spooled then still
    /// has a number for its gap. Reuse after a crash is still caught: the
    /// spool's highest file sets the floor at the next start, and a number
    /// the collector already holds with other content starts a new epoch.
    pub fn take_sequence(&mut self) -> (u64, Option<ShipError>) {
        let sequence = self.next_sequence;
        self.next_sequence = sequence + 1;
        (sequence, write_atomic(&self.sequence_file, (sequence + 1).to_string().as_bytes()).err())
    }

    /// Starts a new epoch: the collector holds other content under this
    /// agent's current keys (a cloned or restored state directory).
    pub fn new_epoch(&mut self) -> Result<u64, ShipError> {
        let epoch = u64::from_le_bytes(random::<8>()?).max(1);
        let file = self.sequence_file.with_file_name("epoch");
        // The new epoch holds in memory even if the file cannot be written.
        let written = write_atomic(&file, epoch.to_string().as_bytes());
        self.epoch = epoch;
        written.map(|()| epoch)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_lost_counter_starts_a_new_epoch_and_files_are_private() {
        let dir = std::env::temp_dir().join(format!("sqlbee-identity-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let mut first = Identity::load(&dir, 1).unwrap();
        assert_eq!(first.take_sequence().0, 1);
        assert_eq!(first.take_sequence().0, 2);
        let again = Identity::load(&dir, 1).unwrap();
        assert_eq!(
            (again.agent_id.as_str(), again.epoch, again.next_sequence),
            (first.agent_id.as_str(), first.epoch, 3)
        );
        fs::remove_file(dir.join("next-sequence")).unwrap();
        let mut reborn = Identity::load(&dir, 1).unwrap();
        assert_eq!(reborn.agent_id, first.agent_id);
        assert_ne!(reborn.epoch, first.epoch, "numbering from 1 again must not reuse the old keys");
        assert_eq!(reborn.take_sequence().0, 1);
        assert_eq!(fs::metadata(&dir).unwrap().permissions().mode() & 0o777, DIR_MODE);
        for file in ["agent-id", "epoch", "next-sequence"] {
            let mode = fs::metadata(dir.join(file)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, FILE_MODE, "{file}");
        }
        fs::remove_dir_all(dir).ok();
    }
}
