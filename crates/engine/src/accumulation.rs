//! Accumulation: what a sandbox has gathered over time, measured from its
//! layers on the host (it is never resumed for it): its writable layer's bytes
//! and entries and their growth per day, what changed since its last
//! checkpoint, the checkpoints it keeps and their storage, and how old its base is. The
//! policy's `max_writable` and `max_age` turn figures past them into check
//! findings (`accumulation.writable`, `accumulation.age`).
//!
//! The writable layer is walked (the same `O_NOFOLLOW` walk as a diff's), so
//! measuring costs about what a scan's walk costs: it runs in checks, on
//! `GET /v1/sandboxes/{id}/accumulation` (`strata inspect`, `strata ps
//! --wide`), never on a plain inspect.

use std::time::{Duration, SystemTime};

use strata_api::{Accumulation, Finding, SandboxPolicy, SandboxState, Severity};
use strata_core::units;
use strata_store::db::SandboxRecord;

use crate::clock::parse_time;
use crate::error::{EngineError, EngineResult};
use crate::state::Shared;

const DAY: Duration = Duration::from_secs(86_400);

/// Whole days from `since` (RFC 3339) to `now`.
fn days_since(since: &str, now: SystemTime) -> u64 {
    parse_time(since).and_then(|t| now.duration_since(t).ok()).map_or(0, |d| d.as_secs() / DAY.as_secs())
}

/// Whether a sandbox in `state` has its writable layer on this host (to
/// measure or check): not while it is archived, being created or gone.
pub fn layer_on_host(state: SandboxState) -> bool {
    !matches!(state, SandboxState::Archived | SandboxState::Creating | SandboxState::Destroyed)
}

/// Measures the sandbox `rec` (its writable layer is walked: call it off the async workers).
pub fn measure(st: &Shared, rec: &SandboxRecord) -> EngineResult<Accumulation> {
    let s = &rec.sandbox;
    if !layer_on_host(s.state) {
        return Err(EngineError::invalid_state(
            s.state,
            format!("sandbox {} is {}: its writable layer is not on this host to measure", s.name, s.state),
        ));
    }
    let upper = st.upper_dir(&s.id);
    let walked = if upper.is_dir() {
        Some(
            strata_image::changes::scan(&upper, &strata_runtime::spec::IDENTITY_PATHS)
                .map_err(|e| EngineError::internal("walk the writable layer", &e))?,
        )
    } else {
        None
    };
    measure_walked(st, rec, walked)
}

/// [`measure`] from a walk of the writable layer already made (`None`: it is
/// missing), for a sandbox whose layer is on this host ([`layer_on_host`]).
pub(crate) fn measure_walked(
    st: &Shared,
    rec: &SandboxRecord,
    walked: Option<strata_image::changes::TreeManifest>,
) -> EngineResult<Accumulation> {
    let s = &rec.sandbox;
    let now_tree = walked.unwrap_or_default();
    let (writable_bytes, writable_files) =
        (now_tree.entries.values().map(|e| e.size).sum(), now_tree.entries.len() as u64);
    // What changed since the last checkpoint: the walk against the layer's manifest then.
    let (head_tree, lowers) = crate::checkpoints::head_manifest(st, rec)?;
    let changed = strata_image::changes::diff(&head_tree, &now_tree, &lowers);
    let mine = st.db.list_checkpoints(Some(&s.id))?;
    let head = s.head_checkpoint.as_deref().and_then(|h| mine.iter().find(|c| c.id == h));
    let checkpoint_since = head.map_or_else(|| s.created_at.clone(), |c| c.created_at.clone());
    let (base, base_created_at) = match s.base_checkpoint.as_deref().map(|b| st.db.checkpoint_by_id(b)).transpose()? {
        Some(Some((c, _))) => (format!("checkpoint {}", c.name), c.created_at),
        _ => match st.db.get_image(&s.image_id)? {
            Some(i) => (format!("image {}", i.name), i.created_at),
            // The image was removed: the sandbox's creation is the latest its base can be.
            None => (format!("image {} (removed)", s.source), s.created_at.clone()),
        },
    };
    let now = SystemTime::now();
    let age = parse_time(&s.created_at)
        .and_then(|t| now.duration_since(t).ok())
        .map_or(1.0, |d| d.as_secs_f64() / DAY.as_secs_f64())
        .max(1.0);
    let mut acc = Accumulation {
        writable_bytes,
        writable_files,
        growth_per_day_bytes: (writable_bytes as f64 / age) as u64,
        since_checkpoint_bytes: changed.iter().map(|c| c.size).sum(),
        since_checkpoint_paths: changed.len() as u64,
        checkpoint_since,
        checkpoints: mine.len() as u64,
        checkpoint_bytes: mine.iter().map(|c| c.layer_size).sum(),
        base_age_days: days_since(&base_created_at, now),
        base,
        base_created_at,
        age_days: days_since(&s.created_at, now),
        image: None,
        newer_image: None,
        days_behind_newest: 0,
        over: Vec::new(),
    };
    if let Some(img) = crate::patching::base_image(st, &s.image_id, &rec.layers)? {
        acc.image = Some(format!("{}@{}", img.name, img.version));
    }
    if let Some((v, n)) = crate::patching::behind(st, &s.image_id)? {
        acc.image = Some(format!("{}@{}", v.name, v.version));
        acc.newer_image = Some(format!("{}@{}", n.name, n.version));
        acc.days_behind_newest = crate::patching::days_between(&v, &n);
    }
    acc.over = over_limits(&acc, &s.policy, now).into_iter().map(|f| f.reason).collect();
    Ok(acc)
}

/// The findings of `acc` against the policy's `max_writable` and `max_age`.
pub fn over_limits(acc: &Accumulation, policy: &SandboxPolicy, now: SystemTime) -> Vec<Finding> {
    let mut out = Vec::new();
    if let Some(max) = policy.max_writable.as_deref().and_then(|m| units::parse_size(m).ok()) {
        if acc.writable_bytes > max {
            out.push(Finding {
                path: "/".into(),
                rule: "accumulation.writable".into(),
                severity: Severity::Medium,
                reason: format!(
                    "the writable layer holds {} in {} entries, over max_writable {}",
                    units::format_size(acc.writable_bytes),
                    acc.writable_files,
                    units::format_size(max)
                ),
            });
        }
    }
    if let Some(max) = policy.max_age.as_deref().and_then(|m| units::parse_duration(m).ok()) {
        let age = parse_time(&acc.base_created_at).and_then(|t| now.duration_since(t).ok()).unwrap_or_default();
        if age > max {
            out.push(Finding {
                path: "/".into(),
                rule: "accumulation.age".into(),
                severity: Severity::Medium,
                reason: format!(
                    "its base ({}, made {}) is {} days old, over max_age {}",
                    acc.base,
                    acc.base_created_at,
                    age.as_secs() / DAY.as_secs(),
                    policy.max_age.as_deref().unwrap_or_default()
                ),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acc(writable_bytes: u64, base_created_at: &str) -> Accumulation {
        Accumulation {
            writable_bytes,
            writable_files: 3,
            growth_per_day_bytes: 0,
            since_checkpoint_bytes: 0,
            since_checkpoint_paths: 0,
            checkpoint_since: "2026-12-01T00:00:00Z".into(),
            checkpoints: 0,
            checkpoint_bytes: 0,
            base: "image busybox".into(),
            base_created_at: base_created_at.into(),
            base_age_days: 0,
            age_days: 0,
            over: vec![],
            ..Default::default()
        }
    }

    #[test]
    fn limits_past_the_policy_are_findings() {
        let now = parse_time("2026-12-06T00:00:00Z").unwrap();
        let mut p = SandboxPolicy::default();
        assert!(over_limits(&acc(10 << 30, "2020-01-01T00:00:00Z"), &p, now).is_empty(), "no limits, no findings");
        p.max_writable = Some("1G".into());
        p.max_age = Some("30d".into());
        let f = over_limits(&acc(2 << 30, "2026-10-01T00:00:00Z"), &p, now);
        let rules: Vec<&str> = f.iter().map(|f| f.rule.as_str()).collect();
        assert_eq!(rules, ["accumulation.writable", "accumulation.age"]);
        assert!(f[0].reason.contains("over max_writable"), "{}", f[0].reason);
        assert!(f[1].reason.contains("66 days old"), "{}", f[1].reason);
        assert!(over_limits(&acc(1 << 30, "2026-11-20T00:00:00Z"), &p, now).is_empty(), "at or under both");
    }

    #[test]
    fn days_are_whole_and_never_negative() {
        let now = parse_time("2026-12-06T12:00:00Z").unwrap();
        assert_eq!(days_since("2026-12-04T13:00:00Z", now), 1);
        assert_eq!(days_since("2027-01-01T00:00:00Z", now), 0);
        assert_eq!(days_since("garbage", now), 0);
    }
}
