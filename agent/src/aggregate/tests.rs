//! The aggregator without a server: statements as the probe stage hands
//! them on become one row per digest, with exact counts and sums.
use std::time::SystemTime;

use sqlbee_vocabulary::digest_id;

use super::{
    Aggregator, OVERFLOW_DIGEST,
    fixtures::{all_figures, figure_value, probe_batch, report, statement, with_figures},
};
use crate::normalize::Normalizer;

const MS: u64 = 1_000_000;

fn digest_of(sql: &str) -> u64 {
    Normalizer::new(1).normalize(sql.as_bytes()).id
}

#[test]
fn statements_of_one_digest_make_one_row_with_exact_sums() {
    let mut failed = statement(2, 40 * MS, 3 * MS, "INSERT INTO t VALUES (1)");
    failed.error_code = 1062;
    let report = report(
        "db:3306",
        all_figures(),
        vec![
            statement(1, 0, MS, "SELECT * FROM t WHERE id = 1"),
            statement(1, 10 * MS, 2 * MS, "SELECT * FROM t WHERE id = 2"),
            statement(3, 20 * MS, 5 * MS, "select * from t where id = 3"),
            failed,
        ],
    );
    assert_eq!(report.instance, "db:3306");
    assert_eq!(report.digests.len(), 2, "{:?}", report.digests);
    let select = report.digests.iter().find(|d| d.digest == digest_of("SELECT * FROM t WHERE id = 9")).unwrap();
    assert_eq!((select.count, select.errors), (3, 0));
    assert_eq!((select.sum_ns, select.min_ns, select.max_ns), (8 * MS, MS, 5 * MS));
    assert_eq!(select.histogram.buckets().map(|(_, n)| n).sum::<u64>(), 3);
    assert_eq!(select.digest, digest_id::of(&select.digest_text), "the id is the hash of the text");
    let insert = report.digests.iter().find(|d| d.digest == digest_of("INSERT INTO t VALUES (2)")).unwrap();
    assert_eq!((insert.count, insert.errors), (1, 1));
    assert_eq!(insert.error_codes.get(&1062), Some(&1));
    // Rows come most total time first.
    assert_eq!(report.digests[0].digest, select.digest);
}

#[test]
fn every_figure_is_summed_per_digest() {
    let report = report(
        "db:3306",
        all_figures(),
        vec![
            with_figures(statement(1, 0, MS, "SELECT a FROM t"), 1),
            with_figures(statement(2, 0, MS, "SELECT a FROM t"), 10),
            statement(3, 0, MS, "SELECT b FROM t"),
        ],
    );
    let a = report.digests.iter().find(|d| d.digest == digest_of("SELECT a FROM t")).unwrap();
    for (i, (figure, value)) in sqlbee_figures::FIGURES.iter().zip(a.stats.values()).enumerate() {
        assert_eq!(value, figure_value(i, 1) + figure_value(i, 10), "{}", figure.name);
    }
    let b = report.digests.iter().find(|d| d.digest == digest_of("SELECT b FROM t")).unwrap();
    assert!(b.stats.values().iter().all(|v| *v == 0), "{:?}", b.stats);
}

#[test]
fn digests_past_the_limit_go_to_the_overflow_row_and_stay_counted() {
    let mut aggregator = Aggregator::new(Normalizer::new(100), 2, SystemTime::now());
    let texts = ["SELECT a FROM t", "SELECT b FROM t", "SELECT c FROM t", "SELECT d FROM t"];
    let statements = texts.iter().enumerate().map(|(i, t)| statement(i as u64, 0, MS, t)).collect();
    aggregator.ingest(probe_batch("db:3306", all_figures(), statements));
    let report = aggregator.flush(SystemTime::now()).remove(0);
    assert_eq!(report.digests.len(), 3, "two digests and the overflow row");
    let overflow = report.digests.iter().find(|d| d.digest == OVERFLOW_DIGEST).unwrap();
    assert_eq!((overflow.count, &*overflow.digest_text), (2, digest_id::OVERFLOW_TEXT));
    assert_eq!(report.summary.overflow_statements, 2);
    assert_eq!(report.digests.iter().map(|d| d.count).sum::<u64>(), 4, "every statement in a row");
}
