//! The value formats of the cgroup files the budget reads and writes, for
//! v1 and v2 alike: what a quota is, how a limit and a usage are written.
//! Pure text in, numbers out.

/// CFS period the quota is expressed in (the kernel default).
pub(super) const PERIOD_US: u64 = 100_000;

/// The quota per `PERIOD_US` for `cores`; at least 1 ms, the kernel's floor.
pub(super) fn quota_us(cores: f64) -> u64 {
    (cores * PERIOD_US as f64).round().max(1000.0) as u64
}

/// Cores a v2 `cpu.max` (`QUOTA PERIOD`) allows; None for `max`.
pub(super) fn parse_cpu_max(text: &str) -> Option<f64> {
    let mut parts = text.split_whitespace();
    let quota = parts.next()?.parse::<f64>().ok()?;
    let period = parts.next()?.parse::<f64>().ok()?;
    (period > 0.0).then(|| quota / period)
}

/// CPU time from a v2 `cpu.stat` (`usage_usec`), ns.
pub(super) fn usage_ns(cpu_stat: &str) -> Option<u64> {
    let usec = cpu_stat.lines().find_map(|l| l.strip_prefix("usage_usec "))?.trim().parse::<u64>().ok()?;
    Some(usec * 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_max_parses() {
        assert_eq!(parse_cpu_max("50000 100000\n"), Some(0.5));
        assert_eq!(parse_cpu_max("max 100000\n"), None);
    }

    #[test]
    fn quota_and_usage() {
        assert_eq!(quota_us(1.0), PERIOD_US);
        assert_eq!(quota_us(0.001), 1000, "the kernel's floor");
        assert_eq!(usage_ns("usage_usec 1500\nuser_usec 1000\n"), Some(1_500_000));
        assert_eq!(usage_ns("user_usec 1000\n"), None);
    }
}
