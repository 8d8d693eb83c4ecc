//! What the server counted for one digest's statements, summed: one `u64`
//! per figure of `sqlbee_figures::figures!`, in its order. The kernel
//! digests and the agent's aggregator add statements into it.
use sqlbee_figures::{COUNT, figures};

use crate::{StatementStats, statement_flag};

macro_rules! declare {
    ($(($name:ident, $needs:ident, $unit:ident, $from:ident($source:ident), $label:literal, $about:literal
        $(, rank($key:literal, $column:literal))?)),* $(,)?) => {
        /// What the server counted for one digest's statements (the sum
        /// over them), one field per figure.
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct FigureSums {
            $(#[doc = $about] pub $name: u64,)*
        }

        impl FigureSums {
            /// Each figure's value, in list order.
            #[inline(always)]
            pub fn values(&self) -> [u64; COUNT] {
                [$(self.$name,)*]
            }

            /// Each figure's slot, in list order.
            pub fn values_mut(&mut self) -> [&mut u64; COUNT] {
                [$(&mut self.$name,)*]
            }

            /// Wrapping: a counter read from a server's memory may hold
            /// anything, and a sum must never panic the agent.
            #[inline(always)]
            pub fn add(&mut self, other: &FigureSums) {
                $(self.$name = self.$name.wrapping_add(other.$name);)*
            }

            /// Adds one statement's figures.
            #[inline(always)]
            pub fn add_statement(&mut self, s: &StatementStats) {
                $(self.$name = self.$name.wrapping_add(from_record!(s, $from($source)));)*
            }

            /// Adds one statement's figures that can be known (`needs`
            /// all in `known`), leaving the others alone. In the kernel
            /// `known` comes from the load-time layout, a constant to the
            /// verifier, so a figure not read costs no instruction and
            /// touches no line of the slot.
            #[inline(always)]
            pub fn add_known(&mut self, s: &StatementStats, known: u32) {
                $(if sqlbee_figures::needs::$needs & known == sqlbee_figures::needs::$needs {
                    self.$name = self.$name.wrapping_add(from_record!(s, $from($source)));
                })*
            }
        }
    };
}

/// How one statement's record gives a figure: `value(field)` (a u64
/// field), `widen(field)` (a u32 field) or `flag(BIT)` (1 when the
/// `statement_flag` bit is set).
macro_rules! from_record {
    ($s:ident, value($field:ident)) => {
        $s.$field
    };
    ($s:ident, widen($field:ident)) => {
        u64::from($s.$field)
    };
    ($s:ident, flag($bit:ident)) => {
        u64::from($s.flags & statement_flag::$bit != 0)
    };
}

figures!(declare);
