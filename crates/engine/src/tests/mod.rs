//! Unit tests of the engine's lifecycle bookkeeping, run as the daemon
//! ([`crate::tenancy::as_daemon`]; a task with no caller sees nothing), against
//! [`strata_runtime::fake::FakeRuntime`]: no root, no mounts, no processes.
//! What they cover is the engine's own logic (states, events, images on disk,
//! error paths, reconciliation); the real tier is covered by the root-only
//! integration tests in crates/cli/tests.

mod access;
mod harness;
mod layers;
mod lifecycle;
mod preview;
mod state;
mod surface;
