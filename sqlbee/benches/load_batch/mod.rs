//! The batches the collector benchmarks send: windows of one simulated
//! agent, each with `digests` digest rows carrying what a current agent
//! sends (histogram, schema, the server's figures, accounts, a sample).
use sqlbee_proto::v1::{
    AccountCount, Bucket, CommandCount, DigestStats, Histogram, InstanceWindow, QueryStats, ServerInstance,
};
use sqlbee_vocabulary::histogram::Histogram as AgentHistogram;

/// One window of `agent` ending at `end_ms`; `seed` varies the counts.
pub fn window(agent: u64, end_ms: i64, window_ms: i64, digests: u64, seed: &mut u64) -> InstanceWindow {
    let mut rows = Vec::new();
    let mut statements = 0;
    for d in 0..digests {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        let count = 1 + *seed % 500;
        let base = 20_000 + (d * 7_919) % 5_000_000;
        let mut h = AgentHistogram::default();
        let mut sum = 0;
        for i in 0..count.min(64) {
            let ns = base + i * 1_000;
            h.record(ns);
            sum += ns;
        }
        // Scale to `count` statements while keeping the histogram exact.
        let sampled = count.min(64);
        let mut buckets: Vec<Bucket> = h.buckets().map(|(index, c)| Bucket { index: index as u32, count: c }).collect();
        if let Some(last) = buckets.last_mut() {
            last.count += count - sampled;
        }
        let max = base + (sampled - 1) * 1_000;
        let top = sqlbee_vocabulary::histogram::bucket_high(buckets.last().unwrap().index as usize);
        statements += count;
        let text = format!("SELECT `c{d}` FROM `t{}` WHERE `id` = ?", d % 7);
        rows.push(DigestStats {
            digest: sqlbee_vocabulary::digest_id::of(&text),
            digest_text: text,
            count,
            errors: 0,
            sum_ns: sum + (count - sampled) * top.min(max),
            min_ns: base,
            max_ns: max.max(top.min(max)),
            histogram: Some(Histogram { scheme: 1, buckets }),
            sample: format!("SELECT c{d} FROM t{} WHERE id = 42", d % 7),
            truncated: 0,
            error_codes: vec![],
            waits: vec![],
            estimated_count: 0,
            // What a current agent sends with every row: the schema, the
            // server's figures and the accounts.
            schema: format!("app{}", d % 3),
            stats: Some(figures(d, count, sum)),
            accounts: vec![
                AccountCount {
                    user: "app".into(),
                    host: format!("10.0.{}.{}", agent % 200, d % 4),
                    count: count - count / 4,
                },
                AccountCount { user: "report".into(), host: "10.1.0.9".into(), count: count / 4 },
            ],
            ..Default::default()
        });
    }
    InstanceWindow {
        instance: Some(ServerInstance {
            name: format!("db{agent}:3306"),
            pid: 1000 + agent as u32,
            start_time_unix_ms: 1,
            ..Default::default()
        }),
        window_start_unix_ms: end_ms - window_ms,
        window_end_unix_ms: end_ms,
        digests: rows,
        commands: vec![CommandCount { command: "COM_QUERY".into(), count: statements }],
        statements,
        events: statements,
        ..Default::default()
    }
}

/// A digest's figures as a current agent sends them: every one known (0
/// unless set here), so a figure added later is carried too.
fn figures(d: u64, count: u64, sum: u64) -> QueryStats {
    let mut stats = QueryStats::default();
    for value in stats.values_mut() {
        *value = Some(0);
    }
    QueryStats {
        rows_sent: Some(count),
        rows_examined: Some(count * (d % 50 + 1)),
        lock_ns: Some(count * 2_000),
        cpu_ns: Some(sum / 2),
        cpu_statements: Some(count),
        no_index_used: Some(if d % 9 == 0 { count } else { 0 }),
        tmp_tables: Some(d % 3),
        tmp_disk_tables: Some(d % 5 / 4),
        select_scan: Some(if d % 9 == 0 { count } else { 0 }),
        filesort: Some(d % 2),
        ..stats
    }
}
