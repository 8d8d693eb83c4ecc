//! Human durations for every flag and config key: `250ms`, `10s`, `5m`,
//! `2h`, `7d`.
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
#[error("{value:?} is not a duration: expected a number followed by ms, s, m, h or d (for example 10s, 5m, 2h, 7d)")]
pub struct DurationError {
    pub value: String,
}

pub fn parse(value: &str) -> Result<Duration, DurationError> {
    let bad = || DurationError { value: value.to_string() };
    let trimmed = value.trim();
    let split = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let number: u64 = number.parse().map_err(|_| bad())?;
    let unit_ms: u64 = match unit.trim() {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    let ms = number.checked_mul(unit_ms).ok_or_else(bad)?;
    Ok(Duration::from_millis(ms))
}

/// A point in time as flags and URLs give it: that long before
/// `now_unix_ms` (`10s`, `7d`), or milliseconds since the epoch (all
/// digits). Never before the epoch.
pub fn unix_ms_ago(text: &str, now_unix_ms: i64) -> Result<i64, DurationError> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(text.parse::<i64>().unwrap_or(i64::MAX));
    }
    let back = parse(text)?;
    Ok(now_unix_ms.saturating_sub(back.as_millis().min(i64::MAX as u128) as i64).max(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse("7d").unwrap(), Duration::from_secs(7 * 86_400));
        assert_eq!(parse("250ms").unwrap(), Duration::from_millis(250));
        for bad in ["", "10", "s", "1.5h", "-1s", "3w", "99999999999999999999d"] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.contains("7d"), "{bad}: {err}");
        }
    }
}
