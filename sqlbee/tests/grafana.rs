//! The Grafana dashboard in `docker/grafana/` against the real agent: Grafana
//! cannot run here, so every PromQL expression in it must parse (promtool),
//! name only metrics the agent exported while watching a real mariadbd, and
//! return data from a real Prometheus scraping that agent. The counters the
//! dashboard rates are checked against the server's own status counters.
mod common;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use common::{
    Agent, PrivateServer,
    collector::{Collector, TempDir},
    delta, free_port, http_get, instance_of, privileged,
    prometheus::{Prometheus, prometheus_binary},
};
use mysql::prelude::Queryable;
use serde_json::Value;

const PROMTOOL: &str = "/usr/bin/promtool";
const DASHBOARD: &str = "grafana/sqlbee-agent.json";

/// What the dashboard's variables and Grafana's own stand for when an
/// expression is checked. `.+` rather than `.*` for the label variables:
/// a matcher on a label the agent's series lack (say, `exported_instance`
/// under another scrape setup) then selects nothing and the data check
/// fails, instead of matching everything by the empty string.
const VARIABLES: [(&str, &str); 7] = [
    ("$__rate_interval", "1m"),
    ("$__interval", "15s"),
    ("$__range", "1h"),
    ("$job", ".+"),
    ("$instance", ".+"),
    ("$server", ".+"),
    ("${DS_PROMETHEUS}", "prometheus"),
];

fn connect(server: &PrivateServer) -> mysql::Conn {
    let opts =
        mysql::OptsBuilder::new().socket(Some(server.socket.to_str().unwrap())).user(Some("root")).prefer_socket(true);
    mysql::Conn::new(opts).expect("connecting to the private server")
}

/// `SHOW GLOBAL STATUS` on `conn` (one statement, counted as one), the
/// numeric values.
fn global_status(conn: &mut mysql::Conn) -> HashMap<String, u64> {
    let rows: Vec<(String, Option<String>)> = conn.query("SHOW GLOBAL STATUS").unwrap();
    rows.into_iter().filter_map(|(k, v)| Some((k, v?.parse().ok()?))).collect()
}

/// One scrape of the agent's page: each series (name and labels as
/// written) and its value.
struct Page {
    text: String,
    series: BTreeMap<String, f64>,
}

impl Page {
    fn scrape(port: u16) -> Page {
        let response = http_get(port, "/metrics");
        let (head, text) = response.split_once("\r\n\r\n").expect("an HTTP response");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let series = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                let (series, value) = l.rsplit_once(' ').unwrap_or_else(|| panic!("bad sample line {l:?}"));
                let value = match value {
                    "+Inf" => f64::INFINITY,
                    v => v.parse().unwrap_or_else(|e| panic!("bad value in {l:?}: {e}")),
                };
                (series.to_string(), value)
            })
            .collect();
        Page { text: text.to_string(), series }
    }

    /// Metric names with at least one sample (a family with none is not
    /// something a panel can show).
    fn names(&self) -> BTreeSet<&str> {
        self.series.keys().map(|s| s.split_once('{').map_or(s.as_str(), |(name, _)| name)).collect()
    }

    fn get(&self, series: &str) -> f64 {
        *self.series.get(series).unwrap_or_else(|| panic!("{series} is not on the page:\n{}", self.text))
    }

    /// The latency histogram's buckets for `labels`, in page order.
    fn buckets(&self, labels: &str) -> Vec<(String, f64)> {
        let prefix = format!("sqlbee_statement_latency_seconds_bucket{{{labels},le=\"");
        self.text
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix(&prefix)?;
                let (le, value) = rest.split_once("\"} ")?;
                Some((le.to_string(), value.parse().ok()?))
            })
            .collect()
    }
}

/// Scrapes until the agent has closed `windows` more windows than `since`
/// shows, so everything that ended before the call is on the page.
fn after_windows(port: u16, since: &Page, windows: f64, agent: &Agent) -> Page {
    // The page is empty until the first window closes.
    let closed = |page: &Page| page.series.get("sqlbee_agent_windows_total").copied().unwrap_or(0.0);
    let want = closed(since) + windows;
    let started = Instant::now();
    loop {
        let page = Page::scrape(port);
        if closed(&page) >= want {
            return page;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no new windows: {}", agent.progress());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every PromQL expression in the dashboard, with where it is: panel
/// targets (rows' nested panels included) and the variables' queries
/// (`label_values(<expr>, label)` and `query_result(<expr>)`).
fn dashboard_expressions(dashboard: &Value) -> Vec<(String, String)> {
    fn walk(panels: &Value, out: &mut Vec<(String, String)>) {
        for panel in panels.as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    out.push((format!("panel {:?} {}", panel["title"], target["refId"]), expr.to_string()));
                }
            }
            walk(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    for variable in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        let query = variable["query"]["query"].as_str().or(variable["query"].as_str()).unwrap_or_default();
        let inner = if let Some(args) = query.strip_prefix("label_values(").and_then(|q| q.strip_suffix(')')) {
            // label_values(label) alone has no expression.
            args.rsplit_once(',').map(|(expr, _)| expr.trim())
        } else {
            query.strip_prefix("query_result(").and_then(|q| q.strip_suffix(')'))
        };
        if let Some(expr) = inner {
            out.push((format!("variable {}", variable["name"]), expr.to_string()));
        } else {
            assert!(
                query.starts_with("label_values("),
                "variable {}: a query this test cannot read: {query}",
                variable["name"]
            );
        }
    }
    out
}

fn substituted(expr: &str) -> String {
    VARIABLES.iter().fold(expr.to_string(), |e, (name, value)| e.replace(name, value))
}

/// Parses `expr` with promtool, as the expression of a recording rule.
fn promtool_parses(dir: &Path, n: usize, expr: &str) -> Result<(), String> {
    let rules = dir.join(format!("expr-{n}.rules.yml"));
    // A JSON string is a YAML double-quoted scalar.
    let quoted = serde_json::to_string(expr).unwrap();
    std::fs::write(
        &rules,
        format!(
            "groups:\n  - name: dashboard\n    rules:\n      - record: dashboard:expr_{n}\n        expr: {quoted}\n"
        ),
    )
    .unwrap();
    let out = Command::new(PROMTOOL).args(["check", "rules"]).arg(&rules).output().expect("running promtool");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }
}

/// Words that can stand where a metric name could but are not one.
const NOT_METRICS: [&str; 27] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// The metric names an expression selects: identifiers that are not
/// functions (followed by `(`), keywords, label names (inside `{}` or the
/// label list after `by`, `on`, ...), durations (`[...]`), strings or
/// numbers. promtool has already said the expression is valid PromQL, so
/// this only has to tell those apart.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let skip_string = |i: usize| -> usize {
        let quote = chars[i];
        let mut j = i + 1;
        while j < chars.len() && chars[j] != quote {
            j += if chars[j] == '\\' { 2 } else { 1 };
        }
        j + 1
    };
    let skip_group = |i: usize, close: char| -> usize {
        let mut j = i + 1;
        while j < chars.len() && chars[j] != close {
            j = if matches!(chars[j], '"' | '\'' | '`') { skip_string(j) } else { j + 1 };
        }
        j + 1
    };
    while i < chars.len() {
        let c = chars[i];
        if matches!(c, '"' | '\'' | '`') {
            i = skip_string(i);
        } else if c == '{' {
            i = skip_group(i, '}');
        } else if c == '[' {
            i = skip_group(i, ']');
        } else if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            // 1e6, 0.5, 10000 (and a duration's unit, inside [] anyway).
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let call = chars.get(next) == Some(&'(');
            if matches!(word.as_str(), "by" | "without" | "on" | "ignoring" | "group_left" | "group_right") && call {
                i = skip_group(next, ')');
            } else if !call && !NOT_METRICS.contains(&word.as_str()) {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn metric_names_are_told_from_the_rest() {
    let names = |e: &str| metric_names(e).into_iter().collect::<Vec<_>>();
    assert_eq!(
        names(r#"1e6 * sum by (a, b) (rate(x_total{c=~"d{1}[e]",f!="g h"}[5m] offset 1m)) / on(a) group_left(z) y"#),
        ["x_total", "y"]
    );
    assert_eq!(names(r#"histogram_quantile(0.99, sum without (le) (rate(h_bucket[1m]))) > bool 0.5"#), ["h_bucket"]);
    assert_eq!(names("topk(5, a:b_c) or vector(0)"), ["a:b_c"]);
}

#[test]
fn dashboard_expressions_parse_and_name_what_the_agent_exports() {
    if !privileged("dashboard_expressions_parse_and_name_what_the_agent_exports") {
        return;
    }
    let Some(prometheus_binary) = prometheus_binary("dashboard_expressions_parse_and_name_what_the_agent_exports")
    else {
        return;
    };
    let _serial = common::one_at_a_time();
    let dashboard: Value = serde_json::from_str(&common::docker(DASHBOARD)).expect("the dashboard is JSON");
    assert_eq!(dashboard["__inputs"][0]["name"], "DS_PROMETHEUS");
    let expressions = dashboard_expressions(&dashboard);
    assert!(expressions.len() >= 20, "{expressions:#?}");

    let dir = TempDir::new("grafana");
    let server = PrivateServer::start("grafana", &[]).unwrap();
    server
        .sql("CREATE DATABASE app; CREATE TABLE app.t (id INT PRIMARY KEY, v INT) ENGINE=InnoDB; INSERT INTO app.t VALUES (1, 0), (2, 0), (3, 0)")
        .unwrap();
    let collector = Collector::start(&[]);
    let port = free_port();
    let agent = Agent::start(
        server.dir(),
        &[
            format!("--pid={}", server.pid()),
            "--window=1s".into(),
            "--wait-probes".into(),
            format!("--metrics-listen=127.0.0.1:{port}"),
            format!("--collector={}", collector.http_url()),
            format!("--state-dir={}", dir.path().join("state").display()),
        ],
    );
    let instance = instance_of(&server);
    let labels = format!("instance=\"{instance}\"");
    let series = |name: &str| format!("{name}{{{labels}}}");

    // Every connection opens before the first reading and closes after the
    // last, so the two readings of Questions see each statement between
    // them, and no connection's set-up or QUIT.
    let mut conn = connect(&server);
    let mut holder = connect(&server);
    let mut waiter = connect(&server);
    let page = Page::scrape(port);
    let before = after_windows(port, &page, 2.0, &agent);
    let status_before = global_status(&mut conn);

    const SELECTS: u64 = 300;
    const ERRORS: u64 = 7;
    for i in 0..SELECTS {
        conn.query_drop(format!("SELECT v FROM app.t WHERE id = {}", i % 3 + 1)).unwrap();
    }
    for _ in 0..ERRORS {
        assert!(conn.query_drop("SELECT v FROM app.missing").is_err());
    }
    // One statement waits half a second on a row lock.
    holder.query_drop("BEGIN").unwrap();
    holder.query_drop("SELECT v FROM app.t WHERE id = 1 FOR UPDATE").unwrap();
    let waiting = std::thread::spawn(move || {
        waiter.query_drop("UPDATE app.t SET v = v + 1 WHERE id = 1").unwrap();
        waiter
    });
    std::thread::sleep(Duration::from_millis(500));
    holder.query_drop("COMMIT").unwrap();
    let waiter = waiting.join().unwrap();
    let status_after = global_status(&mut conn);
    // log_slow_statement, where a statement's end is counted, runs after its
    // result is sent: two windows cover the last SHOW's end.
    let after = after_windows(port, &Page::scrape(port), 2.0, &agent);
    let grew = |name: &str| after.get(name) - before.get(name);

    // Questions counts each statement as it starts, the reading one
    // included: the first SHOW is in `status_before`, the second (with the
    // lock's four statements) in the difference. The agent counts both
    // SHOWs between its two pages.
    let questions = delta(&status_before, &status_after, "Questions");
    assert_eq!(questions, SELECTS + ERRORS + 4 + 1, "the workload as the server counted it");
    assert_eq!(grew(&series("sqlbee_statements_total")), (questions + 1) as f64, "statements counter vs Questions");
    assert_eq!(grew(&series("sqlbee_statement_errors_total")), ERRORS as f64);
    let select = after
        .series
        .iter()
        .find(|(s, _)| {
            s.starts_with("sqlbee_digest_statements_total{")
                && s.contains("text=\"SELECT `v` FROM `app`.`t` WHERE ID = ?\"")
        })
        .map(|(s, _)| s.clone())
        .unwrap_or_else(|| panic!("no counter for the SELECT digest:\n{}", after.text));
    // New in this workload: its counter starts with the window it entered
    // the top in, which holds its first statement.
    assert_eq!(after.get(&select) - before.series.get(&select).copied().unwrap_or(0.0), SELECTS as f64, "{select}");
    let row_lock = format!("sqlbee_wait_seconds_total{{{labels},class=\"row_lock\"}}");
    assert!((0.45..=1.5).contains(&grew(&row_lock)), "row lock wait {} s", grew(&row_lock));

    // The histogram counts every statement with a duration: all of them
    // when nothing was dropped and none was unmatched.
    for page in [&before, &after] {
        let count = page.get(&series("sqlbee_statement_latency_seconds_count"));
        let untimed =
            page.get(&series("sqlbee_dropped_events_total")) + page.get(&series("sqlbee_unmatched_statements_total"));
        assert_eq!(count, page.get(&series("sqlbee_statements_total")) - untimed, "{}", page.text);
        let buckets = page.buckets(&labels);
        assert_eq!(buckets.len(), 17, "{buckets:?}");
        assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "cumulative: {buckets:?}");
        assert!(buckets.windows(2).all(|w| w[0].0.parse::<f64>().unwrap() < w[1].0.parse::<f64>().unwrap()));
        assert_eq!(buckets.last().unwrap(), &("+Inf".to_string(), count));
    }
    assert_eq!(grew(&series("sqlbee_statement_latency_seconds_count")), grew(&series("sqlbee_statements_total")));
    // The waiting UPDATE took about half a second, the rest far less.
    let le = |page: &Page, le: &str| page.buckets(&labels).into_iter().find(|(b, _)| b == le).unwrap().1;
    let slow = (le(&after, "1.006632959") - le(&after, "0.251658239"))
        - (le(&before, "1.006632959") - le(&before, "0.251658239"));
    assert!(slow >= 1.0, "the lock wait's statement in 0.25..1 s: {:?}", after.buckets(&labels));
    assert!(grew(&series("sqlbee_statement_latency_seconds_sum")) >= 0.45);
    let cpu = after
        .series
        .keys()
        .find(|s| s.starts_with("sqlbee_agent_cpu_seconds_total{"))
        .expect("the agent's CPU counter");
    assert!(grew(cpu) > 0.0, "{}", after.text);
    assert!(after.get("sqlbee_ship_batches_delivered_total") >= 1.0, "{}", after.text);

    // Now the dashboard: each expression parses and names exported metrics.
    let exported = after.names();
    let mut problems = Vec::new();
    for (n, (place, expr)) in expressions.iter().enumerate() {
        let expr = substituted(expr);
        assert!(!expr.contains('$'), "{place}: a variable this test does not know: {expr}");
        if let Err(why) = promtool_parses(dir.path(), n, &expr) {
            problems.push(format!("{place}: promtool: {why}\n  {expr}"));
            continue;
        }
        let names = metric_names(&expr);
        if names.is_empty() {
            problems.push(format!("{place}: names no metric: {expr}"));
        }
        for name in names.iter().filter(|n| !exported.contains(n.as_str())) {
            problems.push(format!("{place}: {name} is not exported by the agent\n  {expr}"));
        }
    }
    assert!(problems.is_empty(), "{}\n\nexported: {exported:?}", problems.join("\n"));

    // And what a real Prometheus scraping this agent answers for each:
    // data, without error. The workload runs again meanwhile, so every rate
    // over the last minute has something to show.
    let metrics_addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut prometheus = Prometheus::start(prometheus_binary, dir.path(), metrics_addr);
    let started = Instant::now();
    let mut answers = BTreeMap::new();
    while started.elapsed() < Duration::from_secs(40) {
        for i in 0..50 {
            conn.query_drop(format!("SELECT v FROM app.t WHERE id = {}", i % 3 + 1)).unwrap();
        }
        let _ = conn.query_drop("SELECT v FROM app.missing");
        answers =
            expressions.iter().map(|(place, expr)| (place.clone(), prometheus.query(&substituted(expr)))).collect();
        if answers.values().all(|a| a.as_ref().is_ok_and(|r| !r.is_empty())) {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let empty: Vec<String> = answers
        .iter()
        .filter(|(_, a)| !a.as_ref().is_ok_and(|r| !r.is_empty()))
        .map(|(place, a)| format!("{place}: {a:?}"))
        .collect();
    prometheus.wait_for("the agent as a healthy target", |p| {
        p.api("/api/v1/targets").is_some_and(|t| t["activeTargets"][0]["health"] == "up")
    });
    assert!(empty.is_empty(), "expressions with no data or an error:\n{}", empty.join("\n"));
    drop((holder, waiter));
    drop(prometheus);
    let out = agent.stop();
    assert!(out.success, "{}", out.stderr);
}
