//! Deltas of named counter sets (disks, interfaces) between two samples.
use std::collections::HashMap;

/// The previous reading of each name; replaced whole on every sample so a
/// name that disappears is forgotten.
pub(super) struct Deltas<const N: usize> {
    previous: HashMap<String, [u64; N]>,
}

impl<const N: usize> Default for Deltas<N> {
    fn default() -> Self {
        Deltas { previous: HashMap::new() }
    }
}

impl<const N: usize> Deltas<N> {
    #[cfg(test)]
    pub(super) fn tracked(&self) -> usize {
        self.previous.len()
    }

    /// How much each counter grew since the previous sample, for the names
    /// present in both, in the order of `current`. A counter that went
    /// backwards means the device was reset or recreated under the same
    /// name: it has no delta this time and restarts from `current`.
    pub(super) fn advance(&mut self, current: Vec<(String, [u64; N])>) -> Vec<(String, [u64; N])> {
        let mut deltas = Vec::with_capacity(current.len());
        let mut next = HashMap::with_capacity(current.len());
        for (name, now) in current {
            if let Some(before) = self.previous.get(&name) {
                let mut delta = [0; N];
                let grew = delta.iter_mut().zip(before.iter().zip(&now)).all(|(d, (b, n))| {
                    *d = n.wrapping_sub(*b);
                    n >= b
                });
                if grew {
                    deltas.push((name.clone(), delta));
                } else {
                    tracing::debug!(%name, "counters went backwards; restarting its deltas");
                }
            }
            next.insert(name, now);
        }
        self.previous = next;
        deltas
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(entries: &[(&str, [u64; 2])]) -> Vec<(String, [u64; 2])> {
        entries.iter().map(|(n, v)| (n.to_string(), *v)).collect()
    }

    #[test]
    fn deltas_need_two_samples_and_restart_on_reset() {
        let mut deltas = Deltas::<2>::default();
        assert!(deltas.advance(set(&[("a", [10, 20])])).is_empty());
        assert_eq!(deltas.advance(set(&[("a", [15, 20]), ("b", [1, 1])])), set(&[("a", [5, 0])]));
        // `a` reset, `b` grew, `c` is new.
        assert_eq!(deltas.advance(set(&[("a", [3, 25]), ("b", [4, 2]), ("c", [9, 9])])), set(&[("b", [3, 1])]));
        assert_eq!(deltas.advance(set(&[("a", [4, 25])])), set(&[("a", [1, 0])]));
        // Names not seen last time are forgotten.
        assert!(deltas.advance(set(&[("b", [5, 5])])).is_empty());
    }
}
