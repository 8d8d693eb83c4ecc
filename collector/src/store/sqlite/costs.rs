//! The SQLite store's answers about what watching costs: the cost summary
//! beside `Top`, the newest cost per instance for `Instances`, and the
//! agents' own windows for `Hosts`. Costs are stored as the agent encoded
//! them (see the schema); these functions decode and add them up in Rust.
use std::collections::HashMap;

use prost::Message;
use rusqlite::{OptionalExtension, Transaction};
use sqlbee_proto::v1::{
    AgentCost, AgentWindow, AgentWindowRow, CostSummary, HostMetrics, InstanceCost, ProbeCost, ProcessMetrics,
};

use crate::store::{HostsQuery, StoreError, TotalsQuery, merge, rollup};

fn decode<M: Message + Default>(bytes: &[u8], what: &'static str) -> Result<Option<M>, StoreError> {
    if bytes.is_empty() {
        return Ok(None);
    }
    M::decode(bytes).map(Some).map_err(|_| StoreError::Corrupt { what })
}

fn sqlite(action: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |e| super::error(action, e)
}

/// Per agent over the range: its own windows, and the statements and probe
/// cost of its instance windows. An agent's own CPU is shared by all the
/// instances it watches, so it is divided by all their statements, while
/// the probes' cost counts only instances matching the filter. Each part
/// of the range is read raw or from the cost rollups (`rollup::plan`).
pub fn summaries(tx: &Transaction<'_>, query: &TotalsQuery) -> Result<Vec<CostSummary>, StoreError> {
    let err = sqlite("costs");
    let mut agents: HashMap<String, Agent> = HashMap::new();
    let spans = rollup::plan(query.since_unix_ms, query.until_unix_ms, None);
    for span in &spans {
        let rows = match span.level {
            None => "SELECT w.agent_id, w.instance, w.statements, coalesce(c.probes, x''), 0.0, 0, 0
                 FROM instance_windows w LEFT JOIN instance_costs c ON c.window_id = w.id
                 WHERE w.window_end >= ?1 AND w.window_end < ?2"
                .to_string(),
            Some(level) => format!(
                "SELECT agent_id, instance, statements, x'', probe_cpu_seconds, estimated, probed_windows
                 FROM instance_cost_rollups WHERE level = {level} AND bucket >= ?1 AND bucket < ?2"
            ),
        };
        let mut stmt = tx.prepare_cached(&rows).map_err(&err)?;
        let mut rows = stmt.query([span.start, span.end]).map_err(&err)?;
        while let Some(row) = rows.next().map_err(&err)? {
            let agent = agents.entry(row.get(0).map_err(&err)?).or_default();
            let statements = row.get::<_, i64>(2).map_err(&err)? as u64;
            agent.summary.statements = agent.summary.statements.saturating_add(statements);
            let instance = row.get_ref(1).map_err(&err)?.as_str().map_err(|e| err(e.into()))?;
            if query.instance.as_deref().is_some_and(|wanted| wanted != instance) {
                continue;
            }
            agent.matched = true;
            let probes = row.get_ref(3).map_err(&err)?.as_blob().map_err(|e| err(e.into()))?;
            // Windows without a probe cost (older agents) add to neither
            // side of the server's cost per statement.
            if let Some(p) = decode::<ProbeCost>(probes, "probe cost")? {
                agent.summary.probe_cpu_seconds += p.probe_cpu_seconds;
                let estimated = merge::probed_statements(statements, &p);
                agent.estimated = agent.estimated.saturating_add(estimated);
            }
            if row.get::<_, i64>(6).map_err(&err)? > 0 {
                agent.summary.probe_cpu_seconds += row.get::<_, f64>(4).map_err(&err)?;
                agent.estimated = agent.estimated.saturating_add(row.get::<_, i64>(5).map_err(&err)? as u64);
            }
        }
    }
    for span in &spans {
        let rows = match span.level {
            None => "SELECT a.agent_id, coalesce(g.host, ''), a.window_start, a.window_end, a.cost
                 FROM agent_windows a LEFT JOIN agents g ON g.agent_id = a.agent_id
                 WHERE a.window_end >= ?1 AND a.window_end < ?2 ORDER BY a.window_end"
                .to_string(),
            Some(level) => format!(
                "SELECT r.agent_id, coalesce(g.host, ''), r.windows, r.seconds, r.cpu_seconds, r.max_rss_bytes,
                        r.dropped_events, r.shedding_windows, r.latest_shedding, r.latest_end
                 FROM agent_cost_rollups r LEFT JOIN agents g ON g.agent_id = r.agent_id
                 WHERE r.level = {level} AND r.bucket >= ?1 AND r.bucket < ?2 ORDER BY r.bucket"
            ),
        };
        let mut stmt = tx.prepare_cached(&rows).map_err(&err)?;
        let mut rows = stmt.query([span.start, span.end]).map_err(&err)?;
        while let Some(row) = rows.next().map_err(&err)? {
            let id: String = row.get(0).map_err(&err)?;
            // With an instance filter, only agents that watch it.
            if query.instance.is_some() && !agents.get(&id).is_some_and(|a| a.matched) {
                continue;
            }
            let host: String = row.get(1).map_err(&err)?;
            let window = if span.level.is_none() {
                let blob = row.get_ref(4).map_err(&err)?.as_blob().map_err(|e| err(e.into()))?;
                let Some(cost) = decode::<AgentCost>(blob, "agent cost")? else { continue };
                let (start, end): (i64, i64) = (row.get(2).map_err(&err)?, row.get(3).map_err(&err)?);
                AgentCosts::of_window(&cost, start, end)
            } else {
                AgentCosts {
                    windows: row.get::<_, i64>(2).map_err(&err)? as u64,
                    seconds: row.get(3).map_err(&err)?,
                    cpu_seconds: row.get(4).map_err(&err)?,
                    max_rss_bytes: row.get::<_, i64>(5).map_err(&err)? as u64,
                    dropped_events: row.get::<_, i64>(6).map_err(&err)? as u64,
                    shedding_windows: row.get::<_, i64>(7).map_err(&err)? as u64,
                    latest_shedding: row.get(8).map_err(&err)?,
                    latest_end: row.get(9).map_err(&err)?,
                }
            };
            let agent = agents.entry(id).or_default();
            agent.summary.host = host;
            agent.add(window);
        }
    }
    let mut out: Vec<CostSummary> = agents
        .into_iter()
        .filter(|(_, a)| a.summary.windows > 0)
        .map(|(id, a)| merge::cost_summary(id, a.summary, a.estimated))
        .collect();
    out.sort_by(|a, b| a.host.cmp(&b.host).then_with(|| a.agent_id.cmp(&b.agent_id)));
    Ok(out)
}

#[derive(Default)]
struct Agent {
    summary: CostSummary,
    /// Had a window of the filtered instance (any, without a filter).
    matched: bool,
    /// Statements of the matching instances, scaled where sampled.
    estimated: u64,
    /// End of the window `latest_shedding` came from.
    latest_end: i64,
}

impl Agent {
    fn add(&mut self, c: AgentCosts) {
        let s = &mut self.summary;
        s.windows += c.windows;
        s.seconds += c.seconds;
        s.agent_cpu_seconds += c.cpu_seconds;
        s.agent_max_rss_bytes = s.agent_max_rss_bytes.max(c.max_rss_bytes);
        s.dropped_events = s.dropped_events.saturating_add(c.dropped_events);
        s.shedding_windows += c.shedding_windows;
        if c.latest_end >= self.latest_end {
            self.latest_end = c.latest_end;
            s.latest_shedding = c.latest_shedding;
        }
    }
}

/// An agent's own windows added up: one window, or a rollup bucket of them.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct AgentCosts {
    pub windows: u64,
    pub seconds: f64,
    pub cpu_seconds: f64,
    pub max_rss_bytes: u64,
    pub dropped_events: u64,
    pub shedding_windows: u64,
    pub latest_shedding: String,
    pub latest_end: i64,
}

impl AgentCosts {
    pub(super) fn of_window(cost: &AgentCost, start: i64, end: i64) -> AgentCosts {
        let seconds = (end - start).max(0) as f64 / 1e3;
        AgentCosts {
            windows: 1,
            seconds,
            cpu_seconds: cost.cpu_cores * seconds,
            max_rss_bytes: cost.rss_bytes,
            dropped_events: cost.dropped_events,
            shedding_windows: u64::from(merge::shedding(&cost.shedding)),
            latest_shedding: cost.shedding.clone(),
            latest_end: end,
        }
    }
}

/// The newest window's cost of one instance as one agent reported it.
pub fn latest(tx: &Transaction<'_>, agent_id: &str, instance: &str) -> Result<Option<InstanceCost>, StoreError> {
    let err = sqlite("instances");
    let window = tx
        .prepare_cached(
            "SELECT w.window_start, w.window_end, w.statements, c.aggregated_in_kernel, c.probes, c.process
             FROM instance_windows w JOIN instance_costs c ON c.window_id = w.id
             WHERE w.agent_id = ?1 AND w.instance = ?2 ORDER BY w.window_end DESC LIMIT 1",
        )
        .map_err(&err)?
        .query_row([agent_id, instance], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)? as u64,
                r.get::<_, i64>(3)? as u64,
                r.get::<_, Vec<u8>>(4)?,
                r.get::<_, Vec<u8>>(5)?,
            ))
        })
        .optional()
        .map_err(&err)?;
    let Some((start, end, statements, in_kernel, probes, process)) = window else { return Ok(None) };
    // The agent's own window that ended closest to this one: the nearest
    // on each side, each found through the (agent_id, window_end) index.
    let mut nearest: Option<(i64, Vec<u8>)> = None;
    for sql in [
        "SELECT window_end, cost FROM agent_windows WHERE agent_id = ?1 AND window_end <= ?2
         ORDER BY window_end DESC LIMIT 1",
        "SELECT window_end, cost FROM agent_windows WHERE agent_id = ?1 AND window_end > ?2
         ORDER BY window_end LIMIT 1",
    ] {
        let found = tx
            .prepare_cached(sql)
            .map_err(&err)?
            .query_row(rusqlite::params![agent_id, end], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)))
            .optional()
            .map_err(&err)?;
        if let Some((at, cost)) = found
            && nearest.as_ref().is_none_or(|(best, _)| (at - end).abs() < (best - end).abs())
        {
            nearest = Some((at, cost));
        }
    }
    let agent_cost = nearest.map(|(_, cost)| decode::<AgentCost>(&cost, "agent cost")).transpose()?.flatten();
    Ok(Some(merge::instance_cost(
        (start, end, statements),
        in_kernel,
        decode::<ProbeCost>(&probes, "probe cost")?,
        decode::<ProcessMetrics>(&process, "process metrics")?,
        agent_cost,
    )))
}

/// Agents' own windows, newest first.
pub fn hosts(tx: &Transaction<'_>, query: &HostsQuery) -> Result<Vec<AgentWindowRow>, StoreError> {
    let err = sqlite("hosts");
    let mut stmt = tx
        .prepare_cached(
            "SELECT a.agent_id, coalesce(g.host, ''), a.window_start, a.window_end, a.cost, a.host
             FROM agent_windows a LEFT JOIN agents g ON g.agent_id = a.agent_id
             WHERE a.window_end >= ?1 AND (?2 = '' OR g.host = ?2)
             ORDER BY a.window_end DESC, a.id DESC LIMIT ?3",
        )
        .map_err(&err)?;
    let host = query.host.clone().unwrap_or_default();
    let mut rows = stmt.query(rusqlite::params![query.since_unix_ms, host, query.limit as i64]).map_err(&err)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(&err)? {
        out.push(AgentWindowRow {
            agent_id: row.get(0).map_err(&err)?,
            host: row.get(1).map_err(&err)?,
            window: Some(AgentWindow {
                window_start_unix_ms: row.get(2).map_err(&err)?,
                window_end_unix_ms: row.get(3).map_err(&err)?,
                cost: decode::<AgentCost>(&row.get::<_, Vec<u8>>(4).map_err(&err)?, "agent cost")?,
                host: decode::<HostMetrics>(&row.get::<_, Vec<u8>>(5).map_err(&err)?, "host metrics")?,
                // Untraced servers are in Instances, not in the agent's windows.
                untraced: Vec::new(),
            }),
        });
    }
    Ok(out)
}
