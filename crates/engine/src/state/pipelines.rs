//! The pipeline driver's in-memory state: which runs a task of this daemon
//! drives, which were asked to pause at their next stage boundary, and the
//! progress channel followers subscribe to. The runs themselves are in the
//! store; this is what does not outlive the daemon.

use std::collections::HashSet;
use std::sync::Mutex;

use strata_api::PipelineEvent;

/// Runs being driven, runs pausing, progress (one per daemon, in [`super::AppState`]).
pub struct Pipelines {
    active: Mutex<HashSet<String>>,
    pausing: Mutex<HashSet<String>>,
    events: tokio::sync::broadcast::Sender<PipelineEvent>,
}

impl Default for Pipelines {
    fn default() -> Self {
        Pipelines {
            active: Mutex::default(),
            pausing: Mutex::default(),
            events: tokio::sync::broadcast::channel(1024).0,
        }
    }
}

fn locked(m: &Mutex<HashSet<String>>) -> std::sync::MutexGuard<'_, HashSet<String>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Pipelines {
    /// Claims `run_id` for the calling driver; `false` when a driver has it already.
    pub fn claim(&self, run_id: &str) -> bool {
        locked(&self.active).insert(run_id.to_string())
    }

    /// Releases a run its driver finished with.
    pub fn release(&self, run_id: &str) {
        locked(&self.active).remove(run_id);
    }

    /// Whether a driver of this daemon has `run_id`.
    pub fn is_active(&self, run_id: &str) -> bool {
        locked(&self.active).contains(run_id)
    }

    /// Asks `run_id` to pause at its next stage boundary.
    pub fn ask_pause(&self, run_id: &str) {
        locked(&self.pausing).insert(run_id.to_string());
    }

    /// Whether `run_id` was asked to pause (the request is consumed).
    pub fn take_pause(&self, run_id: &str) -> bool {
        locked(&self.pausing).remove(run_id)
    }

    /// Progress of every run driven by this daemon, for followers.
    pub fn events(&self) -> &tokio::sync::broadcast::Sender<PipelineEvent> {
        &self.events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_driven_once_and_a_pause_request_is_taken_once() {
        let p = Pipelines::default();
        assert!(p.claim("r1") && !p.claim("r1") && p.is_active("r1"));
        p.release("r1");
        assert!(!p.is_active("r1") && p.claim("r1"));
        assert!(!p.take_pause("r1"));
        p.ask_pause("r1");
        assert!(p.take_pause("r1") && !p.take_pause("r1"));
    }
}
