//! What a collector holds at most for what callers send, as one table for
//! the manual's limits page (`sqlbee reference` writes it from these very
//! constants, so the page cannot drift from the code).
use std::fmt::Write as _;

use super::{
    admission, annotate, detect, detect::webhook, http, live, ownership, query_api, store::answer_budget, throttle,
};

fn mib(bytes: usize) -> String {
    format!("{} MiB", bytes >> 20)
}

fn secs(d: std::time::Duration) -> String {
    format!("{} s", d.as_secs())
}

/// The table, in Markdown.
pub fn table() -> String {
    let rows: Vec<(&str, String, &str)> = vec![
        (
            "Live activity, all instances",
            mib(live::MAX_BYTES),
            "counted decoded (structs and strings); a report past it is refused whole (RESOURCE_EXHAUSTED)",
        ),
        ("Live activity, one agent", mib(live::MAX_BYTES_PER_AGENT), "so one agent cannot take the others' room"),
        ("Live activity, instances", live::MAX_INSTANCES.to_string(), ""),
        (
            "Live activity, connections answered per instance",
            live::MAX_ANSWERED.to_string(),
            "the longest-running; the rest counted in `more_connections`",
        ),
        (
            "Live activity before the instance's first window",
            "refused".into(),
            "FAILED_PRECONDITION: only windows claim an instance",
        ),
        (
            "Blocking tree depth",
            query_api::json::MAX_CHAIN_DEPTH.to_string(),
            "deeper waiters counted in `more_blocked`",
        ),
        (
            "Instances one agent speaks for",
            ownership::MAX_PER_AGENT.to_string(),
            "a claim past it is RESOURCE_EXHAUSTED",
        ),
        ("Instances with an owner, all agents", ownership::MAX_OWNERS.to_string(), ""),
        ("Push body: time to first judgement", secs(admission::BODY_GRACE), ""),
        (
            "Push body: average rate after that",
            format!("{} KiB/s", admission::MIN_BODY_RATE / 1024),
            "cut with UNAVAILABLE, which agents retry",
        ),
        ("Push body: pause between bytes", secs(admission::BODY_STALL), "whatever was sent before"),
        ("Push body: whole within", secs(admission::BODY_DEADLINE), ""),
        ("Web UI connections, all", http::server::MAX_CONNECTIONS.to_string(), ""),
        ("Web UI connections, one client address", http::server::MAX_PER_ADDRESS.to_string(), ""),
        (
            "Web UI spare places for `/healthz`",
            http::server::HEALTH_SPARE.to_string(),
            "when every place is taken; anything else is answered 503",
        ),
        ("Web UI answer left unread", secs(http::server::WRITE_STALL), "the connection is closed"),
        (
            "Web UI store calls at once",
            http::UI_QUERIES_IN_FLIGHT.to_string(),
            "one at a time per client address: a reader waits for its own previous call, not for others'",
        ),
        (
            "Top, lock waits, long statements and live activity answers",
            mib(answer_budget::ANSWER_BYTES),
            "counted encoded as each row is built, in order (rank, newest first, instance name); the rest counted in `left_out` (gRPC, `/api/top`, `/api/activity`, the CLI's stderr, the pages)",
        ),
        (
            "Digest text in comparisons and tables",
            format!("{} KiB", answer_budget::LEAN_TEXT_BYTES / 1024),
            "cut with `…`: those reads hold every digest of two ranges",
        ),
        ("Web UI request head, and an idle connection", secs(http::server::HEADER_TIMEOUT), ""),
        ("Web UI answer ready within", secs(http::server::REQUEST_DEADLINE), ""),
        ("Web UI connection, whole life", secs(http::server::CONNECTION_DEADLINE), ""),
        (
            "Web UI host names",
            "IP addresses, `localhost`, `--http-host`".into(),
            "others are answered 421 (DNS rebinding)",
        ),
        (
            "Refused tokens per client address",
            format!("{} a minute", throttle::MAX_REFUSED),
            "gRPC, `/api/` and sign-in together; then RESOURCE_EXHAUSTED or 429 until the minute ends, one log line per address and minute",
        ),
        (
            "Token entropy",
            format!("{} bits", crate::auth::MIN_TOKEN_BITS as u32),
            "estimated from its characters; a weaker token is refused when the tokens file is read",
        ),
        (
            "Markers per token",
            format!("{} an hour", annotate::MAX_PER_HOUR),
            "without control or direction-changing characters",
        ),
        (
            "Instances judged per detection round",
            detect::MAX_JUDGED.to_string(),
            "a larger fleet in turns: each round the next slice of the sorted names, the same on every collector",
        ),
        ("Webhook events waiting, one instance", webhook::PER_INSTANCE.to_string(), "instances take turns"),
        (
            "Webhook events waiting, all",
            webhook::QUEUE.to_string(),
            "the body carries no text an agent chose but the redacted digest",
        ),
    ];
    let mut out = String::from("| what | bound | notes |\n|---|---|---|\n");
    for (what, bound, notes) in rows {
        let _ = writeln!(out, "| {what} | {bound} | {notes} |");
    }
    out
}
