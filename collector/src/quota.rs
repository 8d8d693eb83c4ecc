//! Per-agent quotas on what is stored: rows and bytes per hour, so that a
//! runaway or hostile agent fills its own quota, not the store's disk.
//! Each agent has two buckets that hold an hour's quota and refill
//! steadily; a batch that does not fit in what is left is refused with
//! RESOURCE_EXHAUSTED (the agent keeps it spooled and retries, so a spool
//! replayed after an outage drains at the quota's rate). What was refused
//! is counted per agent since the collector started and shown with the
//! agents' costs.
//!
//! A batch's rows are those it adds to the store (an instance window, each
//! digest row, lock wait, command count and long statement, two for each
//! plan (its row and the plan change it may be), each agent window, untraced
//! server and gap); its bytes are the larger of its decoded protobuf size
//! and `STORED_ROW_BYTES` per row: a batch of many small new rows grows the
//! store far past its size on the wire (measured on SQLite: 80,000 new
//! digests, 4 MB, grew the file by 82 MB: each is a raw row, three rollup
//! rows, its text and their indexes).
//!
//! Quotas hold per agent id, so they hold against a hostile host when its
//! token is bound to its agents (`agents=` in the tokens file); without
//! that, a token may invent agent ids.
use std::{collections::HashMap, sync::Mutex};

use prost::Message as _;
use sqlbee_proto::v1::{AgentQuota, Batch};

const HOUR_MS: f64 = 3_600_000.0;
/// Agents whose buckets are full again (an hour without a charge) and who
/// were never refused are forgotten once the map holds this many, so ids
/// that come and go cannot grow it; the sweep runs again each time it has
/// grown by `SWEEP_EVERY`, so a charge costs O(1) on average.
const SWEEP_AT: usize = 100_000;
const SWEEP_EVERY: usize = 4096;
/// What a new row costs the store at least, all levels and indexes
/// counted (see the module comment).
pub const STORED_ROW_BYTES: u64 = 1024;

/// What a batch adds to the store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    pub rows: u64,
    pub bytes: u64,
}

impl Cost {
    pub fn of(batch: &Batch) -> Cost {
        let windows: u64 = batch
            .windows
            .iter()
            .map(|w| {
                // A plan is a row, and may be a plan change, another.
                let plans = 2 * w.plans.len() as u64;
                1 + w.digests.len() as u64
                    + w.lock_waits.len() as u64
                    + w.commands.len() as u64
                    + w.long_statements.len() as u64
                    + w.changes.len() as u64
                    + w.table_indexes.len() as u64
                    + w.replication.len() as u64
                    + plans
            })
            .sum();
        let agent_windows: u64 = batch.agent_windows.iter().map(|w| 1 + w.untraced.len() as u64).sum();
        let rows = windows + agent_windows + batch.gaps.len() as u64;
        Cost { rows, bytes: (batch.encoded_len() as u64).max(rows.saturating_mul(STORED_ROW_BYTES)) }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error(
    "agent {agent:?} is over its quota of {per_hour} {what} stored per hour (this batch: {wanted}, left now: \
     {left}); retry later: the quota refills by {per_minute} a minute"
)]
pub struct OverQuota {
    pub agent: String,
    pub what: &'static str,
    pub per_hour: u64,
    pub per_minute: u64,
    pub wanted: u64,
    pub left: u64,
}

#[derive(Debug, Default)]
struct Account {
    /// What is left of the hour's quota, as of `at_ms`.
    rows: f64,
    bytes: f64,
    at_ms: i64,
    refused: Cost,
    refused_batches: u64,
    stored: Cost,
}

#[derive(Debug)]
pub struct Quotas {
    per_hour: Cost,
    accounts: Mutex<HashMap<String, Account>>,
}

impl Quotas {
    /// 0 in either: that one is not limited.
    pub fn new(rows_per_hour: u64, bytes_per_hour: u64) -> Quotas {
        Quotas { per_hour: Cost { rows: rows_per_hour, bytes: bytes_per_hour }, accounts: Mutex::default() }
    }

    fn limit(per_hour: u64) -> f64 {
        if per_hour == 0 { f64::INFINITY } else { per_hour as f64 }
    }

    /// Takes `cost` from the agent's quota, or refuses it whole and counts
    /// it refused.
    pub fn charge(&self, agent: &str, cost: Cost, now_ms: i64) -> Result<(), OverQuota> {
        let (rows_limit, bytes_limit) = (Self::limit(self.per_hour.rows), Self::limit(self.per_hour.bytes));
        let mut accounts = self.accounts.lock().unwrap_or_else(|e| e.into_inner());
        if accounts.len() >= SWEEP_AT && accounts.len().is_multiple_of(SWEEP_EVERY) && !accounts.contains_key(agent) {
            accounts.retain(|_, a| a.refused_batches > 0 || ((now_ms - a.at_ms) as f64) < HOUR_MS);
        }
        let account = accounts.entry(agent.to_string()).or_insert_with(|| Account {
            rows: rows_limit,
            bytes: bytes_limit,
            at_ms: now_ms,
            ..Default::default()
        });
        let elapsed = (now_ms - account.at_ms).max(0) as f64 / HOUR_MS;
        account.rows = (account.rows + elapsed * rows_limit).min(rows_limit);
        account.bytes = (account.bytes + elapsed * bytes_limit).min(bytes_limit);
        account.at_ms = account.at_ms.max(now_ms);
        let over = |what, per_hour: u64, wanted: u64, left: f64| OverQuota {
            agent: agent.to_string(),
            what,
            per_hour,
            per_minute: per_hour.div_ceil(60),
            wanted,
            left: left as u64,
        };
        let refusal = if cost.rows as f64 > account.rows {
            Some(over("rows", self.per_hour.rows, cost.rows, account.rows))
        } else if cost.bytes as f64 > account.bytes {
            Some(over("bytes", self.per_hour.bytes, cost.bytes, account.bytes))
        } else {
            None
        };
        if let Some(refusal) = refusal {
            account.refused_batches += 1;
            account.refused.rows += cost.rows;
            account.refused.bytes += cost.bytes;
            return Err(refusal);
        }
        account.rows -= cost.rows as f64;
        account.bytes -= cost.bytes as f64;
        account.stored.rows += cost.rows;
        account.stored.bytes += cost.bytes;
        Ok(())
    }

    /// Gives back what a batch that was not stored (a duplicate, a store
    /// failure) had taken.
    pub fn refund(&self, agent: &str, cost: Cost) {
        let mut accounts = self.accounts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(account) = accounts.get_mut(agent) {
            account.rows = (account.rows + cost.rows as f64).min(Self::limit(self.per_hour.rows));
            account.bytes = (account.bytes + cost.bytes as f64).min(Self::limit(self.per_hour.bytes));
            account.stored.rows = account.stored.rows.saturating_sub(cost.rows);
            account.stored.bytes = account.stored.bytes.saturating_sub(cost.bytes);
        }
    }

    /// The agents worth a look: refused at least once, or with under half
    /// of an hour's quota left now; the most refused first.
    pub fn report(&self, now_ms: i64) -> Vec<AgentQuota> {
        let (rows_limit, bytes_limit) = (Self::limit(self.per_hour.rows), Self::limit(self.per_hour.bytes));
        let accounts = self.accounts.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<AgentQuota> = accounts
            .iter()
            .filter_map(|(agent, a)| {
                let elapsed = (now_ms - a.at_ms).max(0) as f64 / HOUR_MS;
                let rows_left = (a.rows + elapsed * rows_limit).min(rows_limit);
                let bytes_left = (a.bytes + elapsed * bytes_limit).min(bytes_limit);
                let used = |left: f64, limit: f64| if limit.is_finite() { 1.0 - left / limit } else { 0.0 };
                let used = used(rows_left, rows_limit).max(used(bytes_left, bytes_limit));
                (a.refused_batches > 0 || used > 0.5).then(|| AgentQuota {
                    agent_id: agent.clone(),
                    rows_per_hour: self.per_hour.rows,
                    bytes_per_hour: self.per_hour.bytes,
                    used_fraction: used,
                    stored_rows: a.stored.rows,
                    stored_bytes: a.stored.bytes,
                    refused_batches: a.refused_batches,
                    refused_rows: a.refused.rows,
                    refused_bytes: a.refused.bytes,
                })
            })
            .collect();
        out.sort_by(|a, b| b.refused_rows.cmp(&a.refused_rows).then_with(|| a.agent_id.cmp(&b.agent_id)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;

    #[test]
    fn an_agent_fills_its_own_quota_and_it_refills() {
        let quotas = Quotas::new(600, 0);
        let rows = |n| Cost { rows: n, bytes: 1 };
        quotas.charge("a", rows(400), 0).unwrap();
        let refused = quotas.charge("a", rows(400), 0).unwrap_err();
        assert_eq!((refused.what, refused.left, refused.per_minute), ("rows", 200, 10), "{refused}");
        quotas.charge("b", rows(600), 0).expect("another agent has its own quota");
        // 20 minutes refill 200 rows: 400 left.
        quotas.charge("a", rows(400), 20 * MIN).unwrap();
        assert!(quotas.charge("a", rows(1), 20 * MIN).is_err());
        quotas.refund("a", rows(400));
        quotas.charge("a", rows(400), 20 * MIN).expect("a refunded batch gives its rows back");
        let report = quotas.report(20 * MIN);
        let a = report.iter().find(|q| q.agent_id == "a").unwrap();
        assert_eq!((a.refused_batches, a.refused_rows, a.stored_rows), (2, 401, 800));
        assert!(a.used_fraction > 0.9, "{a:?}");
        // Two hours on, a's quota is whole again, b's too (and b, never
        // refused, is no longer worth a line).
        quotas.charge("a", rows(600), 140 * MIN).unwrap();
        assert_eq!(quotas.report(200 * MIN).iter().map(|q| q.agent_id.as_str()).collect::<Vec<_>>(), ["a"]);
    }

    #[test]
    fn bytes_are_limited_apart_from_rows() {
        let quotas = Quotas::new(0, 1000);
        quotas.charge("a", Cost { rows: 1_000_000, bytes: 900 }, 0).unwrap();
        let refused = quotas.charge("a", Cost { rows: 1, bytes: 200 }, 0).unwrap_err();
        assert_eq!(refused.what, "bytes");
    }
}
