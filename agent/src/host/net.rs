//! Network traffic per interface from /proc/net/dev.
//!
//! Loopback is left out: it is traffic the host has with itself.
use super::{Counted, parse_counters};

/// Interfaces kept per sample; the rest are counted in
/// `Truncated::interfaces`.
pub const MAX_INTERFACES: usize = 64;

/// rx bytes, packets, errors, drops, then the same for tx.
pub(super) const FIELDS: usize = 8;

/// What an interface did over the interval.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NetIo {
    pub interface: String,
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub rx_errors: u64,
    pub rx_drops: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
    pub tx_errors: u64,
    pub tx_drops: u64,
}

impl NetIo {
    pub(super) fn from_delta((interface, c): (String, [u64; FIELDS])) -> Self {
        let [rx_bytes, rx_packets, rx_errors, rx_drops, tx_bytes, tx_packets, tx_errors, tx_drops] = c;
        NetIo { interface, rx_bytes, rx_packets, rx_errors, rx_drops, tx_bytes, tx_packets, tx_errors, tx_drops }
    }
}

pub(super) fn read(text: &str) -> Counted<FIELDS> {
    let mut kept = Vec::new();
    let (mut truncated, mut skipped) = (0, 0);
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        // Interface names cannot contain ':', so the first one ends the
        // name even when old kernels glue the first number to it.
        let Some((name, rest)) = line.split_once(':') else {
            // The two header lines are the only ones with '|'.
            if !line.contains('|') {
                skipped += 1;
            }
            continue;
        };
        // Eight receive counters, then eight transmit ones.
        let Some(c) = parse_counters::<12>(rest.split_whitespace()) else {
            skipped += 1;
            continue;
        };
        let name = name.trim();
        if name == "lo" {
            continue;
        }
        if kept.len() < MAX_INTERFACES {
            kept.push((name.to_string(), [c[0], c[1], c[2], c[3], c[8], c[9], c[10], c[11]]));
        } else {
            truncated += 1;
        }
    }
    Counted { kept, truncated, skipped }
}
