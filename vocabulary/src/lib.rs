//! The vocabulary every sqlbee role speaks, written once: the latency
//! histogram (its bucket math lives in `sqlbee_figures::histogram`, shared
//! with the kernel programs), wall-clock times as the wire and the output
//! write them, human durations for flags and config keys, what a digest
//! id is, percent-encoding, and how an error and its causes read on one
//! line.
//!
//! Imports no role: the agent, the collector and the query tools all
//! depend on this crate, never on each other's rooms to get these.
pub mod clock;
pub mod digest_id;
pub mod duration;
mod error_chain;
pub mod histogram;
pub mod percent;

pub use error_chain::error_chain;
