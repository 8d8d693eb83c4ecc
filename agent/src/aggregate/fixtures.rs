//! Statements and probe batches as the probe stage hands them on, for
//! tests of the stages downstream (aggregate, output, ship, and the
//! collector pages fed by them) without root or a server.
use std::time::SystemTime;

use sqlbee_kernel_abi::{FigureSums, wait_class};

use crate::{
    discover::ServerProcess,
    normalize::Normalizer,
    probe::{ProbeBatch, Readable, Statement},
};

use super::{Aggregator, WindowReport};

/// A client statement of `connection` that ran `sql` from `start_ns` for
/// `duration_ns`, without errors, waits or figures.
pub fn statement(connection: u64, start_ns: u64, duration_ns: u64, sql: &str) -> Statement {
    Statement {
        start_ns,
        duration_ns,
        thd: connection,
        connection_id: connection,
        tid: 1000 + connection as u32,
        command: 3,
        stmt_id: 0,
        error_code: 0,
        text_len: sql.len() as u32,
        truncated: false,
        text: sql.as_bytes().to_vec(),
        waits: [0; wait_class::COUNT],
        stats: FigureSums::default(),
        schema_hash: 0,
        account_hash: 0,
        schema: None,
        account: None,
        client: None,
        nested: false,
        source: 0,
        program_hash: 0,
        program_kind: 0,
        program: None,
        parent_start_ns: 0,
        error_ns: 0,
        error_message: None,
        text_hash: 0,
        sample: false,
        shed: false,
        values: None,
    }
}

/// `statement` with every figure set to [`figure_value`].
pub fn with_figures(mut s: Statement, scale: u64) -> Statement {
    for (i, value) in s.stats.values_mut().into_iter().enumerate() {
        *value = figure_value(i, scale);
    }
    s
}

/// What `with_figures` gives figure `i` of the list: 1 for a figure that
/// counts statements (a statement is flagged or not), `(i + 1) * scale`
/// for the others.
/// Two reads with every figure on one connection and a deadlocked update
/// on another: a window of each kind of row.
pub fn two_reads_and_a_deadlock() -> Vec<Statement> {
    let mut failed = statement(2, 5_000, 9_000, "UPDATE t SET a = 1 WHERE id = 2");
    failed.error_code = 1213;
    failed.error_message = Some("Deadlock found when trying to get lock".into());
    vec![
        with_figures(statement(1, 0, 1_000_000, "SELECT * FROM t WHERE id = 1"), 1),
        with_figures(statement(1, 2_000_000, 3_000_000, "SELECT * FROM t WHERE id = 2"), 1),
        failed,
    ]
}

pub fn figure_value(i: usize, scale: u64) -> u64 {
    match sqlbee_figures::FIGURES[i].unit {
        sqlbee_figures::Unit::Statements => 1,
        _ => (i as u64 + 1) * scale,
    }
}

/// One server's statements as one probe batch.
pub fn probe_batch(instance: &str, readable: Readable, statements: Vec<Statement>) -> ProbeBatch {
    ProbeBatch {
        binary: Default::default(),
        readable,
        programs: Default::default(),
        server: ServerProcess {
            pid: 1,
            start_ticks: 1,
            start_unix_ms: 1,
            comm: "mariadbd".into(),
            binary: "/usr/sbin/mariadbd".into(),
            instance: instance.into(),
            container: None,
        },
        statements,
        long_waits: Vec::new(),
        applied: Vec::new(),
        counters: None,
        kernel: Vec::new(),
        forgotten: Vec::new(),
        cost: None,
        detached: false,
        stopped: None,
    }
}

/// The window the aggregator reports for these statements of one server:
/// ten seconds ending now.
pub fn report(instance: &str, readable: Readable, statements: Vec<Statement>) -> WindowReport {
    let start = SystemTime::now() - std::time::Duration::from_secs(10);
    let mut aggregator = Aggregator::new(Normalizer::new(100), 100, start);
    aggregator.ingest(probe_batch(instance, readable, statements));
    let mut reports = aggregator.flush(SystemTime::now());
    assert_eq!(reports.len(), 1, "one server, one report");
    reports.remove(0)
}

/// Every figure readable.
pub fn all_figures() -> Readable {
    Readable(u32::MAX)
}
