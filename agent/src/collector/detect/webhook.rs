//! `--webhook URL`: each event the detection writes (opened or closed) is
//! posted as JSON, as `sqlbee events --format json` shows one:
//! `{"status": "opened" | "closed", "event": {...}}`. Delivery never holds
//! up detection or ingest: events wait in a bounded queue, one task posts
//! them in order, retrying a failed post a few times with a growing pause;
//! what does not fit or keeps failing is dropped with a warning (the event
//! stays in the store, `sqlbee events` lists it). Several collectors on one
//! store each post what their own rounds write: a receiver tells repeats
//! apart by `event.id` and `status`.
use std::time::Duration;

use serde_json::json;
use sqlbee_proto::v1::Event;
use tokio::sync::mpsc;

use crate::collector::query_api::json::events_json;

/// Events waiting to be posted; more are dropped.
const QUEUE: usize = 1_000;
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

/// Where events go; clones share the queue.
#[derive(Clone)]
pub struct Webhook {
    queue: mpsc::Sender<Event>,
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
        let (queue, events) = mpsc::channel(QUEUE);
        tokio::spawn(deliver(url, events));
        Ok(Webhook { queue })
    }

    /// Queues `events`; never waits.
    pub fn offer(&self, events: &[Event]) {
        for event in events {
            if self.queue.try_send(event.clone()).is_err() {
                tracing::warn!(
                    id = format!("{:016x}", event.id),
                    queue = QUEUE,
                    "webhook: the queue is full (the receiver is down or slow); this event is not posted"
                );
            }
        }
    }
}

/// The body posted for one event.
pub fn body(event: &Event) -> String {
    let status = if event.closed_unix_ms == 0 { "opened" } else { "closed" };
    let shape = events_json(std::slice::from_ref(event));
    json!({"status": status, "event": shape["events"][0]}).to_string()
}

async fn deliver(url: String, mut events: mpsc::Receiver<Event>) {
    let agent: ureq::Agent =
        ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(TIMEOUT)).build().into();
    let target = shown(&url);
    while let Some(event) = events.recv().await {
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
}
