//! An agent whose clock runs ahead stamps its windows in the collector's
//! future. Refusing them would lose real data for a wrong clock, and
//! storing them as they are would put them where no query for "now" looks.
//! So a batch built (by its own clock) after the collector received it is
//! moved back by the difference, and every agent window it carries says
//! by how much (`clock_correction_ms`). A clock that runs behind cannot be
//! told from a backlog replayed late, so it is left alone; the agent sees
//! its skew in every answer either way.
use sqlbee_proto::v1::Batch;

/// Network delay and clock jitter below this are not skew.
pub const TOLERANCE_MS: i64 = 2_000;

/// Moves the batch's times back when it comes from the future; returns by
/// how many milliseconds (0: left as it was).
pub fn correct(batch: &mut Batch, now_unix_ms: i64) -> i64 {
    let ahead = batch.created_unix_ms.saturating_sub(now_unix_ms);
    if ahead <= TOLERANCE_MS {
        return 0;
    }
    let back = |t: &mut i64| {
        if *t != 0 {
            *t = t.saturating_sub(ahead);
        }
    };
    back(&mut batch.created_unix_ms);
    for w in &mut batch.windows {
        back(&mut w.window_start_unix_ms);
        back(&mut w.window_end_unix_ms);
        for l in &mut w.lock_waits {
            back(&mut l.start_unix_ms);
            for b in &mut l.blockers {
                back(&mut b.started_unix_ms);
            }
        }
        for p in &mut w.plans {
            back(&mut p.explained_unix_ms);
        }
        for l in &mut w.long_statements {
            back(&mut l.start_unix_ms);
        }
        for c in &mut w.changes {
            back(&mut c.start_unix_ms);
        }
    }
    for w in &mut batch.agent_windows {
        back(&mut w.window_start_unix_ms);
        back(&mut w.window_end_unix_ms);
        if let Some(cost) = &mut w.cost {
            cost.clock_correction_ms = ahead;
        }
    }
    for g in &mut batch.gaps {
        back(&mut g.first_window_start_unix_ms);
        back(&mut g.last_window_end_unix_ms);
    }
    ahead
}

#[cfg(test)]
mod tests {
    use sqlbee_proto::v1::{AgentCost, AgentWindow, InstanceWindow};

    use super::*;

    #[test]
    fn only_batches_from_the_future_move() {
        let hour = 3_600_000;
        let now = 1_800_000_000_000;
        let batch = |created: i64| Batch {
            created_unix_ms: created,
            windows: vec![InstanceWindow {
                window_start_unix_ms: created - 10_000,
                window_end_unix_ms: created,
                ..Default::default()
            }],
            agent_windows: vec![AgentWindow {
                window_start_unix_ms: created - 10_000,
                window_end_unix_ms: created,
                cost: Some(AgentCost::default()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut ahead = batch(now + hour);
        assert_eq!(correct(&mut ahead, now), hour);
        assert_eq!((ahead.windows[0].window_start_unix_ms, ahead.windows[0].window_end_unix_ms), (now - 10_000, now));
        assert_eq!(ahead.agent_windows[0].cost.as_ref().unwrap().clock_correction_ms, hour);
        for created in [now + TOLERANCE_MS, now - hour] {
            let mut kept = batch(created);
            assert_eq!(correct(&mut kept, now), 0);
            assert_eq!(kept, batch(created));
        }
    }
}
