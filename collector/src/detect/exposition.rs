//! The collector's Prometheus page (`--metrics-listen`): the events the
//! detection holds open, by kind and instance, so that alert rules can page
//! on them (an example rule file is in the manual), and whether detection
//! runs at all. It formats the newest round's snapshot; a scrape reads no
//! store. With `--otlp-endpoint`, it also counts what the export sent,
//! retried and dropped, and how far behind it is.
use std::{collections::BTreeMap, sync::Arc};

use super::OpenEvents;

/// Instances named on the page at most, those with the most open events
/// first; the rest are added up under `instance="(others)"`. Instance
/// names come from agents, and each series costs every scraper memory.
pub const MAX_INSTANCE_SERIES: usize = 500;
use sqlbee_prometheus::{Encoder, MetricType, Render};

use crate::query_api::EVENT_KINDS;

pub fn render(open: Arc<OpenEvents>, otlp: Vec<Arc<crate::otlp::Counts>>) -> Render {
    Arc::new(move || page(&open, &otlp))
}

fn page(open: &OpenEvents, otlp: &[Arc<crate::otlp::Counts>]) -> String {
    let mut enc = Encoder::new();
    if !otlp.is_empty() {
        otlp_families(&mut enc, otlp);
    }
    let (rounds, failed) = open.rounds();
    enc.family(
        "sqlbee_collector_detection_rounds_total",
        "Detection rounds run since the collector started.",
        MetricType::Counter,
    )
    .sample(&[], rounds);
    enc.family(
        "sqlbee_collector_detection_failed_rounds_total",
        "Detection rounds that failed (the store did not answer); see the collector's log.",
        MetricType::Counter,
    )
    .sample(&[], failed);
    if let Some(counts) = open.counts() {
        let mut f = enc.family(
            "sqlbee_collector_open_events",
            "Events the detection holds open, by kind (regressed, new) and instance, as of its newest round.",
            MetricType::Gauge,
        );
        // Every kind appears for the fleet even at zero, so a rule can tell
        // "none open" from "not reported".
        for kind in EVENT_KINDS {
            f.sample(&[("kind", kind), ("instance", "")], 0u64);
        }
        for ((kind, instance), n) in bounded(counts) {
            f.sample(&[("kind", &kind), ("instance", &instance)], n);
        }
    }
    enc.finish()
}

/// Each signal's export counts, labelled `signal` (metrics, logs).
fn otlp_families(enc: &mut Encoder, exports: &[Arc<crate::otlp::Counts>]) {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    type Field = fn(&crate::otlp::Counts) -> &AtomicU64;
    let counters: [(&str, &str, Field); 5] = [
        ("sqlbee_collector_otlp_requests_total", "OTLP export requests the receiver acknowledged.", |c| &c.requests),
        ("sqlbee_collector_otlp_items_total", "Data points or log records the receiver took.", |c| &c.items),
        (
            "sqlbee_collector_otlp_retries_total",
            "Export passes that failed and were retried (receiver away, store error).",
            |c| &c.retries,
        ),
        (
            "sqlbee_collector_otlp_dropped_items_total",
            "Data points or log records the receiver refused for good or rejected.",
            |c| &c.dropped_items,
        ),
        (
            "sqlbee_collector_otlp_skipped_steps_total",
            "Steps not exported because the export fell further behind than --otlp-max-behind.",
            |c| &c.skipped_steps,
        ),
    ];
    for (name, help, field) in counters {
        let mut f = enc.family(name, help, MetricType::Counter);
        for counts in exports {
            f.sample(&[("signal", counts.signal.name())], field(counts).load(Relaxed));
        }
    }
    let mut f = enc.family(
        "sqlbee_collector_otlp_behind_seconds",
        "How long ago the oldest step not yet exported began.",
        MetricType::Gauge,
    );
    for counts in exports {
        let mark = counts.mark_unix_ms.load(Relaxed);
        if mark > 0 {
            let behind = (sqlbee_vocabulary::clock::now_unix_ms() - mark).max(0) as f64 / 1000.0;
            f.sample(&[("signal", counts.signal.name())], behind);
        }
    }
}

/// The counts of the `MAX_INSTANCE_SERIES` instances with the most open
/// events, and the others' added up per kind.
fn bounded(counts: BTreeMap<(String, String), u64>) -> BTreeMap<(String, String), u64> {
    let mut per_instance: BTreeMap<&str, u64> = BTreeMap::new();
    for ((_, instance), n) in &counts {
        *per_instance.entry(instance.as_str()).or_default() += n;
    }
    if per_instance.len() <= MAX_INSTANCE_SERIES {
        return counts;
    }
    let mut ranked: Vec<(&str, u64)> = per_instance.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let named: std::collections::HashSet<String> =
        ranked.iter().take(MAX_INSTANCE_SERIES).map(|(i, _)| i.to_string()).collect();
    let mut out = BTreeMap::new();
    for ((kind, instance), n) in counts {
        let instance = if named.contains(&instance) { instance } else { "(others)".to_string() };
        *out.entry((kind, instance)).or_default() += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_names_open_events_by_kind_and_instance() {
        let open = OpenEvents::default();
        assert!(!page(&open, &[]).contains("sqlbee_collector_open_events"), "nothing before the first round");
        open.set(std::collections::BTreeMap::from([(("regressed".to_string(), "db:3306".to_string()), 2)]));
        let text = page(&open, &[]);
        assert!(text.contains("sqlbee_collector_open_events{kind=\"regressed\",instance=\"db:3306\"} 2"), "{text}");
        assert!(text.contains("sqlbee_collector_open_events{kind=\"new\",instance=\"\"} 0"), "{text}");
    }

    /// 2,000 instances an agent invented make a bounded page, the largest
    /// named and the rest added up, every event still counted.
    #[test]
    fn the_export_counts_each_signal() {
        use std::sync::atomic::Ordering::Relaxed;

        use crate::otlp::{Counts, config::Signal};
        let (metrics, logs) = (Arc::new(Counts::new(Signal::Metrics)), Arc::new(Counts::new(Signal::Logs)));
        metrics.items.store(303, Relaxed);
        logs.dropped_items.store(2, Relaxed);
        logs.mark_unix_ms.store(sqlbee_vocabulary::clock::now_unix_ms() - 90_000, Relaxed);
        let text = page(&OpenEvents::default(), &[metrics, logs]);
        assert!(text.contains("sqlbee_collector_otlp_items_total{signal=\"metrics\"} 303"), "{text}");
        assert!(text.contains("sqlbee_collector_otlp_dropped_items_total{signal=\"logs\"} 2"), "{text}");
        assert!(text.contains("sqlbee_collector_otlp_behind_seconds{signal=\"logs\"} 9"), "{text}");
        assert!(!text.contains("sqlbee_collector_otlp_behind_seconds{signal=\"metrics\"}"), "no mark read yet: {text}");
    }

    #[test]
    fn invented_instances_make_a_bounded_page() {
        let open = OpenEvents::default();
        let counts: BTreeMap<(String, String), u64> =
            (0..2_000u64).map(|i| (("new".to_string(), format!("invented-{i}:1")), 1 + i / 1_000)).collect();
        open.set(counts);
        let text = page(&open, &[]);
        let series = text.lines().filter(|l| l.starts_with("sqlbee_collector_open_events{")).count();
        assert!(series <= MAX_INSTANCE_SERIES + 1 + EVENT_KINDS.len(), "{series}");
        let total: u64 = text
            .lines()
            .filter(|l| l.starts_with("sqlbee_collector_open_events{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        assert_eq!(total, 1_000 + 2 * 1_000);
        // Ties go by name: the first 500 of the instances with two events.
        assert!(text.contains("instance=\"invented-1000:1\"} 2"), "the largest are named");
        assert!(!text.contains("instance=\"invented-7:1\""), "a small one is not");
        assert!(text.contains("instance=\"(others)\"}"), "{text}");
    }
}
