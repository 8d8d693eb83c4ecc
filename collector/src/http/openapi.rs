//! The `/api/` contract: every endpoint, the parameters it takes and the
//! shape of its answer, as an OpenAPI 3.1 document
//! (`GET /api/openapi.json`, and the manual's reference).
//!
//! Nothing in it is written by hand twice. `api` refuses a parameter an
//! endpoint does not declare here, so the parameter lists are the ones the
//! code reads; and each answer's schema is learned from the very function
//! that writes the answer (`sqlbee_proto::json_schema`), run on example
//! messages made from the protocol's descriptors.
use serde_json::{Map, Value, json};
use sqlbee_proto::{
    json_schema::{Example, example, learned},
    query_client::{EVENT_KINDS, ORDER_KEYS},
    v1::{
        ActivityResponse, Annotation, AnnotationsResponse, DiffResponse, EventsResponse, HostsResponse,
        InstancesResponse, LocksResponse, LongStatementsResponse, PlansResponse, ReplicationResponse, SeriesResponse,
        TablesResponse, TopResponse, TotalsResponse,
    },
};

/// One `GET` endpoint under `/api/`.
pub struct Endpoint {
    pub path: &'static str,
    pub summary: &'static str,
    /// The query parameters it reads besides `COMMON` (see `parameter`).
    pub params: &'static [&'static str],
    /// Its answer for an example message (`json_schema::Example`).
    answer: fn(Example) -> Value,
}

/// What every endpoint takes (and checks): the range and the instance.
/// An endpoint that answers what is live, or per host, ignores them.
pub const COMMON: [&str; 3] = ["since", "until", "instance"];

impl Endpoint {
    /// Every parameter it takes.
    pub fn takes(&self) -> impl Iterator<Item = &'static str> {
        COMMON.into_iter().chain(self.params.iter().copied())
    }
}

/// The time an example answer is made at (ages and lags are computed
/// against it).
const EXAMPLE_NOW: i64 = 1_000;

pub const ENDPOINTS: &[Endpoint] = &[
    Endpoint {
        path: "/api/top",
        summary: "The digests that cost the most in the range (`sqlbee top`)",
        params: &["order", "limit", "schema", "digest", "nested", "program"],
        answer: |e| sqlbee_proto::json::top_answer_json(&example::<TopResponse>("TopResponse", e)),
    },
    Endpoint {
        path: "/api/series",
        summary: "A digest's, all statements' or the agents' cost step by step (`sqlbee series`)",
        params: &["schema", "digest", "of", "step"],
        answer: |e| sqlbee_proto::json::series_json(&example::<SeriesResponse>("SeriesResponse", e), false),
    },
    Endpoint {
        path: "/api/instances",
        summary: "Server instances and agents, with lag and gaps (`sqlbee instances`)",
        params: &[],
        answer: |e| {
            sqlbee_proto::json::instances_json(
                &example::<InstancesResponse>("InstancesResponse", e).instances,
                EXAMPLE_NOW,
            )
        },
    },
    Endpoint {
        path: "/api/locks",
        summary: "Long lock waits with the waiting statement and candidate blockers (`sqlbee locks`)",
        params: &["limit"],
        answer: |e| sqlbee_proto::json::locks_json(&example::<LocksResponse>("LocksResponse", e).waits),
    },
    Endpoint {
        path: "/api/plans",
        summary: "Plans, plan changes and findings of digests (`sqlbee plans`)",
        params: &["schema", "digest", "limit"],
        answer: |e| sqlbee_proto::json::plans_json(&example::<PlansResponse>("PlansResponse", e)),
    },
    Endpoint {
        path: "/api/activity",
        summary: "What runs now on each server, and who blocks whom (`sqlbee activity`)",
        params: &["min_duration"],
        answer: |e| sqlbee_proto::json::activity_json(&example::<ActivityResponse>("ActivityResponse", e), EXAMPLE_NOW),
    },
    Endpoint {
        path: "/api/long",
        summary: "Long, killed and abandoned statements (`sqlbee long`)",
        params: &["limit"],
        answer: |e| {
            sqlbee_proto::json::long_statements_json(
                &example::<LongStatementsResponse>("LongStatementsResponse", e).statements,
            )
        },
    },
    Endpoint {
        path: "/api/replication",
        summary: "What replicas applied: transactions, lag at commit, tables and event classes (`sqlbee replication`)",
        params: &[],
        answer: |e| sqlbee_proto::json::replication_json(&example::<ReplicationResponse>("ReplicationResponse", e)),
    },
    Endpoint {
        path: "/api/diff",
        summary: "The range against an earlier one: digests that regressed, improved, appeared or went (`sqlbee diff`)",
        params: &["before", "shift", "limit"],
        answer: |e| sqlbee_proto::json::diff_json(&example::<DiffResponse>("DiffResponse", e).digests),
    },
    Endpoint {
        path: "/api/events",
        summary: "Regressions, new digests, plan changes and changes made to servers (`sqlbee events`)",
        params: &["open", "limit", "kind"],
        answer: |e| sqlbee_proto::json::events_json(&example::<EventsResponse>("EventsResponse", e).events),
    },
    Endpoint {
        path: "/api/annotations",
        summary: "Markers of deploys and changes (`sqlbee annotate`)",
        params: &["limit"],
        answer: |e| {
            sqlbee_proto::json::annotations_json(&example::<AnnotationsResponse>("AnnotationsResponse", e).annotations)
        },
    },
    Endpoint {
        path: "/api/tables",
        summary: "Per-table totals of the digests that read or write each table (`sqlbee tables`)",
        params: &["limit"],
        answer: |e| sqlbee_proto::json::tables_json(&example::<TablesResponse>("TablesResponse", e)),
    },
    Endpoint {
        path: "/api/hosts",
        summary: "Agents' hosts and the agents' own cost, window by window (`sqlbee hosts`)",
        params: &["host", "limit"],
        answer: |e| sqlbee_proto::json::hosts_json(&example::<HostsResponse>("HostsResponse", e).windows),
    },
    Endpoint {
        path: "/api/totals",
        summary: "Statements, digests and commands over the range, and what was lost",
        params: &[],
        answer: |e| sqlbee_proto::json::totals_json(&example::<TotalsResponse>("TotalsResponse", e)),
    },
];

/// The endpoint at `path`.
pub fn endpoint(path: &str) -> Option<&'static Endpoint> {
    ENDPOINTS.iter().find(|e| e.path == path)
}

/// A parameter's schema and meaning; the same name means the same thing
/// on every endpoint.
fn parameter(name: &str) -> (Value, &'static str) {
    let string = json!({ "type": "string" });
    match name {
        "since" => (
            string,
            "Start of the range: a duration back from now (10s, 5m, 2h, 7d), `all`, or milliseconds since the epoch; default 1h (instances and activity are live and take no range)",
        ),
        "until" => (
            string,
            "End of the range: a duration back from now, `now` (the default), or milliseconds since the epoch (locks, long and hosts read from since to now)",
        ),
        "instance" => (string, "Only this server instance (host:port); hosts and instances answer every one"),
        "limit" => {
            (json!({ "type": "integer", "minimum": 0 }), "Rows to answer at most; 0 or absent: the endpoint's default")
        }
        "order" => (json!({ "type": "string", "enum": ORDER_KEYS }), "What to rank by; default total"),
        "schema" => (string, "Only statements that ran in this schema"),
        "digest" => (
            json!({ "type": "string", "pattern": "^[0-9a-fA-F]{1,16}$" }),
            "One digest, as `top` writes it (16 hex digits)",
        ),
        "nested" => (json!({ "type": "string", "enum": ["1"] }), "1: also the statements stored programs ran"),
        "program" => (string, "Only the statements of this stored program (`schema.name`)"),
        "of" => (
            json!({ "type": "string", "enum": ["statements", "digest", "cost"] }),
            "What the series is of; default digest with a digest, else statements; `cost` answers the agents' cost per step",
        ),
        "step" => (string, "Step of the series, a duration (10s, 1m, 1h); default: chosen for the range"),
        "min_duration" => (string, "Only statements running at least this long (250ms, 1s, 5m)"),
        "before" => (
            json!({ "type": "string", "pattern": "^[0-9]+\\.\\.[0-9]+$" }),
            "The earlier range, FROM..TO in milliseconds since the epoch",
        ),
        "shift" => {
            (string, "Without before: the earlier range is this range moved back by shift (a duration; default 1d)")
        }
        "open" => (json!({ "type": "string", "enum": ["1"] }), "1: only events still open"),
        "kind" => (json!({ "type": "string", "enum": EVENT_KINDS }), "Only events of this kind"),
        "host" => (string, "Only this host (as the agents name it)"),
        _ => (string, "undocumented"),
    }
}

/// An endpoint's answer schema, learned from the function that writes it.
pub fn answer_schema(endpoint: &Endpoint) -> Value {
    let mut schema = learned(endpoint.answer);
    if endpoint.path == "/api/series" {
        // `of=cost` answers other points: either shape.
        let cost = |e| sqlbee_proto::json::series_json(&example::<SeriesResponse>("SeriesResponse", e), true);
        let cost = learned(cost);
        let statements = schema["properties"]["points"]["items"].take();
        schema["properties"]["points"]["items"] =
            json!({ "anyOf": [statements, cost["properties"]["points"]["items"]] });
    }
    schema
}

/// The OpenAPI 3.1 document of `/api/`.
pub fn document() -> Value {
    let error = json!({ "$ref": "#/components/schemas/Error" });
    let failures = |extra: &[(&str, &str)]| {
        let mut out = Map::new();
        for (status, why) in [
            ("400", "A parameter is wrong or unknown; the error names it"),
            ("401", "No token, or one the collector does not take (or no session cookie)"),
            ("403", "The token's role may not do this"),
            ("429", "Too many failed sign-ins from this address; retry after Retry-After"),
            ("503", "The store is down or the answer took too long; worth retrying"),
        ]
        .iter()
        .chain(extra)
        {
            out.insert(
                (*status).to_string(),
                json!({ "description": why, "content": { "application/json": { "schema": error } } }),
            );
        }
        out
    };
    let mut paths = Map::new();
    for endpoint in ENDPOINTS {
        let parameters: Vec<Value> = endpoint
            .takes()
            .map(|name| {
                let (schema, description) = parameter(name);
                json!({ "name": name, "in": "query", "required": false, "schema": schema, "description": description })
            })
            .collect();
        let mut responses = failures(&[]);
        responses.insert(
            "200".into(),
            json!({ "description": "The answer", "content": { "application/json": { "schema": answer_schema(endpoint) } } }),
        );
        let operation = endpoint.path.trim_start_matches("/api/");
        paths.insert(
            endpoint.path.to_string(),
            json!({ "get": {
                "operationId": operation,
                "summary": endpoint.summary,
                "parameters": parameters,
                "responses": responses,
            } }),
        );
    }
    let marker = |e| sqlbee_proto::json::annotations_json(&[example::<Annotation>("Annotation", e)]);
    let mut created = failures(&[
        ("408", "The body was too slow"),
        ("413", "The body is larger than a marker can be"),
        ("415", "The body is not `Content-Type: application/json`"),
    ]);
    created.insert(
        "201".into(),
        json!({ "description": "The marker, as stored", "content": { "application/json": {
            "schema": learned(marker) } } }),
    );
    paths["/api/annotations"]["post"] = json!({
        "operationId": "annotate",
        "summary": "Marks a deploy or a change on every plot (a token of the `annotate` role)",
        "requestBody": { "required": true, "content": { "application/json": { "schema": {
            "type": "object",
            "required": ["text"],
            "additionalProperties": false,
            "properties": {
                "text": { "type": "string", "description": "What happened" },
                "instances": { "type": "array", "items": { "type": "string" }, "description": "The instances it concerns; none: every instance" },
                "at_unix_ms": { "type": "integer", "description": "When, in milliseconds since the epoch; 0 or absent: now" },
            },
        } } } },
        "responses": created,
    });
    paths.insert(
        "/api/openapi.json".into(),
        json!({ "get": {
            "operationId": "openapi",
            "summary": "This document",
            "responses": { "200": { "description": "The OpenAPI document", "content": { "application/json": { "schema": { "type": "object" } } } } },
        } }),
    );
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "sqlbee collector HTTP API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The Query service's answers as JSON, in the shapes `sqlbee ... --format json` prints. \
                            Every call takes a read token as `Authorization: Bearer <token>` (or the web UI's \
                            session cookie) when the collector has tokens; marking takes one of the annotate role. \
                            Statement texts, samples and plans are redacted by the agents.",
        },
        "security": [{ "bearer": [] }],
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "schemas": { "Error": {
                "type": "object",
                "required": ["error"],
                "properties": { "error": { "type": "string", "description": "What went wrong, for a person" } },
            } },
        },
        "paths": paths,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_endpoint_has_a_learned_answer_and_known_parameters() {
        let doc = document();
        for endpoint in ENDPOINTS {
            let schema =
                &doc["paths"][endpoint.path]["get"]["responses"]["200"]["content"]["application/json"]["schema"];
            assert!(schema["type"].is_string(), "{}: {schema}", endpoint.path);
            for name in endpoint.takes() {
                assert_ne!(parameter(name).1, "undocumented", "{} {name}", endpoint.path);
            }
            // Its own examples hold to what was learned from them.
            for e in [Example::Full, Example::Other].into_iter().chain(Example::sparse()) {
                let errors = sqlbee_proto::json_schema::validate(&answer_schema(endpoint), &(endpoint.answer)(e));
                assert!(errors.is_empty(), "{}: {errors:?}", endpoint.path);
            }
        }
        assert!(doc["paths"]["/api/annotations"]["post"]["requestBody"].is_object());
    }
}
