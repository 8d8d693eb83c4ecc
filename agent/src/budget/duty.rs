//! Budget mode: keeps what the probes cost mysqld under a fraction of
//! mysqld's own CPU by attaching them only part of the time.
//!
//! Each period the probes are attached for `duty * period` and detached
//! for the rest. The duty follows from what one statement costs mysqld
//! with the probes on (trap plus program, see `budget::calibrate`), the
//! statement rate seen while attached and mysqld's CPU:
//!
//! ```text
//! duty = budget * mysqld_cores / (statements_per_s * seconds_per_statement)
//! ```
//!
//! While the duty is below 1, every count is a sample of the time the
//! probes were attached: the agent says so and scales totals by the
//! attached fraction it measured.
use std::time::{Duration, Instant};

/// Never attach for less than this share of a period: a few statements
/// per period still name the digests.
pub const MIN_DUTY: f64 = 0.02;

#[derive(Clone, Copy, Debug)]
pub struct DutyConfig {
    /// Allowed probe CPU as a fraction of mysqld's CPU (0.01 for 1%).
    pub budget: f64,
    pub period: Duration,
}

#[derive(Debug)]
pub struct DutyCycle {
    config: DutyConfig,
    duty: f64,
    attached: bool,
    /// When the current on or off phase began.
    phase_start: Instant,
    /// Attached time since the last window read, counted up to
    /// `counted_until`.
    attached_time: Duration,
    counted_until: Instant,
    window_start: Instant,
}

impl DutyCycle {
    /// Starts attached at the smallest duty until the first measurement.
    pub fn new(config: DutyConfig, now: Instant) -> Self {
        Self {
            config,
            duty: MIN_DUTY,
            attached: true,
            phase_start: now,
            attached_time: Duration::ZERO,
            counted_until: now,
            window_start: now,
        }
    }

    fn account(&mut self, now: Instant) {
        if self.attached {
            self.attached_time += now.saturating_duration_since(self.phase_start.max(self.counted_until));
        }
        self.counted_until = now;
    }

    /// Sets the duty from the last window's measurements; a rate or cost
    /// of zero (nothing seen) keeps the previous duty.
    pub fn rebudget(&mut self, statements_per_s: f64, seconds_per_statement: f64, mysqld_cores: f64) {
        let probe_cores = statements_per_s * seconds_per_statement;
        if probe_cores > 0.0 && mysqld_cores > 0.0 {
            self.duty = (self.config.budget * mysqld_cores / probe_cores).clamp(MIN_DUTY, 1.0);
        }
    }

    pub fn attached(&self) -> bool {
        self.attached
    }

    /// Whether the probes should change state now: `Some(attach)`.
    pub fn tick(&mut self, now: Instant) -> Option<bool> {
        let on = self.config.period.mul_f64(self.duty);
        let off = self.config.period.saturating_sub(on);
        let elapsed = now.saturating_duration_since(self.phase_start);
        let switch = if self.attached { elapsed >= on && !off.is_zero() } else { elapsed >= off };
        if !switch {
            return None;
        }
        self.account(now);
        self.attached = !self.attached;
        self.phase_start = now;
        Some(self.attached)
    }

    /// The attach that `tick` asked for took until `now`: the attached
    /// phase, and the time counted as attached, start only now.
    pub fn started(&mut self, now: Instant) {
        self.phase_start = now;
        self.counted_until = self.counted_until.max(now);
    }

    /// The attach that `tick` asked for could not happen yet: stay
    /// detached and ask again at the next tick.
    pub fn stay_detached(&mut self, now: Instant) {
        self.account(now);
        self.attached = false;
        let off = self.config.period.saturating_sub(self.config.period.mul_f64(self.duty));
        self.phase_start = now.checked_sub(off).unwrap_or(now);
    }

    /// Share of the time since the last call that the probes were attached.
    pub fn take_attached_fraction(&mut self, now: Instant) -> f64 {
        self.account(now);
        let attached = std::mem::take(&mut self.attached_time);
        let wall = now.saturating_duration_since(self.window_start);
        self.window_start = now;
        if wall.is_zero() { 1.0 } else { (attached.as_secs_f64() / wall.as_secs_f64()).clamp(0.0, 1.0) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cycle() -> (DutyCycle, Instant) {
        let now = Instant::now();
        (DutyCycle::new(DutyConfig { budget: 0.01, period: Duration::from_secs(1) }, now), now)
    }

    #[test]
    fn duty_follows_the_budget() {
        let (mut d, _) = cycle();
        // 20k statements/s at 2.5 us cost 0.05 cores; 1% of 1.5 cores is
        // 0.015 cores: attached 30% of the time.
        d.rebudget(20_000.0, 2.5e-6, 1.5);
        assert!((d.duty - 0.3).abs() < 1e-9, "{}", d.duty);
        d.rebudget(100.0, 2.5e-6, 1.5);
        assert_eq!(d.duty, 1.0, "a quiet server is watched all the time");
        d.rebudget(1e9, 1e-3, 0.1);
        assert_eq!(d.duty, MIN_DUTY);
        d.rebudget(0.0, 2.5e-6, 1.5);
        assert_eq!(d.duty, MIN_DUTY, "no measurement keeps the duty");
    }

    #[test]
    fn phases_alternate_and_the_fraction_is_measured() {
        let (mut d, t0) = cycle();
        d.rebudget(20_000.0, 2.5e-6, 1.5);
        let ms = |n: u64| t0 + Duration::from_millis(n);
        assert_eq!(d.tick(ms(100)), None);
        assert_eq!(d.tick(ms(300)), Some(false));
        assert_eq!(d.tick(ms(900)), None);
        assert_eq!(d.tick(ms(1000)), Some(true));
        assert_eq!(d.tick(ms(1300)), Some(false));
        let fraction = d.take_attached_fraction(ms(2000));
        assert!((fraction - 0.3).abs() < 1e-9, "{fraction}");
        assert_eq!(d.tick(ms(2000)), Some(true));
        let fraction = d.take_attached_fraction(ms(2150));
        assert!((fraction - 1.0).abs() < 1e-9, "{fraction}");
    }

    #[test]
    fn full_duty_never_detaches() {
        let (mut d, t0) = cycle();
        d.rebudget(10.0, 2.5e-6, 1.0);
        for s in 1..5 {
            assert_eq!(d.tick(t0 + Duration::from_secs(s)), None);
        }
        assert_eq!(d.take_attached_fraction(t0 + Duration::from_secs(5)), 1.0);
    }

    #[test]
    fn a_slow_attach_counts_from_when_it_took_effect() {
        let (mut d, t0) = cycle();
        d.rebudget(20_000.0, 2.5e-6, 1.5);
        let ms = |n: u64| t0 + Duration::from_millis(n);
        assert_eq!(d.tick(ms(300)), Some(false));
        assert_eq!(d.tick(ms(1000)), Some(true));
        d.started(ms(1200));
        assert_eq!(d.tick(ms(1400)), None, "on for 300 ms from when the attach took effect");
        assert_eq!(d.tick(ms(1500)), Some(false));
        let fraction = d.take_attached_fraction(ms(2000));
        assert!((fraction - 0.6 / 2.0).abs() < 1e-9, "{fraction}");
    }

    #[test]
    fn a_deferred_attach_is_retried_and_not_counted() {
        let (mut d, t0) = cycle();
        d.rebudget(20_000.0, 2.5e-6, 1.5);
        let ms = |n: u64| t0 + Duration::from_millis(n);
        assert_eq!(d.tick(ms(300)), Some(false));
        assert_eq!(d.tick(ms(1000)), Some(true));
        d.stay_detached(ms(1000));
        assert_eq!(d.tick(ms(1020)), Some(true), "retried at the next tick");
        let fraction = d.take_attached_fraction(ms(1020));
        assert!((fraction - 300.0 / 1020.0).abs() < 1e-9, "{fraction}");
    }
}
