//! The few /proc files more than one agent room reads, parsed once:
//! `/proc/PID/stat` (discover and host), the clock tick, the boot time and
//! the host name. Pure reads; a file that cannot be read or understood is
//! `None`, and the caller says what that means.
use std::fs;

/// The fields of `/proc/PID/stat` the agent uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PidStat {
    /// utime + stime, in clock ticks (fields 14 and 15).
    pub cpu_ticks: u64,
    /// Field 20.
    pub threads: u64,
    /// Start time in clock ticks since boot (field 22): with the pid, it
    /// names one process life.
    pub start_ticks: u64,
    /// Resident pages (field 24): the counter statm reads too.
    pub rss_pages: u64,
}

impl PidStat {
    pub fn parse(text: &str) -> Option<PidStat> {
        // comm may contain spaces and parentheses: fields start after the
        // last ')', with field 3 (state) first.
        let fields: Vec<&str> = text[text.rfind(')')? + 1..].split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        Some(PidStat {
            cpu_ticks: field(14)?.checked_add(field(15)?)?,
            threads: field(20)?,
            start_ticks: field(22)?,
            rss_pages: field(24)?,
        })
    }

    pub fn read(pid: u32) -> Option<PidStat> {
        PidStat::parse(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
    }
}

/// Clock ticks per second, the unit of `/proc/PID/stat` and `/proc/stat`.
pub fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 { hz as u64 } else { 100 }
}

/// Boot time from /proc/stat (`btime`), ms since the epoch; 0 if unknown.
pub fn boot_time_unix_ms() -> i64 {
    fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse::<i64>().ok()))
        .unwrap_or(0)
        * 1000
}

/// This host's name as the kernel has it (`localhost` if unreadable).
pub fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_an_odd_comm() {
        let stat = "42 (my (odd) d) S 1 42 42 0 -1 4194560 1 0 0 0 7 5 0 0 20 0 3 0 98765 1 2";
        let parsed = PidStat::parse(stat).unwrap();
        assert_eq!(parsed, PidStat { cpu_ticks: 12, threads: 3, start_ticks: 98765, rss_pages: 2 });
        assert_eq!(PidStat::parse("42 (x) S 1"), None);
        assert_eq!(PidStat::parse("no parenthesis"), None);
        let own = PidStat::read(std::process::id()).unwrap();
        assert!(own.threads >= 1 && own.start_ticks > 0);
    }
}
