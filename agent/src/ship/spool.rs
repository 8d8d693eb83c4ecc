//! The disk spool: every batch is written here (fsync'd) before it is
//! sent, and deleted only after the collector acknowledged it, so neither a
//! collector outage nor an agent crash loses a batch.
//!
//! Invariants:
//! - one batch per file `<sequence:020>.batch`, written to a temp file,
//!   fsync'd and renamed, so a file either holds a whole record or does
//!   not exist;
//! - record = magic `SQB1`, payload length (u32 LE), CRC32 of the payload
//!   (u32 LE), payload (protobuf `sqlbee.v1.Batch`);
//! - total size is bounded; when full, whole oldest batches are dropped and
//!   described as a gap (statements and windows lost) that travels with the
//!   next batch;
//! - a record that fails its checks is moved to `corrupt/`, counted and
//!   logged; the rest replays. Batches the collector refuses for good go to
//!   `rejected/` for inspection.
use std::{
    fs,
    path::{Path, PathBuf},
};

use prost::Message;
use sqlbee_proto::v1::{Batch, Gap};

use super::{ShipError, identity::write_atomic};

const MAGIC: &[u8; 4] = b"SQB1";
const HEADER: usize = 12;
const PENDING_GAPS: &str = "pending-gaps.pb";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub sequence: u64,
    pub path: PathBuf,
    pub bytes: u64,
}

pub struct Spool {
    dir: PathBuf,
    state_dir: PathBuf,
    limit_bytes: u64,
    pub corrupt_records: u64,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ShipError + '_ {
    move |source| ShipError::Spool { path: path.to_path_buf(), source }
}

pub fn encode_record(payload: &[u8]) -> Vec<u8> {
    let mut record = Vec::with_capacity(HEADER + payload.len());
    record.extend_from_slice(MAGIC);
    record.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    record.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    record.extend_from_slice(payload);
    record
}

/// The payload of a record, or what is wrong with it.
pub fn decode_record(record: &[u8]) -> Result<&[u8], String> {
    if record.len() < HEADER {
        return Err(format!("record of {} bytes is shorter than its header", record.len()));
    }
    if &record[..4] != MAGIC {
        return Err("bad magic".into());
    }
    let len = u32::from_le_bytes(record[4..8].try_into().unwrap()) as usize;
    let crc = u32::from_le_bytes(record[8..12].try_into().unwrap());
    let payload = &record[HEADER..];
    if payload.len() != len {
        return Err(format!("length field says {len} bytes, file holds {}", payload.len()));
    }
    if crc32fast::hash(payload) != crc {
        return Err("checksum mismatch".into());
    }
    Ok(payload)
}

impl Spool {
    pub fn open(state_dir: &Path, limit_bytes: u64) -> Result<Self, ShipError> {
        let dir = state_dir.join("spool");
        for d in [&dir, &state_dir.join("corrupt"), &state_dir.join("rejected")] {
            fs::create_dir_all(d).map_err(io(d))?;
        }
        // Leftover temp files are batches whose write never completed; the
        // sequence they held was persisted, so dropping them loses nothing
        // that was acknowledged as safe.
        for entry in fs::read_dir(&dir).map_err(io(&dir))?.flatten() {
            if entry.path().extension().is_some_and(|e| e == "tmp") {
                let _ = fs::remove_file(entry.path());
            }
        }
        Ok(Self { dir, state_dir: state_dir.to_path_buf(), limit_bytes, corrupt_records: 0 })
    }

    /// Spooled batches, oldest first.
    pub fn entries(&self) -> Result<Vec<Entry>, ShipError> {
        let mut entries: Vec<Entry> = fs::read_dir(&self.dir)
            .map_err(io(&self.dir))?
            .flatten()
            .filter_map(|e| {
                let path = e.path();
                if path.extension()? != "batch" {
                    return None;
                }
                let sequence = path.file_stem()?.to_str()?.parse().ok()?;
                let bytes = e.metadata().ok()?.len();
                Some(Entry { sequence, path, bytes })
            })
            .collect();
        entries.sort_by_key(|e| e.sequence);
        Ok(entries)
    }

    /// Highest sequence present anywhere in the state dir, so a lost
    /// counter file never leads to a reused number.
    pub fn highest_sequence(&self) -> u64 {
        ["spool", "corrupt", "rejected"]
            .iter()
            .filter_map(|d| fs::read_dir(self.state_dir.join(d)).ok())
            .flat_map(|rd| rd.flatten())
            .filter_map(|e| e.path().file_stem()?.to_str()?.split('.').next()?.parse::<u64>().ok())
            .max()
            .unwrap_or(0)
    }

    /// Writes a batch durably. Returns the gap created by dropping older
    /// batches to stay within the limit, if any.
    pub fn append(&mut self, sequence: u64, payload: &[u8]) -> Result<Option<Gap>, ShipError> {
        let path = self.dir.join(format!("{sequence:020}.batch"));
        write_atomic(&path, &encode_record(payload))?;
        self.enforce_limit(sequence)
    }

    fn enforce_limit(&mut self, newest: u64) -> Result<Option<Gap>, ShipError> {
        let entries = self.entries()?;
        let mut total: u64 = entries.iter().map(|e| e.bytes).sum();
        let mut gap: Option<Gap> = None;
        for entry in entries.iter().filter(|e| e.sequence != newest) {
            if total <= self.limit_bytes {
                break;
            }
            let lost = fs::read(&entry.path)
                .ok()
                .and_then(|r| decode_record(&r).ok().and_then(|p| Batch::decode(p).ok()));
            fs::remove_file(&entry.path).map_err(io(&entry.path))?;
            total -= entry.bytes;
            let g = gap.get_or_insert_with(|| Gap {
                first_sequence: entry.sequence,
                reason: "spool full".into(),
                ..Default::default()
            });
            g.last_sequence = entry.sequence;
            g.batches += 1;
            if let Some(batch) = lost {
                for w in &batch.windows {
                    g.lost_statements += w.statements;
                    g.lost_windows += 1;
                    if g.first_window_start_unix_ms == 0 || w.window_start_unix_ms < g.first_window_start_unix_ms {
                        g.first_window_start_unix_ms = w.window_start_unix_ms;
                    }
                    g.last_window_end_unix_ms = g.last_window_end_unix_ms.max(w.window_end_unix_ms);
                }
                // The agent's own windows (cost, host) are lost too; they
                // widen the gap's time range but hold no statements.
                for w in &batch.agent_windows {
                    if g.first_window_start_unix_ms == 0 || w.window_start_unix_ms < g.first_window_start_unix_ms {
                        g.first_window_start_unix_ms = w.window_start_unix_ms;
                    }
                    g.last_window_end_unix_ms = g.last_window_end_unix_ms.max(w.window_end_unix_ms);
                }
                // Gaps the dropped batch carried are not lost with it.
                self.push_pending_gaps(batch.gaps)?;
            }
        }
        if let Some(g) = &gap {
            tracing::warn!(first = g.first_sequence, last = g.last_sequence, batches = g.batches,
                lost_statements = g.lost_statements, "spool full: dropped the oldest batches");
            self.push_pending_gaps(vec![g.clone()])?;
        }
        Ok(gap)
    }

    /// Gaps waiting to travel with the next batch (persisted).
    pub fn pending_gaps(&self) -> Vec<Gap> {
        fs::read(self.state_dir.join(PENDING_GAPS))
            .ok()
            .and_then(|b| Batch::decode(b.as_slice()).ok())
            .map(|b| b.gaps)
            .unwrap_or_default()
    }

    fn push_pending_gaps(&self, gaps: Vec<Gap>) -> Result<(), ShipError> {
        if gaps.is_empty() {
            return Ok(());
        }
        let mut all = self.pending_gaps();
        all.extend(gaps);
        let holder = Batch { gaps: all, ..Default::default() };
        write_atomic(&self.state_dir.join(PENDING_GAPS), &holder.encode_to_vec())
    }

    /// Called once a batch carrying these gaps (by first and last
    /// sequence) is safely spooled; gaps added since stay pending.
    pub fn forget_pending_gaps(&self, carried: &[(u64, u64)]) -> Result<(), ShipError> {
        if carried.is_empty() {
            return Ok(());
        }
        let path = self.state_dir.join(PENDING_GAPS);
        let left: Vec<Gap> = self
            .pending_gaps()
            .into_iter()
            .filter(|g| !carried.contains(&(g.first_sequence, g.last_sequence)))
            .collect();
        if left.is_empty() {
            return match fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(ShipError::Spool { path, source: e }),
                _ => Ok(()),
            };
        }
        write_atomic(&path, &Batch { gaps: left, ..Default::default() }.encode_to_vec())
    }

    /// Reads a spooled batch; a damaged record is moved to `corrupt/`.
    pub fn read(&mut self, entry: &Entry) -> Result<Option<Batch>, ShipError> {
        let record = fs::read(&entry.path).map_err(io(&entry.path))?;
        let problem = match decode_record(&record) {
            Ok(payload) => match Batch::decode(payload) {
                Ok(batch) => return Ok(Some(batch)),
                Err(e) => format!("payload does not decode: {e}"),
            },
            Err(problem) => problem,
        };
        self.corrupt_records += 1;
        tracing::error!(sequence = entry.sequence, path = %entry.path.display(), problem = %problem,
            corrupt_records = self.corrupt_records, "corrupt spool record skipped; moved to corrupt/");
        self.move_aside(entry, "corrupt")?;
        Ok(None)
    }

    pub fn remove(&self, entry: &Entry) -> Result<(), ShipError> {
        fs::remove_file(&entry.path).map_err(io(&entry.path))
    }

    /// Keeps a batch the collector will never take, with the reason beside it.
    pub fn reject(&self, entry: &Entry, reason: &str) -> Result<(), ShipError> {
        let note = self.state_dir.join("rejected").join(format!("{:020}.reason.txt", entry.sequence));
        fs::write(&note, reason).map_err(io(&note))?;
        self.move_aside(entry, "rejected")
    }

    fn move_aside(&self, entry: &Entry, folder: &str) -> Result<(), ShipError> {
        let target = self.state_dir.join(folder).join(entry.path.file_name().unwrap_or_default());
        fs::rename(&entry.path, &target).map_err(io(&entry.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlbee_proto::v1::InstanceWindow;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("sqlbee-spool-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn batch(sequence: u64, statements: u64) -> Vec<u8> {
        Batch {
            sequence,
            windows: vec![InstanceWindow { statements, window_start_unix_ms: 1000, window_end_unix_ms: 2000, ..Default::default() }],
            ..Default::default()
        }
        .encode_to_vec()
    }

    #[test]
    fn records_round_trip_and_damage_is_detected() {
        let payload = batch(1, 5);
        let record = encode_record(&payload);
        assert_eq!(decode_record(&record).unwrap(), payload.as_slice());
        for i in 0..record.len() {
            let mut bad = record.clone();
            bad[i] ^= 0x40;
            assert!(decode_record(&bad).is_err(), "flip at {i} undetected");
        }
        assert!(decode_record(&record[..record.len() - 1]).is_err());
    }

    #[test]
    fn full_spool_drops_oldest_and_records_the_gap() {
        let dir = temp_dir("full");
        let one = encode_record(&batch(1, 7)).len() as u64;
        let mut spool = Spool::open(&dir, one * 2).unwrap();
        for seq in 1..=5 {
            spool.append(seq, &batch(seq, 7)).unwrap();
        }
        let left: Vec<u64> = spool.entries().unwrap().iter().map(|e| e.sequence).collect();
        assert_eq!(left, vec![4, 5]);
        let gaps = spool.pending_gaps();
        let lost: u64 = gaps.iter().map(|g| g.lost_statements).sum();
        let batches: u64 = gaps.iter().map(|g| g.batches).sum();
        assert_eq!((lost, batches), (21, 3));
        let carried: Vec<(u64, u64)> = gaps.iter().map(|g| (g.first_sequence, g.last_sequence)).collect();
        spool.append(6, &batch(6, 7)).unwrap();
        let newer = spool.pending_gaps().len() - gaps.len();
        assert_eq!(newer, 1, "dropping batch 4 adds a gap");
        spool.forget_pending_gaps(&carried).unwrap();
        assert_eq!(spool.pending_gaps().len(), 1, "the newer gap stays pending");
        fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn corrupt_record_is_moved_aside_and_counted() {
        let dir = temp_dir("corrupt");
        let mut spool = Spool::open(&dir, 1 << 20).unwrap();
        spool.append(1, &batch(1, 1)).unwrap();
        spool.append(2, &batch(2, 2)).unwrap();
        let entries = spool.entries().unwrap();
        let mut bytes = fs::read(&entries[0].path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        fs::write(&entries[0].path, bytes).unwrap();
        assert!(spool.read(&entries[0]).unwrap().is_none());
        assert_eq!(spool.corrupt_records, 1);
        assert_eq!(spool.read(&entries[1]).unwrap().unwrap().sequence, 2);
        assert_eq!(spool.entries().unwrap().len(), 1);
        assert_eq!(spool.highest_sequence(), 2);
        fs::remove_dir_all(dir).ok();
    }
}
