//! Wall-clock instants as sqlbee writes them: milliseconds since the Unix
//! epoch on the wire and in stores, RFC 3339 UTC for people.
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch; 0 for an instant before it.
pub fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Milliseconds since the Unix epoch by this host's clock.
pub fn now_unix_ms() -> i64 {
    unix_ms(SystemTime::now())
}

/// The instant `ms` milliseconds after the Unix epoch (negative: the epoch).
pub fn from_unix_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
}

/// `2026-11-18T11:06:40.123Z`, without a date-time dependency.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = civil_from_days(days as i64);
    format!("{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z", rem / 3600, rem % 3600 / 60, rem % 60, d.subsec_millis())
}

/// Days since 1970-01-01 -> (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_795_000_000_123);
        assert_eq!(rfc3339(t), "2026-11-18T11:06:40.123Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn milliseconds_round_trip() {
        let t = UNIX_EPOCH + Duration::from_millis(1_795_000_000_123);
        assert_eq!(unix_ms(t), 1_795_000_000_123);
        assert_eq!(from_unix_ms(unix_ms(t)), t);
        assert_eq!(unix_ms(UNIX_EPOCH - Duration::from_secs(5)), 0);
        assert_eq!(from_unix_ms(-5), UNIX_EPOCH);
    }
}
