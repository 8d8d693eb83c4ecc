//! Which agent speaks for each server instance, so that one agent's token
//! cannot put counts under another agent's server. An instance belongs to
//! the agent that first reported it, until that agent has said nothing of
//! it for the handover time (an agent replaced on its host under a new id
//! then takes over: its retries succeed once the handover time has
//! passed). A token whose `instances=` names it overrides this: only that
//! token may send it.
//!
//! Only windows claim an instance: live activity and plans may be sent
//! only for an instance the agent already speaks for (or one pinned to
//! its token), so a stream of small reports can neither squat a name nor
//! grow the map. The map is bounded per agent and in all; a claim past a
//! bound is refused.
//!
//! Owners live in memory, seeded at start from the store's instances (the
//! newest report of each), so a restart keeps them. Each collector of a
//! shared store holds its own; two collectors can each let a different
//! agent claim a new instance in the same moment.
use std::{collections::HashMap, sync::Mutex, time::Duration};

use sqlbee_proto::v1::InstanceInfo;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refused {
    #[error(
        "instance {instance:?} is reported by agent {owner:?} (last {silent_s} s ago); an instance belongs to the \
         agent that first reported it until that agent has been silent for {handover_s} s, or to the token \
         whose instances= names it in the collector's tokens file"
    )]
    Owned { instance: String, owner: String, silent_s: i64, handover_s: u64 },
    #[error("instance {instance:?} is named by another token's instances= in the collector's tokens file")]
    PinnedElsewhere { instance: String },
    #[error(
        "this token may send windows of instances {allowed:?} only (instances= in the tokens file), not of {instance:?}"
    )]
    NotPinnedHere { instance: String, allowed: Vec<String> },
    #[error(
        "instance {instance:?} has no window from this agent yet (or its agent has changed): activity and plans \
         follow the instance's windows"
    )]
    NotClaimed { instance: String },
    #[error(
        "this agent speaks for {held} instances already, at most {MAX_PER_AGENT}; the collector holds {total}, at \
         most {MAX_OWNERS}"
    )]
    TooMany { held: usize, total: usize },
    #[error(
        "instance {instance:?} is pinned to no token, and this collector takes only pinned instances \
         (--require-instance-pins): add instances= to the agent's token in the tokens file"
    )]
    Unpinned { instance: String },
}

/// Instances one agent may speak for at once: a node agent's servers,
/// with room.
pub const MAX_PER_AGENT: usize = 10_000;
/// Instances this collector tracks owners of at once.
pub const MAX_OWNERS: usize = 1_000_000;

#[derive(Debug)]
struct Owner {
    agent: String,
    last_seen_unix_ms: i64,
}

#[derive(Debug)]
pub struct Owners {
    handover: Duration,
    owners: Mutex<Map>,
}

#[derive(Debug, Default)]
struct Map {
    by_instance: HashMap<String, Owner>,
    /// Instances per agent.
    per_agent: HashMap<String, usize>,
}

impl Map {
    fn set(&mut self, instance: &str, agent: &str, last_seen_unix_ms: i64) {
        let owner = Owner { agent: agent.to_string(), last_seen_unix_ms };
        if let Some(old) = self.by_instance.insert(instance.to_string(), owner) {
            self.forget(&old.agent);
        }
        *self.per_agent.entry(agent.to_string()).or_default() += 1;
    }

    fn forget(&mut self, agent: &str) {
        if let Some(n) = self.per_agent.get_mut(agent) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_agent.remove(agent);
            }
        }
    }

    fn sweep(&mut self, now_unix_ms: i64, handover_ms: i64) {
        let gone: Vec<String> = self
            .by_instance
            .iter()
            .filter(|(_, o)| now_unix_ms - o.last_seen_unix_ms >= handover_ms)
            .map(|(i, _)| i.clone())
            .collect();
        for instance in gone {
            if let Some(old) = self.by_instance.remove(&instance) {
                self.forget(&old.agent);
            }
        }
    }
}

/// Sweeping owners past their handover time waits until the map has grown
/// by this many since the last sweep, so a claim costs O(1) on average.
const SWEEP_EVERY: usize = 4096;

impl Owners {
    pub fn new(handover: Duration) -> Owners {
        Owners { handover, owners: Mutex::default() }
    }

    fn handover_ms(&self) -> i64 {
        self.handover.as_millis().min(i64::MAX as u128) as i64
    }

    /// The owners the store remembers: the agent that reported each
    /// instance last.
    pub fn seed(&self, instances: &[InstanceInfo], now_unix_ms: i64) {
        let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        for i in instances {
            if now_unix_ms - i.last_seen_unix_ms >= self.handover_ms() || owners.by_instance.len() >= MAX_OWNERS {
                continue;
            }
            let newer = owners.by_instance.get(&i.instance).is_none_or(|o| o.last_seen_unix_ms < i.last_seen_unix_ms);
            if newer {
                owners.set(&i.instance, &i.agent_id, i.last_seen_unix_ms);
            }
        }
    }

    /// Lets `agent` send live activity or plans for `instances`: each must
    /// be the agent's already (its windows claimed it, within the handover
    /// time). Claims nothing.
    pub fn check<'a>(
        &self,
        agent: &str,
        instances: impl Iterator<Item = &'a str>,
        now_unix_ms: i64,
    ) -> Result<(), Refused> {
        let handover_ms = self.handover_ms();
        let owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        for instance in instances {
            match owners.by_instance.get(instance) {
                Some(o) if o.agent == agent && now_unix_ms - o.last_seen_unix_ms < handover_ms => {}
                Some(o) if o.agent != agent && now_unix_ms - o.last_seen_unix_ms < handover_ms => {
                    return Err(Refused::Owned {
                        instance: instance.to_string(),
                        owner: o.agent.clone(),
                        silent_s: (now_unix_ms - o.last_seen_unix_ms).max(0) / 1000,
                        handover_s: self.handover.as_secs(),
                    });
                }
                _ => return Err(Refused::NotClaimed { instance: instance.to_string() }),
            }
        }
        Ok(())
    }

    /// Lets `agent` report `instances` (none of them pinned to a token: the
    /// Ingest service checks those first): every one is free, past its handover time, or the
    /// agent's own; then claims them all. One refused refuses the batch and
    /// claims nothing.
    pub fn claim<'a>(
        &self,
        agent: &str,
        instances: impl Iterator<Item = &'a str> + Clone,
        now_unix_ms: i64,
    ) -> Result<(), Refused> {
        let handover_ms = self.handover_ms();
        let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        let mut new = 0;
        for instance in instances.clone() {
            if let Some(owner) = owners.by_instance.get(instance) {
                let silent_ms = now_unix_ms - owner.last_seen_unix_ms;
                if owner.agent != agent && silent_ms < handover_ms {
                    return Err(Refused::Owned {
                        instance: instance.to_string(),
                        owner: owner.agent.clone(),
                        silent_s: silent_ms.max(0) / 1000,
                        handover_s: self.handover.as_secs(),
                    });
                }
                if owner.agent != agent {
                    new += 1;
                }
            } else {
                new += 1;
            }
        }
        if new > 0 {
            let held = owners.per_agent.get(agent).copied().unwrap_or(0);
            if held + new > MAX_PER_AGENT || owners.by_instance.len() + new > MAX_OWNERS {
                owners.sweep(now_unix_ms, handover_ms);
                let held = owners.per_agent.get(agent).copied().unwrap_or(0);
                let total = owners.by_instance.len();
                if held + new > MAX_PER_AGENT || total + new > MAX_OWNERS {
                    return Err(Refused::TooMany { held, total });
                }
            }
        }
        let before = owners.by_instance.len();
        for instance in instances {
            match owners.by_instance.get_mut(instance) {
                Some(owner) if owner.agent == agent => {
                    owner.last_seen_unix_ms = owner.last_seen_unix_ms.max(now_unix_ms)
                }
                Some(owner) => {
                    tracing::warn!(
                        instance,
                        from = owner.agent,
                        to = agent,
                        "an instance changed agents: its agent had been silent past the handover time"
                    );
                    owners.set(instance, agent, now_unix_ms);
                }
                None => owners.set(instance, agent, now_unix_ms),
            }
        }
        if owners.by_instance.len() / SWEEP_EVERY > before / SWEEP_EVERY {
            owners.sweep(now_unix_ms, handover_ms);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;

    #[test]
    fn the_first_agent_keeps_an_instance_until_it_falls_silent() {
        let owners = Owners::new(Duration::from_secs(600));
        owners.claim("a", ["db-a:3306"].into_iter(), 0).unwrap();
        owners.claim("b", ["db-b:3306"].into_iter(), 0).unwrap();
        let refused = owners.claim("a", ["db-a:3307", "db-b:3306"].into_iter(), MIN).unwrap_err();
        assert!(matches!(&refused, Refused::Owned { owner, .. } if owner == "b"), "{refused}");
        // Nothing of a refused batch is claimed.
        owners.claim("b", ["db-a:3307"].into_iter(), MIN).unwrap();
        owners.claim("b", ["db-b:3306"].into_iter(), 9 * MIN).unwrap();
        assert!(owners.claim("a", ["db-b:3306"].into_iter(), 18 * MIN).is_err(), "b reported it 9 minutes ago");
        owners.claim("a", ["db-b:3306"].into_iter(), 19 * MIN).unwrap();
        assert!(owners.claim("b", ["db-b:3306"].into_iter(), 19 * MIN).is_err(), "a took it over");
    }

    #[test]
    fn activity_needs_a_claim_and_claims_are_bounded_per_agent() {
        let owners = Owners::new(Duration::from_secs(600));
        assert!(matches!(owners.check("a", ["db:1"].into_iter(), 0), Err(Refused::NotClaimed { .. })));
        owners.claim("a", ["db:1"].into_iter(), 0).unwrap();
        owners.check("a", ["db:1"].into_iter(), MIN).unwrap();
        assert!(matches!(owners.check("b", ["db:1"].into_iter(), MIN), Err(Refused::Owned { .. })));
        assert!(matches!(owners.check("a", ["db:1"].into_iter(), 11 * MIN), Err(Refused::NotClaimed { .. })));
        let names: Vec<String> = (0..MAX_PER_AGENT).map(|i| format!("many:{i}")).collect();
        owners.claim("greedy", names.iter().map(String::as_str), 0).unwrap();
        let refused = owners.claim("greedy", ["one-more:1"].into_iter(), 0).unwrap_err();
        assert!(matches!(refused, Refused::TooMany { held: MAX_PER_AGENT, .. }), "{refused}");
        owners.claim("greedy", ["many:7"].into_iter(), 0).unwrap();
        owners.claim("other", ["db:2"].into_iter(), 0).unwrap();
    }

    #[test]
    fn owners_are_seeded_from_the_store() {
        let owners = Owners::new(Duration::from_secs(600));
        let info = |agent: &str, instance: &str, seen: i64| InstanceInfo {
            agent_id: agent.into(),
            instance: instance.into(),
            last_seen_unix_ms: seen,
            ..Default::default()
        };
        owners.seed(
            &[info("old", "db:3306", 100 * MIN), info("new", "db:3306", 101 * MIN), info("gone", "x:1", 0)],
            105 * MIN,
        );
        assert!(matches!(owners.claim("old", ["db:3306"].into_iter(), 105 * MIN), Err(Refused::Owned { .. })));
        owners.claim("new", ["db:3306"].into_iter(), 105 * MIN).unwrap();
        owners.claim("anyone", ["x:1"].into_iter(), 105 * MIN).unwrap();
    }
}
