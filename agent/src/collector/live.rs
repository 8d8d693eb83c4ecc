//! What runs now: each instance's newest activity snapshot, in this
//! collector's memory only. A snapshot replaces the one before; one older
//! than `STALE_MS` is no longer answered (its agent stopped sending, or
//! sends to another collector). Nothing of it reaches the store.
use std::{collections::HashMap, sync::Mutex};

use sqlbee_proto::v1::{ActivityReport, InstanceActivity, LiveInstance};

/// A snapshot this old is not live any more.
pub const STALE_MS: i64 = 30_000;
/// Instances held at most: past it, the stalest is forgotten first.
const MAX_INSTANCES: usize = 100_000;

#[derive(Default)]
pub struct LiveActivity {
    instances: Mutex<HashMap<String, LiveInstance>>,
}

impl LiveActivity {
    pub fn put(&self, report: ActivityReport, now_unix_ms: i64) {
        let agent_id = report.agent.map(|a| a.agent_id).unwrap_or_default();
        let mut held = self.instances.lock().unwrap_or_else(|e| e.into_inner());
        held.retain(|_, live| now_unix_ms - live.received_unix_ms <= STALE_MS);
        for activity in report.instances {
            let name = activity.instance.as_ref().map(|i| i.name.clone()).unwrap_or_default();
            if held.len() >= MAX_INSTANCES && !held.contains_key(&name) {
                continue;
            }
            held.insert(
                name,
                LiveInstance {
                    activity: Some(activity),
                    agent_id: agent_id.clone(),
                    taken_unix_ms: report.taken_unix_ms,
                    received_unix_ms: now_unix_ms,
                },
            );
        }
    }

    /// The live instances (or one), with only the connections running at
    /// least `min_running_ms` (every one when 0), by instance name.
    pub fn get(&self, instance: Option<&str>, min_running_ms: u64, now_unix_ms: i64) -> Vec<LiveInstance> {
        let held = self.instances.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<LiveInstance> = held
            .iter()
            .filter(|(name, live)| {
                instance.is_none_or(|i| i == name.as_str()) && now_unix_ms - live.received_unix_ms <= STALE_MS
            })
            .map(|(_, live)| live.clone())
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
        live.put(report("db1", &[(1, "Query", 5)]), 1_000);
        live.put(report("db1", &[(1, "Query", 2_000), (2, "Sleep", 9_000)]), 2_000);
        live.put(report("db2", &[]), 2_000);
        let all = live.get(None, 0, 2_500);
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].activity.as_ref().unwrap().connections.len(), 2);
        let slow = live.get(Some("db1"), 1_000, 2_500);
        let ids: Vec<u64> = slow[0].activity.as_ref().unwrap().connections.iter().map(|c| c.thread_id).collect();
        assert_eq!(ids, [1], "idle connections never qualify for a minimum");
        assert!(live.get(None, 0, 2_000 + STALE_MS + 1).is_empty());
    }
}
