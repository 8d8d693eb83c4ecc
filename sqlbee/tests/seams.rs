//! Every web UI page rendered from a store filled in process, through the
//! path statements take from the agent: statements -> aggregator -> wire ->
//! validation -> SQLite -> Query service -> page. No browser and no root:
//! the numbers on the page are checked against the statements fed in (the
//! browser tests in `tests/web_ui.rs` check the pages as loaded). It sits
//! with the binary's tests because it crosses from the agent's crate into
//! the collector's.
use std::{collections::HashMap, sync::Arc};

use sqlbee_proto::v1::{AgentIdentity, Batch};
use sqlbee_vocabulary::clock::now_unix_ms;

use sqlbee_agent::{
    aggregate::fixtures::{all_figures, figure_value, report, statement, two_reads_and_a_deadlock, with_figures},
    ship,
};
use sqlbee_collector::{
    annotate::AnnotateService,
    http::{Ui, page_for_test},
    query_api::QueryService,
    store::{SqliteStore, Store, content_hash},
    validate,
};

const MS: u64 = 1_000_000;

/// The `data-` attributes of each row of the table with id `table`.
fn rows(page: &str, table: &str) -> Vec<HashMap<String, String>> {
    let start = page.find(&format!("id=\"{table}\"")).unwrap_or_else(|| panic!("no table {table} in {page}"));
    let end = start + page[start..].find("</table>").unwrap();
    page[start..end]
        .split("<tr ")
        .skip(1)
        .map(|tr| {
            let head = &tr[..tr.find('>').unwrap()];
            head.split("\" ")
                .filter_map(|part| part.trim().split_once("=\""))
                .map(|(name, value)| (name.to_string(), value.trim_end_matches('"').to_string()))
                .collect()
        })
        .collect()
}

struct Fixture {
    ui: Ui,
    store: Arc<dyn Store>,
    dir: std::path::PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

/// A store holding one agent's window of `statements` on `db:3306`.
fn filled(name: &str, statements: Vec<sqlbee_agent::probe::Statement>) -> Fixture {
    let dir = std::env::temp_dir().join(format!("sqlbee-pages-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.join("store.db")).unwrap());
    let window = ship::instance_window(&report("db:3306", all_figures(), statements), None);
    let batch = Batch {
        agent: Some(AgentIdentity { host: "h".into(), agent_id: "agent-1".into(), version: "v".into() }),
        sequence: 1,
        windows: vec![window],
        ..Default::default()
    };
    let now = now_unix_ms();
    validate::batch(&batch, now).expect("the collector accepts the agent's window");
    store.ingest(batch.clone(), now, content_hash(&batch)).unwrap();
    let ui = Ui::for_test(QueryService::without_quotas(store.clone()), AnnotateService::new(store.clone()));
    Fixture { ui, store, dir }
}

async fn page(ui: &Ui, path_and_query: &str) -> String {
    let (path, query) = path_and_query.split_once('?').unwrap_or((path_and_query, ""));
    page_for_test(ui, path, &format!("since=all&{query}")).await
}

fn workload() -> Vec<sqlbee_agent::probe::Statement> {
    let mut failed = statement(3, 0, 4 * MS, "INSERT INTO t VALUES (1)");
    failed.error_code = 1062;
    vec![
        with_figures(statement(1, 0, MS, "SELECT * FROM t WHERE k = 1"), 1),
        with_figures(statement(1, 0, 2 * MS, "SELECT * FROM t WHERE k = 2"), 1),
        with_figures(statement(2, 0, 6 * MS, "SELECT * FROM t WHERE k = 3"), 1),
        failed,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_top_and_fleet_pages_count_what_was_stored() {
    let f = filled("top", workload());
    let top = rows(&page(&f.ui, "/top").await, "top");
    assert_eq!(top.len(), 2, "{top:?}");
    let by_count: HashMap<&str, (&str, &str)> = top
        .iter()
        .map(|r| (r["data-count"].as_str(), (r["data-errors"].as_str(), r["data-sum-ns"].as_str())))
        .collect();
    assert_eq!(by_count["3"], ("0", "9000000"), "three selects, 9 ms in all");
    assert_eq!(by_count["1"], ("1", "4000000"), "one failed insert");
    let fleet = rows(&page(&f.ui, "/").await, "instances");
    assert_eq!(fleet.len(), 1);
    assert_eq!((fleet[0]["data-count"].as_str(), fleet[0]["data-errors"].as_str()), ("4", "1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_digest_page_shows_every_figure_summed() {
    let f = filled("digest", workload());
    let select = sqlbee_agent::normalize::Normalizer::new(1).normalize(b"SELECT * FROM t WHERE k = 9").id;
    let html = page(&f.ui, &format!("/digest?id={select:016x}")).await;
    let figures = rows(&html, "figures");
    assert_eq!(figures.len(), sqlbee_figures::FIGURES.len(), "every figure is known: {figures:?}");
    for (i, figure) in sqlbee_figures::FIGURES.iter().enumerate() {
        let row = figures.iter().find(|r| r["data-figure"] == figure.name).unwrap_or_else(|| panic!("{}", figure.name));
        assert_eq!(row["data-value"], (3 * figure_value(i, 1)).to_string(), "{}", figure.name);
        assert!(html.contains(figure.label), "{} is labelled", figure.name);
    }
    let by_schema = rows(&html, "rows");
    assert_eq!(by_schema.iter().map(|r| r["data-count"].parse::<u64>().unwrap()).sum::<u64>(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markers_and_events_show_on_their_page_and_on_every_plot() {
    let f = filled("marks", workload());
    let now = now_unix_ms();
    let marker = sqlbee_proto::v1::Annotation {
        id: 7,
        at_unix_ms: now - 60_000,
        text: "deploy <v2.3>".into(),
        instances: Vec::new(),
        created_unix_ms: now,
    };
    f.store.annotate(&marker).unwrap();
    let event = sqlbee_proto::v1::Event {
        id: 9,
        instance: "db:3306".into(),
        kind: "regressed".into(),
        digest: 0xabc,
        digest_text: "SELECT ?".into(),
        opened_unix_ms: now - 30_000,
        evidence: "rank test p = 1e-9".into(),
        before_since_unix_ms: now - 7_200_000,
        before_until_unix_ms: now - 3_600_000,
        after_since_unix_ms: now - 3_600_000,
        after_until_unix_ms: now - 30_000,
        updated_unix_ms: now - 30_000,
        ..Default::default()
    };
    f.store.put_events(std::slice::from_ref(&event)).unwrap();
    let events = page(&f.ui, "/events?since=1h").await;
    assert!(events.contains("data-kind=\"regressed\"") && events.contains("data-open=\"true\""), "{events}");
    assert!(events.contains("deploy &lt;v2.3&gt;") && events.contains("rank test p = 1e-9"), "{events}");
    assert!(events.contains(&format!("before={}..{}", now - 7_200_000, now - 3_600_000)), "links its compare view");
    for path in ["/?since=1h", "/cost?since=1h"] {
        let html = page(&f.ui, path).await;
        assert!(
            html.contains("class=\"marker annotation\"") && html.contains("class=\"marker event\""),
            "{path}: {html}"
        );
    }
    // Closed, it is still in the range's list, and no longer open.
    let closed = sqlbee_proto::v1::Event {
        closed_unix_ms: now - 10_000,
        updated_unix_ms: now - 10_000,
        closed_because: "back within 20%".into(),
        ..event
    };
    f.store.put_events(&[closed]).unwrap();
    let events = page(&f.ui, "/events?since=1h").await;
    assert!(events.contains("data-open=\"false\"") && events.contains("back within 20%"), "{events}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_renders_whole() {
    let f = filled("every", workload());
    for path in ["/", "/top", "/top?order=p99", "/locks", "/hosts", "/cost", "/compare", "/compare?shift=1h", "/events"]
    {
        let html = page(&f.ui, path).await;
        assert!(html.contains("</main>") && html.contains("</html>"), "{path} rendered whole: {html}");
    }
}

#[test]
fn the_collector_takes_a_window_with_every_figure_and_a_failed_statement() {
    let window = ship::instance_window(&report("db:3306", all_figures(), two_reads_and_a_deadlock()), None);
    let batch = Batch {
        agent: Some(AgentIdentity { host: "h".into(), agent_id: "a".into(), version: "v".into() }),
        sequence: 1,
        windows: vec![window],
        ..Default::default()
    };
    validate::batch(&batch, now_unix_ms()).expect("the collector accepts what the agent sends");
}
