//! `--webhook URL`: each event the detection writes (opened or closed) is
//! posted as JSON: `{"status": "opened" | "closed", "event": {...}}`.
//! Delivery never holds up detection or ingest: events wait in bounded
//! queues, one per instance, and one task posts them taking each instance
//! in turn, so one instance's flood (an agent's thousands of plan changes)
//! cannot keep another instance's alert waiting or push it out. A failed
//! post is retried a few times with a growing pause; what does not fit or
//! keeps failing is dropped with a warning (the event stays in the store,
//! `sqlbee events` lists it). Several collectors on one store each post
//! what their own rounds write: a receiver tells repeats apart by
//! `event.id` and `status`.
//!
//! The body carries what the collector computed and the names an agent's
//! windows were validated under (instance, schema, the redacted digest
//! text), never free text an agent chose (an event's evidence may quote a
//! plan): the receiver is often a chat room.
use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::json;
use sqlbee_proto::v1::Event;
use tokio::sync::Notify;

use sqlbee_proto::json::events_json;

/// Events of one instance waiting to be posted; more of it are dropped.
pub const PER_INSTANCE: usize = 100;
/// Events waiting in all; more are dropped.
pub const QUEUE: usize = 1_000;
/// Tries per event, the pause doubling from `FIRST_PAUSE` between them.
const TRIES: u32 = 5;
const FIRST_PAUSE: Duration = Duration::from_secs(1);
/// One post's whole deadline.
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
#[error("--webhook {url:?}: expected an http:// or https:// URL")]
pub struct WebhookError {
    url: String,
}

/// Where events go; clones share the queues.
#[derive(Clone)]
pub struct Webhook {
    queues: Arc<Queues>,
}

/// Waiting events per instance, and the order instances take turns in.
#[derive(Default)]
struct Queues {
    waiting: Mutex<Waiting>,
    ready: Notify,
}

#[derive(Default)]
struct Waiting {
    by_instance: HashMap<String, VecDeque<Event>>,
    /// Instances with events waiting, in the order they are served.
    turns: VecDeque<String>,
    total: usize,
}

impl Waiting {
    /// Queues `event` unless its instance's queue or the whole is full.
    fn push(&mut self, event: Event) -> Result<(), &'static str> {
        if self.total >= QUEUE {
            return Err("the queue is full (the receiver is down or slow)");
        }
        let queue = self.by_instance.entry(event.instance.clone()).or_default();
        if queue.len() >= PER_INSTANCE {
            return Err("this instance has too many events waiting");
        }
        if queue.is_empty() {
            self.turns.push_back(event.instance.clone());
        }
        queue.push_back(event);
        self.total += 1;
        Ok(())
    }

    /// The next event: the first of the instance whose turn it is, which
    /// then goes to the back of the line.
    fn pop(&mut self) -> Option<Event> {
        let instance = self.turns.pop_front()?;
        let queue = self.by_instance.get_mut(&instance)?;
        let event = queue.pop_front()?;
        if queue.is_empty() {
            self.by_instance.remove(&instance);
        } else {
            self.turns.push_back(instance);
        }
        self.total -= 1;
        Some(event)
    }
}

/// The URL's scheme and host, for logs: the rest of a webhook URL is often
/// its secret.
fn shown(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = host.rsplit('@').next().unwrap_or(host);
    format!("{scheme}://{host}/…")
}

impl Webhook {
    /// Checks the URL and starts the task that posts (on the current
    /// runtime).
    pub fn start(url: &str) -> Result<Webhook, WebhookError> {
        let url = url.trim().to_string();
        let valid = (url.starts_with("http://") || url.starts_with("https://")) && url.parse::<hyper::Uri>().is_ok();
        if !valid {
            return Err(WebhookError { url: shown(&url) });
        }
        let queues = Arc::new(Queues::default());
        tokio::spawn(deliver(url, queues.clone()));
        Ok(Webhook { queues })
    }

    /// Queues `events`; never waits.
    pub fn offer(&self, events: &[Event]) {
        let mut waiting = self.queues.waiting.lock().unwrap_or_else(|e| e.into_inner());
        for event in events {
            if let Err(why) = waiting.push(event.clone()) {
                tracing::warn!(
                    id = format!("{:016x}", event.id),
                    instance = event.instance,
                    queue = QUEUE,
                    per_instance = PER_INSTANCE,
                    "webhook: {why}; this event is not posted"
                );
            }
        }
        drop(waiting);
        self.queues.ready.notify_one();
    }
}

/// The body posted for one event: the event as `sqlbee events --format
/// json` shows it, less what an agent could have written into it.
pub fn body(event: &Event) -> String {
    let status = if event.closed_unix_ms == 0 { "opened" } else { "closed" };
    let shape = events_json(std::slice::from_ref(event));
    let mut event_json = shape["events"][0].clone();
    if let Some(fields) = event_json.as_object_mut() {
        fields.remove("evidence");
    }
    json!({"status": status, "event": event_json}).to_string()
}

async fn deliver(url: String, queues: Arc<Queues>) {
    let agent: ureq::Agent =
        ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(TIMEOUT)).build().into();
    let target = shown(&url);
    loop {
        let next = queues.waiting.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let Some(event) = next else {
            queues.ready.notified().await;
            continue;
        };
        let payload = body(&event);
        let mut pause = FIRST_PAUSE;
        for attempt in 1..=TRIES {
            let (agent, url, payload) = (agent.clone(), url.clone(), payload.clone());
            let sent = tokio::task::spawn_blocking(move || {
                agent
                    .post(&url)
                    .header("Content-Type", "application/json")
                    .send(payload.as_bytes())
                    .map(|r| r.status().as_u16())
                    .map_err(|e| e.to_string())
            })
            .await
            .unwrap_or_else(|e| Err(e.to_string()));
            let again = match sent {
                Ok(status) if (200..300).contains(&status) => break,
                // The receiver refused this body: sending it again will not help.
                Ok(status) if (400..500).contains(&status) && status != 408 && status != 429 => {
                    tracing::warn!(%target, status, "webhook: the receiver refused an event; not retried");
                    break;
                }
                Ok(status) => format!("status {status}"),
                Err(error) => error,
            };
            if attempt == TRIES {
                tracing::warn!(%target, error = %again, tries = TRIES, id = format!("{:016x}", event.id),
                    "webhook: giving up on an event");
                break;
            }
            tracing::debug!(%target, error = %again, attempt, "webhook: post failed; retrying");
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_name_the_host_not_the_secret() {
        assert_eq!(shown("https://hooks.example.com/services/T0/B0/s3cret"), "https://hooks.example.com/…");
        assert_eq!(shown("http://user:pw@alerts.local:9093/hook?token=x"), "http://alerts.local:9093/…");
    }

    #[test]
    fn a_body_says_whether_the_event_opened_or_closed() {
        let event = Event { id: 0xab, kind: "regressed".into(), opened_unix_ms: 5, ..Default::default() };
        let opened: serde_json::Value = serde_json::from_str(&body(&event)).unwrap();
        assert_eq!(
            (opened["status"].as_str(), opened["event"]["id"].as_str()),
            (Some("opened"), Some("00000000000000ab"))
        );
        let closed = Event { closed_unix_ms: 9, ..event };
        assert_eq!(serde_json::from_str::<serde_json::Value>(&body(&closed)).unwrap()["status"], "closed");
    }

    fn event(instance: &str, id: u64) -> Event {
        Event { id, instance: instance.into(), kind: "plan_changed".into(), ..Default::default() }
    }

    #[test]
    fn one_instances_flood_neither_fills_the_queue_nor_delays_another() {
        let mut waiting = Waiting::default();
        let refused = (0..2_000).filter(|i| waiting.push(event("flood:3306", *i)).is_err()).count();
        assert_eq!(refused, 2_000 - PER_INSTANCE, "the flood keeps only its own share");
        waiting.push(event("quiet:3306", 9_999)).unwrap();
        let first_two: Vec<String> = (0..2).filter_map(|_| waiting.pop()).map(|e| e.instance).collect();
        assert_eq!(first_two, ["flood:3306", "quiet:3306"], "instances take turns");
        let mut left = 0;
        while waiting.pop().is_some() {
            left += 1;
        }
        assert_eq!(left, PER_INSTANCE - 1);
        assert_eq!(waiting.total, 0);
    }

    #[test]
    fn a_body_carries_no_text_an_agent_wrote() {
        let event = Event {
            id: 1,
            instance: "db:3306".into(),
            kind: "plan_changed".into(),
            digest_text: "SELECT ? FROM `t`".into(),
            evidence: "key `<script>alert(1)</script>` chosen".into(),
            ..Default::default()
        };
        let posted = body(&event);
        assert!(!posted.contains("script") && !posted.contains("evidence"), "{posted}");
        assert!(posted.contains("SELECT ? FROM `t`"), "{posted}");
    }
}
