//! Refused tokens counted per client address, on every surface that takes
//! one (gRPC, `/api/`, the sign-in form), so that guessing tokens is slow
//! and cannot fill the log: past `MAX_REFUSED` in a minute an address is
//! refused at once (RESOURCE_EXHAUSTED, 429) until its minute ends, and the
//! log says so once per address and minute, with the count.
use std::{
    collections::HashMap,
    net::IpAddr,
    sync::Mutex,
    time::{Duration, Instant},
};

/// Refused tokens from one address per `PERIOD`.
pub const MAX_REFUSED: u32 = 10;
pub const PERIOD: Duration = Duration::from_secs(60);
/// Addresses remembered at once; past this the stale ones are forgotten,
/// and if none is stale the oldest goes.
const MAX_ADDRESSES: usize = 10_000;

struct Counter {
    since: Instant,
    refused: u32,
}

#[derive(Default)]
pub struct RefusedTokens {
    by_address: Mutex<HashMap<IpAddr, Counter>>,
}

/// What to do with a refused token's log line.
#[derive(Debug, PartialEq, Eq)]
pub enum LogLine {
    /// The first refusal from the address in its period.
    First,
    /// Counted, not logged.
    Quiet,
}

impl RefusedTokens {
    /// How long `address` must wait before it may try again, if at all.
    pub fn wait(&self, address: IpAddr) -> Option<Duration> {
        let map = self.by_address.lock().unwrap_or_else(|e| e.into_inner());
        let counter = map.get(&address)?;
        let elapsed = counter.since.elapsed();
        (elapsed < PERIOD && counter.refused >= MAX_REFUSED).then(|| PERIOD - elapsed)
    }

    /// Counts a refused token; when a new period starts, returns how
    /// many the previous one refused beyond its first (for the log).
    pub fn refused(&self, address: IpAddr) -> (LogLine, u32) {
        let mut map = self.by_address.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_ADDRESSES && !map.contains_key(&address) {
            map.retain(|_, c| c.since.elapsed() < PERIOD);
            if map.len() >= MAX_ADDRESSES
                && let Some(oldest) = map.iter().min_by_key(|(_, c)| c.since).map(|(a, _)| *a)
            {
                map.remove(&oldest);
            }
        }
        let counter = map.entry(address).or_insert(Counter { since: Instant::now(), refused: 0 });
        if counter.since.elapsed() >= PERIOD {
            let before = counter.refused.saturating_sub(1);
            *counter = Counter { since: Instant::now(), refused: 1 };
            return (LogLine::First, before);
        }
        counter.refused = counter.refused.saturating_add(1);
        if counter.refused == 1 { (LogLine::First, 0) } else { (LogLine::Quiet, 0) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_stopped_after_its_refusals_and_others_are_not() {
        let throttle = RefusedTokens::default();
        let (guesser, other): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        assert_eq!(throttle.refused(guesser), (LogLine::First, 0));
        for _ in 1..MAX_REFUSED {
            assert!(throttle.wait(guesser).is_none());
            assert_eq!(throttle.refused(guesser), (LogLine::Quiet, 0));
        }
        let wait = throttle.wait(guesser).expect("stopped");
        assert!(wait <= PERIOD && wait > PERIOD - Duration::from_secs(5), "{wait:?}");
        assert!(throttle.wait(other).is_none(), "another address is not");
    }
}
