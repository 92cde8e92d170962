//! Prometheus metrics (`GET /metrics`, OpenMetrics text through `prometheus-client`).
//!
//! Histograms and counters are updated where operations complete; gauges (sandboxes
//! by state, per-sandbox resources) are recomputed at scrape time from the current
//! sandbox rows and cgroup counters, so a scrape costs O(live sandboxes), never
//! O(history).

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use strata_api::SandboxState;
use strata_core::lifecycle::has_processes;
use strata_core::Action;

/// The phases timed by `strata_phase_duration_seconds`.
pub const PHASES: [&str; 12] = [
    "create",
    "ready",
    "exec",
    "checkpoint",
    "fork",
    "standby",
    "resume",
    "archive",
    "unarchive",
    "start",
    "stop",
    "destroy",
];

/// Histogram buckets, seconds: 1 ms to ~65 s.
pub fn buckets() -> Vec<f64> {
    (0..17).map(|i| 0.001 * 2f64.powi(i)).collect()
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransitionLabels {
    to: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PreviewLabels {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabels {
    direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SandboxLabels {
    sandbox: String,
}

/// The daemon's metrics.
pub struct Metrics {
    registry: Registry,
    phases: Family<PhaseLabels, Histogram, fn() -> Histogram>,
    transitions: Family<TransitionLabels, Counter>,
    states: Family<StateLabels, Gauge>,
    memory: Family<SandboxLabels, Gauge>,
    cpu: Family<SandboxLabels, Counter<f64, AtomicU64>>,
    pids: Family<SandboxLabels, Gauge>,
    preview_requests: Family<PreviewLabels, Counter>,
    preview_bytes: Family<DirectionLabels, Counter>,
    /// One scrape at a time (gauges are cleared and refilled).
    scrape: Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every strata metric.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let phases =
            Family::<PhaseLabels, Histogram, fn() -> Histogram>::new_with_constructor(|| Histogram::new(buckets()));
        registry.register("strata_phase_duration_seconds", "Duration of lifecycle phases (create: creating->running; ready: a create request end to end; exec: API process spawn to exit; ...)", phases.clone());
        let transitions = Family::<TransitionLabels, Counter>::default();
        registry.register(
            "strata_transitions",
            "Lifecycle transitions by target state and reason",
            transitions.clone(),
        );
        let states = Family::<StateLabels, Gauge>::default();
        registry.register("strata_sandboxes", "Sandboxes by state (at scrape time)", states.clone());
        let memory = Family::<SandboxLabels, Gauge>::default();
        registry.register(
            "strata_sandbox_memory_bytes",
            "Memory charged to a running sandbox's cgroup",
            memory.clone(),
        );
        let cpu = Family::<SandboxLabels, Counter<f64, AtomicU64>>::default();
        registry.register(
            "strata_sandbox_cpu_seconds",
            "CPU time used by a running sandbox since its cgroup was created",
            cpu.clone(),
        );
        let pids = Family::<SandboxLabels, Gauge>::default();
        registry.register("strata_sandbox_pids", "Tasks in a running sandbox", pids.clone());
        let preview_requests = Family::<PreviewLabels, Counter>::default();
        registry.register(
            "strata_preview_requests",
            "Requests to preview URLs by outcome (proxied, upgraded, unauthorized, refused, upstream_error)",
            preview_requests.clone(),
        );
        let preview_bytes = Family::<DirectionLabels, Counter>::default();
        registry.register(
            "strata_preview_bytes",
            "Bytes proxied through preview URLs (to_sandbox, from_sandbox; bodies and upgraded streams)",
            preview_bytes.clone(),
        );
        // Every phase appears (with zero counts) from the first scrape.
        for p in PHASES {
            let _ = phases.get_or_create(&PhaseLabels { phase: p.to_string() });
        }
        Metrics {
            registry,
            phases,
            transitions,
            states,
            memory,
            cpu,
            pids,
            preview_requests,
            preview_bytes,
            scrape: Mutex::new(()),
        }
    }

    /// Counts one preview request by outcome.
    pub fn preview_request(&self, outcome: &str) {
        self.preview_requests.get_or_create(&PreviewLabels { outcome: outcome.to_string() }).inc();
    }

    /// Counts bytes proxied for a preview (`to_sandbox` or `from_sandbox`).
    pub fn preview_bytes(&self, direction: &str, n: u64) {
        self.preview_bytes.get_or_create(&DirectionLabels { direction: direction.to_string() }).inc_by(n);
    }

    /// Records one completed phase.
    pub fn observe(&self, phase: &str, d: Duration) {
        self.phases.get_or_create(&PhaseLabels { phase: phase.to_string() }).observe(d.as_secs_f64());
    }

    /// Counts one transition.
    pub fn transition(&self, to: SandboxState, reason: &str) {
        self.transitions
            .get_or_create(&TransitionLabels { to: to.as_str().to_string(), reason: reason.to_string() })
            .inc();
    }

    /// The OpenMetrics text of every metric, gauges refreshed from the
    /// sandboxes `db` records and their counters (`usage`: a sandbox's, from its tier).
    pub fn render(
        &self,
        db: &strata_store::Db,
        usage: &dyn Fn(&strata_api::Sandbox) -> strata_runtime::ResourceUsage,
    ) -> String {
        let _g = self.scrape.lock().unwrap_or_else(|p| p.into_inner());
        self.states.clear();
        self.memory.clear();
        self.cpu.clear();
        self.pids.clear();
        for s in SandboxState::ALL {
            if s != SandboxState::Destroyed {
                let _ = self.states.get_or_create(&StateLabels { state: s.as_str().to_string() });
            }
        }
        if let Ok(list) = db.list_sandboxes() {
            for rec in list {
                self.states.get_or_create(&StateLabels { state: rec.sandbox.state.as_str().to_string() }).inc();
                if has_processes(rec.sandbox.state) {
                    let u = usage(&rec.sandbox);
                    let l = SandboxLabels { sandbox: rec.sandbox.id.clone() };
                    self.memory.get_or_create(&l).set(u.memory_bytes as i64);
                    self.cpu.get_or_create(&l).inc_by(u.cpu_usec as f64 / 1e6);
                    self.pids.get_or_create(&l).set(u.pids as i64);
                }
            }
        }
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The phase a completed transition action times, if any.
pub fn phase_of(action: Action) -> Option<&'static str> {
    Some(match action {
        Action::Ready => "create",
        Action::Start => "start",
        Action::Stop => "stop",
        Action::Standby => "standby",
        Action::Resume => "resume",
        Action::Archive => "archive",
        Action::Unarchive | Action::UnarchiveStandby => "unarchive",
        Action::Destroy => "destroy",
        Action::Pause | Action::Unpause | Action::Fail | Action::Lose => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_milliseconds_to_a_minute() {
        let b = buckets();
        assert_eq!(b[0], 0.001);
        assert!(b.windows(2).all(|w| w[1] == w[0] * 2.0));
        assert!(*b.last().unwrap() > 60.0);
    }

    #[test]
    fn every_phase_action_maps_to_a_known_phase() {
        for a in [
            Action::Ready,
            Action::Start,
            Action::Stop,
            Action::Standby,
            Action::Resume,
            Action::Archive,
            Action::Unarchive,
            Action::UnarchiveStandby,
            Action::Destroy,
        ] {
            assert!(PHASES.contains(&phase_of(a).unwrap()));
        }
        assert_eq!(phase_of(Action::Fail), None);
    }

    #[test]
    fn histogram_counts_and_transitions_are_encoded() {
        let m = Metrics::new();
        m.observe("exec", Duration::from_millis(3));
        m.observe("exec", Duration::from_millis(300));
        m.transition(SandboxState::Running, "created");
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &m.registry).unwrap();
        assert!(out.contains("strata_phase_duration_seconds_count{phase=\"exec\"} 2"), "{out}");
        assert!(
            out.contains("strata_phase_duration_seconds_bucket{le=\"0.004\",phase=\"exec\"} 1")
                || out.contains("strata_phase_duration_seconds_bucket{phase=\"exec\",le=\"0.004\"} 1"),
            "{out}"
        );
        assert!(out.contains("strata_phase_duration_seconds_count{phase=\"fork\"} 0"));
        assert!(out.contains("strata_transitions_total{to=\"running\",reason=\"created\"} 1"), "{out}");
    }
}
