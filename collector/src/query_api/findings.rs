//! What a DBA can act on, from a digest's newest plan and its figures over
//! the range asked. Each finding names the plan line (the table and how
//! it is read) that causes it, and says the evidence: no finding without
//! a figure or a plan field that shows it.
//!
//! A candidate index is offered only for a full scan of one table whose
//! condition is equalities on its own columns and for which EXPLAIN found
//! no usable index (`possible_keys` empty): then no index on those
//! columns exists. It is a suggestion, marked so.
use serde_json::Value;
use sqlbee_proto::v1::{Finding, Plan, QueryStats, TableAccess};

/// Rows examined per row sent at or above which a full scan is reported.
const SCAN_RATIO: f64 = 10.0;
/// Rows examined per statement at or above which a full scan is reported.
const SCAN_ROWS: f64 = 100.0;
/// Without the server's figures: the optimizer's estimate that counts.
const SCAN_ESTIMATE: u64 = 1_000;

fn finding(kind: &str, access: &TableAccess, detail: String, suggestion: Option<String>) -> Finding {
    Finding {
        kind: kind.into(),
        table: access.table.clone(),
        plan_line: format!("{} (access {}{})", access.table, access.r#type, key_shown(access)),
        detail,
        suggestion: suggestion.unwrap_or_default(),
    }
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
            let columns = table_object(&json, &access.table)
                .and_then(|t| t.get("attached_condition"))
                .and_then(Value::as_str)
                .and_then(|condition| equality_columns(condition, &access.table))
                .filter(|_| plan.access.len() == 1);
            let suggestion = columns.map(|columns| {
                let table = if plan.schema.is_empty() {
                    quoted(&access.table)
                } else {
                    format!("{}.{}", quoted(&plan.schema), quoted(&access.table))
                };
                let columns: Vec<String> = columns.iter().map(|c| quoted(c)).collect();
                format!("suggestion: ALTER TABLE {table} ADD INDEX ({})", columns.join(", "))
            });
            out.push(finding("full_scan", access, format!("full scan of {}: {evidence}", access.table), suggestion));
        }
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

fn quoted(name: &str) -> String {
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

/// `t.a = ? and t.b = ?` (as the server prints a condition, literals
/// redacted or not): the columns, when every term is an equality of one
/// of `table`'s columns with a constant.
fn equality_columns(condition: &str, table: &str) -> Option<Vec<String>> {
    let condition = condition.trim().trim_start_matches('(').trim_end_matches(')');
    let mut columns = Vec::new();
    for term in split_and(condition) {
        let term = term.trim().trim_start_matches('(').trim_end_matches(')');
        let (left, right) = term.split_once(" = ")?;
        let right = right.trim();
        let constant = right == "?"
            || right.starts_with(['\'', '"'])
            || right.chars().next().is_some_and(|c| c.is_ascii_digit() || c == '-');
        if !constant {
            return None;
        }
        let column = left.trim().replace('`', "");
        let (qualifier, name) = column.rsplit_once('.').unwrap_or(("", &column));
        let qualifier = qualifier.rsplit('.').next().unwrap_or_default();
        if !qualifier.is_empty() && qualifier != table {
            return None;
        }
        if name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            return None;
        }
        if !columns.iter().any(|c| c == name) {
            columns.push(name.to_string());
        }
    }
    (!columns.is_empty()).then_some(columns)
}

/// Terms of a conjunction, at the top level of parentheses.
fn split_and(condition: &str) -> Vec<&str> {
    let lower = condition.to_ascii_lowercase();
    let mut terms = Vec::new();
    let (mut depth, mut start, mut i) = (0i32, 0, 0);
    let bytes = lower.as_bytes();
    while i < bytes.len() {
        match bytes[i] {
            b'(' => depth += 1,
            b')' => depth -= 1,
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
        assert_eq!((range.len(), range[0].suggestion.as_str()), (1, ""), "only equalities get an index");
        let other = findings(&scan(&[], "orders.a = other.b"), 10, Some(&stats(20_000, 10)));
        assert_eq!(other[0].suggestion, "");
        let unused = findings(&scan(&["by_email"], "orders.email = ?"), 10, Some(&stats(20_000, 10)));
        assert_eq!((unused[0].kind.as_str(), unused[0].suggestion.as_str()), ("index_not_used", ""));
        // No figures: the optimizer's estimate is the evidence.
        assert_eq!(findings(&scan(&[], "orders.email = ?"), 0, None)[0].kind, "full_scan");
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
