//! The state machines: one exhaustive table each, with no wildcard arms, so a
//! new state or action does not compile until its table decides what it does.
//!
//! - [`sandbox`]: creating/running/paused/standby/stopped/archived/... (the
//!   store's compare-and-set `transition` applies it, destroy included);
//! - [`pipeline`]: a pipeline run (running/paused/succeeded/failed/interrupted);
//! - [`approval`]: a Rule-of-Two approval (pending/approved/denied/used).

pub mod approval;
pub mod pipeline;
pub mod sandbox;

pub use sandbox::*;
