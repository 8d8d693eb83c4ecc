//! Each table's indexes, with the digests whose plans chose each over the
//! range, and what to do about them: an index that repeats another
//! (`duplicate_index`), one that is a left prefix of another
//! (`redundant_index`), one no plan chose (`unused_index`), and one its
//! digests' plans ask for (`missing_index`: the candidates their own
//! findings suggest, gathered over every digest they would serve). Pure: the
//! definitions are what agents read over their login (`SHOW INDEX`), the
//! use is what the stored plans say.
//!
//! How sure `unused_index` is depends on how much of the table's traffic
//! has plans: the answer says so (`planned_statements` of
//! `plannable_statements`), and names the digests it rests on. A plan
//! only says which index the optimizer chose for the sample explained, and
//! a statement that runs once a month may not have run in the range: the
//! finding says to check before dropping.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use sqlbee_proto::v1::{Finding, IndexDefinition, PlanRow, TableIndex, TableIndexes, TableTotals, TopDigest};

use super::findings::quoted;
use crate::store::{DigestTables, StoredIndexes};

/// Digests a finding names at most.
const MAX_NAMED_DIGESTS: usize = 20;
/// Digests whose figures are read to judge their plans' candidate indexes.
pub const MAX_CANDIDATES: usize = 50;

/// What the store holds for the range: definitions, plans, and which
/// tables each digest touches.
pub struct Evidence<'a> {
    pub rows: &'a [TopDigest],
    pub described: &'a [DigestTables],
    pub indexes: &'a [StoredIndexes],
    /// Plans of the range's digests first seen before its end.
    pub plans: &'a [PlanRow],
    pub since_unix_ms: i64,
}

/// A digest (run in a schema).
type DigestKey<'a> = (u64, &'a str);

/// Fills in each table's indexes, their use, the coverage of its plans and
/// its findings.
pub fn advise(tables: &mut [TableTotals], evidence: &Evidence<'_>) {
    let definitions = newest_definitions(evidence.indexes);
    let plans = plans_in_force(evidence.plans, evidence.since_unix_ms);
    let counts: HashMap<DigestKey<'_>, u64> = {
        let mut counts = HashMap::new();
        for row in evidence.rows {
            *counts.entry((row.digest, row.schema.as_str())).or_default() += row.count;
        }
        counts
    };
    for t in tables.iter_mut() {
        let Some((instance, definition)) = definitions.get(&(t.schema.as_str(), t.table.as_str())) else { continue };
        t.indexes_instance = instance.to_string();
        t.indexes_read_unix_ms = definition.read_unix_ms;
        // Per index: the digests that chose it and their statements.
        let mut used: BTreeMap<&str, (BTreeSet<u64>, u64)> = BTreeMap::new();
        let mut statements_of: HashMap<u64, u64> = HashMap::new();
        let mut planned: Vec<(u64, u64)> = Vec::new();
        for d in evidence.described.iter().filter(|d| !d.unknown) {
            let Some(count) = counts.get(&(d.digest, d.schema.as_str())).copied() else { continue };
            let own = |u: &&sqlbee_proto::v1::TableUse| {
                let schema = if u.schema.is_empty() { d.schema.as_str() } else { u.schema.as_str() };
                schema == t.schema && u.table == t.table
            };
            let Some(table_use) = d.tables.iter().find(own) else { continue };
            // The table a plain INSERT writes chooses no index, and an
            // EXPLAIN (the agent's own, or anyone's) reads no row.
            let inserted = table_use.write && matches!(d.kind.as_str(), "INSERT" | "REPLACE");
            if inserted || matches!(d.kind.as_str(), "EXPLAIN" | "DESCRIBE" | "DESC") {
                continue;
            }
            t.plannable_statements += count;
            let Some(accesses) = plans.get(&(d.digest, d.schema.as_str())) else { continue };
            let alone = d.tables.len() == 1;
            let mine: Vec<&str> =
                accesses.iter().filter(|(table, _)| alone || *table == t.table).map(|(_, key)| *key).collect();
            if mine.is_empty() {
                continue;
            }
            t.planned_statements += count;
            planned.push((d.digest, count));
            *statements_of.entry(d.digest).or_default() += count;
            for key in mine.iter().flat_map(|k| k.split(',')).map(str::trim).filter(|k| !k.is_empty()) {
                let entry = used.entry(key).or_default();
                if entry.0.insert(d.digest) {
                    entry.1 += count;
                }
            }
        }
        planned.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        t.indexes = definition
            .indexes
            .iter()
            .map(|i| {
                let (digests, statements) = used.get(i.name.as_str()).map_or((0, 0), |(d, n)| (d.len() as u64, *n));
                let mut digest_ids: Vec<u64> =
                    used.get(i.name.as_str()).map(|(d, _)| d.iter().copied().collect()).unwrap_or_default();
                digest_ids.sort_by_key(|d| (std::cmp::Reverse(statements_of.get(d).copied().unwrap_or(0)), *d));
                digest_ids.truncate(MAX_NAMED_DIGESTS);
                TableIndex {
                    digest_ids,
                    name: i.name.clone(),
                    columns: i.columns.iter().map(column).collect(),
                    unique: i.unique,
                    r#type: i.r#type.clone(),
                    ignored: i.ignored,
                    digests,
                    statements,
                    rows_read: i.rows_read,
                }
            })
            .collect();
        let using = |name: &str| -> Vec<u64> {
            used.get(name).map(|(d, _)| d.iter().copied().take(MAX_NAMED_DIGESTS).collect()).unwrap_or_default()
        };
        t.findings = repeats(&t.schema, &t.table, &definition.indexes, &using);
        let flagged: BTreeSet<String> = t.findings.iter().map(|f| f.plan_line.clone()).collect();
        if t.planned_statements > 0 {
            for index in &definition.indexes {
                if index.unique || index.ignored || used.contains_key(index.name.as_str()) {
                    continue;
                }
                if flagged.contains(&index_line(index)) {
                    continue;
                }
                t.findings.push(unused(t, index, &planned));
            }
        }
    }
}

/// `name` or `name(prefix)`; an expression part as `(expression)`.
fn column(c: &sqlbee_proto::v1::IndexColumn) -> String {
    match (c.name.is_empty(), c.prefix) {
        (true, _) => "(expression)".into(),
        (false, 0) => c.name.clone(),
        (false, n) => format!("{}({n})", c.name),
    }
}

fn index_line(index: &IndexDefinition) -> String {
    let columns: Vec<String> = index.columns.iter().map(column).collect();
    format!("index {} ({})", index.name, columns.join(", "))
}

/// The newest reading of each table (schema, table): of the instance
/// asked for when the store was read for one, else of whichever instance
/// read it last. A table the server says is gone has none.
fn newest_definitions(stored: &[StoredIndexes]) -> HashMap<(&str, &str), (&str, &TableIndexes)> {
    let mut out: HashMap<(&str, &str), (&str, &TableIndexes)> = HashMap::new();
    for s in stored {
        let key = (s.table.schema.as_str(), s.table.table.as_str());
        let newer = out.get(&key).is_none_or(|(_, t)| s.table.read_unix_ms > t.read_unix_ms);
        if newer {
            out.insert(key, (s.instance.as_str(), &s.table));
        }
    }
    out.retain(|_, (_, t)| !t.missing);
    out
}

/// Per digest: the (table as the plan names it, key) of every plan in
/// force in the range: those seen in it, and each (instance, digest)'s
/// newest before it (it stood until the next).
fn plans_in_force(plans: &[PlanRow], since: i64) -> HashMap<DigestKey<'_>, Vec<(&str, &str)>> {
    let mut newest: HashMap<(&str, &str, u64), i64> = HashMap::new();
    for p in plans {
        let Some(plan) = &p.plan else { continue };
        let at = newest.entry((p.instance.as_str(), plan.schema.as_str(), plan.digest)).or_insert(i64::MIN);
        *at = (*at).max(p.last_seen_unix_ms);
    }
    let mut out: HashMap<DigestKey<'_>, Vec<(&str, &str)>> = HashMap::new();
    for p in plans {
        let Some(plan) = &p.plan else { continue };
        let newest = newest[&(p.instance.as_str(), plan.schema.as_str(), plan.digest)];
        if p.last_seen_unix_ms < since && p.last_seen_unix_ms < newest {
            continue;
        }
        let accesses = out.entry((plan.digest, plan.schema.as_str())).or_default();
        accesses.extend(plan.access.iter().map(|a| (a.table.as_str(), a.key.as_str())));
    }
    out
}

/// The newest plan of each digest (run in a schema) whose plan may ask for
/// an index: a table read whole, or one
/// table read and then sorted. At most `MAX_CANDIDATES`, costliest first
/// by `rows`' time: each costs a read of the digest's figures.
pub fn candidate_plans<'a>(plans: &'a [PlanRow], rows: &[TopDigest]) -> Vec<&'a sqlbee_proto::v1::Plan> {
    let mut newest: HashMap<DigestKey<'_>, &PlanRow> = HashMap::new();
    for p in plans {
        let Some(plan) = &p.plan else { continue };
        let key = (plan.digest, plan.schema.as_str());
        if newest.get(&key).is_none_or(|n| p.last_seen_unix_ms > n.last_seen_unix_ms) {
            newest.insert(key, p);
        }
    }
    let time: HashMap<DigestKey<'_>, u64> = rows.iter().map(|r| ((r.digest, r.schema.as_str()), r.sum_ns)).collect();
    let mut out: Vec<(u64, &sqlbee_proto::v1::Plan)> = newest
        .into_values()
        .filter_map(|p| p.plan.as_ref())
        .filter(|plan| plan.access.iter().any(|a| a.r#type == "ALL") || (plan.filesort && plan.access.len() == 1))
        .filter_map(|plan| time.get(&(plan.digest, plan.schema.as_str())).map(|t| (*t, plan)))
        .collect();
    out.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.digest.cmp(&b.1.digest)));
    out.into_iter().take(MAX_CANDIDATES).map(|(_, p)| p).collect()
}

/// The candidate indexes the digests' own findings suggest, gathered per
/// table: one `missing_index` finding per suggestion, naming every digest
/// it would serve and what they cost over the range. `judged` holds each
/// candidate plan with its digest's figures over the range.
pub fn gather_candidates(tables: &mut [TableTotals], judged: &[(&sqlbee_proto::v1::Plan, TopDigest)]) {
    // (schema, table) -> suggestion -> (first finding, digests, statements, time)
    type Gathered = BTreeMap<String, (Finding, Vec<u64>, u64, u64)>;
    let mut by_table: HashMap<(String, String), Gathered> = HashMap::new();
    for (plan, row) in judged {
        for f in super::findings::findings(plan, row.count, row.stats.as_ref()) {
            if f.suggestion.is_empty() {
                continue;
            }
            let table = by_table.entry((plan.schema.clone(), f.table.clone())).or_default();
            let entry = table.entry(f.suggestion.clone()).or_insert_with(|| (f.clone(), Vec::new(), 0, 0));
            if !entry.1.contains(&plan.digest) {
                entry.1.push(plan.digest);
                entry.2 += row.count;
                entry.3 = entry.3.saturating_add(row.sum_ns);
            }
        }
    }
    for t in tables.iter_mut() {
        let Some(gathered) = by_table.remove(&(t.schema.clone(), t.table.clone())) else { continue };
        for (suggestion, (first, digests, statements, sum_ns)) in gathered {
            t.findings.push(Finding {
                kind: "missing_index".into(),
                table: t.table.clone(),
                plan_line: first.plan_line.clone(),
                detail: format!(
                    "{} digests ({statements} statements, {:.1} ms in this range) would use it; the costliest's \
                     plan: {} ({})",
                    digests.len(),
                    sum_ns as f64 / 1e6,
                    first.detail,
                    first.kind
                ),
                suggestion,
                check_first: first.check_first.clone(),
                digests: digests.into_iter().take(MAX_NAMED_DIGESTS).collect(),
            });
        }
    }
}

/// Same type and the same parts (names and prefixes) in the same order.
fn same_parts(a: &IndexDefinition, b: &IndexDefinition) -> bool {
    a.r#type == b.r#type && a.columns == b.columns
}

/// `a`'s parts are the first parts of `b`, which has more.
fn left_prefix(a: &IndexDefinition, b: &IndexDefinition) -> bool {
    a.r#type == b.r#type && a.columns.len() < b.columns.len() && b.columns.starts_with(&a.columns)
}

/// Duplicate and redundant indexes, from the definition alone. Of two
/// alike, the one kept is the primary key, else a unique one, else the
/// first by name; a unique index is never called redundant (it holds a
/// constraint the longer one does not).
fn repeats(schema: &str, table: &str, indexes: &[IndexDefinition], using: &dyn Fn(&str) -> Vec<u64>) -> Vec<Finding> {
    let ordered_kind = |i: &IndexDefinition| !matches!(i.r#type.as_str(), "FULLTEXT" | "SPATIAL" | "VECTOR");
    let keep_first = |a: &IndexDefinition, b: &IndexDefinition| {
        (a.name == "PRIMARY", a.unique, std::cmp::Reverse(a.name.as_str()))
            > (b.name == "PRIMARY", b.unique, std::cmp::Reverse(b.name.as_str()))
    };
    let mut out = Vec::new();
    let mut reported: BTreeSet<&str> = BTreeSet::new();
    for (n, a) in indexes.iter().enumerate() {
        for b in &indexes[n + 1..] {
            if !same_parts(a, b) {
                continue;
            }
            let (kept, dropped) = if keep_first(a, b) { (a, b) } else { (b, a) };
            if dropped.name == "PRIMARY" || !reported.insert(dropped.name.as_str()) {
                continue;
            }
            out.push(drop_finding(
                "duplicate_index",
                schema,
                table,
                dropped,
                format!(
                    "{} repeats {} ({}, the same parts in the same order): every write updates both, and the \
                     optimizer can use either",
                    dropped.name,
                    kept.name,
                    kept.columns.iter().map(column).collect::<Vec<_>>().join(", ")
                ),
                format!(
                    "no statement names {name} in an index hint (FORCE/USE INDEX ({name}) would fail once it is \
                     gone); the digests that chose it will choose {kept} instead",
                    name = dropped.name,
                    kept = kept.name
                ),
                using(&dropped.name),
            ));
        }
    }
    for a in indexes.iter().filter(|a| !a.unique && a.name != "PRIMARY" && ordered_kind(a)) {
        if reported.contains(a.name.as_str()) {
            continue;
        }
        let Some(longer) = indexes.iter().find(|b| left_prefix(a, b)) else { continue };
        reported.insert(a.name.as_str());
        out.push(drop_finding(
            "redundant_index",
            schema,
            table,
            a,
            format!(
                "{} ({}) is a left prefix of {} ({}): any lookup or range on its parts can use the longer index",
                a.name,
                a.columns.iter().map(column).collect::<Vec<_>>().join(", "),
                longer.name,
                longer.columns.iter().map(column).collect::<Vec<_>>().join(", ")
            ),
            format!(
                "EXPLAIN the digests that chose {name} with it made invisible first (MariaDB: ALTER TABLE ... \
                 ALTER INDEX {name} IGNORED; MySQL: ALTER INDEX {name} INVISIBLE): the longer index is wider, so \
                 a scan of the whole index reads more; and no index hint names {name}",
                name = a.name
            ),
            using(&a.name),
        ));
    }
    out
}

fn drop_finding(
    kind: &str,
    schema: &str,
    table: &str,
    index: &IndexDefinition,
    detail: String,
    check_first: String,
    digests: Vec<u64>,
) -> Finding {
    Finding {
        kind: kind.into(),
        table: table.into(),
        plan_line: index_line(index),
        detail,
        suggestion: format!("suggestion: ALTER TABLE {} DROP INDEX {}", qualified(schema, table), quoted(&index.name)),
        check_first,
        digests,
    }
}

fn qualified(schema: &str, table: &str) -> String {
    if schema.is_empty() { quoted(table) } else { format!("{}.{}", quoted(schema), quoted(table)) }
}

/// An index no plan in force in the range chose, with how sure that is.
fn unused(t: &TableTotals, index: &IndexDefinition, planned: &[(u64, u64)]) -> Finding {
    let share = 100.0 * t.planned_statements as f64 / t.plannable_statements.max(1) as f64;
    // The server's own count, where it keeps one: a second opinion.
    let counted = match index.rows_read {
        Some(0) => "; INDEX_STATISTICS counts no row read through it since the server started".to_string(),
        Some(n) => format!(
            "; but INDEX_STATISTICS counts {n} rows read through it since the server started: statements outside \
             this range or without a plan use it"
        ),
        None => String::new(),
    };
    drop_finding(
        "unused_index",
        &t.schema,
        &t.table,
        index,
        format!(
            "no plan chose {} in this range: the plans of {} digests ({} statements, {share:.0}% of the statements \
             on {} that may use an index) read the table by other means; every write still updates it{counted}",
            index.name,
            planned.len(),
            t.planned_statements,
            t.table
        ),
        format!(
            "statements that did not run in this range (a monthly report) or have no plan may need it: look at a \
             longer range, and at MariaDB's INDEX_STATISTICS (userstat=ON) for reads of it since the server \
             started; make it invisible first (MariaDB: ALTER TABLE ... ALTER INDEX {name} IGNORED; MySQL: \
             INVISIBLE) and drop it when nothing slowed",
            name = index.name
        ),
        planned.iter().take(MAX_NAMED_DIGESTS).map(|(d, _)| *d).collect(),
    )
}

#[cfg(test)]
mod tests {
    use sqlbee_proto::v1::{IndexColumn, Plan, TableAccess, TableUse};

    use super::*;

    fn index(name: &str, columns: &[&str], unique: bool) -> IndexDefinition {
        IndexDefinition {
            name: name.into(),
            columns: columns.iter().map(|c| IndexColumn { name: c.to_string(), prefix: 0 }).collect(),
            unique,
            r#type: "BTREE".into(),
            ignored: false,
            rows_read: None,
        }
    }

    fn plan(digest: u64, last_seen: i64, accesses: &[(&str, &str)]) -> PlanRow {
        PlanRow {
            instance: "db:3306".into(),
            first_seen_unix_ms: last_seen,
            last_seen_unix_ms: last_seen,
            plan: Some(Plan {
                digest,
                schema: "app".into(),
                plan_hash: digest * 10 + last_seen as u64,
                access: accesses
                    .iter()
                    .map(|(t, k)| TableAccess { table: t.to_string(), key: k.to_string(), ..Default::default() })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn uses(digest: u64, kind: &str, tables: &[(&str, bool)]) -> DigestTables {
        DigestTables {
            digest,
            schema: "app".into(),
            kind: kind.into(),
            tables: tables
                .iter()
                .map(|(t, write)| TableUse { schema: "app".into(), table: t.to_string(), write: *write })
                .collect(),
            unknown: false,
        }
    }

    fn row(digest: u64, count: u64) -> TopDigest {
        TopDigest { digest, count, schema: "app".into(), ..Default::default() }
    }

    #[test]
    fn duplicate_redundant_and_unused_indexes_each_once_with_their_digests() {
        let definition = TableIndexes {
            schema: "app".into(),
            table: "items".into(),
            read_unix_ms: 5,
            indexes: vec![
                index("PRIMARY", &["id"], true),
                index("k_idx", &["k"], false),
                index("k_pad", &["k", "pad"], false),
                index("k_again", &["k", "pad"], false),
                index("c_idx", &["c"], false),
                index("email", &["email"], true),
            ],
            missing: false,
        };
        let stored = [StoredIndexes { instance: "db:3306".into(), table: definition }];
        let described = [
            uses(1, "SELECT", &[("items", false)]),
            uses(2, "SELECT", &[("items", false), ("orders", false)]),
            uses(3, "INSERT", &[("items", true)]),
            uses(4, "UPDATE", &[("items", true)]),
        ];
        let rows = [row(1, 100), row(2, 10), row(3, 50), row(4, 5)];
        let plans = [
            // Digest 1's old plan chose k_pad; its plan in the range, k_idx.
            plan(1, 100, &[("items", "k_pad")]),
            plan(1, 2_000, &[("i", "k_idx")]),
            plan(2, 500, &[("items", "PRIMARY"), ("orders", "")]),
        ];
        let mut tables =
            [TableTotals { schema: "app".into(), table: "items".into(), statements: 165, ..Default::default() }];
        let evidence =
            Evidence { rows: &rows, described: &described, indexes: &stored, plans: &plans, since_unix_ms: 1_000 };
        advise(&mut tables, &evidence);
        let t = &tables[0];
        assert_eq!(t.plannable_statements, 115, "the INSERT's statements choose no index");
        assert_eq!(t.planned_statements, 110, "digest 4 has no plan");
        let by_name: HashMap<&str, &TableIndex> = t.indexes.iter().map(|i| (i.name.as_str(), i)).collect();
        assert_eq!((by_name["k_idx"].digests, by_name["k_idx"].statements), (1, 100));
        assert_eq!((by_name["PRIMARY"].digests, by_name["PRIMARY"].statements), (1, 10), "the newest before the range");
        assert_eq!(by_name["k_pad"].digests, 0, "an old plan replaced in the range does not count");
        let found: Vec<(&str, &str)> = t.findings.iter().map(|f| (f.kind.as_str(), f.plan_line.as_str())).collect();
        assert_eq!(
            found,
            [
                ("duplicate_index", "index k_pad (k, pad)"),
                ("redundant_index", "index k_idx (k)"),
                ("unused_index", "index k_again (k, pad)"),
                ("unused_index", "index c_idx (c)"),
            ],
            "{:#?}",
            t.findings
        );
        assert_eq!(t.findings[1].digests, [1], "the digest that chose the redundant index is named");
        assert_eq!(t.findings[3].digests, [1, 2], "the unused verdict rests on the planned digests");
        assert!(t.findings[0].suggestion.contains("DROP INDEX `k_pad`"), "{}", t.findings[0].suggestion);
        assert!(t.findings[3].detail.contains("96%"), "{}", t.findings[3].detail);
    }

    #[test]
    fn digests_that_ask_for_one_index_make_one_finding() {
        let scan = |digest: u64, condition: &str, last_seen: i64| {
            let mut row = plan(digest, last_seen, &[("orders", "")]);
            let p = row.plan.as_mut().unwrap();
            p.access[0].r#type = "ALL".into();
            p.access[0].rows = Some(5_000);
            p.plan_json = serde_json::json!({"query_block": {"table": {"table_name": "orders", "access_type": "ALL",
                "attached_condition": condition}}})
            .to_string();
            row
        };
        let plans = [
            scan(1, "orders.email = ?", 10),
            scan(2, "orders.email = ? and orders.total > ?", 10),
            // Digest 3's newer plan uses an index: no candidate from it.
            scan(3, "orders.email = ?", 10),
            plan(3, 20, &[("orders", "by_email")]),
            scan(4, "orders.`status` = ?", 10),
        ];
        let rows = [
            TopDigest { sum_ns: 9_000_000, ..row(1, 30) },
            TopDigest { sum_ns: 1_000_000, ..row(2, 10) },
            row(3, 5),
            TopDigest { sum_ns: 500_000, ..row(4, 3) },
        ];
        let chosen = candidate_plans(&plans, &rows);
        assert_eq!(chosen.iter().map(|p| p.digest).collect::<Vec<_>>(), [1, 2, 4], "costliest first, no digest 3");
        let judged: Vec<_> =
            chosen.into_iter().map(|p| (p, rows.iter().find(|r| r.digest == p.digest).unwrap().clone())).collect();
        let mut tables = [TableTotals { schema: "app".into(), table: "orders".into(), ..Default::default() }];
        gather_candidates(&mut tables, &judged);
        let found: Vec<(&str, &[u64])> =
            tables[0].findings.iter().map(|f| (f.suggestion.as_str(), f.digests.as_slice())).collect();
        assert_eq!(
            found,
            [
                ("suggestion: ALTER TABLE `app`.`orders` ADD INDEX (`email`)", &[1][..]),
                ("suggestion: ALTER TABLE `app`.`orders` ADD INDEX (`email`, `total`)", &[2][..]),
                ("suggestion: ALTER TABLE `app`.`orders` ADD INDEX (`status`)", &[4][..]),
            ],
            "{:#?}",
            tables[0].findings
        );
        assert!(tables[0].findings.iter().all(|f| f.kind == "missing_index"));
        assert!(
            tables[0].findings[0].detail.starts_with("1 digests (30 statements, 9.0 ms"),
            "{}",
            tables[0].findings[0].detail
        );
    }

    #[test]
    fn no_plan_no_unused_verdict_and_a_gone_table_has_no_indexes() {
        let live = TableIndexes {
            schema: "app".into(),
            table: "items".into(),
            read_unix_ms: 5,
            indexes: vec![index("PRIMARY", &["id"], true), index("c_idx", &["c"], false)],
            missing: false,
        };
        let gone = TableIndexes { table: "old".into(), missing: true, read_unix_ms: 9, ..live.clone() };
        let stored =
            [StoredIndexes { instance: "a".into(), table: live }, StoredIndexes { instance: "a".into(), table: gone }];
        let described = [uses(1, "SELECT", &[("items", false)])];
        let rows = [row(1, 100)];
        let mut tables = [
            TableTotals { schema: "app".into(), table: "items".into(), ..Default::default() },
            TableTotals { schema: "app".into(), table: "old".into(), ..Default::default() },
        ];
        let evidence = Evidence { rows: &rows, described: &described, indexes: &stored, plans: &[], since_unix_ms: 0 };
        advise(&mut tables, &evidence);
        assert_eq!(tables[0].indexes.len(), 2);
        assert_eq!((tables[0].plannable_statements, tables[0].planned_statements), (100, 0));
        assert!(tables[0].findings.is_empty(), "{:#?}", tables[0].findings);
        assert!(tables[1].indexes.is_empty() && tables[1].indexes_instance.is_empty());
    }
}
