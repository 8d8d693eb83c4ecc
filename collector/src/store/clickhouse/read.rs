//! Answers: digests merged over windows, rollups and instances (`Top`),
//! instances, lock waits and exact totals. Rows of winning attempts only
//! (`winners`, `rollups`); every sum, min, max and merge runs in Rust
//! (`digest_rows`, `merge`), as in the SQLite store, so u64 values and
//! saturation behave the same.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use sqlbee_proto::v1::{
    CommandCount, InstanceInfo, LockWait, LockWaitRow, LongStatement, LongStatementRow, TopDigest, TotalsResponse,
};

use super::{
    digest_rows::{DIGEST_COLUMNS, FullRow, MERGE_COLUMNS, Merging, RowKey, read_digest_row, read_full_row},
    equals, error,
    http::{Client, Malformed, Rows, quote},
    malformed,
    rollups::{self, Table},
    winners,
};
use crate::store::{
    LocksQuery, OrderBy, Page, StoreError, TopPage, TopQuery, TotalsQuery, answer_budget::lean_text, blob, merge,
};

/// The top query's filters on digest rows (the range apart).
pub(super) fn top_filters(query: &TopQuery) -> String {
    let mut sql = equals(&[("instance", &query.instance), ("schema", &query.schema), ("program", &query.program)]);
    if let Some(digest) = query.digest {
        sql.push_str(&format!(" AND digest = {digest}"));
    }
    // Client statements only, unless asked (a program's are nested).
    if !query.nested && query.program.is_none() {
        sql.push_str(" AND nested = 0");
    }
    sql
}

/// The top digests (`lean`: see `Store::top_lean`; ranking by waits reads
/// them, so it is never lean).
pub(super) fn top(db: &Client, query: &TopQuery, lean: bool) -> Result<TopPage, StoreError> {
    // A comparison answers every digest of its cut, texts cut short; a
    // full read as many as fit the answer.
    let answer_all = lean;
    let lean = lean && query.order_by != OrderBy::Wait;
    let bad = malformed("top");
    let figure = match query.order_by.figure() {
        Some(figure) => format!("ifNull({}, 0)", figure.name),
        // Materialized: see `costs::AGENT_RAW`.
        None => "materialize(toUInt64(0))".to_string(),
    };
    let sources = rollups::sources(db, query.since_unix_ms, query.until_unix_ms, None, "top")?;
    let merged = if lean { LEAN_COLUMNS } else { MERGE_COLUMNS };
    let columns = format!("{DIGEST_COLUMNS}, {merged}, {figure} AS figure");
    let mut rows =
        db.select(&sources.union(Table::Digests, &columns, &top_filters(query))).map_err(|e| error("top", e))?;
    let mut digests: HashMap<RowKey, Merging> = HashMap::new();
    while !rows.done() {
        let (full, lean_figures) = if lean {
            let (full, figures) = read_lean_row(&mut rows).map_err(&bad)?;
            (full, Some(figures))
        } else {
            (read_full_row(&mut rows, &bad)?, None)
        };
        let figure = rows.u64().map_err(&bad)?;
        // Looked up before it is copied: most rows find their key.
        if !digests.contains_key(&full.row.key) {
            digests.insert(full.row.key.clone(), Merging::default());
        }
        let Some(m) = digests.get_mut(&full.row.key) else { continue };
        if query.order_by != OrderBy::Wait {
            m.rank = m.rank.saturating_add(figure);
        }
        m.add(full)?;
        if let Some((rows_examined, cpu_ns)) = lean_figures {
            add_some(&mut m.stats.rows_examined, rows_examined);
            add_some(&mut m.stats.cpu_ns, cpu_ns);
        }
    }
    for m in digests.values_mut() {
        match query.order_by {
            OrderBy::P99 => m.rank = merge::percentile(&m.histogram, 0.99, &m.totals),
            OrderBy::Wait => m.rank = m.waits.total_ns(),
            _ => {}
        }
    }
    let mut ranked: Vec<(RowKey, Merging)> = digests.into_iter().collect();
    ranked.sort_by(|(ka, a), (kb, b)| {
        merge::compare(query.order_by, (ka.digest, &a.totals, a.rank), (kb.digest, &b.totals, b.rank))
            .then_with(|| ka.cmp(kb))
    });
    ranked.truncate(query.limit);
    let ids: BTreeSet<u64> = ranked.iter().map(|(k, _)| k.digest).collect();
    let texts = texts(db, &ids)?;
    let mut messages = if lean { HashMap::new() } else { messages(db, &ids, query.instance.as_deref())? };
    let mut page = TopPage::default();
    for (key, m) in ranked {
        if page.is_full() {
            page.skip();
            continue;
        }
        let digest = key.digest;
        let t = &m.totals;
        let senders = m.senders.into_top();
        let text = texts.get(&digest).cloned().unwrap_or_default();
        let row = TopDigest {
            digest,
            digest_text: if answer_all { lean_text(text) } else { text },
            schema: key.schema,
            nested: key.nested,
            program: key.program,
            program_kind: key.program_kind,
            parent_digest: key.parent_digest,
            source: key.source,
            count: t.count,
            errors: t.errors,
            sum_ns: t.sum_ns,
            min_ns: t.min_ns,
            max_ns: t.max_ns,
            p50_ns: merge::percentile(&m.histogram, 0.50, t),
            p95_ns: merge::percentile(&m.histogram, 0.95, t),
            p99_ns: merge::percentile(&m.histogram, 0.99, t),
            sample: m.sample.map(|(_, s)| s).unwrap_or_default(),
            instances: m.instances.into_iter().collect(),
            waits: m.waits.into_stats(),
            error_codes: m.errors.into_counts(|code| messages.remove(&(digest, code)).unwrap_or_default()),
            estimated_count: if m.sampled { m.estimated } else { 0 },
            stats: Some(m.stats),
            accounts: senders.accounts,
            clients: senders.clients,
            tags: senders.tags,
            exemplars: senders.exemplars,
            histogram: Some(merge::wire_histogram(&m.histogram)),
        };
        if answer_all {
            page.rows.push(row);
        } else {
            page.push(row);
        }
    }
    Ok(page)
}

/// What a lean read takes after `DIGEST_COLUMNS`: rows examined and CPU,
/// each as (value, known).
const LEAN_COLUMNS: &str = "ifNull(rows_examined, 0), isNotNull(rows_examined), ifNull(cpu_ns, 0), isNotNull(cpu_ns)";

/// A row of a lean read: the digest row alone (nothing else to merge), and
/// its rows examined and CPU.
fn read_lean_row(rows: &mut Rows) -> Result<(FullRow, (Option<u64>, Option<u64>)), Malformed> {
    let row = read_digest_row(rows)?;
    let figure = |rows: &mut Rows| -> Result<Option<u64>, Malformed> {
        let value = rows.u64()?;
        Ok((rows.u8()? != 0).then_some(value))
    };
    let figures = (figure(rows)?, figure(rows)?);
    let full = FullRow {
        row,
        truncated: 0,
        errors: Vec::new(),
        waits: Vec::new(),
        figures: Vec::new(),
        accounts: Vec::new(),
        sample: String::new(),
        sample_end: 0,
    };
    Ok((full, figures))
}

fn add_some(sum: &mut Option<u64>, value: Option<u64>) {
    if let Some(value) = value {
        *sum = Some(sum.unwrap_or(0).saturating_add(value));
    }
}

fn id_list(ids: &BTreeSet<u64>) -> String {
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
}

pub(super) fn texts(db: &Client, ids: &BTreeSet<u64>) -> Result<HashMap<u64, String>, StoreError> {
    let mut out = HashMap::new();
    if ids.is_empty() {
        return Ok(out);
    }
    let mut rows = db
        .select(&format!(
            "SELECT digest, any(text) FROM digest_texts WHERE digest IN ({}) GROUP BY digest",
            id_list(ids)
        ))
        .map_err(|e| error("top", e))?;
    while !rows.done() {
        let digest = rows.u64().map_err(malformed("top"))?;
        out.insert(digest, rows.string().map_err(malformed("top"))?);
    }
    Ok(out)
}

/// The newest message per (digest, code): by window end, then by arrival;
/// of `instance` alone when one is asked for, so another agent's message
/// never stands for its statements.
fn messages(
    db: &Client,
    ids: &BTreeSet<u64>,
    instance: Option<&str>,
) -> Result<HashMap<(u64, u32), String>, StoreError> {
    let mut out = HashMap::new();
    if ids.is_empty() {
        return Ok(out);
    }
    let of_instance = instance.map(|i| format!("AND instance = {}", quote(i))).unwrap_or_default();
    let mut rows = db
        .select(&format!(
            "SELECT digest, code, argMax(message, (window_end, ingest_id, position)) FROM error_samples
             WHERE digest IN ({}) {of_instance} AND {} GROUP BY digest, code",
            id_list(ids),
            winners(i64::MIN, i64::MAX)
        ))
        .map_err(|e| error("top", e))?;
    let bad = malformed("top");
    while !rows.done() {
        let (digest, code) = (rows.u64().map_err(&bad)?, rows.u32().map_err(&bad)?);
        out.insert((digest, code), rows.string().map_err(&bad)?);
    }
    Ok(out)
}

/// Gaps counted once per (agent, sequence range): the first copy stored.
/// (agent_id, lost_statements, placed at).
fn gaps(db: &Client, action: &'static str) -> Result<Vec<(String, u64, i64)>, StoreError> {
    let mut rows = db
        .select(&format!(
            "SELECT agent_id, argMin(lost_statements, (received_unix_ms, ingest_id)),
                    argMin(if(last_window_end_unix_ms > 0, last_window_end_unix_ms, received_unix_ms),
                           (received_unix_ms, ingest_id))
             FROM gaps WHERE {} GROUP BY agent_id, first_sequence, last_sequence",
            winners(i64::MIN, i64::MAX)
        ))
        .map_err(|e| error(action, e))?;
    let bad = malformed(action);
    let mut out = Vec::new();
    while !rows.done() {
        out.push((rows.string().map_err(&bad)?, rows.u64().map_err(&bad)?, rows.i64().map_err(&bad)?));
    }
    Ok(out)
}

pub(super) fn instances(db: &Client) -> Result<Vec<InstanceInfo>, StoreError> {
    let bad = malformed("instances");
    let err = |e| error("instances", e);
    let mut batches: HashMap<String, u64> = HashMap::new();
    let mut rows = db
        .select(
            "SELECT agent_id, count() FROM (SELECT DISTINCT agent_id, epoch, sequence FROM batches) GROUP BY agent_id",
        )
        .map_err(err)?;
    while !rows.done() {
        let agent = rows.string().map_err(&bad)?;
        batches.insert(agent, rows.u64().map_err(&bad)?);
    }
    let mut gap_totals: HashMap<String, (u64, u64)> = HashMap::new();
    for (agent, lost, _) in gaps(db, "instances")? {
        let entry = gap_totals.entry(agent).or_default();
        entry.0 += 1;
        entry.1 = entry.1.saturating_add(lost);
    }
    // Host and version follow the newest sequence.
    let mut rows = db
        .select(
            "SELECT agent_id, argMax(host, (sequence, received_unix_ms)), argMax(version, (sequence, received_unix_ms)),
                    max(received_unix_ms), max(sequence)
             FROM agent_seen GROUP BY agent_id",
        )
        .map_err(err)?;
    let mut agents = Vec::new();
    while !rows.done() {
        agents.push((
            rows.string().map_err(&bad)?,
            rows.string().map_err(&bad)?,
            rows.string().map_err(&bad)?,
            rows.i64().map_err(&bad)?,
            rows.u64().map_err(&bad)?,
        ));
    }
    // Per (agent, instance): the newest instance window's word, and the
    // newest untraced report's; the newer of the two names the server.
    #[derive(Default, Clone)]
    struct Server {
        at: i64,
        pid: u32,
        container_id: String,
        container: String,
        build_id: String,
        server_version: String,
    }
    let read_server = |rows: &mut Rows| -> Result<Server, Malformed> {
        Ok(Server {
            at: rows.i64()?,
            pid: rows.u32()?,
            container_id: {
                // The server's start time: InstanceInfo has no field for it.
                rows.i64()?;
                rows.string()?
            },
            container: rows.string()?,
            build_id: rows.string()?,
            server_version: rows.string()?,
        })
    };
    let newest = |at: &str| {
        format!(
            "max({at}), argMax(pid, {at}), argMax(start_time_unix_ms, {at}), argMax(container_id, {at}),
             argMax(container, {at}), argMax(build_id, {at}), argMax(server_version, {at})"
        )
    };
    let all = winners(i64::MIN, i64::MAX);
    let mut servers: BTreeMap<(String, String), (Option<Server>, Option<(Server, String, String, i64)>)> =
        BTreeMap::new();
    let mut logins: HashMap<(String, String), String> = HashMap::new();
    let mut rows = db
        .select(&format!(
            "SELECT agent_id, instance, {}, argMax(server_login, window_end) FROM instance_windows WHERE {all}
             GROUP BY agent_id, instance",
            newest("window_end")
        ))
        .map_err(err)?;
    while !rows.done() {
        let key = (rows.string().map_err(&bad)?, rows.string().map_err(&bad)?);
        servers.entry(key.clone()).or_default().0 = Some(read_server(&mut rows).map_err(&bad)?);
        logins.insert(key, rows.string().map_err(&bad)?);
    }
    let mut rows = db
        .select(&format!(
            "SELECT agent_id, instance, {}, argMax(reason, seen_unix_ms), argMax(kind, seen_unix_ms),
                    argMax(since_unix_ms, seen_unix_ms)
             FROM untraced WHERE {all} GROUP BY agent_id, instance",
            newest("seen_unix_ms")
        ))
        .map_err(err)?;
    while !rows.done() {
        let key = (rows.string().map_err(&bad)?, rows.string().map_err(&bad)?);
        let server = read_server(&mut rows).map_err(&bad)?;
        let (reason, kind, since) =
            (rows.string().map_err(&bad)?, rows.string().map_err(&bad)?, rows.i64().map_err(&bad)?);
        servers.entry(key).or_default().1 = Some((server, reason, kind, since));
    }
    let mut by_agent: HashMap<String, Vec<InstanceInfo>> = HashMap::new();
    for ((agent_id, instance), (traced, untraced)) in servers {
        let server_login = logins.remove(&(agent_id.clone(), instance.clone())).unwrap_or_default();
        let last_window_end = traced.as_ref().map_or(0, |s| s.at);
        let seen = untraced.as_ref().map_or(0, |u| u.0.at);
        let mut info = InstanceInfo {
            instance,
            last_window_end_unix_ms: last_window_end,
            untraced_seen_unix_ms: seen,
            server_login,
            ..Default::default()
        };
        let named_by = match (&traced, &untraced) {
            (Some(t), Some(u)) if u.0.at > t.at => Some(&u.0),
            (Some(t), _) => Some(t),
            (None, Some(u)) => Some(&u.0),
            (None, None) => None,
        };
        if let Some(s) = named_by.cloned() {
            info.pid = s.pid;
            info.container_id = s.container_id;
            info.container = s.container;
            info.build_id = s.build_id;
            info.server_version = s.server_version;
        }
        if let Some((_, reason, kind, since)) = untraced
            && seen > last_window_end
        {
            info.untraced_reason = reason;
            info.untraced_kind = kind;
            info.untraced_since_unix_ms = since;
        }
        by_agent.entry(agent_id).or_default().push(info);
    }
    let mut out = Vec::new();
    for (agent_id, host, version, last_seen, last_sequence) in agents {
        let instances = by_agent.remove(&agent_id).unwrap_or_else(|| vec![InstanceInfo::default()]);
        for mut info in instances {
            info.agent_id = agent_id.clone();
            info.host = host.clone();
            info.version = version.clone();
            info.last_seen_unix_ms = last_seen;
            info.last_sequence = last_sequence;
            info.batches = batches.get(&agent_id).copied().unwrap_or(0);
            let (count, lost) = gap_totals.get(&agent_id).copied().unwrap_or_default();
            info.gaps = count;
            info.lost_statements = lost;
            out.push(info);
        }
    }
    out.sort_by(|a, b| (&a.instance, &a.agent_id).cmp(&(&b.instance, &b.agent_id)));
    Ok(out)
}

pub(super) fn locks(db: &Client, query: &LocksQuery) -> Result<Page<LockWaitRow>, StoreError> {
    let bad = malformed("locks");
    let mut rows = db
        .select(&format!(
            "SELECT agent_id, instance, start_unix_ms, duration_ns, class, connection_id, digest, digest_text,
                    sample, blocker_kind, blockers
             FROM lock_waits WHERE start_unix_ms >= {}{} AND {}
             ORDER BY start_unix_ms DESC, received_unix_ms DESC, ingest_id DESC, position DESC LIMIT {}",
            query.since_unix_ms,
            equals(&[("instance", &query.instance)]),
            winners(query.since_unix_ms, i64::MAX),
            query.limit
        ))
        .map_err(|e| error("locks", e))?;
    let mut out = Page::default();
    while !rows.done() {
        let agent_id = rows.string().map_err(&bad)?;
        let instance = rows.string().map_err(&bad)?;
        let mut wait = LockWait {
            start_unix_ms: rows.i64().map_err(&bad)?,
            duration_ns: rows.u64().map_err(&bad)?,
            class: rows.string().map_err(&bad)?,
            connection_id: rows.u64().map_err(&bad)?,
            digest: rows.u64().map_err(&bad)?,
            digest_text: rows.string().map_err(&bad)?,
            sample: rows.string().map_err(&bad)?,
            blocker_kind: rows.string().map_err(&bad)?,
            blockers: Vec::new(),
        };
        let blockers = rows.string().map_err(&bad)?;
        wait.blockers = blob::decode_blockers(&blockers).ok_or(StoreError::Corrupt { what: "lock_waits.blockers" })?;
        out.push(LockWaitRow { agent_id, instance, wait: Some(wait) });
    }
    Ok(out)
}

pub(super) fn long_statements(db: &Client, query: &LocksQuery) -> Result<Page<LongStatementRow>, StoreError> {
    let bad = malformed("long_statements");
    let mut rows = db
        .select(&format!(
            "SELECT agent_id, instance, statement FROM long_statements WHERE start_unix_ms >= {}{} AND {}
             ORDER BY start_unix_ms DESC, received_unix_ms DESC, ingest_id DESC, position DESC LIMIT {}",
            query.since_unix_ms,
            equals(&[("instance", &query.instance)]),
            winners(query.since_unix_ms, i64::MAX),
            query.limit
        ))
        .map_err(|e| error("long_statements", e))?;
    let mut out = Page::default();
    while !rows.done() {
        let agent_id = rows.string().map_err(&bad)?;
        let instance = rows.string().map_err(&bad)?;
        let bytes = rows.bytes().map_err(&bad)?;
        let statement = <LongStatement as prost::Message>::decode(bytes.as_slice())
            .map_err(|_| StoreError::Corrupt { what: "long_statements.statement" })?;
        out.push(LongStatementRow { agent_id, instance, statement: Some(statement) });
    }
    Ok(out)
}

pub(super) fn totals(db: &Client, query: &TotalsQuery) -> Result<TotalsResponse, StoreError> {
    let bad = malformed("totals");
    let err = |e| error("totals", e);
    let (since, until) = (query.since_unix_ms, query.until_unix_ms);
    let sources = rollups::sources(db, since, until, None, "totals")?;
    let filters = equals(&[("instance", &query.instance)]);
    let mut out = TotalsResponse::default();
    let mut commands: BTreeMap<String, u64> = BTreeMap::new();
    let mut rows = db
        .select(&sources.union(
            Table::Instances,
            "statements, dropped_events, unmatched, command, command_count",
            &filters,
        ))
        .map_err(err)?;
    while !rows.done() {
        out.statements = out.statements.saturating_add(rows.u64().map_err(&bad)?);
        out.dropped_events = out.dropped_events.saturating_add(rows.u64().map_err(&bad)?);
        out.unmatched = out.unmatched.saturating_add(rows.u64().map_err(&bad)?);
        let names = rows.array(|r| r.string()).map_err(&bad)?;
        let counts = rows.array(|r| r.u64()).map_err(&bad)?;
        for (name, count) in names.into_iter().zip(counts) {
            let slot = commands.entry(name).or_default();
            *slot = slot.saturating_add(count);
        }
    }
    out.commands = commands.into_iter().map(|(command, count)| CommandCount { command, count }).collect();
    let mut rows = db
        .select(&format!("SELECT uniqExact(digest) FROM ({})", sources.union(Table::Digests, "digest", &filters)))
        .map_err(err)?;
    out.digest_count = rows.u64().map_err(&bad)?;
    // Gaps belong to agents, not instances: with an instance filter, count
    // the gaps of the agents that served it.
    let agents: Option<BTreeSet<String>> = match &query.instance {
        Some(instance) => {
            let all = winners(i64::MIN, i64::MAX);
            let mut rows = db
                .select(&format!(
                    "SELECT DISTINCT agent_id FROM (SELECT agent_id FROM instance_windows
                         WHERE instance = {name} AND {all}
                     UNION ALL SELECT agent_id FROM untraced WHERE instance = {name} AND {all})",
                    name = quote(instance)
                ))
                .map_err(err)?;
            let mut set = BTreeSet::new();
            while !rows.done() {
                set.insert(rows.string().map_err(&bad)?);
            }
            Some(set)
        }
        None => None,
    };
    for (agent, lost, at) in gaps(db, "totals")? {
        if at >= since && at < until && agents.as_ref().is_none_or(|a| a.contains(&agent)) {
            out.lost_statements = out.lost_statements.saturating_add(lost);
        }
    }
    Ok(out)
}
