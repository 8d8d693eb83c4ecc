//! CPU time by mode from /proc/stat.

/// user, nice, system, idle, iowait, irq, softirq, steal: the order of the
/// aggregate `cpu` line. guest and guest_nice are already inside user/nice.
pub(super) type CpuTicks = [u64; 8];

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CpuMetrics {
    /// CPUs listed in /proc/stat, which lists only online ones.
    pub online_cores: u32,
    /// Cores busy in each mode over the interval; `None` on the first sample.
    pub busy: Option<CpuModes>,
}

/// Cores' worth of time in each mode: 1.5 `user` means one and a half CPUs
/// ran user code for the whole interval. The modes add up to about
/// `online_cores`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CpuModes {
    pub user: f64,
    pub nice: f64,
    pub system: f64,
    pub idle: f64,
    pub iowait: f64,
    pub irq: f64,
    pub softirq: f64,
    pub steal: f64,
}

pub(super) struct Stat {
    pub ticks: CpuTicks,
    pub online_cores: u32,
    pub skipped: u64,
}

/// `None` when the aggregate `cpu` line is missing or unreadable: without
/// it the file is not /proc/stat.
pub(super) fn parse_stat(text: &str) -> Option<Stat> {
    let mut ticks = None;
    let mut online_cores = 0;
    let mut skipped = 0;
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let Some(key) = fields.next() else { continue };
        if key == "cpu" {
            ticks = Some(parse_ticks(fields)?);
        } else if let Some(n) = key.strip_prefix("cpu") {
            if n.parse::<u32>().is_ok() && parse_ticks(fields).is_some() {
                online_cores += 1;
            } else {
                skipped += 1;
            }
        }
    }
    Some(Stat { ticks: ticks?, online_cores, skipped })
}

/// Kernels before 2.6.11 stop before `steal` (and older ones earlier
/// still): missing trailing modes read as zero, but the four original ones
/// must be there.
fn parse_ticks<'a>(fields: impl Iterator<Item = &'a str>) -> Option<CpuTicks> {
    let mut ticks = [0; 8];
    let mut n = 0;
    for (slot, field) in ticks.iter_mut().zip(fields) {
        *slot = field.parse().ok()?;
        n += 1;
    }
    (n >= 4).then_some(ticks)
}

pub(super) fn busy(before: &CpuTicks, now: &CpuTicks, ticks_per_second: u64, seconds: f64) -> CpuModes {
    // iowait (and idle, on tickless kernels) can step backwards between
    // reads; that is noise, not a reset, so it counts as zero.
    let cores = |i: usize| now[i].saturating_sub(before[i]) as f64 / ticks_per_second as f64 / seconds;
    CpuModes {
        user: cores(0),
        nice: cores(1),
        system: cores(2),
        idle: cores(3),
        iowait: cores(4),
        irq: cores(5),
        softirq: cores(6),
        steal: cores(7),
    }
}
