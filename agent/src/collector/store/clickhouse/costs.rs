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
use crate::collector::store::{HostsQuery, StoreError, TotalsQuery, merge};

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
/// row does (see `read_agent_row`).
pub(super) const AGENT_RAW: &str = "agent_id, window_start, window_end, cost, toUInt8(0) AS rolled,
    toUInt64(0) AS windows, toUInt64(0) AS costless_windows, toUInt64(0) AS shedding_windows,
    toFloat64(0) AS cpu_seconds, received_unix_ms, ingest_id, position";
pub(super) const AGENT_ROLLUP: &str = "agent_id, window_start, window_end, cost, toUInt8(1) AS rolled, windows,
    costless_windows, shedding_windows, cpu_seconds, toInt64(0) AS received_unix_ms, toUInt64(0) AS ingest_id,
    toUInt32(0) AS position";
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
    let (_received, _ingest_id, _position) = (rows.i64().map_err(&bad)?, rows.u64().map_err(&bad)?, rows.u32().map_err(&bad)?);
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

/// The newest window's cost of one instance as one agent reported it.
pub(super) fn latest(db: &Client, agent_id: &str, instance: &str) -> Result<Option<InstanceCost>, StoreError> {
    let bad = malformed("instances");
    let err = |e| error("instances", e);
    let all = winners(i64::MIN, i64::MAX);
    let mut rows = db
        .select(&format!(
            "SELECT window_start, window_end, statements, aggregated_in_kernel, probes, process FROM instance_windows
             WHERE agent_id = {} AND instance = {} AND has_cost = 1 AND {all}
             ORDER BY window_end DESC LIMIT 1",
            quote(agent_id),
            quote(instance)
        ))
        .map_err(err)?;
    if rows.done() {
        return Ok(None);
    }
    let (start, end) = (rows.i64().map_err(&bad)?, rows.i64().map_err(&bad)?);
    let (statements, in_kernel) = (rows.u64().map_err(&bad)?, rows.u64().map_err(&bad)?);
    let probes: Option<ProbeCost> = decode(&rows.bytes().map_err(&bad)?, "probe cost")?;
    let process = rows.bytes().map_err(&bad)?;
    let mut out = InstanceCost {
        window_end_unix_ms: end,
        aggregated_in_kernel: in_kernel,
        server: decode::<ProcessMetrics>(&process, "process metrics")?,
        ..Default::default()
    };
    let seconds = (end - start).max(0) as f64 / 1e3;
    if seconds > 0.0 {
        out.statements_per_s = statements as f64 / seconds;
    }
    // Agents before budget mode were always attached.
    out.attached_fraction = 1.0;
    if let Some(p) = probes {
        out.server_extra_cores_per_10k_qps = p.extra_cores_per_10k_qps;
        out.attached_fraction = p.attached_fraction;
    }
    // The agent's own window that ended closest to this one.
    let mut rows = db
        .select(&format!(
            "SELECT window_end, cost FROM agent_windows WHERE agent_id = {} AND {all}
             ORDER BY abs(window_end - {end}), window_end LIMIT 1",
            quote(agent_id)
        ))
        .map_err(err)?;
    if !rows.done() {
        let _at = rows.i64().map_err(&bad)?;
        if let Some(cost) = decode::<AgentCost>(&rows.bytes().map_err(&bad)?, "agent cost")? {
            out.agent_cpu_cores = cost.cpu_cores;
            out.agent_cores_per_10k_qps = cost.cores_per_10k_qps;
            out.agent_rss_bytes = cost.rss_bytes;
            out.shedding = cost.shedding;
            out.events_per_s = cost.events_per_s;
            out.dropped_events = cost.dropped_events;
        }
    }
    Ok(Some(out))
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
