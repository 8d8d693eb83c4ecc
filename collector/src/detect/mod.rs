//! Continuous detection: every `--detect-every`, the collector compares
//! each instance's recent range (`--detect-window`) with its baseline and
//! records what changed as events (`rules`): regressions, new digests and
//! plan changes. The baseline is the same range a day earlier when the
//! store holds statements of the instance then, and otherwise the
//! `--detect-baseline` just before the recent range.
//!
//! It reads and writes through the store only, so any number of
//! collectors may run it on one store: rounds fall on multiples of the
//! interval, and an event's id names its round, so two collectors write
//! the same events. A failed round is logged and the next one runs as
//! usual; detection never holds up ingest (its reads run on the blocking
//! pool like a query's).
pub mod exposition;
pub mod rules;
pub mod webhook;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use sqlbee_proto::v1::{DigestChange, Event, TopDigest};
use sqlbee_vocabulary::clock::now_unix_ms;

use super::{
    query_api::{
        blame,
        diff::{self, Thresholds},
    },
    store::{EventsQuery, OrderBy, PlansQuery, Store, StoreError, TopQuery, rollup::DAY_MS},
};

/// Digests compared per instance and round: the busiest by total time.
const MAX_DIGESTS: usize = 10_000;
/// Open events read per round.
const MAX_OPEN: usize = 10_000;
/// Instances judged per round. A larger fleet is judged in turns: round
/// `n` judges slice `n` mod the number of slices of the sorted names, the
/// same slice on every collector of a store, so a round's cost stays
/// bounded however many instances agents report (each instance is read
/// two or three times a round).
pub const MAX_JUDGED: usize = 500;

#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Zero: no detection.
    pub every: Duration,
    pub window: Duration,
    pub baseline: Duration,
    pub thresholds: Thresholds,
}

/// Open events by (kind, instance), as of the newest round: what the
/// collector's `/metrics` serves.
#[derive(Default)]
pub struct OpenEvents {
    counts: Mutex<Option<BTreeMap<(String, String), u64>>>,
    rounds: std::sync::atomic::AtomicU64,
    failed: std::sync::atomic::AtomicU64,
}

impl OpenEvents {
    /// None before the first round.
    pub fn counts(&self) -> Option<BTreeMap<(String, String), u64>> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, counts: BTreeMap<(String, String), u64>) {
        *self.counts.lock().unwrap_or_else(|e| e.into_inner()) = Some(counts);
    }

    /// (rounds run, rounds failed) since start.
    pub fn rounds(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.rounds.load(Relaxed), self.failed.load(Relaxed))
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

pub async fn run(store: Arc<dyn Store>, settings: Settings, open: Arc<OpenEvents>, webhook: Option<webhook::Webhook>) {
    let every = ms(settings.every);
    if every <= 0 {
        return;
    }
    tracing::info!(
        every_s = every / 1000,
        window_s = ms(settings.window) / 1000,
        baseline_s = ms(settings.baseline) / 1000,
        "detection on"
    );
    loop {
        // Rounds fall on multiples of the interval, for every collector.
        let now = now_unix_ms();
        let at = (now.div_euclid(every) + 1) * every;
        tokio::time::sleep(Duration::from_millis((at - now).max(0) as u64)).await;
        let store = store.clone();
        let started = std::time::Instant::now();
        let outcome = tokio::task::spawn_blocking(move || round(store.as_ref(), &settings, at)).await;
        use std::sync::atomic::Ordering::Relaxed;
        open.rounds.fetch_add(1, Relaxed);
        match outcome {
            Ok(Ok(Outcome { written, open_counts: counts, instances, waiting })) => {
                tracing::info!(
                    instances,
                    waiting,
                    events_written = written.len(),
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "detection round"
                );
                if let Some(webhook) = &webhook {
                    webhook.offer(&written);
                }
                open.set(counts);
            }
            Ok(Err(error)) => {
                open.failed.fetch_add(1, Relaxed);
                tracing::warn!(%error, "detection round failed; the next one runs as usual");
            }
            Err(error) => {
                open.failed.fetch_add(1, Relaxed);
                tracing::warn!(%error, "detection task failed");
            }
        }
    }
}

fn top(
    store: &dyn Store,
    instance: &str,
    range: (i64, i64),
    digest: Option<(u64, &str)>,
) -> Result<Vec<TopDigest>, StoreError> {
    store.top_lean(&TopQuery {
        instance: Some(instance.to_string()),
        digest: digest.map(|d| d.0),
        schema: digest.map(|d| d.1.to_string()),
        nested: false,
        program: None,
        since_unix_ms: range.0,
        until_unix_ms: range.1,
        order_by: OrderBy::Total,
        limit: MAX_DIGESTS,
    })
}

/// Every instance's open events.
fn open_events(store: &dyn Store) -> Result<Vec<Event>, StoreError> {
    store.events(&EventsQuery {
        instance: None,
        kind: None,
        since_unix_ms: 0,
        until_unix_ms: i64::MAX,
        open_only: true,
        limit: MAX_OPEN,
    })
}

fn length((since, until): (i64, i64)) -> i64 {
    until - since
}

/// What one round did.
pub struct Outcome {
    pub written: Vec<Event>,
    /// Open events by (kind, instance) after the round.
    pub open_counts: BTreeMap<(String, String), u64>,
    /// Instances judged (those with a window in the recent range, in
    /// their turn).
    pub instances: usize,
    /// Instances left for later rounds (see `MAX_JUDGED`).
    pub waiting: usize,
}

/// One round at `at`.
pub fn round(store: &dyn Store, settings: &Settings, at: i64) -> Result<Outcome, StoreError> {
    let window = ms(settings.window);
    let recent = (at - window, at);
    let all_open = open_events(store)?;
    // Instances with a window in the recent range, and those with open
    // events even if they fell silent: their events close.
    let mut instances: Vec<String> = store
        .instances()?
        .into_iter()
        .filter(|i| i.last_window_end_unix_ms >= recent.0)
        .map(|i| i.instance)
        .chain(all_open.iter().map(|e| e.instance.clone()))
        .collect();
    instances.sort();
    instances.dedup();
    let waiting = judged_in_turn(&mut instances, at, ms(settings.every));
    let mut written = Vec::new();
    for instance in &instances {
        let after = top(store, instance, recent, None)?;
        let day_before = (recent.0 - DAY_MS, recent.1 - DAY_MS);
        let mut baseline = day_before;
        let mut before = top(store, instance, day_before, None)?;
        if before.is_empty() {
            baseline = (recent.0 - ms(settings.baseline), recent.0);
            before = top(store, instance, baseline, None)?;
        }
        let mut changes = diff::compare(&before, &after, (length(baseline), length(recent)), settings.thresholds);
        // A regression opens on the first round that shows it, and the
        // round before may have seen its first slow statements without
        // enough of them: a change up to one window before the recent range
        // (the tail of an adjacent baseline) can be behind it.
        let blamed_since = baseline.1.min(recent.0 - window);
        blame::name_changes(store, Some(instance), (blamed_since, recent.1), &mut changes)?;
        let open: Vec<Event> = all_open.iter().filter(|e| e.instance == *instance).cloned().collect();
        let mut rechecks: HashMap<u64, Option<DigestChange>> = HashMap::new();
        for event in open.iter().filter(|e| e.kind == "regressed") {
            let own = (event.before_since_unix_ms, event.before_until_unix_ms);
            let key = Some((event.digest, event.schema.as_str()));
            let (b, a) = (top(store, instance, own, key)?, top(store, instance, recent, key)?);
            let change = diff::compare(&b, &a, (length(own), length(recent)), settings.thresholds).into_iter().next();
            rechecks.insert(event.id, change);
        }
        let plan_changes = store
            .plans(&PlansQuery {
                digest: None,
                schema: None,
                instance: Some(instance.clone()),
                since_unix_ms: recent.0,
                until_unix_ms: recent.1,
                limit: MAX_OPEN,
            })?
            .changes;
        let known: HashSet<u64> = if plan_changes.is_empty() {
            HashSet::new()
        } else {
            store
                .events(&EventsQuery {
                    instance: Some(instance.clone()),
                    kind: Some("plan_changed".into()),
                    since_unix_ms: recent.0,
                    until_unix_ms: i64::MAX,
                    open_only: false,
                    limit: MAX_OPEN,
                })?
                .into_iter()
                .map(|e| e.id)
                .collect()
        };
        let round = rules::Round {
            instance: instance.clone(),
            at_unix_ms: at,
            recent,
            baseline,
            has_baseline: !before.is_empty(),
            thresholds: settings.thresholds,
        };
        let events = rules::decide(&round, &changes, &open, &rechecks, &plan_changes, &known);
        for e in &events {
            tracing::info!(instance = %e.instance, kind = %e.kind, digest = format!("{:016x}", e.digest),
                schema = %e.schema, closed = e.closed_unix_ms != 0, because = %e.closed_because,
                evidence = %e.evidence, "event");
        }
        store.put_events(&events)?;
        written.extend(events);
    }
    let mut counts = BTreeMap::new();
    for e in open_events(store)? {
        *counts.entry((e.kind, e.instance)).or_insert(0) += 1;
    }
    Ok(Outcome { written, open_counts: counts, instances: instances.len(), waiting })
}

/// Keeps of `sorted` the slice of at most `MAX_JUDGED` whose turn the round
/// at `at` is (rounds `every` apart); how many others wait for theirs.
fn judged_in_turn(sorted: &mut Vec<String>, at: i64, every: i64) -> usize {
    let total = sorted.len();
    if total <= MAX_JUDGED {
        return 0;
    }
    let slices = total.div_ceil(MAX_JUDGED);
    let turn = (at.div_euclid(every.max(1)).rem_euclid(slices as i64)) as usize;
    let start = turn * MAX_JUDGED;
    sorted.truncate((start + MAX_JUDGED).min(total));
    sorted.drain(..start);
    total - sorted.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SqliteStore;

    #[test]
    fn an_instance_that_fell_silent_has_its_events_closed() {
        let dir = std::env::temp_dir().join(format!("sqlbee-detect-silent-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = SqliteStore::open(&dir.join("store.db")).unwrap();
        let at = 10 * DAY_MS;
        let open = Event {
            id: 1,
            instance: "gone:3306".into(),
            kind: "regressed".into(),
            digest: 7,
            opened_unix_ms: at - 600_000,
            before_since_unix_ms: at - 4_200_000,
            before_until_unix_ms: at - 600_000,
            updated_unix_ms: at - 600_000,
            ..Default::default()
        };
        store.put_events(std::slice::from_ref(&open)).unwrap();
        let settings = Settings {
            every: Duration::from_secs(300),
            window: Duration::from_secs(900),
            baseline: Duration::from_secs(3600),
            thresholds: Thresholds::default(),
        };
        let outcome = round(&store, &settings, at).unwrap();
        assert_eq!(outcome.instances, 1, "judged for its open event alone");
        assert_eq!(outcome.written.len(), 1);
        assert_eq!((outcome.written[0].id, outcome.written[0].closed_unix_ms), (1, at));
        assert!(outcome.written[0].closed_because.starts_with("no statement"), "{:?}", outcome.written[0]);
        assert!(outcome.open_counts.is_empty());
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn a_large_fleet_is_judged_in_turns_every_instance_once() {
        let every = 300_000;
        let names: Vec<String> = (0..MAX_JUDGED * 2 + 7).map(|n| format!("db-{n:05}:3306")).collect();
        let mut seen = Vec::new();
        for round in 0..3 {
            let mut turn = names.clone();
            let waiting = judged_in_turn(&mut turn, (1_000 + round) * every, every);
            assert!(turn.len() <= MAX_JUDGED && !turn.is_empty());
            assert_eq!(waiting + turn.len(), names.len());
            seen.extend(turn);
        }
        seen.sort();
        assert_eq!(seen, names, "three rounds judge each of the 1,007 once");
        let mut small = names[..MAX_JUDGED].to_vec();
        assert_eq!(judged_in_turn(&mut small, every, every), 0);
        assert_eq!(small.len(), MAX_JUDGED, "a fleet that fits is judged whole every round");
    }
}
