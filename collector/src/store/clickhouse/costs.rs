//! What watching costs: the summary beside `Top`, the newest cost per
//! instance for `Instances`, and the agents' own windows for `Hosts`, the
//! same arithmetic as the SQLite store's, on winning rows.
use std::collections::HashMap;

use prost::Message;
use sqlbee_proto::v1::{
    AgentCost, AgentWindow, AgentWindowRow, CostSummary, HostMetrics, InstanceCost, ProbeCost, ProcessMetrics,
};

use super::{
    error,
    http::{Client, Rows, quote},
    malformed,
    rollups::{self, Table},
    winners,
};
use crate::store::{HostsQuery, StoreError, TotalsQuery, merge};

fn decode<M: Message + Default>(bytes: &[u8], what: &'static str) -> Result<Option<M>, StoreError> {
    if bytes.is_empty() {
        return Ok(None);
    }
    M::decode(bytes).map(Some).map_err(|_| StoreError::Corrupt { what })
}

/// Each agent's host as it last named it.
fn hosts_by_agent(db: &Client, action: &'static str) -> Result<HashMap<String, String>, StoreError> {
    let mut rows = db
        .select("SELECT agent_id, argMax(host, (sequence, received_unix_ms)) FROM agent_seen GROUP BY agent_id")
        .map_err(|e| error(action, e))?;
    let mut out = HashMap::new();
    while !rows.done() {
        let agent = rows.string().map_err(malformed(action))?;
        out.insert(agent, rows.string().map_err(malformed(action))?);
    }
    Ok(out)
}

/// An agent window's columns as the raw table gives them and as a rollup
/// row does (see `read_agent_row`). The constants are materialized: a
/// shard of a cluster sends them as full columns, and a UNION ALL of a
/// constant and a full column of one name is refused.
pub(super) const AGENT_RAW: &str = "agent_id, window_start, window_end, cost, materialize(toUInt8(0)) AS rolled,
    materialize(toUInt64(0)) AS windows, materialize(toUInt64(0)) AS costless_windows,
    materialize(toUInt64(0)) AS shedding_windows, materialize(toFloat64(0)) AS cpu_seconds, received_unix_ms,
    ingest_id, position";
pub(super) const AGENT_ROLLUP: &str = "agent_id, window_start, window_end, cost, materialize(toUInt8(1)) AS rolled,
    windows, costless_windows, shedding_windows, cpu_seconds, materialize(toInt64(0)) AS received_unix_ms,
    materialize(toUInt64(0)) AS ingest_id, materialize(toUInt32(0)) AS position";
/// Oldest first, as the agent sent them.
pub(super) const AGENT_ORDER: &str = "ORDER BY window_end, received_unix_ms, ingest_id, position";

/// What a rollup row of an agent's windows adds up.
pub(super) struct Rolled {
    /// Windows with a cost (the row's span and cost are theirs).
    pub windows: u64,
    pub costless_windows: u64,
    pub shedding_windows: u64,
    pub cpu_seconds: f64,
}

/// One of an agent's windows, or a bucket of them.
pub(super) struct AgentRow {
    pub agent_id: String,
    pub start: i64,
    pub end: i64,
    /// None: no cost (a raw window without one, a bucket of such).
    pub cost: Option<AgentCost>,
    pub rolled: Option<Rolled>,
}

impl AgentRow {
    pub fn seconds(&self) -> f64 {
        (self.end - self.start).max(0) as f64 / 1e3
    }

    pub fn cpu_seconds(&self, cost: &AgentCost) -> f64 {
        match &self.rolled {
            Some(r) => r.cpu_seconds,
            None => cost.cpu_cores * self.seconds(),
        }
    }
}

/// Reads the columns of `AGENT_RAW` / `AGENT_ROLLUP`.
pub(super) fn read_agent_row(rows: &mut Rows) -> Result<AgentRow, StoreError> {
    let bad = malformed("agent windows");
    let agent_id = rows.string().map_err(&bad)?;
    let (start, end) = (rows.i64().map_err(&bad)?, rows.i64().map_err(&bad)?);
    let blob = rows.bytes().map_err(&bad)?;
    let rolled = rows.u8().map_err(&bad)? != 0;
    let (windows, costless_windows) = (rows.u64().map_err(&bad)?, rows.u64().map_err(&bad)?);
    let (shedding_windows, cpu_seconds) = (rows.u64().map_err(&bad)?, rows.f64().map_err(&bad)?);
    let (_received, _ingest_id, _position) =
        (rows.i64().map_err(&bad)?, rows.u64().map_err(&bad)?, rows.u32().map_err(&bad)?);
    let cost = decode::<AgentCost>(&blob, "agent cost")?;
    if !rolled {
        return Ok(AgentRow { agent_id, start, end, cost, rolled: None });
    }
    // A bucket's cost may encode to nothing (all zero) and still be one.
    let cost = (windows > 0).then(|| cost.unwrap_or_default());
    Ok(AgentRow {
        agent_id,
        start,
        end,
        cost,
        rolled: Some(Rolled { windows, costless_windows, shedding_windows, cpu_seconds }),
    })
}

/// Per agent over the range (see the SQLite store's `summaries`): the
/// agent's CPU is divided by all its instances' statements, the probes'
/// cost counts only instances matching the filter.
pub(super) fn summaries(db: &Client, query: &TotalsQuery) -> Result<Vec<CostSummary>, StoreError> {
    #[derive(Default)]
    struct Agent {
        summary: CostSummary,
        matched: bool,
        estimated: u64,
    }
    let bad = malformed("costs");
    let err = |e| error("costs", e);
    let sources = rollups::sources(db, query.since_unix_ms, query.until_unix_ms, None, "costs")?;
    let mut agents: HashMap<String, Agent> = HashMap::new();
    let mut rows =
        db.select(&sources.union(Table::Instances, "agent_id, instance, statements, probes", "")).map_err(err)?;
    while !rows.done() {
        let agent = agents.entry(rows.string().map_err(&bad)?).or_default();
        let instance = rows.string().map_err(&bad)?;
        let statements = rows.u64().map_err(&bad)?;
        let probes = rows.bytes().map_err(&bad)?;
        agent.summary.statements = agent.summary.statements.saturating_add(statements);
        if query.instance.as_deref().is_some_and(|wanted| wanted != instance) {
            continue;
        }
        agent.matched = true;
        if let Some(p) = decode::<ProbeCost>(&probes, "probe cost")? {
            agent.summary.probe_cpu_seconds += p.probe_cpu_seconds;
            let estimated = merge::probed_statements(statements, &p);
            agent.estimated = agent.estimated.saturating_add(estimated);
        }
    }
    let hosts = hosts_by_agent(db, "costs")?;
    let mut rows = db
        .select(&format!("{} {AGENT_ORDER}", sources.union_of(Table::Agents, AGENT_RAW, AGENT_ROLLUP, "")))
        .map_err(err)?;
    while !rows.done() {
        let row = read_agent_row(&mut rows)?;
        if query.instance.is_some() && !agents.get(&row.agent_id).is_some_and(|a| a.matched) {
            continue;
        }
        let Some(cost) = &row.cost else { continue };
        let (windows, shedding_windows) = match &row.rolled {
            Some(r) => (r.windows, r.shedding_windows),
            None => (1, u64::from(merge::shedding(&cost.shedding))),
        };
        let (seconds, cpu_seconds) = (row.seconds(), row.cpu_seconds(cost));
        let host = hosts.get(&row.agent_id).cloned().unwrap_or_default();
        let s = &mut agents.entry(row.agent_id).or_default().summary;
        s.host = host;
        s.windows += windows;
        s.seconds += seconds;
        s.agent_cpu_seconds += cpu_seconds;
        s.agent_max_rss_bytes = s.agent_max_rss_bytes.max(cost.rss_bytes);
        s.dropped_events = s.dropped_events.saturating_add(cost.dropped_events);
        s.shedding_windows += shedding_windows;
        s.latest_shedding = cost.shedding.clone();
    }
    let mut out: Vec<CostSummary> = agents
        .into_iter()
        .filter(|(_, a)| a.summary.windows > 0)
        .map(|(id, a)| merge::cost_summary(id, a.summary, a.estimated))
        .collect();
    out.sort_by(|a, b| a.host.cmp(&b.host).then_with(|| a.agent_id.cmp(&b.agent_id)));
    Ok(out)
}

/// How far from an instance's newest window its agent's own window is
/// first looked for: an agent reports both in the same batch, so the
/// nearest is almost always within it, and a band keeps the read small.
const NEAR_MS: i64 = 15 * 60 * 1000;

/// Instances whose agents' windows one statement looks for.
const NEAR_PER_QUERY: usize = 200;

/// The newest cost window of an instance, as stored.
struct CostWindow {
    start: i64,
    end: i64,
    statements: u64,
    in_kernel: u64,
    probes: Vec<u8>,
    process: Vec<u8>,
}

/// The newest window's cost of every instance, keyed by (agent, instance),
/// each with its agent's own window that ended closest to it: two grouped
/// reads for the fleet, not two per instance (each of which gathered the
/// winners of every batch stored; a week of 100 agents took seconds).
pub(super) fn latest(db: &Client) -> Result<HashMap<(String, String), InstanceCost>, StoreError> {
    let windows = newest_cost_windows(db)?;
    let targets: Vec<(&str, i64)> = windows.iter().map(|((agent, _), w)| (agent.as_str(), w.end)).collect();
    let agent_costs = nearest_agent_costs(db, &targets)?;
    let mut out = HashMap::new();
    for ((agent_id, instance), w) in windows {
        let cost = agent_costs.get(&(agent_id.clone(), w.end)).cloned().flatten();
        out.insert((agent_id, instance), instance_cost(w, cost)?);
    }
    Ok(out)
}

fn newest_cost_windows(db: &Client) -> Result<HashMap<(String, String), CostWindow>, StoreError> {
    let bad = malformed("instances");
    // One row's columns together (a tuple), so a tie on window_end cannot
    // mix two rows.
    let mut rows = db
        .select(&format!(
            "SELECT agent_id, instance,
                    argMax((window_start, window_end, statements, aggregated_in_kernel, probes, process),
                           (window_end, ingest_id, position))
             FROM instance_windows WHERE has_cost = 1 AND instance != '' AND {}
             GROUP BY agent_id, instance",
            winners(i64::MIN, i64::MAX)
        ))
        .map_err(|e| error("instances", e))?;
    let mut out = HashMap::new();
    while !rows.done() {
        let key = (rows.string().map_err(&bad)?, rows.string().map_err(&bad)?);
        let (start, end) = (rows.i64().map_err(&bad)?, rows.i64().map_err(&bad)?);
        let (statements, in_kernel) = (rows.u64().map_err(&bad)?, rows.u64().map_err(&bad)?);
        let (probes, process) = (rows.bytes().map_err(&bad)?, rows.bytes().map_err(&bad)?);
        out.insert(key, CostWindow { start, end, statements, in_kernel, probes, process });
    }
    Ok(out)
}

/// For each (agent, time): the agent's own window that ended closest to
/// it, by |end - time| and then the earlier end, as a decoded cost (None
/// for a window without one). A pair with no window within `NEAR_MS` is
/// looked up alone over all time.
fn nearest_agent_costs(
    db: &Client,
    targets: &[(&str, i64)],
) -> Result<HashMap<(String, i64), Option<AgentCost>>, StoreError> {
    let bad = malformed("instances");
    let err = |e| error("instances", e);
    let mut out: HashMap<(String, i64), (i64, Option<AgentCost>)> = HashMap::new();
    let consider = |out: &mut HashMap<(String, i64), (i64, Option<AgentCost>)>,
                    agent: &str,
                    target: i64,
                    end: i64,
                    cost: &[u8]|
     -> Result<(), StoreError> {
        let better = match out.get(&(agent.to_string(), target)) {
            Some(&(best, _)) => ((end - target).abs(), end) < ((best - target).abs(), best),
            None => true,
        };
        if better {
            out.insert((agent.to_string(), target), (end, decode::<AgentCost>(cost, "agent cost")?));
        }
        Ok(())
    };
    let mut by_agent: HashMap<&str, Vec<i64>> = HashMap::new();
    for (agent, t) in targets {
        by_agent.entry(agent).or_default().push(*t);
    }
    // Chunks keep each statement well under ClickHouse's max_query_size
    // (256 KiB by default) for a fleet of thousands of instances.
    for chunk in targets.chunks(NEAR_PER_QUERY) {
        let near: Vec<String> = chunk
            .iter()
            .map(|(agent, t)| {
                format!("(agent_id = {} AND window_end BETWEEN {} AND {})", quote(agent), t - NEAR_MS, t + NEAR_MS)
            })
            .collect();
        let bands: Vec<(i64, i64)> = chunk.iter().map(|(_, t)| (t - NEAR_MS, t + NEAR_MS + 1)).collect();
        let mut rows = db
            .select(&format!(
                "SELECT agent_id, window_end, cost FROM agent_windows WHERE ({}) AND {}",
                near.join(" OR "),
                super::winners_of(&bands)
            ))
            .map_err(err)?;
        while !rows.done() {
            let agent = rows.string().map_err(&bad)?;
            let end = rows.i64().map_err(&bad)?;
            let cost = rows.bytes().map_err(&bad)?;
            for &t in by_agent.get(agent.as_str()).into_iter().flatten() {
                if (end - t).abs() <= NEAR_MS {
                    consider(&mut out, &agent, t, end, &cost)?;
                }
            }
        }
    }
    let all = winners(i64::MIN, i64::MAX);
    for &(agent, t) in targets {
        if out.contains_key(&(agent.to_string(), t)) {
            continue;
        }
        let mut rows = db
            .select(&format!(
                "SELECT window_end, cost FROM agent_windows WHERE agent_id = {} AND {all}
                 ORDER BY abs(window_end - {t}), window_end LIMIT 1",
                quote(agent)
            ))
            .map_err(err)?;
        if !rows.done() {
            let end = rows.i64().map_err(&bad)?;
            consider(&mut out, agent, t, end, &rows.bytes().map_err(&bad)?)?;
        }
    }
    Ok(out.into_iter().map(|(key, (_, cost))| (key, cost)).collect())
}

fn instance_cost(w: CostWindow, agent_cost: Option<AgentCost>) -> Result<InstanceCost, StoreError> {
    Ok(merge::instance_cost(
        (w.start, w.end, w.statements),
        w.in_kernel,
        decode::<ProbeCost>(&w.probes, "probe cost")?,
        decode::<ProcessMetrics>(&w.process, "process metrics")?,
        agent_cost,
    ))
}

/// Agents' own windows, newest first.
pub(super) fn hosts(db: &Client, query: &HostsQuery) -> Result<Vec<AgentWindowRow>, StoreError> {
    let bad = malformed("hosts");
    let hosts = hosts_by_agent(db, "hosts")?;
    let agent_filter = match &query.host {
        Some(host) => {
            let ids: Vec<String> = hosts.iter().filter(|(_, h)| *h == host).map(|(a, _)| quote(a)).collect();
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            format!(" AND agent_id IN ({})", ids.join(", "))
        }
        None => String::new(),
    };
    let mut rows = db
        .select(&format!(
            "SELECT agent_id, window_start, window_end, cost, host FROM agent_windows
             WHERE window_end >= {since}{agent_filter} AND {}
             ORDER BY window_end DESC, received_unix_ms DESC, ingest_id DESC, position DESC LIMIT {}",
            winners(query.since_unix_ms, i64::MAX),
            query.limit,
            since = query.since_unix_ms,
        ))
        .map_err(|e| error("hosts", e))?;
    let mut out = Vec::new();
    while !rows.done() {
        let agent_id = rows.string().map_err(&bad)?;
        let (start, end) = (rows.i64().map_err(&bad)?, rows.i64().map_err(&bad)?);
        let cost = decode::<AgentCost>(&rows.bytes().map_err(&bad)?, "agent cost")?;
        let host = decode::<HostMetrics>(&rows.bytes().map_err(&bad)?, "host metrics")?;
        out.push(AgentWindowRow {
            host: hosts.get(&agent_id).cloned().unwrap_or_default(),
            agent_id,
            window: Some(AgentWindow {
                window_start_unix_ms: start,
                window_end_unix_ms: end,
                cost,
                host,
                // Untraced servers are in Instances, not in the agent's windows.
                untraced: Vec::new(),
            }),
        });
    }
    Ok(out)
}
