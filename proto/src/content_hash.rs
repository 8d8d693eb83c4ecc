//! What makes a replay the same batch. The agent takes this hash when it
//! makes a batch and sends it along (`Batch::content_hash`); a collector
//! takes it itself only for batches of agents from before that field.
//! Stores keep it for every batch they took, so its value must never
//! change: a replay through a newer collector, or from a newer agent, must
//! still match it.
use prost::Message as _;

use crate::v1::Batch;

/// A stable hash of what a batch carries (windows, gaps, agent windows, as
/// they are before anything is moved or left out). The identity, the time
/// it was made and the hash field itself are left out: they are not its
/// content. 0 is kept for "unknown".
pub fn content_hash(batch: &Batch) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut part = Vec::new();
    let mut add = |tag: u8, message: &dyn Fn(&mut Vec<u8>)| {
        part.clear();
        message(&mut part);
        hasher.update(&[tag]);
        hasher.update(&(part.len() as u64).to_le_bytes());
        hasher.update(&part);
    };
    // encode_raw writes the very bytes encode does, without first walking
    // the whole message for its length.
    for w in &batch.windows {
        add(1, &|out| w.encode_raw(out));
    }
    for g in &batch.gaps {
        add(2, &|out| g.encode_raw(out));
    }
    for a in &batch.agent_windows {
        add(3, &|out| a.encode_raw(out));
    }
    hasher.digest().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{AgentCost, AgentWindow, DigestStats, Gap, InstanceWindow, ServerInstance};

    /// Stores keep the hash of every batch they took, and a replay through
    /// a newer collector must still match it: the value is pinned.
    #[test]
    fn content_hash_is_the_same_in_every_version() {
        let batch = Batch {
            sequence: 7,
            windows: vec![InstanceWindow {
                instance: Some(ServerInstance { name: "db:3306".into(), pid: 42, ..Default::default() }),
                window_start_unix_ms: 1000,
                window_end_unix_ms: 61_000,
                statements: 12,
                digests: vec![DigestStats {
                    digest: 9,
                    digest_text: "SELECT ?".into(),
                    count: 12,
                    sum_ns: 3456,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            gaps: vec![Gap { first_sequence: 3, last_sequence: 4, lost_statements: 10, ..Default::default() }],
            agent_windows: vec![AgentWindow {
                window_end_unix_ms: 61_000,
                cost: Some(AgentCost { cpu_cores: 0.25, ..Default::default() }),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(content_hash(&batch), 12_549_979_062_949_168_462);
        let resent = Batch { sequence: 8, epoch: 3, created_unix_ms: 99, content_hash: 5, ..batch.clone() };
        assert_eq!(content_hash(&resent), content_hash(&batch), "identity, time and the claim are not content");
    }
}
