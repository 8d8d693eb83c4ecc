//! What changed before a digest regressed: the `change` events (statements
//! agents saw change a server, and server starts) between the two ranges a
//! comparison looked at, that touched a table the digest reads or writes,
//! or changed the whole instance (a global setting, a restart). Named in
//! the regression's evidence and listed whole beside it; a digest that did
//! not regress is blamed on nothing.
use std::collections::HashMap;

use sqlbee_proto::v1::{DigestChange, Event};
use sqlbee_vocabulary::clock;

use crate::store::{DigestTables, EventsQuery, Store, StoreError};

/// Changes read per comparison at most: the newest.
const MAX_READ: usize = 1_000;
/// Changes named in one evidence at most (the rest are counted).
const MAX_NAMED: usize = 5;
/// Changes listed whole per digest at most.
const MAX_LISTED: usize = 20;

/// Names the changes in `between` behind each regressed digest of
/// `digests` (compared on `instance`, or on every instance).
pub fn name_changes(
    store: &dyn Store,
    instance: Option<&str>,
    between: (i64, i64),
    digests: &mut [DigestChange],
) -> Result<(), StoreError> {
    if between.0 >= between.1 || !digests.iter().any(|d| d.status == "regressed") {
        return Ok(());
    }
    let changes = store.events(&EventsQuery {
        instance: instance.map(str::to_string),
        kind: Some(sqlbee_proto::query_client::CHANGE_EVENT_KIND.into()),
        since_unix_ms: between.0,
        until_unix_ms: between.1,
        open_only: false,
        limit: MAX_READ,
    })?;
    let mut changes: Vec<Event> = changes.into_iter().filter(|e| e.opened_unix_ms >= between.0).collect();
    if changes.is_empty() {
        return Ok(());
    }
    changes.sort_by_key(|e| (e.opened_unix_ms, e.id));
    let regressed: Vec<u64> = digests.iter().filter(|d| d.status == "regressed").map(|d| d.digest).collect();
    let described = store.digest_tables(&regressed)?;
    let tables: HashMap<(u64, &str), &DigestTables> =
        described.iter().map(|d| ((d.digest, d.schema.as_str()), d)).collect();
    for d in digests.iter_mut().filter(|d| d.status == "regressed") {
        let own = tables.get(&(d.digest, d.schema.as_str())).copied();
        let behind: Vec<&Event> = changes.iter().filter(|e| touches(e, own, &d.schema)).collect();
        if behind.is_empty() {
            continue;
        }
        let named: Vec<String> = behind.iter().take(MAX_NAMED).map(|e| describe(e)).collect();
        d.evidence.push_str(&format!("; after {}", named.join("; ")));
        if behind.len() > MAX_NAMED {
            d.evidence.push_str(&format!("; and {} more changes", behind.len() - MAX_NAMED));
        }
        d.changes = behind.into_iter().take(MAX_LISTED).cloned().collect();
    }
    Ok(())
}

/// `ALTER TABLE app.items, index k_idx by app@10.0.0.5 (migrate.py) at
/// 2026-12-02T12:03:11.000Z`.
fn describe(e: &Event) -> String {
    format!("{} at {}", e.evidence, clock::rfc3339(clock::from_unix_ms(e.opened_unix_ms)))
}

/// Whether `change` may explain a digest with `tables` (None: not
/// described) that ran in `schema`: it names one of its tables, or it
/// changed the whole server.
fn touches(change: &Event, tables: Option<&DigestTables>, schema: &str) -> bool {
    let tables = tables.map_or(&[][..], |t| t.tables.as_slice());
    touches_tables(
        change,
        tables.iter().map(|t| (if t.schema.is_empty() { schema } else { t.schema.as_str() }, t.table.as_str())),
    )
}

/// Whether `change` names one of `tables` (schema, table; an empty schema
/// matches any), or changed the whole server (a setting, a start or stop).
pub fn touches_tables<'a>(change: &Event, mut tables: impl Iterator<Item = (&'a str, &'a str)>) -> bool {
    let Some(c) = &change.change else { return false };
    if matches!(c.kind.as_str(), "setting" | "server") {
        return true;
    }
    tables.any(|(schema, table)| {
        let qualified = format!("{schema}.{table}");
        c.objects.iter().any(|o| *o == qualified || (schema.is_empty() && o.ends_with(&format!(".{table}"))))
    })
}

#[cfg(test)]
mod tests {
    use sqlbee_proto::v1::{Change, TableUse};

    use super::*;

    fn change(kind: &str, objects: &[&str]) -> Event {
        Event {
            change: Some(Change {
                kind: kind.into(),
                objects: objects.iter().map(|o| o.to_string()).collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_change_explains_the_digests_of_its_tables_and_a_setting_every_digest() {
        let items = DigestTables {
            digest: 1,
            schema: "app".into(),
            kind: "SELECT".into(),
            tables: vec![TableUse { schema: String::new(), table: "items".into(), write: false }],
            unknown: false,
        };
        let alter = change("schema", &["app.items", "index k_idx"]);
        assert!(touches(&alter, Some(&items), "app"));
        assert!(!touches(&alter, Some(&items), "shop"), "another schema's items");
        assert!(!touches(&change("schema", &["app.orders"]), Some(&items), "app"));
        assert!(!touches(&alter, None, "app"), "an undescribed digest is blamed on no table");
        assert!(touches(&change("setting", &["long_query_time"]), None, "app"));
        assert!(touches(&change("server", &["10.11.19-MariaDB"]), Some(&items), "app"));
        assert!(!touches(&Event::default(), Some(&items), "app"));
    }
}
