//! Graceful degradation when the agent nears its CPU budget or its ring
//! buffers start to drop. Each step gives up something the one before it
//! kept, in this order, so that per-digest counts and latency histograms
//! stay exact for as long as possible:
//!
//! 0. `exact`: the default. Known texts are counted in the kernel, every
//!    other statement is sent with its text.
//! 1. `no-samples`: the kernel stops sending each kernel-counted text's one
//!    sample per window (fresh sample texts and the hash check pause).
//!    Nothing that is counted changes.
//! 2. `known-texts-only`: statements whose text the agent has not
//!    registered are sent without their text and counted under
//!    `(text not sent: shedding)` by command, except one in 64 (per CPU),
//!    which keeps its text so that a new text still gets registered and
//!    from then on is counted in the kernel. Known digests, every count by
//!    command and all totals stay exact; a new digest's statements before
//!    its text came through lose their name.
//!
//! A window above 80% of the CPU limit, or with dropped records, goes one
//! step down; three calm windows in a row (under 40%, no drops) go one
//! step back up. mysqld never waits in any step.
//!
//! `--shedding-floor` pins a step the agent never goes above: an operator
//! who prefers the cheaper step all the time, and the cost benchmark,
//! which measures each step at the same load.
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Step {
    #[default]
    Exact = 0,
    NoSamples = 1,
    KnownTextsOnly = 2,
}

impl Step {
    /// The name used in output and on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Step::Exact => "exact",
            Step::NoSamples => "no-samples",
            Step::KnownTextsOnly => "known-texts-only",
        }
    }

    fn down(self) -> Step {
        match self {
            Step::Exact => Step::NoSamples,
            _ => Step::KnownTextsOnly,
        }
    }

    fn up(self) -> Step {
        match self {
            Step::KnownTextsOnly => Step::NoSamples,
            _ => Step::Exact,
        }
    }
}

const PRESSED: f64 = 0.8;
const CALM: f64 = 0.4;
const CALM_WINDOWS: u32 = 3;

#[derive(Debug, Default)]
pub struct Shedder {
    step: Step,
    calm_windows: u32,
    floor: Step,
}

impl Shedder {
    /// Starts at `floor` and never goes above it.
    pub fn with_floor(floor: Step) -> Shedder {
        Shedder { step: floor, calm_windows: 0, floor }
    }

    /// One window's pressure: the agent's CPU as a share of its limit
    /// (None without a limit) and whether records were dropped.
    pub fn update(&mut self, cpu_share: Option<f64>, dropped: bool) -> Step {
        let share = cpu_share.unwrap_or(0.0);
        if dropped || share > PRESSED {
            self.step = self.step.down();
            self.calm_windows = 0;
        } else if share < CALM {
            self.calm_windows += 1;
            if self.calm_windows >= CALM_WINDOWS {
                self.step = self.step.up();
                self.calm_windows = 0;
            }
        } else {
            self.calm_windows = 0;
        }
        self.step = self.step.max(self.floor);
        self.step
    }

    pub fn step(&self) -> Step {
        self.step
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_holds() {
        let mut s = Shedder::with_floor(Step::NoSamples);
        assert_eq!(s.step(), Step::NoSamples);
        for _ in 0..5 {
            assert_eq!(s.update(Some(0.0), false), Step::NoSamples);
        }
        assert_eq!(s.update(Some(0.9), false), Step::KnownTextsOnly);
        for _ in 0..3 {
            s.update(Some(0.0), false);
        }
        assert_eq!(s.step(), Step::NoSamples, "calm goes back to the floor, not above");
    }

    #[test]
    fn pressure_steps_down_and_calm_steps_back() {
        let mut s = Shedder::default();
        assert_eq!(s.update(Some(0.5), false), Step::Exact);
        assert_eq!(s.update(Some(0.9), false), Step::NoSamples);
        assert_eq!(s.update(Some(0.1), true), Step::KnownTextsOnly);
        assert_eq!(s.update(Some(0.95), false), Step::KnownTextsOnly, "no step below the last");
        assert_eq!(s.update(Some(0.1), false), Step::KnownTextsOnly);
        assert_eq!(s.update(Some(0.5), false), Step::KnownTextsOnly, "not calm: the count restarts");
        for _ in 0..2 {
            assert_eq!(s.update(Some(0.1), false), Step::KnownTextsOnly);
        }
        assert_eq!(s.update(Some(0.1), false), Step::NoSamples);
        for _ in 0..3 {
            s.update(None, false);
        }
        assert_eq!(s.step(), Step::Exact);
    }
}
