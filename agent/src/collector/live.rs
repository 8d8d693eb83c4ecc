//! What runs now: each instance's newest activity snapshot, in this
//! collector's memory only. A snapshot replaces the one before; one older
//! than `STALE_MS` is no longer answered (its agent stopped sending, or
//! sends to another collector). Nothing of it reaches the store.
use std::{collections::HashMap, sync::Mutex};

use prost::Message;
use sqlbee_proto::v1::{ActivityReport, InstanceActivity, LiveInstance};

/// A snapshot this old is not live any more.
pub const STALE_MS: i64 = 30_000;
/// Instances held at most.
const MAX_INSTANCES: usize = 100_000;
/// Encoded bytes of all snapshots held at most: what agents send can
/// never take more of the collector's memory than this.
pub const MAX_BYTES: usize = 256 << 20;

#[derive(Default)]
pub struct LiveActivity {
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    /// Each instance's newest snapshot and its encoded size.
    instances: HashMap<String, (LiveInstance, usize)>,
    bytes: usize,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "live activity is full ({held} instances, {bytes} bytes held, at most {MAX_INSTANCES} and {MAX_BYTES});      snapshots are refused until older ones go stale"
)]
pub struct Full {
    held: usize,
    bytes: usize,
}

impl LiveActivity {
    /// Keeps each instance's snapshot, replacing its previous one; refuses
    /// the whole report (keeping nothing of it) past the bounds.
    pub fn put(&self, report: ActivityReport, now_unix_ms: i64) -> Result<(), Full> {
        let agent_id = report.agent.map(|a| a.agent_id).unwrap_or_default();
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let Held { instances, bytes } = &mut *held;
        instances.retain(|_, (live, size)| {
            let fresh = now_unix_ms - live.received_unix_ms <= STALE_MS;
            if !fresh {
                *bytes -= *size;
            }
            fresh
        });
        let sized: Vec<(String, InstanceActivity, usize)> = report
            .instances
            .into_iter()
            .map(|a| (a.instance.as_ref().map(|i| i.name.clone()).unwrap_or_default(), a.encoded_len(), a))
            .map(|(name, size, a)| (name, a, size))
            .collect();
        let replaced: usize = sized.iter().filter_map(|(name, _, _)| instances.get(name).map(|(_, s)| *s)).sum();
        let added: usize = sized.iter().map(|(_, _, s)| s).sum();
        let new_names = sized.iter().filter(|(name, _, _)| !instances.contains_key(name)).count();
        if *bytes - replaced + added > MAX_BYTES || instances.len() + new_names > MAX_INSTANCES {
            return Err(Full { held: instances.len(), bytes: *bytes });
        }
        for (name, activity, size) in sized {
            let live = LiveInstance {
                activity: Some(activity),
                agent_id: agent_id.clone(),
                taken_unix_ms: report.taken_unix_ms,
                received_unix_ms: now_unix_ms,
            };
            if let Some((_, old)) = instances.insert(name, (live, size)) {
                *bytes -= old;
            }
            *bytes += size;
        }
        Ok(())
    }

    /// The live instances (or one), with only the connections running at
    /// least `min_running_ms` (every one when 0), by instance name.
    pub fn get(&self, instance: Option<&str>, min_running_ms: u64, now_unix_ms: i64) -> Vec<LiveInstance> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<LiveInstance> = held
            .instances
            .iter()
            .filter(|(name, (live, _))| {
                instance.is_none_or(|i| i == name.as_str()) && now_unix_ms - live.received_unix_ms <= STALE_MS
            })
            .map(|(_, (live, _))| live.clone())
            .collect();
        drop(held);
        if min_running_ms > 0 {
            for live in &mut out {
                if let Some(InstanceActivity { connections, .. }) = &mut live.activity {
                    connections.retain(|c| c.command != "Sleep" && c.running_ms >= min_running_ms);
                }
            }
        }
        out.sort_by(|a, b| name_of(a).cmp(name_of(b)));
        out
    }
}

fn name_of(live: &LiveInstance) -> &str {
    live.activity.as_ref().and_then(|a| a.instance.as_ref()).map_or("", |i| i.name.as_str())
}

#[cfg(test)]
mod tests {
    use sqlbee_proto::v1::{AgentIdentity, LiveConnection, ServerInstance};

    use super::*;

    fn report(instance: &str, running: &[(u64, &str, u64)]) -> ActivityReport {
        ActivityReport {
            agent: Some(AgentIdentity { agent_id: "a1".into(), ..Default::default() }),
            taken_unix_ms: 1,
            instances: vec![InstanceActivity {
                instance: Some(ServerInstance { name: instance.into(), ..Default::default() }),
                connections: running
                    .iter()
                    .map(|&(thread_id, command, running_ms)| LiveConnection {
                        thread_id,
                        command: command.into(),
                        running_ms,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
        }
    }

    #[test]
    fn newest_replaces_stale_goes_and_filters_apply() {
        let live = LiveActivity::default();
        live.put(report("db1", &[(1, "Query", 5)]), 1_000).unwrap();
        live.put(report("db1", &[(1, "Query", 2_000), (2, "Sleep", 9_000)]), 2_000).unwrap();
        live.put(report("db2", &[]), 2_000).unwrap();
        let all = live.get(None, 0, 2_500);
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].activity.as_ref().unwrap().connections.len(), 2);
        let slow = live.get(Some("db1"), 1_000, 2_500);
        let ids: Vec<u64> = slow[0].activity.as_ref().unwrap().connections.iter().map(|c| c.thread_id).collect();
        assert_eq!(ids, [1], "idle connections never qualify for a minimum");
        assert!(live.get(None, 0, 2_000 + STALE_MS + 1).is_empty());
    }

    #[test]
    fn memory_is_bounded_and_replacing_frees() {
        let live = LiveActivity::default();
        let mut big = report("db1", &[(1, "Query", 5)]);
        big.instances[0].connections[0].sample = "x".repeat(MAX_BYTES / 2);
        live.put(big.clone(), 1_000).unwrap();
        live.put(big.clone(), 1_001).unwrap();
        let mut other = big.clone();
        other.instances[0].instance.as_mut().unwrap().name = "db2".into();
        assert!(live.put(other.clone(), 1_002).is_err(), "past the byte bound");
        assert_eq!(live.get(None, 0, 1_003).len(), 1, "nothing of the refused report is kept");
        live.put(other, 1_002 + STALE_MS + 1).unwrap();
        assert_eq!(live.get(None, 0, 1_003 + STALE_MS + 1).len(), 1, "the stale one made room");
    }
}
