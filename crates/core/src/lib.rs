//! Pure logic of strata: no I/O, no async, no syscalls.
//!
//! * [`lifecycle`]: the exhaustive transition table of sandbox states.
//! * [`units`]: durations (`30s`, `2h`), sizes (`512m`, `2G`) and CPU counts.
//! * [`ids`]: sandbox ids and names.
//! * [`rule_of_two`]: which Rule-of-Two capabilities a sandbox holds.
//! * [`errors`]: an error and its causes on one line.

pub mod advisor;
pub mod errors;
pub mod ids;
pub mod lifecycle;
pub mod rule_of_two;
pub mod units;

pub use lifecycle::{Action, InvalidTransition};
