//! What the agent keeps of one `EXPLAIN FORMAT=JSON` answer: the tables
//! in join order with how each is read, a hash over that shape, and the
//! JSON itself with every literal the server quoted back taken out.
//!
//! MariaDB and MySQL name the same things differently (MariaDB nests
//! `filesort` and `temporary_table` objects, MySQL sets `using_filesort`
//! and `using_temporary_table`), so the walk looks for both and for
//! nothing else: a key it does not know is carried, never interpreted.
use serde_json::Value;

/// How one table is read, as EXPLAIN names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableAccess {
    pub table: String,
    /// `ALL`, `index`, `range`, `ref`, `eq_ref`, `const`, ...
    pub access_type: String,
    /// The index used; empty for none.
    pub key: String,
    pub key_parts: Vec<String>,
    /// Indexes the optimizer found usable.
    pub possible_keys: Vec<String>,
    /// Rows the optimizer expects to read from it (an estimate; not part
    /// of the hash).
    pub rows: Option<u64>,
}

/// One plan of one statement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Over the shape only: tables in join order, access type, key, key
    /// parts, and whether a filesort or a temporary table is used.
    /// Estimates and costs are left out, so a plan that stays the same
    /// keeps its hash as the table grows.
    pub hash: u64,
    pub access: Vec<TableAccess>,
    pub filesort: bool,
    pub temporary: bool,
    /// The answer as JSON text, compact, literals replaced (see `from_explain`).
    pub json: String,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("EXPLAIN answered something that is not JSON: {0}")]
    NotJson(#[from] serde_json::Error),
}

/// Keys whose string values name the plan's parts (tables, indexes,
/// columns, access types): identifiers, never literals. Every other string
/// value (conditions, sort keys, messages) goes through the redactor.
const NAMES: [&str; 8] =
    ["table_name", "access_type", "key", "possible_keys", "used_key_parts", "key_length", "ref", "select_type"];

/// The plan in `json`; `redact` is applied to every string value that is
/// not a name (`attached_condition`, `sort_key`, ...), so a constant of
/// the statement is never kept unless `redact` keeps it.
pub fn from_explain(json: &str, redact: &dyn Fn(&str) -> String) -> Result<Plan, PlanError> {
    let mut value: Value = serde_json::from_str(json)?;
    let mut shape = Shape::default();
    shape.walk(&value);
    redact_strings(&mut value, None, redact);
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for access in &shape.access {
        for part in [&access.table, &access.access_type, &access.key] {
            hasher.update(part.as_bytes());
            hasher.update(&[0]);
        }
        for part in &access.key_parts {
            hasher.update(part.as_bytes());
            hasher.update(&[1]);
        }
        hasher.update(&[2]);
    }
    hasher.update(&[shape.filesort as u8, shape.temporary as u8]);
    Ok(Plan {
        // 0 stays free for "no plan".
        hash: hasher.digest().max(1),
        access: shape.access,
        filesort: shape.filesort,
        temporary: shape.temporary,
        json: value.to_string(),
    })
}

#[derive(Default)]
struct Shape {
    access: Vec<TableAccess>,
    filesort: bool,
    temporary: bool,
}

impl Shape {
    /// Depth first in document order, which is the join order in both
    /// servers' formats.
    fn walk(&mut self, value: &Value) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(table)) = map.get("table_name") {
                    let text = |key: &str| map.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
                    let list = |key: &str| -> Vec<String> {
                        map.get(key)
                            .and_then(Value::as_array)
                            .map(|items| items.iter().filter_map(Value::as_str).map(str::to_string).collect())
                            .unwrap_or_default()
                    };
                    self.access.push(TableAccess {
                        table: table.clone(),
                        access_type: text("access_type"),
                        key: text("key"),
                        key_parts: list("used_key_parts"),
                        possible_keys: list("possible_keys"),
                        rows: map.get("rows").or_else(|| map.get("rows_examined_per_scan")).and_then(Value::as_u64),
                    });
                }
                for (key, inner) in map {
                    match (key.as_str(), inner) {
                        ("filesort", Value::Object(_)) | ("using_filesort", Value::Bool(true)) => self.filesort = true,
                        ("temporary_table", Value::Object(_)) | ("using_temporary_table", Value::Bool(true)) => {
                            self.temporary = true
                        }
                        _ => {}
                    }
                    self.walk(inner);
                }
            }
            Value::Array(items) => items.iter().for_each(|item| self.walk(item)),
            _ => {}
        }
    }
}

fn redact_strings(value: &mut Value, key: Option<&str>, redact: &dyn Fn(&str) -> String) {
    match value {
        Value::String(text) if !key.is_some_and(|k| NAMES.contains(&k)) => *text = redact(text),
        Value::Array(items) => items.iter_mut().for_each(|item| redact_strings(item, key, redact)),
        Value::Object(map) => map.iter_mut().for_each(|(k, inner)| redact_strings(inner, Some(k), redact)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCAN: &str = r#"{"query_block": {"select_id": 1, "cost": 0.25,
        "nested_loop": [{"table": {"table_name": "orders", "access_type": "ALL", "rows": 2000, "filtered": 100,
        "attached_condition": "orders.email = 'ann@example.com' and orders.total > 4111"}},
        {"table": {"table_name": "items", "access_type": "ref", "possible_keys": ["o"], "key": "o",
        "key_length": "4", "used_key_parts": ["order_id"], "ref": ["app.orders.id"], "rows": 3}}],
        "filesort": {"sort_key": "orders.created", "temporary_table": {}}}}"#;

    fn redacted(text: &str) -> String {
        crate::normalize::redact::statement(text.as_bytes())
    }

    #[test]
    fn tables_in_join_order_with_keys() {
        let plan = from_explain(SCAN, &redacted).unwrap();
        let tables: Vec<(&str, &str, &str)> =
            plan.access.iter().map(|a| (a.table.as_str(), a.access_type.as_str(), a.key.as_str())).collect();
        assert_eq!(tables, [("orders", "ALL", ""), ("items", "ref", "o")]);
        assert_eq!(plan.access[1].key_parts, ["order_id"]);
        assert_eq!(plan.access[1].possible_keys, ["o"]);
        assert_eq!(plan.access[0].rows, Some(2000));
        assert!(plan.filesort && plan.temporary);
    }

    #[test]
    fn conditions_lose_their_constants_and_names_stay() {
        let plan = from_explain(SCAN, &redacted).unwrap();
        assert!(!plan.json.contains("ann@example.com") && !plan.json.contains("4111"), "{}", plan.json);
        assert!(plan.json.contains("orders.email = ? and orders.total > ?"), "{}", plan.json);
        assert!(plan.json.contains("app.orders.id") && plan.json.contains("order_id"), "{}", plan.json);
        let raw = from_explain(SCAN, &|s: &str| s.to_string()).unwrap();
        assert!(raw.json.contains("ann@example.com"));
        assert_eq!(raw.hash, plan.hash, "redaction does not change the shape");
    }

    #[test]
    fn estimates_do_not_change_the_hash_and_keys_do() {
        let base = from_explain(SCAN, &redacted).unwrap().hash;
        let grown = from_explain(&SCAN.replace("2000", "90000").replace("0.25", "7.5"), &redacted).unwrap();
        assert_eq!(grown.hash, base);
        let indexed = from_explain(
            &SCAN.replace(
                r#""access_type": "ALL""#,
                r#""access_type": "ref", "key": "email", "used_key_parts": ["email"]"#,
            ),
            &redacted,
        )
        .unwrap();
        assert_ne!(indexed.hash, base);
        let unsorted = from_explain(&SCAN.replace("filesort", "other"), &redacted).unwrap();
        assert_ne!(unsorted.hash, base);
    }

    #[test]
    fn mysql_flags_count_too() {
        let mysql = r#"{"query_block": {"ordering_operation": {"using_filesort": true, "using_temporary_table": true,
            "table": {"table_name": "t", "access_type": "ALL", "rows_examined_per_scan": 10}}}}"#;
        let plan = from_explain(mysql, &redacted).unwrap();
        assert!(plan.filesort && plan.temporary);
        assert_eq!(plan.access[0].rows, Some(10));
        assert!(from_explain("not json", &redacted).is_err());
    }
}
