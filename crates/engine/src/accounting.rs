//! Cost accounting: integrates cgroup samples of running sandboxes into
//! CPU-seconds and memory-GB-seconds, and storage sizes into GB-hours by kind;
//! prices them, with two counterfactuals (see docs/metrics.md).
//!
//! Accumulators live in the `usage` table, which outlives the sandbox row, so
//! a destroyed sandbox can still be costed. The last raw sample of every
//! running sandbox is kept in memory only: after a daemon restart the first
//! sample sets a new baseline (at most one interval goes uncounted).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use strata_api::{ComputeCost, ComputeUsage, CostReport, Counterfactual, Prices, SandboxState, UsageRecord};
use strata_core::lifecycle::has_processes;
use tracing::warn;

use crate::state::Shared;

pub use crate::state::accounting::*;

/// Default sampling interval (`STRATA_ACCOUNTING_INTERVAL_MS` overrides it).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
/// Storage sizes are re-measured every this many samples (60 s by default).
pub const STORAGE_EVERY: u32 = 12;

/// The last sampled figures of every running or paused sandbox the caller sees.
pub fn live_stats(st: &Shared) -> crate::error::EngineResult<Vec<strata_api::SandboxStats>> {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs();
    let mut out = Vec::new();
    for rec in st.db.list_sandboxes()? {
        let s = &rec.sandbox;
        if !crate::tenancy::visible(&s.tenant) || !has_processes(s.state) {
            continue;
        }
        // The last hour's history holds the newest point.
        let Some(p) = st.accounting.history(&s.id, now.saturating_sub(3600), now + 60).pop() else { continue };
        out.push(strata_api::SandboxStats {
            sandbox_id: s.id.clone(),
            unix_secs: p.unix_secs,
            cpu_core_pct: p.cpu_core_pct,
            memory_bytes: p.memory_bytes,
            memory_limit_bytes: s.limits.memory_bytes,
            disk_bytes: p.disk_bytes,
            disk_limit_bytes: s.limits.disk_bytes,
        });
    }
    Ok(out)
}

/// Compute between two samples: CPU from the counter delta (a counter that went
/// backwards belongs to a new cgroup and counts from 0), memory by the
/// trapezoid rule, wall-clock time.
pub fn integrate(prev: Sample, cur: Sample) -> ComputeUsage {
    let dt = (cur.at - prev.at).max(0.0);
    let cpu = if cur.cpu_usec >= prev.cpu_usec { cur.cpu_usec - prev.cpu_usec } else { cur.cpu_usec };
    ComputeUsage {
        running_seconds: dt,
        cpu_seconds: cpu as f64 / 1e6,
        memory_gb_seconds: (prev.memory_bytes as f64 + cur.memory_bytes as f64) / 2.0 / 1e9 * dt,
    }
}

/// GB-hours of `bytes` kept for `seconds`.
pub fn gb_hours(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / 1e9 * seconds / 3600.0
}

fn compute_cost(c: &ComputeUsage, p: &Prices) -> ComputeCost {
    let cpu = c.cpu_seconds * p.cpu_second;
    let memory = c.memory_gb_seconds * p.memory_gb_second;
    ComputeCost { cpu, memory, total: cpu + memory }
}

/// Prices a usage record: actual cost and the two counterfactuals.
/// `lifetime_seconds` runs from creation to destruction (or now).
pub fn price(u: &UsageRecord, state: SandboxState, lifetime_seconds: f64, p: &Prices) -> CostReport {
    let compute = compute_cost(&u.compute, p);
    let storage: BTreeMap<String, f64> =
        u.storage_gb_hours.iter().map(|(k, gbh)| (k.clone(), gbh * p.storage_gb_hour.of(k))).collect();
    let storage_total: f64 = storage.values().sum();
    let ephemeral_compute = compute_cost(&u.compute.plus(u.repaid_setup), p);
    let ephemeral_only = Counterfactual {
        compute: ephemeral_compute,
        storage: 0.0,
        total: ephemeral_compute.total,
        extra_seconds: u.repaid_setup.running_seconds,
        method: format!(
            "no storage kept; the measured compute plus the setup repaid at each of {} reuse(s) of kept state (create from a checkpoint/template: the compute recorded behind that checkpoint; start/resume: all compute accumulated before it), priced at the same rates",
            u.reuses
        ),
    };
    let idle = (lifetime_seconds - u.compute.running_seconds).max(0.0);
    let always = ComputeUsage {
        running_seconds: lifetime_seconds.max(u.compute.running_seconds),
        cpu_seconds: u.compute.cpu_seconds,
        memory_gb_seconds: u.compute.memory_gb_seconds + u.peak_memory_bytes as f64 / 1e9 * idle,
    };
    let always_compute = compute_cost(&always, p);
    let always_storage: f64 =
        storage.iter().filter(|(k, _)| !matches!(k.as_str(), "standby" | "archive")).map(|(_, v)| v).sum();
    let always_on = Counterfactual {
        compute: always_compute,
        storage: always_storage,
        total: always_compute.total + always_storage,
        extra_seconds: 0.0,
        method: format!("compute for the whole lifetime: the measured CPU-seconds (idle processes use next to none) plus memory at its peak sample ({} bytes) for the {idle:.0} s not running; storage without standby images and archives", u.peak_memory_bytes),
    };
    CostReport {
        sandbox_id: u.sandbox_id.clone(),
        name: u.name.clone(),
        state,
        lifetime_seconds,
        usage: u.clone(),
        compute,
        storage,
        storage_total,
        total: compute.total + storage_total,
        ephemeral_only,
        always_on,
        prices: p.clone(),
    }
}

/// Reads prices from a JSON file (missing fields keep their defaults).
pub fn load_prices(path: &Path) -> Result<Prices, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading prices {}: {e}", path.display()))?;
    let p: Prices = serde_json::from_str(&text).map_err(|e| format!("prices {}: {e}", path.display()))?;
    let all = [
        p.cpu_second,
        p.memory_gb_second,
        p.storage_gb_hour.writable,
        p.storage_gb_hour.checkpoint,
        p.storage_gb_hour.template,
        p.storage_gb_hour.standby,
        p.storage_gb_hour.archive,
    ];
    if all.iter().any(|v| !v.is_finite() || *v < 0.0) {
        return Err(format!("prices {}: every price must be a finite number >= 0", path.display()));
    }
    Ok(p)
}

/// Samples a running sandbox and adds what it used since its last sample.
pub fn sample(st: &Shared, id: &str) {
    let u = st.runtime_by_id(id).usage(id);
    let acc = &st.accounting;
    let cur = Sample { at: acc.now(), cpu_usec: u.cpu_usec, memory_bytes: u.memory_bytes };
    let mut inner = acc.inner.lock().unwrap_or_else(|p| p.into_inner());
    let prev = inner.live.insert(id.to_string(), cur);
    let disk_bytes = inner.sizes.get(id).and_then(|k| k.get("writable")).copied().unwrap_or(0);
    drop(inner);
    let delta = prev.map(|p| integrate(p, cur)).unwrap_or_default();
    if delta.running_seconds > 0.0 {
        acc.record_point(
            id,
            MetricPoint {
                unix_secs: SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs(),
                cpu_core_pct: delta.cpu_seconds / delta.running_seconds * 100.0,
                memory_bytes: cur.memory_bytes,
                disk_bytes,
            },
        );
    }
    let res = st.db.update_usage(id, |r| {
        r.compute = r.compute.plus(delta);
        r.peak_memory_bytes = r.peak_memory_bytes.max(cur.memory_bytes);
        r.last_memory_bytes = cur.memory_bytes;
        r.updated_at = crate::record::now();
    });
    if let Err(e) = res {
        warn!(sandbox = id, error = %e, "recording usage");
    }
}

/// The final sample before a sandbox's processes go (stop, standby, destroy).
pub fn final_sample(st: &Shared, id: &str) {
    sample(st, id);
    st.accounting.inner.lock().unwrap_or_else(|p| p.into_inner()).live.remove(id);
}

/// Records the compute behind a new checkpoint of `sandbox_id` (its inherited
/// setup plus everything it used so far), for sandboxes created from it.
pub fn on_checkpoint(st: &Shared, sandbox_id: &str, checkpoint_id: &str, running: bool) {
    if running {
        sample(st, sandbox_id);
    }
    if let Ok(Some(u)) = st.db.usage_by_id(sandbox_id) {
        if let Err(e) = st.db.set_checkpoint_setup(checkpoint_id, &u.inherited_setup.plus(u.compute)) {
            warn!(checkpoint = checkpoint_id, error = %e, "recording checkpoint setup");
        }
    }
}

/// Allocated bytes under `dir` (not following symlinks; 0 when missing).
pub fn du(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(md) = std::fs::symlink_metadata(&d) else { continue };
        total += md.blocks() * 512;
        if md.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&d) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
        }
    }
    total
}

/// Measures the storage each sandbox (destroyed ones included, for their
/// checkpoints and templates) holds, by kind.
fn measure(st: &Shared) -> HashMap<String, BTreeMap<&'static str, u64>> {
    let mut out: HashMap<String, BTreeMap<&'static str, u64>> = HashMap::new();
    if let Ok(list) = st.db.list_sandboxes() {
        for rec in list {
            let id = rec.sandbox.id.clone();
            let dir = st.sandbox_dir(&id);
            let e = out.entry(id.clone()).or_default();
            if rec.sandbox.state != SandboxState::Archived {
                e.insert("writable", du(&strata_runtime::disk::upper_dir(&dir)));
            }
            e.insert("standby", du(&dir.join("standby")));
            if let Some(m) = crate::archive::pointer(st, &id) {
                e.insert("archive", m.objects.iter().map(|o| o.size).sum());
            }
        }
    }
    let templates: HashSet<String> =
        st.db.list_templates().map(|l| l.into_iter().map(|(_, c, _)| c).collect()).unwrap_or_default();
    if let Ok(ckpts) = st.db.list_checkpoints(None) {
        for c in ckpts {
            let kind = if templates.contains(&c.id) { "template" } else { "checkpoint" };
            // A warm checkpoint's process image is stored with it.
            *out.entry(c.sandbox_id.clone()).or_default().entry(kind).or_default() +=
                c.layer_size + c.processes.as_ref().map_or(0, |p| p.bytes);
        }
    }
    out
}

fn interval() -> Duration {
    std::env::var("STRATA_ACCOUNTING_INTERVAL_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis)
        .unwrap_or(DEFAULT_INTERVAL)
}

/// Runs forever: samples running sandboxes every interval; re-measures storage
/// every [`STORAGE_EVERY`] intervals and then records the GB-hours accrued
/// since the last measurement, for every sandbox in one transaction (so a
/// host with many parked sandboxes does a little work once a minute, not a
/// write per sandbox per interval).
pub async fn run(st: Shared) {
    let every = interval();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n: u32 = 0;
    let mut last_storage: Option<Instant> = None;
    loop {
        tick.tick().await;
        let st2 = st.clone();
        let remeasure = n.is_multiple_of(STORAGE_EVERY);
        n = n.wrapping_add(1);
        let now = Instant::now();
        let secs = last_storage.map(|t| now.duration_since(t).as_secs_f64()).unwrap_or(0.0);
        if remeasure {
            last_storage = Some(now);
        }
        let _ = tokio::task::spawn_blocking(move || {
            for id in st2.db.live_sandbox_ids().unwrap_or_default() {
                sample(&st2, &id);
            }
            if !remeasure {
                return;
            }
            // Storage held since the last measurement was what that measurement found.
            let held = {
                let inner = st2.accounting.inner.lock().unwrap_or_else(|p| p.into_inner());
                inner.sizes.clone()
            };
            if secs > 0.0 {
                let accrued: Vec<(String, BTreeMap<String, f64>)> = held
                    .into_iter()
                    .filter(|(_, kinds)| kinds.values().any(|b| *b > 0))
                    .map(|(id, kinds)| {
                        (id, kinds.into_iter().map(|(k, b)| (k.to_string(), gb_hours(b, secs))).collect())
                    })
                    .collect();
                if let Err(e) = st2.db.add_storage_usage(&accrued) {
                    warn!(error = %e, "recording storage usage");
                }
            }
            let sizes = measure(&st2);
            st2.accounting.inner.lock().unwrap_or_else(|p| p.into_inner()).sizes = sizes;
        })
        .await;
    }
}

fn seconds_between(a: &str, b: Option<&str>) -> f64 {
    let start = humantime::parse_rfc3339_weak(a).ok();
    let end = b.and_then(|b| humantime::parse_rfc3339_weak(b).ok()).unwrap_or_else(SystemTime::now);
    start.and_then(|s| end.duration_since(s).ok()).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// The priced report of one usage record.
pub fn report(st: &Shared, mut u: UsageRecord) -> CostReport {
    let state = match st.db.sandbox_by_id(&u.sandbox_id) {
        Ok(Some(rec)) if u.destroyed_at.is_none() => {
            if has_processes(rec.sandbox.state) {
                sample(st, &u.sandbox_id);
                if let Ok(Some(fresh)) = st.db.usage_by_id(&u.sandbox_id) {
                    u = fresh;
                }
            }
            rec.sandbox.state
        }
        _ => SandboxState::Destroyed,
    };
    let lifetime = seconds_between(&u.created_at, u.destroyed_at.as_deref());
    price(&u, state, lifetime, &st.prices)
}

/// The cost report of the sandbox `key` names for the current caller,
/// destroyed sandboxes included (404 otherwise); read on a blocking thread.
pub async fn report_for(st: &Shared, key: &str) -> crate::error::EngineResult<CostReport> {
    let st2 = st.clone();
    let key = key.to_string();
    // The caller's scope, taken here: a blocking thread has no task-local caller.
    let scope = crate::tenancy::scope();
    tokio::task::spawn_blocking(move || -> crate::error::EngineResult<CostReport> {
        let u = st2
            .db
            .find_usage(&key, scope.as_deref())?
            .ok_or_else(|| crate::error::EngineError::sandbox_not_found(&key))?;
        Ok(report(&st2, u))
    })
    .await
    .map_err(|e| crate::error::EngineError::internal("cost task", &e))?
}

/// Cost of every sandbox the current caller sees, destroyed ones included,
/// with totals (read on a blocking thread).
pub async fn summary(st: &Shared) -> crate::error::EngineResult<strata_api::CostSummary> {
    let st = st.clone();
    // Taken here: the blocking thread has no task-local caller.
    let scope = crate::tenancy::scope();
    tokio::task::spawn_blocking(move || -> crate::error::EngineResult<strata_api::CostSummary> {
        let sandboxes: Vec<CostReport> = st
            .db
            .list_usage()?
            .into_iter()
            .filter(|u| scope.as_deref().is_none_or(|t| t == u.tenant))
            .map(|u| report(&st, u))
            .collect();
        Ok(strata_api::CostSummary {
            total: sandboxes.iter().map(|r| r.total).sum(),
            ephemeral_only_total: sandboxes.iter().map(|r| r.ephemeral_only.total).sum(),
            always_on_total: sandboxes.iter().map(|r| r.always_on.total).sum(),
            sandboxes,
            prices: st.prices.clone(),
        })
    })
    .await
    .map_err(|e| crate::error::EngineError::internal("cost task", &e))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(at: f64, cpu_usec: u64, memory_bytes: u64) -> Sample {
        Sample { at, cpu_usec, memory_bytes }
    }

    #[test]
    fn integrates_cpu_deltas_and_memory_trapezoids() {
        let c = integrate(s(10.0, 1_000_000, 1_000_000_000), s(15.0, 3_500_000, 3_000_000_000));
        assert_eq!(c.running_seconds, 5.0);
        assert_eq!(c.cpu_seconds, 2.5);
        assert!((c.memory_gb_seconds - 10.0).abs() < 1e-9); // average 2 GB for 5 s
                                                            // A counter that went backwards belongs to a new cgroup: count from 0.
        let c = integrate(s(0.0, 9_000_000, 0), s(1.0, 500_000, 0));
        assert_eq!(c.cpu_seconds, 0.5);
        // Samples out of order never produce negative time.
        assert_eq!(integrate(s(2.0, 0, 1), s(1.0, 0, 1)).running_seconds, 0.0);
    }

    #[test]
    fn storage_is_gb_hours() {
        assert!((gb_hours(2_000_000_000, 1800.0) - 1.0).abs() < 1e-12);
        assert_eq!(gb_hours(0, 3600.0), 0.0);
    }

    fn prices() -> Prices {
        Prices {
            currency: "X".into(),
            cpu_second: 2.0,
            memory_gb_second: 3.0,
            storage_gb_hour: strata_api::StoragePrices {
                writable: 5.0,
                checkpoint: 7.0,
                template: 11.0,
                standby: 13.0,
                archive: 17.0,
            },
        }
    }

    fn usage() -> UsageRecord {
        UsageRecord {
            compute: ComputeUsage { running_seconds: 100.0, cpu_seconds: 10.0, memory_gb_seconds: 20.0 },
            peak_memory_bytes: 2_000_000_000,
            storage_gb_hours: [
                ("writable".to_string(), 1.0),
                ("standby".to_string(), 2.0),
                ("archive".to_string(), 1.0),
            ]
            .into_iter()
            .collect(),
            inherited_setup: ComputeUsage { running_seconds: 50.0, cpu_seconds: 4.0, memory_gb_seconds: 1.0 },
            repaid_setup: ComputeUsage { running_seconds: 60.0, cpu_seconds: 5.0, memory_gb_seconds: 2.0 },
            reuses: 2,
            ..Default::default()
        }
    }

    #[test]
    fn prices_compute_and_storage() {
        let r = price(&usage(), SandboxState::Stopped, 400.0, &prices());
        assert_eq!(r.compute, ComputeCost { cpu: 20.0, memory: 60.0, total: 80.0 });
        assert_eq!(r.storage["writable"], 5.0);
        assert_eq!(r.storage["standby"], 26.0);
        assert_eq!(r.storage["archive"], 17.0);
        assert_eq!(r.storage_total, 48.0);
        assert_eq!(r.total, 128.0);
    }

    #[test]
    fn ephemeral_only_repays_setup_and_keeps_nothing() {
        let r = price(&usage(), SandboxState::Stopped, 400.0, &prices());
        // (10 + 5) cpu-s * 2 + (20 + 2) GB-s * 3
        assert_eq!(r.ephemeral_only.compute.total, 30.0 + 66.0);
        assert_eq!(r.ephemeral_only.storage, 0.0);
        assert_eq!(r.ephemeral_only.extra_seconds, 60.0);
        assert!(r.ephemeral_only.method.contains("2 reuse"));
    }

    #[test]
    fn always_on_charges_peak_memory_while_not_running() {
        let r = price(&usage(), SandboxState::Stopped, 400.0, &prices());
        // 300 s idle at 2 GB = 600 GB-s more memory; CPU unchanged.
        assert_eq!(r.always_on.compute.cpu, 20.0);
        assert_eq!(r.always_on.compute.memory, (20.0 + 600.0) * 3.0);
        // Only the writable layer: no standby image or archive when never released.
        assert_eq!(r.always_on.storage, 5.0);
        // A lifetime shorter than the running time (clock skew) adds nothing.
        let r = price(&usage(), SandboxState::Running, 50.0, &prices());
        assert_eq!(r.always_on.compute.memory, 60.0);
    }

    #[test]
    fn prices_file_overrides_defaults() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("p.json");
        std::fs::write(&p, r#"{"cpu_second": 0.5, "storage_gb_hour": {"archive": 0.001}}"#).unwrap();
        let got = load_prices(&p).unwrap();
        assert_eq!(got.cpu_second, 0.5);
        assert_eq!(got.storage_gb_hour.archive, 0.001);
        assert_eq!(got.memory_gb_second, Prices::default().memory_gb_second);
        assert_eq!(got.storage_gb_hour.writable, Prices::default().storage_gb_hour.writable);
        std::fs::write(&p, r#"{"cpu_second": -1}"#).unwrap();
        assert!(load_prices(&p).is_err());
    }

    #[test]
    fn du_counts_allocated_bytes() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), vec![1u8; 64 * 1024]).unwrap();
        assert!(du(d.path()) >= 64 * 1024);
        assert_eq!(du(&d.path().join("missing")), 0);
    }
}
