//! What a DBA can act on, from a digest's newest plan and its figures over
//! the range asked. Each finding names the plan line (the table and how
//! it is read) that causes it, and says the evidence: no finding without
//! a figure or a plan field that shows it.
//!
//! A candidate index is offered only for one table read alone, for which
//! EXPLAIN found no usable index (`possible_keys` empty, so no index
//! starts with those columns) or that it sorts after reading by one: its
//! equality conditions first, then the columns the statement sorts or
//! groups by when it has no range condition (the rows then come in order,
//! and the sort goes), else the first range condition's column. It is a
//! suggestion, marked so, with what to check before running it.
use serde_json::Value;
use sqlbee_proto::v1::{Finding, Plan, QueryStats, TableAccess};

/// Rows examined per row sent at or above which a full scan is reported.
const SCAN_RATIO: f64 = 10.0;
/// Rows examined per statement at or above which a full scan is reported.
const SCAN_ROWS: f64 = 100.0;
/// Without the server's figures: the optimizer's estimate that counts.
const SCAN_ESTIMATE: u64 = 1_000;

fn finding(kind: &str, access: &TableAccess, detail: String, suggestion: Option<String>) -> Finding {
    let check_first = if suggestion.is_some() {
        format!(
            "SHOW INDEX FROM {table}: no index may start with these columns already (then it is that index's \
             statistics to refresh: ANALYZE TABLE {table}); and the table's size, since building an index reads \
             all of it (ALGORITHM=INPLACE, LOCK=NONE keeps writes going on InnoDB)",
            table = quoted(&access.table)
        )
    } else {
        String::new()
    };
    Finding {
        kind: kind.into(),
        table: access.table.clone(),
        plan_line: format!("{} (access {}{})", access.table, access.r#type, key_shown(access)),
        detail,
        suggestion: suggestion.unwrap_or_default(),
        check_first,
        digests: Vec::new(),
    }
}

/// `suggestion: ALTER TABLE ... ADD INDEX (...)` for `columns` of `table`.
fn add_index(schema: &str, table: &str, columns: &[String]) -> String {
    let table = if schema.is_empty() { quoted(table) } else { format!("{}.{}", quoted(schema), quoted(table)) };
    let columns: Vec<String> = columns.iter().map(|c| quoted(c)).collect();
    format!("suggestion: ALTER TABLE {table} ADD INDEX ({})", columns.join(", "))
}

/// What an index for one table's conditions and sort would hold, and why.
#[derive(Debug, PartialEq, Eq)]
struct Candidate {
    columns: Vec<String>,
    /// The sort columns are in it: the rows come in order.
    sorted: bool,
    /// The range column is in it.
    ranged: bool,
}

/// The candidate for `table` from its condition in the plan, the columns
/// a plan that sorts sorts by, and `equal` (columns the access already
/// compares with constants: a `ref` key's parts).
fn candidate(json: &Value, table: &str, sorts: bool, equal: &[String]) -> Option<Candidate> {
    let condition = table_object(json, table).and_then(|t| t.get("attached_condition")).and_then(Value::as_str);
    let terms = condition.map(|c| terms(c, table)).unwrap_or_default();
    let mut columns: Vec<String> = equal.to_vec();
    let mut range = None;
    for term in &terms {
        match term {
            Term::Equal(c) if !columns.contains(c) => columns.push(c.clone()),
            Term::Range(c) if range.is_none() => range = Some(c.clone()),
            _ => {}
        }
    }
    let sort = if sorts { sort_key(json).and_then(|key| sort_columns(key, table)) } else { None };
    let mut candidate = Candidate { columns, sorted: false, ranged: false };
    match (range, sort) {
        (None, Some(sort)) => {
            for c in sort {
                if !candidate.columns.contains(&c) {
                    candidate.columns.push(c);
                }
            }
            candidate.sorted = true;
        }
        (Some(range), _) if !candidate.columns.contains(&range) => {
            candidate.columns.push(range);
            candidate.ranged = true;
        }
        _ => {}
    }
    (candidate.columns.len() > equal.len() || candidate.sorted).then_some(candidate)
}

fn key_shown(access: &TableAccess) -> String {
    if access.key.is_empty() { String::new() } else { format!(", key {}", access.key) }
}

/// The findings of `plan`, given its digest's statements and figures over
/// the range (`count` 0: none known).
pub fn findings(plan: &Plan, count: u64, stats: Option<&QueryStats>) -> Vec<Finding> {
    let mut out = Vec::new();
    if plan.plan_hash == 0 {
        return out;
    }
    let json: Value = serde_json::from_str(&plan.plan_json).unwrap_or(Value::Null);
    let per_statement = |figure: Option<u64>| (count > 0).then_some(()).and(figure).map(|v| v as f64 / count as f64);
    let examined = stats.and_then(|s| per_statement(s.rows_examined));
    let sent = stats.and_then(|s| per_statement(s.rows_sent));
    for (position, access) in plan.access.iter().enumerate() {
        if access.r#type != "ALL" {
            continue;
        }
        let evidence = match (examined, sent) {
            (Some(examined), Some(sent)) if examined >= SCAN_ROWS && examined >= SCAN_RATIO * sent.max(1.0) => {
                Some(format!("{examined:.0} rows examined per statement for {sent:.1} sent"))
            }
            (None, _) | (_, None) if access.rows.is_some_and(|r| r >= SCAN_ESTIMATE) => {
                Some(format!("the optimizer expects to read {} rows", access.rows.unwrap_or_default()))
            }
            _ => None,
        };
        let Some(evidence) = evidence else { continue };
        if position > 0 {
            out.push(finding(
                "join_without_index",
                access,
                format!("{} is joined without an index, read whole for each row before it: {evidence}", access.table),
                None,
            ));
        } else if !access.possible_keys.is_empty() {
            out.push(finding(
                "index_not_used",
                access,
                format!(
                    "{} has usable indexes ({}) but the plan reads the whole table: {evidence}",
                    access.table,
                    access.possible_keys.join(", ")
                ),
                None,
            ));
        } else {
            let found = (plan.access.len() == 1).then(|| candidate(&json, &access.table, plan.filesort, &[])).flatten();
            let why = match &found {
                Some(c) if c.sorted => " (an index on its equalities then its sort columns would also spare the sort)",
                Some(c) if c.ranged => " (an index on its equalities then its range column would read only the range)",
                _ => "",
            };
            let suggestion = found.map(|c| add_index(&plan.schema, &access.table, &c.columns));
            out.push(finding(
                "full_scan",
                access,
                format!("full scan of {}: {evidence}{why}", access.table),
                suggestion,
            ));
        }
    }
    // One table read by an index and then sorted: an index on what it
    // compares with constants, then on what it sorts by, reads the rows in
    // order and spares the sort.
    if plan.filesort
        && plan.access.len() == 1
        && let Some(access) = plan.access.first()
        && access.r#type == "ref"
        && let (Some(examined), Some(sent)) = (examined, sent)
        && examined >= SCAN_ROWS
        && examined >= SCAN_RATIO * sent.max(1.0)
        && let Some(c) = candidate(&json, &access.table, true, &access.key_parts)
        && c.sorted
    {
        out.push(finding(
            "sort_without_index",
            access,
            format!(
                "{} is read by {} and then sorted: {examined:.0} rows examined and sorted per statement for {sent:.1} sent",
                access.table, access.key
            ),
            Some(add_index(&plan.schema, &access.table, &c.columns)),
        ));
    }
    if let Some(first) = plan.access.first() {
        let in_statements =
            |n: u64| if count > 0 { format!("{n} of {count} statements") } else { format!("{n} statements") };
        let on_disk = |figure: Option<u64>| figure.filter(|n| *n > 0);
        if plan.filesort
            && let Some(n) = on_disk(stats.and_then(|s| s.filesort_on_disk.or(s.sort_merge_passes)))
        {
            out.push(finding(
                "sort_on_disk",
                first,
                format!("the filesort went to disk in {}", in_statements(n)),
                None,
            ));
        }
        if plan.temporary
            && let Some(n) = on_disk(stats.and_then(|s| s.tmp_disk_tables))
        {
            out.push(finding(
                "temporary_table_on_disk",
                first,
                format!("the temporary table went to disk in {}", in_statements(n)),
                None,
            ));
        }
    }
    out
}

pub(super) fn quoted(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// The plan's object for `table` (the first, in document order).
fn table_object<'a>(value: &'a Value, table: &str) -> Option<&'a serde_json::Map<String, Value>> {
    match value {
        Value::Object(map) => {
            if map.get("table_name").and_then(Value::as_str) == Some(table) {
                return Some(map);
            }
            map.values().find_map(|v| table_object(v, table))
        }
        Value::Array(items) => items.iter().find_map(|v| table_object(v, table)),
        _ => None,
    }
}

/// One term of a table's condition, as an index sees it.
#[derive(Debug, PartialEq, Eq)]
enum Term {
    /// `column = constant` (or `IN (constants)`).
    Equal(String),
    /// `column <, <=, >, >= constant`, `BETWEEN`, `LIKE 'prefix%'`.
    Range(String),
    /// Anything an index on the table's own columns cannot use.
    Other,
}

fn is_constant(value: &str) -> bool {
    let value = value.trim();
    value == "?"
        || value.starts_with(['\'', '"'])
        || value.chars().next().is_some_and(|c| c.is_ascii_digit() || c == '-')
}

/// `t.a` or `` `t`.`a` `` as a column of `table`.
fn column_of(expression: &str, table: &str) -> Option<String> {
    let column = expression.trim().trim_start_matches('(').trim_end_matches(')').replace('`', "");
    let (qualifier, name) = column.rsplit_once('.').unwrap_or(("", &column));
    let qualifier = qualifier.rsplit('.').next().unwrap_or_default();
    if !qualifier.is_empty() && qualifier != table {
        return None;
    }
    (!name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '$')).then(|| name.to_string())
}

/// The terms of `condition` (as the server prints one, literals redacted
/// or not), each as an index on `table` sees it.
fn terms(condition: &str, table: &str) -> Vec<Term> {
    let condition = condition.trim().trim_start_matches('(').trim_end_matches(')');
    split_and(condition)
        .into_iter()
        .map(|term| {
            let term = term.trim().trim_start_matches('(').trim_end_matches(')');
            let lower = term.to_ascii_lowercase();
            for (op, equal) in [(" = ", true), (" >= ", false), (" <= ", false), (" > ", false), (" < ", false)] {
                if let Some((left, right)) = term.split_once(op)
                    && is_constant(right)
                    && let Some(column) = column_of(left, table)
                {
                    return if equal { Term::Equal(column) } else { Term::Range(column) };
                }
            }
            if let Some(at) = lower.find(" between ")
                && let Some(column) = column_of(&term[..at], table)
            {
                return Term::Range(column);
            }
            if let Some(at) = lower.find(" in (")
                && term[at + 5..].trim_end_matches(')').split(',').all(is_constant)
                && let Some(column) = column_of(&term[..at], table)
            {
                return Term::Equal(column);
            }
            // `LIKE 'abc%'` reads a range; `LIKE '%abc'` and a redacted
            // pattern (`LIKE ?`) may not.
            if let Some(at) = lower.find(" like ")
                && let pattern = term[at + 6..].trim()
                && pattern.starts_with(['\'', '"'])
                && !pattern[1..].starts_with(['%', '_'])
                && let Some(column) = column_of(&term[..at], table)
            {
                return Term::Range(column);
            }
            Term::Other
        })
        .collect()
}

/// The plan's first `sort_key` (MariaDB's `filesort`).
fn sort_key(value: &Value) -> Option<&str> {
    match value {
        Value::Object(map) => map.get("sort_key").and_then(Value::as_str).or_else(|| map.values().find_map(sort_key)),
        Value::Array(items) => items.iter().find_map(sort_key),
        _ => None,
    }
}

/// `t.a, t.b desc`: the columns of `table`, when every part is one.
fn sort_columns(key: &str, table: &str) -> Option<Vec<String>> {
    key.split(',')
        .map(|part| {
            let part = part.trim();
            let part = part.strip_suffix(" desc").or_else(|| part.strip_suffix(" asc")).unwrap_or(part);
            column_of(part, table)
        })
        .collect::<Option<Vec<String>>>()
        .filter(|columns| !columns.is_empty())
}

/// Terms of a conjunction, at the top level of parentheses.
fn split_and(condition: &str) -> Vec<&str> {
    let lower = condition.to_ascii_lowercase();
    let mut terms = Vec::new();
    let (mut depth, mut start, mut i) = (0i32, 0, 0);
    // `x between a and b`: that `and` is the between's own.
    let mut between = false;
    let bytes = lower.as_bytes();
    while i < bytes.len() {
        match bytes[i] {
            b'(' => depth += 1,
            b')' => depth -= 1,
            b' ' if depth == 0 && lower[i..].starts_with(" between ") => between = true,
            b' ' if depth == 0 && between && lower[i..].starts_with(" and ") => between = false,
            b' ' if depth == 0 && lower[i..].starts_with(" and ") => {
                terms.push(&condition[start..i]);
                i += 5;
                start = i;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    terms.push(&condition[start..]);
    terms
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(possible: &[&str], condition: &str) -> Plan {
        Plan {
            plan_hash: 7,
            schema: "app".into(),
            access: vec![TableAccess {
                table: "orders".into(),
                r#type: "ALL".into(),
                rows: Some(2000),
                possible_keys: possible.iter().map(|k| k.to_string()).collect(),
                ..Default::default()
            }],
            plan_json: serde_json::json!({"query_block": {"table": {"table_name": "orders", "access_type": "ALL",
                "attached_condition": condition}}})
            .to_string(),
            ..Default::default()
        }
    }

    fn stats(examined: u64, sent: u64) -> QueryStats {
        QueryStats { rows_examined: Some(examined), rows_sent: Some(sent), ..Default::default() }
    }

    #[test]
    fn a_full_scan_on_equalities_gets_a_candidate_index() {
        let found = findings(&scan(&[], "orders.email = ? and orders.`status` = ?"), 10, Some(&stats(20_000, 10)));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].kind, "full_scan");
        assert_eq!(found[0].plan_line, "orders (access ALL)");
        assert!(found[0].detail.contains("2000 rows examined per statement for 1.0 sent"), "{}", found[0].detail);
        assert_eq!(found[0].suggestion, "suggestion: ALTER TABLE `app`.`orders` ADD INDEX (`email`, `status`)");
    }

    #[test]
    fn no_finding_without_evidence_and_no_index_for_other_conditions() {
        assert!(findings(&scan(&[], "orders.email = ?"), 10, Some(&stats(10, 10))).is_empty(), "cheap scans are fine");
        let range = findings(&scan(&[], "orders.total > ?"), 10, Some(&stats(20_000, 10)));
        assert_eq!(
            range[0].suggestion, "suggestion: ALTER TABLE `app`.`orders` ADD INDEX (`total`)",
            "a range gets one"
        );
        let other = findings(&scan(&[], "orders.a = other.b"), 10, Some(&stats(20_000, 10)));
        assert_eq!(other[0].suggestion, "");
        let unused = findings(&scan(&["by_email"], "orders.email = ?"), 10, Some(&stats(20_000, 10)));
        assert_eq!((unused[0].kind.as_str(), unused[0].suggestion.as_str()), ("index_not_used", ""));
        // No figures: the optimizer's estimate is the evidence.
        assert_eq!(findings(&scan(&[], "orders.email = ?"), 0, None)[0].kind, "full_scan");
    }

    #[test]
    fn ranges_and_sorts_get_their_columns_after_the_equalities() {
        let found = findings(
            &scan(&[], "orders.`status` = ? and orders.total > ? and orders.note like ?"),
            10,
            Some(&stats(20_000, 10)),
        );
        assert_eq!(found[0].suggestion, "suggestion: ALTER TABLE `app`.`orders` ADD INDEX (`status`, `total`)");
        assert!(found[0].detail.contains("then its range column"), "{}", found[0].detail);
        assert!(found[0].check_first.starts_with("SHOW INDEX FROM `orders`"), "{}", found[0].check_first);
        // A scan that sorts: equalities, then the sort, and no range.
        let mut sorted = scan(&[], "orders.`status` = ?");
        sorted.filesort = true;
        sorted.plan_json = serde_json::json!({"query_block": {"read_sorted_file": {"filesort": {
            "sort_key": "orders.created desc, orders.id",
            "table": {"table_name": "orders", "access_type": "ALL", "attached_condition": "orders.`status` = ?"}}}}})
        .to_string();
        let found = findings(&sorted, 10, Some(&stats(20_000, 10)));
        assert_eq!(
            found[0].suggestion, "suggestion: ALTER TABLE `app`.`orders` ADD INDEX (`status`, `created`, `id`)",
            "{found:#?}"
        );
        assert!(found[0].detail.contains("spare the sort"), "{}", found[0].detail);
        // Read by an index on the equality, then sorted.
        sorted.access[0].r#type = "ref".into();
        sorted.access[0].key = "by_status".into();
        sorted.access[0].key_parts = vec!["status".into()];
        sorted.access[0].possible_keys = vec!["by_status".into()];
        let found = findings(&sorted, 10, Some(&stats(20_000, 10)));
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!(found[0].kind, "sort_without_index");
        assert_eq!(found[0].suggestion, "suggestion: ALTER TABLE `app`.`orders` ADD INDEX (`status`, `created`, `id`)");
        assert!(findings(&sorted, 10, Some(&stats(50, 10))).is_empty(), "a small sort is fine");
        // A sort on another table's column, or a pattern with a leading
        // wildcard, gives nothing to index.
        assert_eq!(sort_columns("customers.name", "orders"), None);
        assert_eq!(terms("orders.note like '%x'", "orders"), [Term::Other]);
        assert_eq!(terms("orders.note like 'x%'", "orders"), [Term::Range("note".into())]);
        assert_eq!(terms("orders.id in (1,2,3)", "orders"), [Term::Equal("id".into())]);
        assert_eq!(terms("orders.total between ? and ?", "orders"), [Term::Range("total".into())]);
    }

    #[test]
    fn joins_and_spills() {
        let mut plan = scan(&[], "");
        plan.access.insert(0, TableAccess { table: "customers".into(), r#type: "const".into(), ..Default::default() });
        plan.filesort = true;
        plan.temporary = true;
        let figures = QueryStats { filesort_on_disk: Some(3), tmp_disk_tables: Some(2), ..stats(50_000, 5) };
        let kinds: Vec<String> = findings(&plan, 10, Some(&figures)).into_iter().map(|f| f.kind).collect();
        assert_eq!(kinds, ["join_without_index", "sort_on_disk", "temporary_table_on_disk"]);
        plan.plan_hash = 0;
        assert!(findings(&plan, 10, Some(&figures)).is_empty(), "no plan, no finding");
    }
}
