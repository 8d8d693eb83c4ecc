//! `sqlbee mcp` spoken to by a real Model Context Protocol client (the
//! protocol's own Python SDK, `sqlbee/tests/mcp_client.py`), against a real
//! collector over gRPC: the tools are listed, each answer is what the
//! query command prints for the same question, no tool writes, and a
//! wrong call or a collector that is down is the tool's error, not the
//! session's end.
mod common;

use std::{path::Path, process::Command};

use serde_json::{Value, json};
use sqlbee_proto::{client::ClientOptions, v1::AnnotationsRequest};

use common::collector::*;

const INGEST_TOKEN: &str = "ingest-token-0123456789abcdef0123456789abcdef";
const READ_TOKEN: &str = "reader-token-0123456789abcdef0123456789abcdef";
const INSTANCE: &str = "mcp-db:3306";
const POINT: &str = RICH_POINT;
const UPDATE: &str = RICH_UPDATE;

/// What the SDK's client reported: the tools listed and each call's answer.
fn ask(python: &Path, url: &str, token_file: &Path, calls: &Value) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client.py");
    let out = Command::new(python)
        .arg(&script)
        .args([env!("CARGO_BIN_EXE_sqlbee"), url, token_file.to_str().unwrap(), &calls.to_string()])
        .output()
        .expect("running the MCP client");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the MCP client failed: {stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn answer_of(report: &Value, index: usize) -> &Value {
    &report["calls"][index]
}

/// The answer's JSON, parsed from its text (what every client reads).
fn json_of(call: &Value) -> Value {
    assert_eq!(call["is_error"], false, "{call}");
    serde_json::from_str(call["text"].as_str().expect("a text answer")).expect("the text is JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assistant_reads_what_the_query_commands_say_and_can_write_nothing() {
    let test = "an_assistant_reads_what_the_query_commands_say_and_can_write_nothing";
    let Some(python) = xtask::python_venv::MCP.for_test(test) else { return };
    let dir = TempDir::new("mcp");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("ingest {INGEST_TOKEN}\nread {READ_TOKEN}\n")).unwrap();
    let collector = Collector::start(&["--tokens".into(), tokens.display().to_string()]);
    let url = collector.http_url();

    // Seven point reads and three updates, a change to the table and a
    // plan that scans it.
    let now = now_ms();
    let mut w = rich_window(INSTANCE, now);
    // And what it applied as a replica of another server.
    w.replication = vec![sqlbee_proto::v1::Replication {
        transactions: 4,
        lag: Some(sqlbee_proto::v1::Histogram {
            scheme: sqlbee_vocabulary::histogram::SCHEME,
            buckets: vec![sqlbee_proto::v1::Bucket { index: 200, count: 4 }],
        }),
        lag_max_ns: 2_000_000,
        ..Default::default()
    }];
    let ingest = ClientOptions { token: Some(INGEST_TOKEN.into()), ..plain(&url) };
    push(&mut ingest_client(&ingest).await, batch("mcp-agent", 1, vec![w])).await.expect("the batch is stored");

    let read_token = dir.path().join("read-token");
    std::fs::write(&read_token, format!("{READ_TOKEN}\n")).unwrap();
    let calls = json!([
        ["instances", {}],
        ["top", {"since": "all", "limit": 10}],
        ["top", {"since": "all", "order_by": "count", "limit": 1}],
        ["events", {"since": "all", "kind": "change"}],
        ["findings", {"digest": format!("{:016x}", id_of(POINT)), "since": "all"}],
        ["top", {"since": "all", "sql": "DROP TABLE `app`.`orders`"}],
        ["top", {"limit": 0}],
        ["annotate", {"text": "deploy"}],
        ["run_sql", {"sql": "DROP TABLE `app`.`orders`"}],
        ["tables", {"since": "all"}],
        ["replication", {"since": "all"}],
    ]);
    let report = ask(&python, &url, &read_token, &calls);

    // The SDK probed the newest revision, fell back to the handshake.
    let version = report["protocol_version"].as_str().unwrap();
    assert!(["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"].contains(&version), "{version}");
    let names: Vec<&str> = report["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "instances",
            "top",
            "diff",
            "plans",
            "findings",
            "tables",
            "activity",
            "long_statements",
            "replication",
            "locks",
            "events",
            "series"
        ]
    );
    for tool in report["tools"].as_array().unwrap() {
        assert_eq!(tool["annotations"]["readOnlyHint"], true, "{tool}");
        assert_eq!(tool["inputSchema"]["additionalProperties"], false, "{tool}");
    }

    let instances = json_of(answer_of(&report, 0));
    assert!(instances.to_string().contains(INSTANCE), "{instances}");

    // `top` answers exactly what `sqlbee top --format json` prints, and
    // that is what was sent.
    let top = json_of(answer_of(&report, 1));
    assert_eq!(answer_of(&report, 1)["structured"], top, "structured content is the same answer");
    let cli = top_answer(&url, &["--token-file", read_token.to_str().unwrap(), "--limit", "10"]);
    assert_eq!(top, cli, "the tool and the command answer alike");
    let count = |text: &str| {
        top["digests"].as_array().unwrap().iter().find(|d| d["digest_text"] == text).map(|d| d["count"].clone())
    };
    assert_eq!((count(POINT), count(UPDATE)), (Some(json!(7)), Some(json!(3))), "{top}");
    let by_count = json_of(answer_of(&report, 2));
    assert_eq!(by_count["digests"].as_array().unwrap().len(), 1);
    assert_eq!(by_count["digests"][0]["digest_text"], POINT);

    // The change, who made it, and the server's start, on the timeline.
    let events = json_of(answer_of(&report, 3));
    let events = events["events"].as_array().expect("events are a list");
    let alter = events.iter().find(|e| e["change"]["action"] == "ALTER TABLE").expect("the ALTER is an event");
    assert_eq!(alter["change"]["user"], "deploy", "{alter}");
    assert!(events.iter().any(|e| e["change"]["action"] == "server start"), "{events:?}");

    // The plan's full scan, with the index it suggests.
    let findings = json_of(answer_of(&report, 4));
    let findings = findings["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert_eq!((findings[0]["kind"].as_str(), findings[0]["digest_text"].as_str()), (Some("full_scan"), Some(POINT)));
    assert!(findings[0]["suggestion"].as_str().unwrap().contains("ADD INDEX (`email`)"), "{}", findings[0]);

    // Wrong arguments are the tool's error, with the reason.
    let unknown = answer_of(&report, 5);
    assert_eq!(unknown["is_error"], true, "{unknown}");
    assert!(unknown["text"].as_str().unwrap().contains("takes no argument \"sql\""), "{unknown}");
    let invalid = answer_of(&report, 6);
    assert_eq!(invalid["is_error"], true, "{invalid}");
    assert!(invalid["text"].as_str().unwrap().contains("limit"), "{invalid}");
    // No tool writes or runs SQL: there is none to call.
    for index in [7, 8] {
        let refused = answer_of(&report, index);
        assert_eq!(refused["protocol_error"]["code"], -32602, "{refused}");
        assert!(refused["protocol_error"]["message"].as_str().unwrap().contains("unknown tool"), "{refused}");
    }
    // ... and the session went on after them: the table both digests use,
    // as `sqlbee tables` says.
    let tables = json_of(answer_of(&report, 9));
    let out = sqlbee_query(&[
        "tables",
        "--collector",
        &url,
        "--token-file",
        read_token.to_str().unwrap(),
        "--since",
        "all",
        "--format",
        "json",
    ]);
    assert_eq!(tables, serde_json::from_slice::<Value>(&out.stdout).unwrap());
    let orders = &tables["tables"][0];
    assert_eq!((orders["table"].as_str(), orders["statements"].as_u64()), (Some("orders"), Some(10)), "{tables}");
    let annotations = query_client(&ClientOptions { token: Some(READ_TOKEN.into()), ..plain(&url) })
        .await
        .annotations(AnnotationsRequest { limit: 100, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(annotations.annotations.is_empty(), "nothing was written: {:?}", annotations.annotations);
    // What the server applied as a replica, as `sqlbee replication` says.
    let replication = json_of(answer_of(&report, 10));
    let args = ["replication", "--collector", &url, "--token-file", read_token.to_str().unwrap(), "--since", "all"];
    let out = sqlbee_query(&[&args[..], &["--format", "json"]].concat());
    assert_eq!(replication, serde_json::from_slice::<Value>(&out.stdout).unwrap());
    assert_eq!(replication["replicas"][0]["transactions"], 4, "{replication}");

    // A token that may not read, then the collector gone: each call says
    // why, and the session answers the next one.
    let ingest_token = dir.path().join("ingest-token");
    std::fs::write(&ingest_token, format!("{INGEST_TOKEN}\n")).unwrap();
    let report = ask(&python, &url, &ingest_token, &json!([["top", {"since": "all"}]]));
    let denied = answer_of(&report, 0);
    assert_eq!(denied["is_error"], true, "{denied}");
    assert!(denied["text"].as_str().unwrap().contains("PermissionDenied"), "{denied}");
    drop(collector);
    let report = ask(&python, &url, &read_token, &json!([["top", {}], ["instances", {}]]));
    for index in [0, 1] {
        let down = answer_of(&report, index);
        assert_eq!(down["is_error"], true, "{down}");
        assert!(down["text"].as_str().unwrap().contains("127.0.0.1"), "the collector is named: {down}");
    }
}
