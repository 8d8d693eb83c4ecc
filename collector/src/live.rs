//! What runs now: each instance's newest activity snapshot, in this
//! collector's memory only. A snapshot replaces the one before; one older
//! than `STALE_MS` is no longer answered (its agent stopped sending, or
//! sends to another collector). Nothing of it reaches the store.
//!
//! What is held is counted as it sits in memory, decoded (a connection
//! costs its struct and its strings, a few hundred bytes, where it may
//! have taken two bytes on the wire), with a bound in all and one per
//! agent, so that one agent cannot take the room of the others. A report
//! past a bound is refused whole, and nothing of it is kept. A read
//! answers at most `MAX_ANSWERED` connections per instance, the
//! longest-running first, and says how many it left out.
use std::{collections::HashMap, sync::Mutex};

use sqlbee_proto::v1::{ActivityReport, InstanceActivity, LiveConnection, LiveInstance};

use super::store::Page;

/// A snapshot this old is not live any more.
pub const STALE_MS: i64 = 30_000;
/// Instances held at most.
pub const MAX_INSTANCES: usize = 100_000;
/// Bytes all snapshots may take in memory, decoded.
pub const MAX_BYTES: usize = 256 << 20;
/// Bytes one agent's snapshots may take: a host's servers, with room.
pub const MAX_BYTES_PER_AGENT: usize = 32 << 20;
/// Connections a read answers per instance: the longest-running first.
pub const MAX_ANSWERED: usize = 5_000;

#[derive(Default)]
pub struct LiveActivity {
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    /// Each instance's newest snapshot and what it takes in memory.
    instances: HashMap<String, (LiveInstance, usize)>,
    bytes: usize,
    /// Bytes per agent id.
    by_agent: HashMap<String, usize>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Full {
    #[error(
        "live activity is full ({held} instances, {bytes} bytes held, at most {MAX_INSTANCES} and {MAX_BYTES}); \
         snapshots are refused until older ones go stale"
    )]
    All { held: usize, bytes: usize },
    #[error(
        "this agent's live activity would take {bytes} bytes of the collector's memory, at most \
         {MAX_BYTES_PER_AGENT}; its snapshots are refused until they are smaller"
    )]
    Agent { bytes: usize },
}

/// What a string costs held.
fn text(s: &str) -> usize {
    s.len()
}

/// What one connection costs held: its struct and its strings.
fn connection_bytes(c: &LiveConnection) -> usize {
    std::mem::size_of::<LiveConnection>()
        + text(&c.user)
        + text(&c.host)
        + text(&c.schema)
        + text(&c.command)
        + text(&c.state)
        + text(&c.digest_text)
        + text(&c.sample)
        + text(&c.wait)
        + text(&c.blocked_by_source)
}

/// What a snapshot costs held, once its vectors are cut to their length.
pub fn held_bytes(a: &InstanceActivity) -> usize {
    let instance = a.instance.as_ref().map_or(0, |i| {
        std::mem::size_of_val(i)
            + text(&i.name)
            + text(&i.container)
            + text(&i.container_id)
            + text(&i.build_id)
            + text(&i.server_version)
    });
    std::mem::size_of::<LiveInstance>()
        + std::mem::size_of::<InstanceActivity>()
        + instance
        + text(&a.warning)
        + a.blocker_sources.iter().map(|s| std::mem::size_of::<String>() + text(s)).sum::<usize>()
        + a.connections.iter().map(connection_bytes).sum::<usize>()
}

/// A snapshot's vectors and strings cut to their length, so what it holds
/// is what `held_bytes` counts.
fn shrink(a: &mut InstanceActivity) {
    a.connections.shrink_to_fit();
    a.blocker_sources.shrink_to_fit();
    for c in &mut a.connections {
        for s in [
            &mut c.user,
            &mut c.host,
            &mut c.schema,
            &mut c.command,
            &mut c.state,
            &mut c.digest_text,
            &mut c.sample,
            &mut c.wait,
            &mut c.blocked_by_source,
        ] {
            s.shrink_to_fit();
        }
    }
}

impl LiveActivity {
    /// Keeps each instance's snapshot, replacing its previous one; refuses
    /// the whole report (keeping nothing of it) past the bounds.
    pub fn put(&self, report: ActivityReport, now_unix_ms: i64) -> Result<(), Full> {
        let agent_id = report.agent.map(|a| a.agent_id).unwrap_or_default();
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let Held { instances, bytes, by_agent } = &mut *held;
        instances.retain(|_, (live, size)| {
            let fresh = now_unix_ms - live.received_unix_ms <= STALE_MS;
            if !fresh {
                *bytes -= *size;
                release(by_agent, &live.agent_id, *size);
            }
            fresh
        });
        let sized: Vec<(String, InstanceActivity, usize)> = report
            .instances
            .into_iter()
            .map(|a| (a.instance.as_ref().map(|i| i.name.clone()).unwrap_or_default(), held_bytes(&a), a))
            .map(|(name, size, a)| (name, a, size))
            .collect();
        // What this report replaces, in all and of this agent's own.
        let replaced = |of_agent: bool| -> usize {
            sized
                .iter()
                .filter_map(|(name, _, _)| instances.get(name))
                .filter(|(live, _)| !of_agent || live.agent_id == agent_id)
                .map(|(_, s)| *s)
                .sum()
        };
        let added: usize = sized.iter().map(|(_, _, s)| s).sum();
        let new_names = sized.iter().filter(|(name, _, _)| !instances.contains_key(name)).count();
        if *bytes - replaced(false) + added > MAX_BYTES || instances.len() + new_names > MAX_INSTANCES {
            return Err(Full::All { held: instances.len(), bytes: *bytes });
        }
        let agent_bytes = by_agent.get(&agent_id).copied().unwrap_or(0) - replaced(true) + added;
        if agent_bytes > MAX_BYTES_PER_AGENT {
            return Err(Full::Agent { bytes: agent_bytes });
        }
        for (name, mut activity, size) in sized {
            shrink(&mut activity);
            let live = LiveInstance {
                activity: Some(activity),
                agent_id: agent_id.clone(),
                taken_unix_ms: report.taken_unix_ms,
                received_unix_ms: now_unix_ms,
                more_connections: 0,
            };
            if let Some((old, old_size)) = instances.insert(name, (live, size)) {
                *bytes -= old_size;
                release(by_agent, &old.agent_id, old_size);
            }
            *bytes += size;
            *by_agent.entry(agent_id.clone()).or_default() += size;
        }
        Ok(())
    }

    /// The live instances (or one), with only the connections running at
    /// least `min_running_ms` (every one when 0), by instance name; each
    /// with its `MAX_ANSWERED` longest-running connections, the rest
    /// counted in `more_connections`, and as many instances as fit an
    /// answer (`answer_budget`), the rest counted. Only what is answered is
    /// copied.
    pub fn get(&self, instance: Option<&str>, min_running_ms: u64, now_unix_ms: i64) -> Page<LiveInstance> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let mut fresh: Vec<(&String, &LiveInstance)> = held
            .instances
            .iter()
            .filter(|(name, (live, _))| {
                instance.is_none_or(|i| i == name.as_str()) && now_unix_ms - live.received_unix_ms <= STALE_MS
            })
            .map(|(name, (live, _))| (name, live))
            .collect();
        fresh.sort_by(|a, b| a.0.cmp(b.0));
        let mut page = Page::default();
        for (_, live) in fresh {
            if page.is_full() {
                page.skip();
            } else {
                page.push(answered(live, min_running_ms));
            }
        }
        page
    }
}

fn release(by_agent: &mut HashMap<String, usize>, agent: &str, size: usize) {
    if let Some(held) = by_agent.get_mut(agent) {
        *held = held.saturating_sub(size);
        if *held == 0 {
            by_agent.remove(agent);
        }
    }
}

/// A copy of `live` with the connections a read answers.
fn answered(live: &LiveInstance, min_running_ms: u64) -> LiveInstance {
    let Some(activity) = &live.activity else { return live.clone() };
    let qualifies =
        |c: &LiveConnection| min_running_ms == 0 || (c.command != "Sleep" && c.running_ms >= min_running_ms);
    let mut picked: Vec<&LiveConnection> = activity.connections.iter().filter(|c| qualifies(c)).collect();
    let qualified = picked.len();
    if qualified > MAX_ANSWERED {
        picked.select_nth_unstable_by(MAX_ANSWERED - 1, |a, b| b.running_ms.cmp(&a.running_ms));
        picked.truncate(MAX_ANSWERED);
        picked.sort_by_key(|c| c.thread_id);
    }
    LiveInstance {
        activity: Some(InstanceActivity {
            instance: activity.instance.clone(),
            connections: picked.into_iter().cloned().collect(),
            warning: activity.warning.clone(),
            blocker_sources: activity.blocker_sources.clone(),
        }),
        agent_id: live.agent_id.clone(),
        taken_unix_ms: live.taken_unix_ms,
        received_unix_ms: live.received_unix_ms,
        more_connections: qualified.saturating_sub(MAX_ANSWERED) as u64,
    }
}

#[cfg(test)]
mod tests {
    use sqlbee_proto::v1::{AgentIdentity, ServerInstance};

    use super::*;

    fn report(instance: &str, running: &[(u64, &str, u64)]) -> ActivityReport {
        report_of("a1", instance, running)
    }

    fn report_of(agent: &str, instance: &str, running: &[(u64, &str, u64)]) -> ActivityReport {
        ActivityReport {
            agent: Some(AgentIdentity { agent_id: agent.into(), ..Default::default() }),
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
        let all = live.get(None, 0, 2_500).rows;
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].activity.as_ref().unwrap().connections.len(), 2);
        let slow = live.get(Some("db1"), 1_000, 2_500).rows;
        let ids: Vec<u64> = slow[0].activity.as_ref().unwrap().connections.iter().map(|c| c.thread_id).collect();
        assert_eq!(ids, [1], "idle connections never qualify for a minimum");
        assert!(live.get(None, 0, 2_000 + STALE_MS + 1).rows.is_empty());
    }

    #[test]
    fn memory_is_bounded_and_replacing_frees() {
        let live = LiveActivity::default();
        let mut big = report("db1", &[(1, "Query", 5)]);
        big.instances[0].connections[0].sample = "x".repeat(MAX_BYTES_PER_AGENT / 2);
        live.put(big.clone(), 1_000).unwrap();
        live.put(big.clone(), 1_001).unwrap();
        let mut other = big.clone();
        other.instances[0].instance.as_mut().unwrap().name = "db2".into();
        assert!(matches!(live.put(other.clone(), 1_002), Err(Full::Agent { .. })), "past the agent's bound");
        assert_eq!(live.get(None, 0, 1_003).rows.len(), 1, "nothing of the refused report is kept");
        live.put(other, 1_002 + STALE_MS + 1).unwrap();
        assert_eq!(live.get(None, 0, 1_003 + STALE_MS + 1).rows.len(), 1, "the stale one made room");
    }

    /// Empty connections cost two bytes each on the wire and a struct each
    /// in memory: the bound counts the struct.
    #[test]
    fn what_is_held_is_counted_decoded_and_one_agent_leaves_room_for_others() {
        let live = LiveActivity::default();
        let per_connection = std::mem::size_of::<LiveConnection>();
        let many = MAX_BYTES_PER_AGENT / per_connection + 1;
        let empty: Vec<(u64, &str, u64)> = (0..many as u64).map(|i| (i, "", 0)).collect();
        let flood = report_of("greedy", "db1", &empty);
        assert!(prost::Message::encoded_len(&flood) < MAX_BYTES_PER_AGENT / 10, "small on the wire");
        assert!(matches!(live.put(flood, 1_000), Err(Full::Agent { .. })));
        let half: Vec<(u64, &str, u64)> = (0..many as u64 / 2).map(|i| (i, "", 0)).collect();
        live.put(report_of("greedy", "db1", &half), 1_000).unwrap();
        assert!(matches!(live.put(report_of("greedy", "db2", &half), 1_000), Err(Full::Agent { .. })));
        live.put(report_of("modest", "db3", &[(1, "Query", 5)]), 1_000).unwrap();
        let held = live.held.lock().unwrap();
        assert!(held.bytes >= many / 2 * per_connection && held.bytes <= MAX_BYTES_PER_AGENT + 4096, "{}", held.bytes);
    }

    #[test]
    fn a_read_answers_the_longest_running_connections_and_counts_the_rest() {
        let live = LiveActivity::default();
        let connections: Vec<(u64, &str, u64)> = (0..MAX_ANSWERED as u64 + 10).map(|i| (i, "Query", i)).collect();
        live.put(report("db1", &connections), 1_000).unwrap();
        let answer = live.get(None, 0, 1_001).rows;
        let kept = &answer[0].activity.as_ref().unwrap().connections;
        assert_eq!(kept.len(), MAX_ANSWERED);
        assert_eq!(answer[0].more_connections, 10);
        assert!(kept.iter().all(|c| c.running_ms >= 10), "the ten shortest are left out");
    }
}
