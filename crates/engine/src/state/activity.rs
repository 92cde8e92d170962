//! The activity tracker: recent API activity and open requests per sandbox
//! (an [`ActivityGuard`] per call that uses a sandbox, held while its answer
//! streams), for idle detection. The leases are [`crate::activity`]'s.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    last: Instant,
    open: usize,
}

/// In-memory activity of every sandbox.
#[derive(Debug)]
pub struct ActivityTracker {
    started: Instant,
    inner: Mutex<HashMap<String, Entry>>,
}

/// What the tracker knows about one sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActivityView {
    /// Time since the last activity (at most the daemon's uptime).
    pub quiet_for: Duration,
    /// Requests (and streamed responses) in progress.
    pub open: usize,
}

impl Default for ActivityTracker {
    fn default() -> Self {
        ActivityTracker { started: Instant::now(), inner: Mutex::new(HashMap::new()) }
    }
}

impl ActivityTracker {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records activity on a sandbox now.
    pub fn touch(&self, id: &str) {
        let now = Instant::now();
        self.lock().entry(id.to_string()).and_modify(|e| e.last = now).or_insert(Entry { last: now, open: 0 });
    }

    /// Records activity now and holds the sandbox awake until the guard is dropped.
    pub fn hold(self: &Arc<Self>, id: &str) -> ActivityGuard {
        let now = Instant::now();
        self.lock()
            .entry(id.to_string())
            .and_modify(|e| {
                e.last = now;
                e.open += 1;
            })
            .or_insert(Entry { last: now, open: 1 });
        ActivityGuard { tracker: self.clone(), id: id.to_string() }
    }

    fn release(&self, id: &str) {
        if let Some(e) = self.lock().get_mut(id) {
            e.open = e.open.saturating_sub(1);
            e.last = Instant::now();
        }
    }

    /// The activity view of a sandbox at `at`.
    pub fn view(&self, id: &str, at: Instant) -> ActivityView {
        let e = self.lock().get(id).copied();
        let last = e.map_or(self.started, |e| e.last.max(self.started));
        ActivityView { quiet_for: at.saturating_duration_since(last), open: e.map_or(0, |e| e.open) }
    }

    /// Forgets sandboxes not in `known` that have nothing open (destroyed ones).
    pub fn retain(&self, known: &HashSet<&str>) {
        self.lock().retain(|id, e| e.open > 0 || known.contains(id.as_str()));
    }
}

/// Holds a sandbox awake while it lives; its end counts as activity.
#[derive(Debug)]
pub struct ActivityGuard {
    tracker: Arc<ActivityTracker>,
    id: String,
}

impl Drop for ActivityGuard {
    fn drop(&mut self) {
        self.tracker.release(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::time::Duration;

    #[test]
    fn guards_hold_until_dropped_and_their_end_is_activity() {
        let t = Arc::new(ActivityTracker::default());
        let later = Instant::now() + Duration::from_secs(60);
        assert_eq!(t.view("a", later).open, 0);
        assert!(
            t.view("a", later).quiet_for >= Duration::from_secs(59),
            "unknown sandboxes are quiet since the daemon started"
        );
        let g1 = t.hold("a");
        let g2 = t.hold("a");
        assert_eq!(t.view("a", later).open, 2);
        drop(g1);
        assert_eq!(t.view("a", later).open, 1);
        drop(g2);
        let v = t.view("a", Instant::now());
        assert_eq!(v.open, 0);
        assert!(v.quiet_for < Duration::from_secs(5));
        t.retain(&HashSet::new());
        assert_eq!(t.lock().len(), 0, "forgotten once unknown and closed");
    }
}
