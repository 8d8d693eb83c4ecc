//! What changed on an instance, as events on its timeline (kind `change`):
//! each statement an agent saw change the server (`sqlbee.v1.Change`), and
//! each start of the server, with its build. An event's id comes from what
//! it records, so a replayed batch, or two collectors on one store, write
//! it once. A change opens when its statement started and closes when it
//! ended.
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use sqlbee_proto::v1::{Batch, Change, Event, ServerInstance};

use crate::store::{EventsQuery, Store, StoreError};

use sqlbee_proto::query_client::CHANGE_EVENT_KIND as KIND;

/// Instances whose newest start this process has recorded, at most this
/// many (past it the memory starts over; a start is then written again,
/// which changes nothing).
const MAX_REMEMBERED: usize = 100_000;

fn id_of(parts: &[&[u8]]) -> u64 {
    let mut bytes = Vec::new();
    for part in parts {
        bytes.extend_from_slice(part);
        bytes.push(0);
    }
    xxhash_rust::xxh3::xxh3_64(&bytes).max(1)
}

/// "by app@10.0.0.5 (migrate.py)" or "" when nobody is known: the
/// account, then the client's program, process or pod.
fn who(c: &Change) -> String {
    let mut out = String::new();
    if !c.user.is_empty() || !c.host.is_empty() {
        out = format!("by {}@{}", c.user, c.host);
    }
    if let Some(client) = &c.client {
        let program = [&client.program, &client.process, &client.pod].into_iter().find(|p| !p.is_empty());
        if let Some(program) = program {
            out = if out.is_empty() { format!("by {program}") } else { format!("{out} ({program})") };
        }
    }
    out
}

/// The action of a server's stop, as the agent reports it when the
/// server's process exits.
const SERVER_STOP: &str = "server stop";

/// Whether `c` records a start of the server (this module writes those).
fn is_start(c: &Change) -> bool {
    c.kind == "server" && c.action != SERVER_STOP && c.action.starts_with("server")
}

/// One statement's change as an event of `instance`.
fn statement_event(instance: &str, c: &Change) -> Event {
    let ended = c.start_unix_ms.saturating_add((c.duration_ns / 1_000_000) as i64).max(c.start_unix_ms.max(1));
    let mut evidence = c.action.clone();
    if c.kind == "server" && c.action == SERVER_STOP {
        evidence = format!(
            "server stopped: its process exited within {:.1} s after the agent last saw it running",
            c.duration_ns as f64 / 1e9
        );
    }
    if !c.objects.is_empty() {
        evidence.push(' ');
        evidence.push_str(&c.objects.join(", "));
    }
    let who = who(c);
    if !who.is_empty() {
        evidence.push(' ');
        evidence.push_str(&who);
    }
    if c.error_code != 0 {
        evidence.push_str(&format!(", failed with error {}", c.error_code));
    }
    for v in &c.values {
        evidence.push_str(&format!("; {}: {} -> {}", v.name, v.old, v.new));
    }
    Event {
        id: id_of(&[
            instance.as_bytes(),
            KIND.as_bytes(),
            &c.start_unix_ms.to_le_bytes(),
            &c.connection_id.to_le_bytes(),
            &c.digest.to_le_bytes(),
            &c.duration_ns.to_le_bytes(),
        ]),
        instance: instance.into(),
        kind: KIND.into(),
        schema: c.schema.clone(),
        digest: c.digest,
        digest_text: c.digest_text.clone(),
        opened_unix_ms: c.start_unix_ms,
        closed_unix_ms: ended,
        // A `SET GLOBAL` comes again with its values: that version wins.
        updated_unix_ms: c.start_unix_ms + i64::from(!c.values.is_empty()),
        closed_because: if c.error_code == 0 { "ran".into() } else { format!("error {}", c.error_code) },
        evidence,
        change: Some(c.clone()),
        ..Default::default()
    }
}

/// Every change statement of `batch`, as events.
pub fn statement_events(batch: &Batch) -> Vec<Event> {
    let mut out = Vec::new();
    for w in &batch.windows {
        let Some(instance) = &w.instance else { continue };
        out.extend(w.changes.iter().map(|c| statement_event(&instance.name, c)));
    }
    out
}

fn build_of(i: &ServerInstance) -> String {
    match (i.server_version.is_empty(), i.build_id.is_empty()) {
        (false, false) => format!("{} (build {})", i.server_version, &i.build_id[..i.build_id.len().min(12)]),
        (false, true) => i.server_version.clone(),
        (true, false) => format!("build {}", &i.build_id[..i.build_id.len().min(12)]),
        (true, true) => "unknown build".into(),
    }
}

/// The starts of the servers agents report, each recorded once.
#[derive(Default)]
pub struct ServerStarts {
    /// Instance -> the start time and build last recorded.
    seen: Mutex<HashMap<String, (i64, String)>>,
}

impl ServerStarts {
    /// Events for the starts in `batch` not recorded yet: `server start`
    /// for the first one a store holds of an instance, `server restart`
    /// after an earlier one, `server restart on another build` when the
    /// build changed. Starts before `oldest_unix_ms` (retention would
    /// delete them) are left out.
    pub fn events(&self, store: &Arc<dyn Store>, batch: &Batch, oldest_unix_ms: i64) -> Result<Vec<Event>, StoreError> {
        let mut out: Vec<Event> = Vec::new();
        for w in &batch.windows {
            let Some(i) = &w.instance else { continue };
            if i.start_time_unix_ms < oldest_unix_ms || i.start_time_unix_ms <= 0 {
                continue;
            }
            let build = build_of(i);
            let known = self.seen.lock().unwrap_or_else(|e| e.into_inner()).get(&i.name).cloned();
            if known.as_ref().is_some_and(|(at, _)| *at >= i.start_time_unix_ms)
                || out.iter().any(|e| e.instance == i.name && e.opened_unix_ms == i.start_time_unix_ms)
            {
                continue;
            }
            let previous = match known {
                Some(known) => Some(known),
                None => previous_start(store, &i.name, i.start_time_unix_ms)?,
            };
            if previous.as_ref().is_some_and(|(at, _)| *at == i.start_time_unix_ms) {
                self.remember(&i.name, i.start_time_unix_ms, build);
                continue;
            }
            let (action, evidence) = match &previous {
                None => ("server start", format!("server started: {build}")),
                Some((_, before)) if *before != build => {
                    ("server restart on another build", format!("server restarted: {build}, was {before}"))
                }
                Some(_) => ("server restart", format!("server restarted: {build}")),
            };
            let change = Change {
                kind: "server".into(),
                action: action.into(),
                objects: vec![build.clone()],
                start_unix_ms: i.start_time_unix_ms,
                ..Default::default()
            };
            out.push(Event {
                id: id_of(&[i.name.as_bytes(), b"server", &i.start_time_unix_ms.to_le_bytes()]),
                instance: i.name.clone(),
                kind: KIND.into(),
                opened_unix_ms: i.start_time_unix_ms,
                closed_unix_ms: i.start_time_unix_ms,
                updated_unix_ms: i.start_time_unix_ms,
                closed_because: "ran".into(),
                evidence,
                change: Some(change),
                ..Default::default()
            });
        }
        Ok(out)
    }

    /// After `events` were stored: they need not be written again.
    pub fn recorded(&self, events: &[Event]) {
        for e in events.iter().filter(|e| e.change.as_ref().is_some_and(is_start)) {
            let build = e.change.as_ref().and_then(|c| c.objects.first()).cloned().unwrap_or_default();
            self.remember(&e.instance, e.opened_unix_ms, build);
        }
    }

    fn remember(&self, instance: &str, at: i64, build: String) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() >= MAX_REMEMBERED && !seen.contains_key(instance) {
            seen.clear();
        }
        let entry = seen.entry(instance.to_string()).or_insert((at, build.clone()));
        if entry.0 <= at {
            *entry = (at, build);
        }
    }
}

/// The newest server start the store holds of `instance` at or before
/// `before`: its time and build.
fn previous_start(store: &Arc<dyn Store>, instance: &str, before: i64) -> Result<Option<(i64, String)>, StoreError> {
    let events = store.events(&EventsQuery {
        instance: Some(instance.into()),
        kind: Some(KIND.into()),
        since_unix_ms: 0,
        until_unix_ms: before.saturating_add(1),
        open_only: false,
        limit: 1_000,
    })?;
    Ok(events
        .iter()
        .filter(|e| e.change.as_ref().is_some_and(is_start))
        .max_by_key(|e| e.opened_unix_ms)
        .map(|e| (e.opened_unix_ms, e.change.as_ref().and_then(|c| c.objects.first()).cloned().unwrap_or_default())))
}
