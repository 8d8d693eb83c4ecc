//! The Annotate service: markers for deploys and changes, which CI or a
//! person writes with a token of the `annotate` role (see `auth`). A marker
//! is a line of text at a time, for the whole fleet or some instances; it
//! is stored as given and shown on every plot, so it is checked here: one
//! printable line without control or direction-changing characters (which
//! could make a marker read as something else), a bounded number of
//! instances, and at most `MAX_PER_HOUR` markers per token and hour, so one
//! token cannot bury the real markers under its own.
use std::{
    collections::{HashMap, VecDeque},
    hash::BuildHasher,
    sync::{Arc, Mutex},
};

use sqlbee_proto::v1::{AnnotateRequest, Annotation, annotate_server};
use sqlbee_vocabulary::clock::now_unix_ms;
use tonic::{Request, Response, Status};

use super::{store::Store, store_task::blocking};

/// A marker's text, in characters.
pub const MAX_TEXT_CHARS: usize = 1_000;
/// Instances one marker may name.
pub const MAX_INSTANCES: usize = 256;
/// How far from the collector's clock a marker may be placed: a marker for
/// last week's deploy is fine, one a century away is a mistake.
const MAX_SKEW_MS: i64 = 366 * 24 * 3600 * 1000;
/// Markers one token may write per hour: deploys, with room.
pub const MAX_PER_HOUR: usize = 60;
const HOUR_MS: i64 = 3_600_000;
/// Tokens whose writes are remembered at once.
const MAX_WRITERS: usize = 10_000;

pub struct AnnotateService {
    store: Arc<dyn Store>,
    budget: MarkerBudget,
}

/// When each token (by fingerprint; 0 without tokens) wrote its markers of
/// the last hour.
#[derive(Default)]
struct MarkerBudget {
    written: Mutex<HashMap<u64, VecDeque<i64>>>,
}

impl MarkerBudget {
    /// Counts a marker of `token` at `now_unix_ms`, or refuses it past the
    /// token's hourly share.
    fn charge(&self, token: u64, now_unix_ms: i64) -> Result<(), Status> {
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        if written.len() >= MAX_WRITERS && !written.contains_key(&token) {
            written.retain(|_, times| times.back().is_some_and(|t| now_unix_ms - t < HOUR_MS));
        }
        let times = written.entry(token).or_default();
        while times.front().is_some_and(|t| now_unix_ms - t >= HOUR_MS) {
            times.pop_front();
        }
        if times.len() >= MAX_PER_HOUR {
            let wait_s = times.front().map_or(0, |t| (t + HOUR_MS - now_unix_ms) / 1000);
            return Err(Status::resource_exhausted(format!(
                "this token wrote {MAX_PER_HOUR} markers in the last hour, at most that many; the next may come in \
                 {wait_s} s"
            )));
        }
        times.push_back(now_unix_ms);
        Ok(())
    }
}

impl AnnotateService {
    pub fn new(store: Arc<dyn Store>) -> AnnotateService {
        AnnotateService { store, budget: MarkerBudget::default() }
    }

    /// Stores the marker `request` describes, at `now_unix_ms` unless it
    /// names a time, for the caller whose token has this fingerprint (0
    /// without tokens); the web UI's `POST /api/annotations` calls this too.
    pub async fn annotate(&self, request: AnnotateRequest, now_unix_ms: i64, token: u64) -> Result<Annotation, Status> {
        let annotation = marker(request, now_unix_ms)?;
        self.budget.charge(token, now_unix_ms)?;
        let store = self.store.clone();
        let stored = annotation.clone();
        blocking(move || store.annotate(&stored)).await?;
        tracing::info!(id = format!("{:016x}", annotation.id), at = annotation.at_unix_ms, text = %annotation.text,
            instances = annotation.instances.len(), "marker stored");
        Ok(annotation)
    }
}

/// The marker a request asks for, or why it is refused.
pub fn marker(request: AnnotateRequest, now_unix_ms: i64) -> Result<Annotation, Status> {
    let text = request.text.trim();
    if text.is_empty() {
        return Err(Status::invalid_argument("text: a marker needs a text (\"deploy v2.3\")"));
    }
    if text.chars().count() > MAX_TEXT_CHARS {
        return Err(Status::invalid_argument(format!("text: longer than {MAX_TEXT_CHARS} characters")));
    }
    if text.chars().any(hidden) {
        return Err(Status::invalid_argument(
            "text: one line, without control characters or characters that change the text's direction",
        ));
    }
    if request.instances.len() > MAX_INSTANCES {
        return Err(Status::invalid_argument(format!("instances: more than {MAX_INSTANCES}")));
    }
    if let Some(bad) = request.instances.iter().find(|i| i.is_empty() || i.chars().any(hidden)) {
        return Err(Status::invalid_argument(format!("instances: {bad:?} is not an instance name")));
    }
    let at_unix_ms = match request.at_unix_ms {
        0 => now_unix_ms,
        at if at < 0 || (at - now_unix_ms).abs() > MAX_SKEW_MS => {
            return Err(Status::invalid_argument(format!(
                "at_unix_ms: {at} is more than a year from the collector's clock ({now_unix_ms})"
            )));
        }
        at => at,
    };
    let mut instances = request.instances;
    instances.sort();
    instances.dedup();
    Ok(Annotation {
        id: new_id(now_unix_ms),
        at_unix_ms,
        text: text.to_string(),
        instances,
        created_unix_ms: now_unix_ms,
    })
}

/// A character that is not what it shows: a control character, or one that
/// changes the direction text is drawn in (bidirectional overrides,
/// embeddings, isolates and marks) or is drawn as nothing.
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{061C}' | '\u{FEFF}')
}

/// Unique across collectors sharing a store: milliseconds in the high bits,
/// random low bits. Never 0, which requests use for "no id".
fn new_id(now_unix_ms: i64) -> u64 {
    let random = std::collections::hash_map::RandomState::new().hash_one(now_unix_ms) & ((1 << 22) - 1);
    (((now_unix_ms.max(0) as u64) << 22) | random).max(1)
}

#[tonic::async_trait]
impl annotate_server::Annotate for AnnotateService {
    async fn annotate(&self, request: Request<AnnotateRequest>) -> Result<Response<Annotation>, Status> {
        let token = request.extensions().get::<super::auth::Caller>().map_or(0, |c| c.token);
        Ok(Response::new(AnnotateService::annotate(self, request.into_inner(), now_unix_ms(), token).await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_one_bounded_line() {
        let ask = |text: &str, instances: &[&str], at: i64| AnnotateRequest {
            text: text.into(),
            instances: instances.iter().map(|s| s.to_string()).collect(),
            at_unix_ms: at,
        };
        let now = 1_800_000_000_000;
        let m = marker(ask("  deploy v2.3 ", &["b:3306", "a:3306", "b:3306"], 0), now).unwrap();
        assert_eq!(
            (m.text.as_str(), m.at_unix_ms, m.instances.clone()),
            ("deploy v2.3", now, vec!["a:3306".into(), "b:3306".into()])
        );
        assert_ne!(m.id, marker(ask("deploy v2.3", &[], 0), now).unwrap().id, "two markers, two ids");
        assert_eq!(marker(ask("x", &[], now - 3_600_000), now).unwrap().at_unix_ms, now - 3_600_000);
        for (request, field) in [
            (ask(" ", &[], 0), "text"),
            (ask("a\nb", &[], 0), "text"),
            (ask(&"x".repeat(MAX_TEXT_CHARS + 1), &[], 0), "text"),
            (ask("x", &[""], 0), "instances"),
            (ask("deploy \u{202E}3.2v", &[], 0), "text"),
            (ask("a\u{2066}b", &[], 0), "text"),
            (ask("x", &["db\u{200F}:3306"], 0), "instances"),
            (ask("x", &[], 1), "at_unix_ms"),
        ] {
            let refused = marker(request, now).unwrap_err();
            assert_eq!(refused.code(), tonic::Code::InvalidArgument);
            assert!(refused.message().starts_with(field), "{}", refused.message());
        }
    }

    #[test]
    fn one_token_writes_its_share_of_markers_and_others_go_on() {
        let service = MarkerBudget::default();
        let now = 1_800_000_000_000;
        for i in 0..MAX_PER_HOUR as i64 {
            service.charge(7, now + i).unwrap();
        }
        let refused = service.charge(7, now + 100).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{}", refused.message());
        service.charge(8, now + 100).unwrap();
        service.charge(7, now + HOUR_MS).unwrap();
    }
}
