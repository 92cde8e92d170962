//! Unit tests of the engine's lifecycle bookkeeping against
//! [`strata_runtime::fake::FakeRuntime`]: no root, no mounts, no processes.
//! What they cover is the engine's own logic (states, events, images on disk,
//! error paths, reconciliation); the real tier is covered by the root-only
//! integration tests in crates/cli/tests.

mod harness;
mod lifecycle;
mod state;
