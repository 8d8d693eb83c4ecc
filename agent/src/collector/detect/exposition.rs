//! The collector's Prometheus page (`--metrics-listen`): the events the
//! detection holds open, by kind and instance, so that alert rules can page
//! on them (an example rule file is in the manual), and whether detection
//! runs at all. It formats the newest round's snapshot; a scrape reads no
//! store.
use std::sync::Arc;

use super::OpenEvents;
use crate::{
    collector::query_api::EVENT_KINDS,
    prometheus::{Encoder, MetricType, Render},
};

pub fn render(open: Arc<OpenEvents>) -> Render {
    Arc::new(move || page(&open))
}

fn page(open: &OpenEvents) -> String {
    let mut enc = Encoder::new();
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
        for ((kind, instance), n) in &counts {
            f.sample(&[("kind", kind), ("instance", instance)], *n);
        }
    }
    enc.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_names_open_events_by_kind_and_instance() {
        let open = OpenEvents::default();
        assert!(!page(&open).contains("sqlbee_collector_open_events"), "nothing before the first round");
        open.set(std::collections::BTreeMap::from([(("regressed".to_string(), "db:3306".to_string()), 2)]));
        let text = page(&open);
        assert!(text.contains("sqlbee_collector_open_events{kind=\"regressed\",instance=\"db:3306\"} 2"), "{text}");
        assert!(text.contains("sqlbee_collector_open_events{kind=\"new\",instance=\"\"} 0"), "{text}");
    }
}
