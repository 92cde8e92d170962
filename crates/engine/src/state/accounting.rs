//! The cost sampler's in-memory state ([`Accounting`]: the last sample of
//! each running sandbox, storage sizes) and what every recorded transition
//! tells it ([`on_transition`]). Sampling, the loop and the reports are
//! [`crate::accounting`]'s.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Instant;

use strata_api::SandboxState;
use strata_core::lifecycle::has_processes;
use strata_core::Action;
use tracing::warn;

/// One raw sample of a running sandbox.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Seconds on a monotonic clock.
    pub at: f64,
    /// Cumulative CPU counter of the cgroup, microseconds.
    pub cpu_usec: u64,
    /// Memory charged now, bytes.
    pub memory_bytes: u64,
}

/// One point of a sandbox's recent metrics (what [`Accounting`] keeps of its
/// samples for range queries such as E2B's `get_metrics(start, end)`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetricPoint {
    /// Wall-clock time of the sample, seconds since the Unix epoch.
    pub unix_secs: u64,
    /// CPU used since the previous sample, in percent of one core.
    pub cpu_core_pct: f64,
    /// Memory charged, bytes.
    pub memory_bytes: u64,
    /// Bytes of its writable layer at the last storage measurement (every
    /// minute by default).
    pub disk_bytes: u64,
}

/// Points kept per sandbox: an hour at the default 5 s interval.
pub const HISTORY_POINTS: usize = 720;

#[derive(Default)]
pub(crate) struct Inner {
    /// Last sample per running sandbox.
    pub(crate) live: HashMap<String, Sample>,
    /// Recent points per sandbox (running or parked; dropped when it is destroyed).
    pub(crate) history: HashMap<String, std::collections::VecDeque<MetricPoint>>,
    /// Bytes by kind per owning sandbox id, from the last measurement.
    pub(crate) sizes: HashMap<String, BTreeMap<&'static str, u64>>,
}

/// The sampler's in-memory state.
pub struct Accounting {
    pub(crate) inner: Mutex<Inner>,
    epoch: Instant,
}

impl Default for Accounting {
    fn default() -> Self {
        Accounting { inner: Mutex::new(Inner::default()), epoch: Instant::now() }
    }
}

impl Accounting {
    /// Seconds since the sampler started (the clock of its samples).
    pub(crate) fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    /// Records a point of `id`'s history (the oldest goes past [`HISTORY_POINTS`]).
    pub(crate) fn record_point(&self, id: &str, point: MetricPoint) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let h = inner.history.entry(id.to_string()).or_default();
        if h.len() == HISTORY_POINTS {
            h.pop_front();
        }
        h.push_back(point);
    }

    /// The points of `id` whose time is within `[start, end]` (seconds since
    /// the epoch, both inclusive), oldest first.
    pub fn history(&self, id: &str, start: u64, end: u64) -> Vec<MetricPoint> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner
            .history
            .get(id)
            .map(|h| h.iter().filter(|p| (start..=end).contains(&p.unix_secs)).copied().collect())
            .unwrap_or_default()
    }
}

/// Called by every recorded transition: a sandbox that starts running gets a
/// fresh baseline; reuses of kept state are counted for the ephemeral-only counterfactual.
pub fn on_transition(
    acc: &Accounting,
    db: &strata_store::Db,
    runtime: &dyn strata_runtime::Runtime,
    id: &str,
    from: SandboxState,
    to: SandboxState,
    action: Action,
) {
    if has_processes(to) && !has_processes(from) {
        let u = runtime.usage(id);
        acc.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .live
            .insert(id.to_string(), Sample { at: acc.now(), cpu_usec: u.cpu_usec, memory_bytes: u.memory_bytes });
    } else if !has_processes(to) {
        let mut inner = acc.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.live.remove(id);
        if to == SandboxState::Destroyed {
            inner.history.remove(id);
        }
    }
    let res = match action {
        Action::Ready => {
            let Ok(Some(rec)) = db.usage_by_id(id) else { return };
            let Some(base) = rec.base_checkpoint.as_deref() else { return };
            let inherited = db.checkpoint_setup(base).ok().flatten().unwrap_or_default();
            db.update_usage(id, |r| {
                r.inherited_setup = inherited;
                r.repaid_setup = r.repaid_setup.plus(inherited);
                r.reuses += 1;
            })
        }
        Action::Start | Action::Resume => db.update_usage(id, |r| {
            r.repaid_setup = r.repaid_setup.plus(r.inherited_setup.plus(r.compute));
            r.reuses += 1;
        }),
        _ => return,
    };
    if let Err(e) = res {
        warn!(sandbox = id, error = %e, "recording usage");
    }
}
