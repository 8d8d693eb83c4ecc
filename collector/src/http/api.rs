//! `/api/`: the Query service's answers as JSON, in the shapes `sqlbee ...
//! --format json` prints (`query_api::json`), with the same parameters as
//! the pages' URLs (`since`, `until`, `instance`, and per endpoint
//! `order`, `limit`, `schema`, `digest`, `of`, `step`), each endpoint's
//! declared in `openapi`.
use serde_json::Value;
use sqlbee_proto::v1::{
    ActivityRequest, AnnotateRequest, AnnotationsRequest, EventsRequest, HostsRequest, LocksRequest,
    LongStatementsRequest, PlansRequest, ReplicationRequest, SeriesRequest, TablesRequest, TopRequest, TotalsRequest,
};
use sqlbee_vocabulary::duration;

use super::{
    Ui, openapi,
    page_error::PageError,
    params::{BadParam, Params, Range},
};
use sqlbee_proto::json as shape;

fn number(params: &Params, name: &'static str) -> Result<u32, BadParam> {
    params.get(name).map_or(Ok(0), |text| {
        text.parse().map_err(|_| BadParam { name, value: text.to_string(), expected: "a whole number" })
    })
}

fn digest(params: &Params) -> Result<u64, BadParam> {
    params.get("digest").map_or(Ok(0), |text| {
        u64::from_str_radix(text, 16).map_err(|_| BadParam {
            name: "digest",
            value: text.to_string(),
            expected: "16 hex digits, as `top` writes a digest",
        })
    })
}

fn text(params: &Params, name: &str) -> String {
    params.get(name).unwrap_or_default().to_string()
}

/// The marker a `POST /api/annotations` body asks for: `{"text": "...",
/// "instances": ["host:port", ...], "at_unix_ms": 0}` (only `text` is
/// needed); the Annotate service checks the values.
pub fn marker_request(body: &[u8]) -> Result<AnnotateRequest, BadParam> {
    let bad = |expected: &'static str| BadParam {
        name: "body",
        value: String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
        expected,
    };
    const SHAPE: &str = r#"a JSON object {"text": "deploy v2.3", "instances": ["db-1:3306"], "at_unix_ms": 0}"#;
    let value: Value = serde_json::from_slice(body).map_err(|_| bad(SHAPE))?;
    let object = value.as_object().ok_or_else(|| bad(SHAPE))?;
    if object.keys().any(|k| !["text", "instances", "at_unix_ms"].contains(&k.as_str())) {
        return Err(bad(r#"only the fields "text", "instances" and "at_unix_ms""#));
    }
    let text = object.get("text").and_then(Value::as_str).ok_or_else(|| bad(r#""text": a string"#))?;
    let instances = match object.get("instances") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(names)) => names
            .iter()
            .map(|n| n.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad(r#""instances": a list of strings"#))?,
        Some(_) => return Err(bad(r#""instances": a list of strings"#)),
    };
    let at_unix_ms = match object.get("at_unix_ms") {
        None | Some(Value::Null) => 0,
        Some(v) => v.as_i64().ok_or_else(|| bad(r#""at_unix_ms": whole milliseconds since the epoch"#))?,
    };
    Ok(AnnotateRequest { text: text.to_string(), instances, at_unix_ms })
}

/// None: no such endpoint. A parameter the endpoint does not declare
/// (`openapi::ENDPOINTS`) is refused, so the published contract is the
/// one the code reads.
pub async fn answer(ui: &Ui, path: &str, params: &Params, now: i64) -> Option<Result<Value, PageError>> {
    static DOCUMENT: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    if path == "/api/openapi.json" {
        return Some(Ok(DOCUMENT.get_or_init(openapi::document).clone()));
    }
    let endpoint = openapi::endpoint(path)?;
    if let Some(name) = params.names().find(|name| !endpoint.takes().any(|known| known == *name)) {
        return Some(Err(PageError::UnknownParam {
            path: endpoint.path,
            name: name.to_string(),
            takes: endpoint.takes().collect::<Vec<_>>().join(", "),
        }));
    }
    let result = async {
        let range = Range::from(params, now)?;
        let instance = text(params, "instance");
        Ok(Some(match path {
            "/api/top" => {
                let digest = digest(params)?;
                let answer = ui
                    .top(TopRequest {
                        instance,
                        since_unix_ms: range.since_unix_ms,
                        until_unix_ms: range.until_unix_ms,
                        order_by: params.get("order").unwrap_or("total").to_string(),
                        limit: number(params, "limit")?,
                        schema: text(params, "schema"),
                        nested: params.get("nested") == Some("1") || digest != 0,
                        program: text(params, "program"),
                        digest,
                    })
                    .await?;
                shape::top_answer_json(&answer)
            }
            "/api/series" => {
                let step_ms = match params.get("step") {
                    Some(step) => duration::parse(step)
                        .map_err(|_| BadParam {
                            name: "step",
                            value: step.to_string(),
                            expected: "a duration (10s, 1m, 1h)",
                        })?
                        .as_millis() as i64,
                    None => 0,
                };
                let digest = digest(params)?;
                let of = params.get("of").unwrap_or(if digest != 0 { "digest" } else { "statements" }).to_string();
                let cost = of == "cost";
                let answer = ui
                    .series(SeriesRequest {
                        of,
                        digest,
                        instance,
                        schema: text(params, "schema"),
                        since_unix_ms: range.since_unix_ms,
                        until_unix_ms: range.until_unix_ms,
                        step_ms,
                        by_instance: false,
                        by_digests: Vec::new(),
                    })
                    .await?;
                shape::series_json(&answer, cost)
            }
            "/api/instances" => shape::instances_json(&ui.instances().await?, now),
            "/api/locks" => {
                let answer = ui
                    .locks(LocksRequest {
                        instance,
                        since_unix_ms: range.since_unix_ms,
                        limit: number(params, "limit")?,
                    })
                    .await?;
                shape::locks_json(&answer.waits)
            }
            "/api/plans" => {
                let answer = ui
                    .plans(PlansRequest {
                        digest: digest(params)?,
                        schema: text(params, "schema"),
                        instance,
                        since_unix_ms: range.since_unix_ms,
                        until_unix_ms: range.until_unix_ms,
                        limit: number(params, "limit")?,
                    })
                    .await?;
                shape::plans_json(&answer)
            }
            "/api/activity" => {
                let min_running_ms = match params.get("min_duration") {
                    None => 0,
                    Some(text) => duration::parse(text)
                        .map_err(|_| BadParam {
                            name: "min_duration",
                            value: text.to_string(),
                            expected: "a duration (250ms, 1s, 5m)",
                        })?
                        .as_millis() as u64,
                };
                let answer = ui.activity(ActivityRequest { instance, min_running_ms }).await?;
                shape::activity_json(&answer, sqlbee_vocabulary::clock::now_unix_ms())
            }
            "/api/long" => {
                let answer = ui
                    .long_statements(LongStatementsRequest {
                        instance,
                        since_unix_ms: range.since_unix_ms,
                        limit: number(params, "limit")?,
                    })
                    .await?;
                shape::long_statements_json(&answer.statements)
            }
            "/api/replication" => {
                let answer = ui
                    .replication(ReplicationRequest {
                        instance,
                        since_unix_ms: range.since_unix_ms,
                        until_unix_ms: range.until_unix_ms,
                    })
                    .await?;
                shape::replication_json(&answer)
            }
            "/api/diff" => {
                let view = super::params::View { range, instance: (!instance.is_empty()).then_some(instance) };
                let (before, _) = super::pages::compare::before_range(params, &view)?;
                let limit = number(params, "limit")?;
                let answer = ui.diff(super::pages::compare::request(&view, before, limit)).await?;
                shape::diff_json(&answer.digests)
            }
            "/api/events" => {
                let events = ui
                    .events(EventsRequest {
                        instance,
                        since_unix_ms: range.since_unix_ms,
                        until_unix_ms: range.until_unix_ms,
                        open_only: params.get("open") == Some("1"),
                        limit: number(params, "limit")?,
                        kind: text(params, "kind"),
                    })
                    .await?;
                shape::events_json(&events)
            }
            "/api/annotations" => {
                let annotations = ui
                    .annotations(AnnotationsRequest {
                        instance,
                        since_unix_ms: range.since_unix_ms,
                        until_unix_ms: range.until_unix_ms,
                        limit: number(params, "limit")?,
                        id: 0,
                    })
                    .await?;
                shape::annotations_json(&annotations)
            }
            "/api/tables" => {
                let answer = ui
                    .tables(TablesRequest {
                        instance,
                        since_unix_ms: range.since_unix_ms,
                        until_unix_ms: range.until_unix_ms,
                        limit: number(params, "limit")?,
                    })
                    .await?;
                shape::tables_json(&answer)
            }
            "/api/hosts" => {
                let answer = ui
                    .hosts(HostsRequest {
                        host: text(params, "host"),
                        since_unix_ms: range.since_unix_ms,
                        limit: number(params, "limit")?,
                    })
                    .await?;
                shape::hosts_json(&answer.windows)
            }
            "/api/totals" => shape::totals_json(
                &ui.totals(TotalsRequest {
                    instance,
                    since_unix_ms: range.since_unix_ms,
                    until_unix_ms: range.until_unix_ms,
                })
                .await?,
            ),
            _ => return Ok::<Option<Value>, PageError>(None),
        }))
    }
    .await;
    result.transpose()
}
