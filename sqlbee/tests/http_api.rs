//! The `/api/` contract against what a real collector answers: every
//! endpoint the OpenAPI document (`GET /api/openapi.json`) lists answers
//! 200 with JSON its schema takes, over a store that holds something in
//! every part of an answer; what the document does not list is refused;
//! and the same tokens and roles hold as for the rest of the web UI.
mod common;

use serde_json::{Value, json};
use sqlbee_proto::{client::ClientOptions, json_schema::validate};

use common::collector::*;

const INGEST: &str = "ingest-token-0123456789abcdef0123456789abcdef";
const READ: &str = "reader-token-0123456789abcdef0123456789abcdef";
const ANNOTATE: &str = "marker-token-0123456789abcdef0123456789abcdef";
const INSTANCE: &str = "api-db:3306";

struct Reply {
    status: u16,
    body: Value,
}

fn request(collector: &Collector, method: &str, path: &str, token: Option<&str>, body: Option<&Value>) -> Reply {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let url = format!("{}{}", collector.ui.trim_end_matches('/'), path);
    let auth = token.map(|t| format!("Bearer {t}"));
    let response = match (method, body) {
        ("POST", Some(body)) => {
            let mut post = agent.post(&url).header("Content-Type", "application/json");
            if let Some(auth) = &auth {
                post = post.header("Authorization", auth);
            }
            post.send(body.to_string())
        }
        _ => {
            let mut get = agent.get(&url);
            if let Some(auth) = &auth {
                get = get.header("Authorization", auth);
            }
            get.call()
        }
    };
    let mut response = response.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let text = response.body_mut().read_to_string().unwrap_or_default();
    Reply {
        status: response.status().as_u16(),
        body: serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {text}")),
    }
}

/// The schema of `status`'s answer to `method path` in the document.
fn schema<'a>(document: &'a Value, method: &str, path: &str, status: &str) -> &'a Value {
    &document["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_answers_what_its_published_schema_says() {
    let dir = TempDir::new("http-api");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("ingest {INGEST}\nread {READ}\nannotate {ANNOTATE}\n")).unwrap();
    let collector = Collector::start(&["--tokens".into(), tokens.display().to_string()]);
    let ingest = ClientOptions { token: Some(INGEST.into()), ..plain(&collector.http_url()) };
    let now = now_ms();
    push(&mut ingest_client(&ingest).await, batch("api-agent", 1, vec![rich_window(INSTANCE, now)]))
        .await
        .expect("the batch is stored");

    let document = request(&collector, "GET", "/api/openapi.json", Some(READ), None);
    assert_eq!(document.status, 200);
    let document = document.body;
    assert_eq!(document["openapi"], "3.1.0");

    // A marker, through the API, with the annotate role's token.
    let marker = json!({"text": "deploy v2.3", "instances": [INSTANCE]});
    let created = request(&collector, "POST", "/api/annotations", Some(ANNOTATE), Some(&marker));
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(validate(schema(&document, "post", "/api/annotations", "201"), &created.body), Vec::<String>::new());

    // Every GET the document lists, over what was stored.
    let digest = format!("{:016x}", id_of(RICH_POINT));
    let paths: Vec<&String> = document["paths"].as_object().unwrap().keys().collect();
    assert!(paths.len() >= 14, "{paths:?}");
    let mut answers = std::collections::BTreeMap::new();
    for path in paths.iter().filter(|p| *p != &"/api/openapi.json") {
        let takes: Vec<&str> = document["paths"][path.as_str()]["get"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        let mut query = vec!["since=2h".to_string()];
        // Plans and a series are of one digest; top is of all.
        if takes.contains(&"digest") && path.as_str() != "/api/top" {
            query.push(format!("digest={digest}"));
        }
        let url = format!("{path}?{}", query.join("&"));
        let reply = request(&collector, "GET", &url, Some(READ), None);
        assert_eq!(reply.status, 200, "{url}: {}", reply.body);
        let errors = validate(schema(&document, "get", path, "200"), &reply.body);
        assert!(errors.is_empty(), "{url} does not answer what the document says: {errors:#?}");
        answers.insert(path.to_string(), reply.body);
    }
    // ... and the answers held something to check, in every part.
    let len = |path: &str, key: &str| answers[path][key].as_array().map_or(0, Vec::len);
    assert_eq!(len("/api/top", "digests"), 2);
    assert_eq!(answers["/api/top"]["digests"][0]["waits"]["row_lock"]["statements"], 1, "{}", answers["/api/top"]);
    assert_eq!(answers["/api/totals"]["statements"], 10);
    assert_eq!(len("/api/plans", "plans"), 1);
    assert_eq!(answers["/api/plans"]["plans"][0]["findings"][0]["kind"], "full_scan");
    assert_eq!(len("/api/tables", "tables"), 1);
    assert!(len("/api/events", "events") >= 2, "the ALTER and the server's start: {}", answers["/api/events"]);
    assert_eq!(answers["/api/locks"].as_array().map_or(0, Vec::len), 1, "{}", answers["/api/locks"]);
    assert_eq!(len("/api/long", "statements"), 1, "{}", answers["/api/long"]);
    assert_eq!(len("/api/annotations", "annotations"), 1, "{}", answers["/api/annotations"]);
    assert!(answers["/api/instances"].to_string().contains(INSTANCE));
    assert!(len("/api/series", "points") >= 1, "{}", answers["/api/series"]);

    // The other shapes an endpoint has: a series of the agents' cost, a
    // diff against a range given outright.
    let before = format!("{}..{}", now - 7_200_000, now - 3_600_000);
    for url in ["/api/series?since=2h&of=cost".to_string(), format!("/api/diff?since=1h&before={before}")] {
        let reply = request(&collector, "GET", &url, Some(READ), None);
        assert_eq!(reply.status, 200, "{url}: {}", reply.body);
        let path = url.split('?').next().unwrap();
        let errors = validate(schema(&document, "get", path, "200"), &reply.body);
        assert!(errors.is_empty(), "{url} does not answer what the document says: {errors:#?}");
    }

    // What the document does not list is refused, naming what is taken.
    let unknown = request(&collector, "GET", "/api/top?since=all&sql=1", Some(READ), None);
    assert_eq!(unknown.status, 400, "{}", unknown.body);
    let error = unknown.body["error"].as_str().unwrap();
    assert!(error.contains("\"sql\"") && error.contains("order"), "{error}");
    assert_eq!(validate(schema(&document, "get", "/api/top", "400"), &unknown.body), Vec::<String>::new());
    assert_eq!(request(&collector, "GET", "/api/nothing", Some(READ), None).status, 404);

    // The same tokens and roles as the rest of the UI: none, or one that
    // may only send, reads nothing (the document included).
    for token in [None, Some(INGEST)] {
        for path in ["/api/openapi.json", "/api/top"] {
            let refused = request(&collector, "GET", path, token, None);
            assert_eq!(refused.status, 401, "{path} with {token:?}: {}", refused.body);
        }
    }
    let not_marker = request(&collector, "POST", "/api/annotations", Some(READ), Some(&marker));
    assert_eq!(not_marker.status, 403, "{}", not_marker.body);
}
