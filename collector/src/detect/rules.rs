//! What one detection round decides for one instance, from what the store
//! answered: which events open and which close. Pure, so every rule is
//! tested without a store.
//!
//! - A digest the two ranges' comparison calls `regressed` opens a
//!   `regressed` event unless one is open for it. That event is judged
//!   again each round against the baseline it opened with (not a moving
//!   one, which would slowly take the regression in as normal), and closes
//!   once the mean is back under the floor of `min_change`, or the digest
//!   stops running.
//! - A digest with no statement in a baseline that holds other statements
//!   of the instance, and at least `min_statements` in the recent range,
//!   opens a `new` event, which
//!   closes once the baseline holds it too, or the digest stops running.
//! - Each plan change opens a `plan_changed` event, closed at once: it is a
//!   moment, not a state.
//!
//! Event ids hash what the event is and the round that found it, so two
//! collectors running the same round on one store write the same events.
use std::collections::HashMap;

use sqlbee_proto::v1::{DiffSide, DigestChange, Event, PlanChange};

use crate::query_api::diff::Thresholds;

/// One round over one instance.
#[derive(Clone, Debug)]
pub struct Round {
    pub instance: String,
    /// The round's time: its recent range ends here (ms since epoch).
    pub at_unix_ms: i64,
    pub recent: (i64, i64),
    pub baseline: (i64, i64),
    /// The baseline holds statements of the instance: without any (a new
    /// instance, or a collector just deployed) no digest is called new.
    pub has_baseline: bool,
    pub thresholds: Thresholds,
}

fn event_id(instance: &str, kind: &str, schema: &str, digest: u64, at_unix_ms: i64) -> u64 {
    let mut bytes = Vec::with_capacity(instance.len() + kind.len() + schema.len() + 24);
    for part in [instance, kind, schema] {
        bytes.extend_from_slice(part.as_bytes());
        bytes.push(0);
    }
    bytes.extend_from_slice(&digest.to_le_bytes());
    bytes.extend_from_slice(&at_unix_ms.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&bytes).max(1)
}

fn opened(round: &Round, kind: &str, change: &DigestChange) -> Event {
    Event {
        id: event_id(&round.instance, kind, &change.schema, change.digest, round.at_unix_ms),
        instance: round.instance.clone(),
        kind: kind.to_string(),
        schema: change.schema.clone(),
        digest: change.digest,
        digest_text: change.digest_text.clone(),
        opened_unix_ms: round.at_unix_ms,
        closed_unix_ms: 0,
        evidence: change.evidence.clone(),
        before_since_unix_ms: round.baseline.0,
        before_until_unix_ms: round.baseline.1,
        after_since_unix_ms: round.recent.0,
        after_until_unix_ms: round.recent.1,
        before: change.before,
        after: change.after,
        p_value: change.p_value,
        updated_unix_ms: round.at_unix_ms,
        closed_because: String::new(),
        change: None,
    }
}

fn close(event: &Event, round: &Round, because: String) -> Event {
    Event {
        closed_unix_ms: round.at_unix_ms,
        updated_unix_ms: round.at_unix_ms.max(event.updated_unix_ms + 1),
        closed_because: because,
        ..event.clone()
    }
}

fn mean_ns(side: &DiffSide) -> f64 {
    side.sum_ns as f64 / side.count.max(1) as f64
}

/// Why an open `regressed` event closes, from the comparison of its own
/// baseline with the recent range (None: the digest did not run in
/// either); None: it stays open.
pub fn regression_over(recheck: Option<&DigestChange>, round: &Round) -> Option<String> {
    let window_s = (round.recent.1 - round.recent.0) / 1000;
    let Some(after) = recheck.and_then(|c| c.after.as_ref()) else {
        return Some(format!("no statement in the last {window_s} s"));
    };
    let Some(before) = recheck.and_then(|c| c.before.as_ref()) else {
        return Some("the baseline it opened with is no longer stored".to_string());
    };
    if after.count < round.thresholds.min_statements {
        // Too few to say it is over; it closes when the digest stops.
        return None;
    }
    let (b, a) = (mean_ns(before), mean_ns(after));
    (a < b * (1.0 + round.thresholds.min_change)).then(|| {
        format!(
            "mean {:.3} ms per statement in the last {window_s} s, within {:.0}% of the {:.3} ms before it opened",
            a / 1e6,
            round.thresholds.min_change * 100.0,
            b / 1e6
        )
    })
}

/// The events to write for one round: new ones, and closed versions of
/// open ones. `changes` compares the round's baseline with its recent
/// range; `rechecks` holds, per open `regressed` event id, its own
/// baseline compared with the recent range; `known` are the ids of the
/// instance's events the store holds from the recent range on (so a plan
/// change is recorded once).
pub fn decide(
    round: &Round,
    changes: &[DigestChange],
    open: &[Event],
    rechecks: &HashMap<u64, Option<DigestChange>>,
    plan_changes: &[PlanChange],
    known: &std::collections::HashSet<u64>,
) -> Vec<Event> {
    let mut out = Vec::new();
    let is_open = |kind: &str, schema: &str, digest: u64| {
        open.iter().any(|e| e.kind == kind && e.schema == schema && e.digest == digest)
    };
    let by_key: HashMap<(&str, u64), &DigestChange> =
        changes.iter().map(|c| ((c.schema.as_str(), c.digest), c)).collect();
    for event in open {
        let because = match event.kind.as_str() {
            "regressed" => regression_over(rechecks.get(&event.id).and_then(Option::as_ref), round),
            "new" => match by_key.get(&(event.schema.as_str(), event.digest)) {
                None => Some(format!("no statement in the last {} s", (round.recent.1 - round.recent.0) / 1000)),
                Some(c) if c.after.is_none() => {
                    Some(format!("no statement in the last {} s", (round.recent.1 - round.recent.0) / 1000))
                }
                Some(c) if c.before.is_some() => Some("the baseline holds it now".to_string()),
                Some(_) => None,
            },
            _ => None,
        };
        if let Some(because) = because {
            out.push(close(event, round, because));
        }
    }
    for change in changes {
        let kind = match change.status.as_str() {
            "regressed" => "regressed",
            "new"
                if round.has_baseline
                    && change.after.as_ref().is_some_and(|a| a.count >= round.thresholds.min_statements) =>
            {
                "new"
            }
            _ => continue,
        };
        if !is_open(kind, &change.schema, change.digest) {
            out.push(opened(round, kind, change));
        }
    }
    for change in plan_changes {
        let id = event_id(&round.instance, "plan_changed", &change.schema, change.digest, change.at_unix_ms);
        if known.contains(&id) {
            continue;
        }
        let evidence = format!("plan {:016x} replaced plan {:016x}", change.to_hash, change.from_hash);
        out.push(Event {
            id,
            instance: round.instance.clone(),
            kind: "plan_changed".into(),
            schema: change.schema.clone(),
            digest: change.digest,
            digest_text: change.digest_text.clone(),
            opened_unix_ms: change.at_unix_ms,
            closed_unix_ms: change.at_unix_ms,
            evidence,
            before_since_unix_ms: round.baseline.0,
            before_until_unix_ms: change.at_unix_ms,
            after_since_unix_ms: change.at_unix_ms,
            after_until_unix_ms: round.recent.1,
            updated_unix_ms: round.at_unix_ms,
            closed_because: "a plan change is a moment".into(),
            ..Default::default()
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(count: u64, mean_ns: u64) -> Option<DiffSide> {
        Some(DiffSide { count, sum_ns: count * mean_ns, ..Default::default() })
    }

    fn change(digest: u64, status: &str, before: Option<DiffSide>, after: Option<DiffSide>) -> DigestChange {
        DigestChange {
            digest,
            schema: "app".into(),
            digest_text: format!("SELECT {digest}"),
            before,
            after,
            status: status.into(),
            evidence: "tested".into(),
            p_value: 0.0,
            changes: Vec::new(),
        }
    }

    fn round(at: i64) -> Round {
        Round {
            instance: "db:3306".into(),
            at_unix_ms: at,
            recent: (at - 60_000, at),
            baseline: (at - 360_000, at - 60_000),
            has_baseline: true,
            thresholds: Thresholds::default(),
        }
    }

    #[test]
    fn a_regression_opens_once_and_closes_against_its_own_baseline() {
        let none = HashMap::new();
        let known = Default::default();
        let r1 = round(1_000_000);
        let slow = change(7, "regressed", side(100, 1_000_000), side(100, 5_000_000));
        let opened =
            decide(&r1, &[slow.clone(), change(8, "unchanged", side(100, 1), side(100, 1))], &[], &none, &[], &known);
        assert_eq!(opened.len(), 1);
        let event = &opened[0];
        assert_eq!((event.kind.as_str(), event.digest, event.closed_unix_ms), ("regressed", 7, 0));
        assert_eq!(event.before_until_unix_ms, r1.recent.0);
        // A second collector in the same round writes the same event.
        assert_eq!(decide(&r1, std::slice::from_ref(&slow), &[], &none, &[], &known)[0].id, event.id);

        // Still slow against its own baseline, whatever the moving one says.
        let r2 = round(1_060_000);
        let still =
            HashMap::from([(event.id, Some(change(7, "unchanged", side(100, 1_000_000), side(50, 4_000_000))))]);
        assert!(
            decide(
                &r2,
                &[change(7, "unchanged", side(100, 4_000_000), side(50, 4_000_000))],
                &opened,
                &still,
                &[],
                &known
            )
            .is_empty()
        );

        // Back within the floor: closed, once.
        let r3 = round(1_120_000);
        let back = HashMap::from([(event.id, Some(change(7, "unchanged", side(100, 1_000_000), side(50, 1_100_000))))]);
        let closed = decide(&r3, &[], &opened, &back, &[], &known);
        assert_eq!(closed.len(), 1);
        assert_eq!((closed[0].id, closed[0].closed_unix_ms), (event.id, r3.at_unix_ms));
        assert!(closed[0].closed_because.contains("within 20%"), "{}", closed[0].closed_because);
        assert!(closed[0].updated_unix_ms > event.updated_unix_ms);

        // Too few statements to judge: it stays open.
        let few = HashMap::from([(event.id, Some(change(7, "unchanged", side(100, 1_000_000), side(29, 1_000_000))))]);
        assert!(decide(&r3, &[], &opened, &few, &[], &known).is_empty());

        // Gone quiet: closed too.
        let quiet = HashMap::from([(event.id, None)]);
        assert!(decide(&r3, &[], &opened, &quiet, &[], &known)[0].closed_because.starts_with("no statement"));
    }

    #[test]
    fn new_digests_need_enough_statements_and_close_once_in_the_baseline() {
        let (none, known) = (HashMap::new(), Default::default());
        let r = round(2_000_000);
        assert!(decide(&r, &[change(9, "new", None, side(29, 1))], &[], &none, &[], &known).is_empty(), "too few");
        let first = Round { has_baseline: false, ..r.clone() };
        assert!(
            decide(&first, &[change(9, "new", None, side(300, 1))], &[], &none, &[], &known).is_empty(),
            "an instance without history has no new digests, only digests"
        );
        let opened = decide(&r, &[change(9, "new", None, side(30, 1))], &[], &none, &[], &known);
        assert_eq!(opened[0].kind, "new");
        assert!(decide(&r, &[change(9, "new", None, side(300, 1))], &opened, &none, &[], &known).is_empty());
        let closed = decide(&r, &[change(9, "unchanged", side(300, 1), side(300, 1))], &opened, &none, &[], &known);
        assert_eq!(closed[0].closed_because, "the baseline holds it now");
    }

    #[test]
    fn a_plan_change_is_recorded_once_and_closed() {
        let none = HashMap::new();
        let r = round(3_000_000);
        let plan = PlanChange {
            instance: r.instance.clone(),
            schema: "app".into(),
            digest: 5,
            at_unix_ms: 2_990_000,
            from_hash: 1,
            to_hash: 2,
            digest_text: "SELECT 5".into(),
        };
        let first = decide(&r, &[], &[], &none, std::slice::from_ref(&plan), &Default::default());
        assert_eq!((first.len(), first[0].opened_unix_ms, first[0].closed_unix_ms), (1, 2_990_000, 2_990_000));
        let known = std::collections::HashSet::from([first[0].id]);
        assert!(decide(&round(3_060_000), &[], &[], &none, &[plan], &known).is_empty());
    }
}
