//! Lifecycle policies as written: the policy a new sandbox starts with
//! ([`initial`], its lifecycle's defaults with the request's patch), the
//! checks of a patch ([`validate`]) and applying one ([`apply_patch`]). Pure:
//! no state, so creating a sandbox (`crate::lifecycle`) uses it without
//! reaching the policy loop, which is [`crate::policy`]'s.

use strata_api::{Lifecycle, OnIdle, PolicyPatch, SandboxPolicy};
use strata_core::units;

use crate::error::{EngineError, EngineResult};

/// Value that removes an optional limit in a [`PolicyPatch`].
pub const NONE: &str = "none";

/// Checks a patch's values: durations parse, `idle_timeout` is not `none`.
pub fn validate(patch: &PolicyPatch) -> EngineResult<()> {
    if let Some(t) = &patch.idle_timeout {
        if t.trim() == NONE {
            return Err(EngineError::bad_request(
                "idle_timeout cannot be none; use on_idle keep to never act on idleness",
            ));
        }
        units::parse_duration(t).map_err(|e| EngineError::bad_request(format!("idle_timeout: {e}")))?;
    }
    for (field, v) in [
        ("max_lifetime", &patch.max_lifetime),
        ("archive_after", &patch.archive_after),
        ("delete_after", &patch.delete_after),
    ] {
        if let Some(v) = v.as_deref().filter(|v| v.trim() != NONE) {
            units::parse_duration(v).map_err(|e| EngineError::bad_request(format!("{field}: {e}")))?;
        }
    }
    if patch.on_max_lifetime == Some(OnIdle::Keep) {
        return Err(EngineError::bad_request(
            "on_max_lifetime cannot be keep; set max_lifetime to none to remove the limit",
        ));
    }
    if let Some(h) = &patch.hooks {
        crate::hooks::validate(h)?;
    }
    if let Some(f) = &patch.flush {
        crate::scan::validate_flush(f)?;
    }
    if let Some(v) = patch.check_every.as_deref().filter(|v| v.trim() != NONE) {
        validate_check_every(v)?;
    }
    if let Some(v) = patch.max_writable.as_deref().filter(|v| v.trim() != NONE) {
        units::parse_size(v).map_err(|e| EngineError::bad_request(format!("max_writable: {e}")))?;
    }
    if let Some(v) = patch.max_age.as_deref().filter(|v| v.trim() != NONE) {
        units::parse_duration(v).map_err(|e| EngineError::bad_request(format!("max_age: {e}")))?;
    }
    Ok(())
}

/// Checks a `check_every`: a duration of at least [`strata_api::MIN_CHECK_EVERY`].
pub fn validate_check_every(v: &str) -> EngineResult<std::time::Duration> {
    let every = units::parse_duration(v).map_err(|e| EngineError::bad_request(format!("check_every: {e}")))?;
    let min = units::parse_duration(strata_api::MIN_CHECK_EVERY).expect("a valid constant");
    if every < min {
        return Err(EngineError::bad_request(format!(
            "check_every {v} is below the minimum of {}: a check scans the whole writable layer",
            strata_api::MIN_CHECK_EVERY
        )));
    }
    Ok(every)
}

/// Applies a (validated) patch to a policy.
pub fn apply_patch(policy: &mut SandboxPolicy, patch: &PolicyPatch) {
    let opt = |v: &String| (v.trim() != NONE).then(|| v.trim().to_string());
    if let Some(a) = patch.on_idle {
        policy.on_idle = a;
    }
    if let Some(t) = &patch.idle_timeout {
        policy.idle_timeout = t.trim().to_string();
    }
    if let Some(v) = &patch.max_lifetime {
        policy.max_lifetime = opt(v);
    }
    if let Some(a) = patch.on_max_lifetime {
        policy.on_max_lifetime = Some(a);
    }
    if let Some(v) = &patch.archive_after {
        policy.archive_after = opt(v);
    }
    if let Some(v) = &patch.delete_after {
        policy.delete_after = opt(v);
    }
    if let Some(h) = &patch.hooks {
        policy.hooks = h.clone();
    }
    if let Some(f) = &patch.flush {
        policy.flush = f.clone();
    }
    if let Some(r) = patch.resume_on_access {
        policy.resume_on_access = r;
    }
    if let Some(v) = &patch.check_every {
        policy.check_every = opt(v);
    }
    if let Some(o) = patch.on_findings {
        policy.on_findings = o;
    }
    if let Some(v) = &patch.max_writable {
        policy.max_writable = opt(v);
    }
    if let Some(v) = &patch.max_age {
        policy.max_age = opt(v);
    }
}

/// The policy a new sandbox gets: its lifecycle's defaults with `patch` applied.
pub fn initial(lifecycle: Lifecycle, patch: Option<&PolicyPatch>) -> EngineResult<SandboxPolicy> {
    let mut p = SandboxPolicy::default_for(lifecycle);
    if let Some(patch) = patch {
        validate(patch)?;
        apply_patch(&mut p, patch);
    }
    Ok(p)
}
