//! Per-table totals from digest rows and what each digest touches. A
//! statement counts in full for every table its digest reads or writes: a
//! join of three tables adds its statements and time to all three, so the
//! tables' totals add up to more than the statements ran. A replica's
//! rows events count for the table they change, beside its statements.
//! Pure.
use std::collections::{BTreeMap, HashMap};

use sqlbee_proto::v1::{AppliedTable, TableDigest, TableTotals, TablesResponse, TopDigest};

use crate::store::DigestTables;

/// Digests listed per table.
const DIGESTS_PER_TABLE: usize = 10;

/// `applied`: rows events merged over the range, one per table and kind
/// (`replication::Merged`).
pub fn totals(
    rows: &[TopDigest],
    described: &[DigestTables],
    applied: &[AppliedTable],
    limit: usize,
) -> TablesResponse {
    let by_key: HashMap<(u64, &str), &DigestTables> =
        described.iter().map(|d| ((d.digest, d.schema.as_str()), d)).collect();
    let mut out = TablesResponse::default();
    let mut tables: BTreeMap<(String, String), TableTotals> = BTreeMap::new();
    for row in rows {
        let Some(description) = by_key.get(&(row.digest, row.schema.as_str())) else {
            out.undescribed_statements += row.count;
            continue;
        };
        if description.unknown {
            out.unknown_statements += row.count;
            continue;
        }
        for table in &description.tables {
            let totals = tables.entry((table.schema.clone(), table.table.clone())).or_insert_with(|| TableTotals {
                schema: table.schema.clone(),
                table: table.table.clone(),
                ..Default::default()
            });
            totals.statements += row.count;
            totals.sum_ns = totals.sum_ns.saturating_add(row.sum_ns);
            if let Some(examined) = row.stats.as_ref().and_then(|s| s.rows_examined) {
                totals.rows_examined = Some(totals.rows_examined.unwrap_or(0).saturating_add(examined));
            }
            if table.write {
                totals.writing_statements += row.count;
            } else {
                totals.reading_statements += row.count;
            }
            totals.digest_count += 1;
            totals.digests.push(TableDigest {
                digest: row.digest,
                schema: row.schema.clone(),
                digest_text: row.digest_text.clone(),
                count: row.count,
                sum_ns: row.sum_ns,
                write: table.write,
            });
        }
    }
    for a in applied {
        let totals = tables.entry((a.schema.clone(), a.table.clone())).or_insert_with(|| TableTotals {
            schema: a.schema.clone(),
            table: a.table.clone(),
            ..Default::default()
        });
        totals.apply_ns = totals.apply_ns.saturating_add(a.apply_ns);
        totals.applied.push(a.clone());
    }
    let mut tables: Vec<TableTotals> = tables.into_values().collect();
    for t in &mut tables {
        t.digests.sort_by(|a, b| b.sum_ns.cmp(&a.sum_ns).then(a.digest.cmp(&b.digest)));
        t.digests.truncate(DIGESTS_PER_TABLE);
        t.applied.sort_by(|a, b| b.apply_ns.cmp(&a.apply_ns).then(a.kind.cmp(&b.kind)));
    }
    let total = |t: &TableTotals| t.sum_ns.saturating_add(t.apply_ns);
    tables.sort_by(|a, b| total(b).cmp(&total(a)).then((&a.schema, &a.table).cmp(&(&b.schema, &b.table))));
    tables.truncate(limit);
    out.tables = tables;
    out
}

#[cfg(test)]
mod tests {
    use sqlbee_proto::v1::TableUse;

    use super::*;

    fn row(digest: u64, count: u64, sum_ns: u64) -> TopDigest {
        TopDigest { digest, count, sum_ns, schema: "app".into(), ..Default::default() }
    }

    fn uses(digest: u64, tables: &[(&str, bool)]) -> DigestTables {
        DigestTables {
            digest,
            schema: "app".into(),
            kind: "SELECT".into(),
            tables: tables
                .iter()
                .map(|(t, write)| TableUse { schema: "app".into(), table: t.to_string(), write: *write })
                .collect(),
            unknown: false,
        }
    }

    #[test]
    fn each_table_gets_every_statement_that_touches_it() {
        let rows = [row(1, 10, 1000), row(2, 5, 3000), row(3, 7, 10), row(4, 2, 5)];
        let described = [
            uses(1, &[("orders", false), ("customers", false)]),
            uses(2, &[("orders", true)]),
            DigestTables { digest: 3, schema: "app".into(), unknown: true, ..Default::default() },
        ];
        let answer = totals(&rows, &described, &[], 100);
        let orders = &answer.tables[0];
        assert_eq!((orders.table.as_str(), orders.statements, orders.sum_ns), ("orders", 15, 4000));
        assert_eq!((orders.writing_statements, orders.reading_statements, orders.digest_count), (5, 10, 2));
        assert_eq!(orders.digests.iter().map(|d| d.digest).collect::<Vec<_>>(), [2, 1], "by time");
        assert_eq!((answer.tables[1].table.as_str(), answer.tables[1].statements), ("customers", 10));
        assert_eq!((answer.unknown_statements, answer.undescribed_statements), (7, 2));
        assert_eq!(totals(&rows, &described, &[], 1).tables.len(), 1);
    }

    #[test]
    fn a_replica_s_rows_events_count_for_their_table_beside_its_statements() {
        let rows = [row(1, 10, 1000)];
        let described = [uses(1, &[("orders", false)])];
        let applied = |table: &str, kind: &str, apply_ns| AppliedTable {
            schema: "app".into(),
            table: table.into(),
            kind: kind.into(),
            events: 2,
            apply_ns,
            rows: Some(7),
            latency: None,
        };
        let answer = totals(
            &rows,
            &described,
            &[
                applied("orders", "write_rows", 300),
                applied("orders", "update_rows", 500),
                applied("audit", "write_rows", 5000),
            ],
            100,
        );
        // Applied alone, audit outranks orders: 5,000 ns against 1,800.
        assert_eq!(answer.tables.iter().map(|t| t.table.as_str()).collect::<Vec<_>>(), ["audit", "orders"]);
        let orders = &answer.tables[1];
        assert_eq!((orders.statements, orders.sum_ns, orders.apply_ns), (10, 1000, 800));
        assert_eq!(orders.applied.iter().map(|a| a.kind.as_str()).collect::<Vec<_>>(), ["update_rows", "write_rows"]);
        assert_eq!((answer.tables[0].statements, answer.tables[0].digest_count), (0, 0));
    }
}
