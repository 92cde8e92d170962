//! Adoption: a create that a warm-pool sandbox fits takes it instead of
//! booting one. The member was booted from the same source with everything a
//! create cannot change later (its [`Fit`]); the adoption gives it the
//! request's identity (hostname and its files), CPU and process limits,
//! tenant, name, environment, labels, policy and TTL, and normal CPU priority.
//! Members never ran anything of anyone and each is adopted once, so no
//! identity or file of another sandbox can come along. The pool itself (its
//! book and refill) is [`crate::state::pool`] and [`crate::pool`].

use std::time::Instant;

use strata_api::{Sandbox, SandboxState};
use strata_store::db::{SandboxRecord, POOL_TENANT};
use tracing::{debug, info, warn};

use crate::error::{EngineError, EngineResult};
use crate::record::{expiry, handle_of, load};
use crate::state::pool::{Fit, Member};
use crate::state::Shared;

/// What of a create request decides whether a pool member fits it, and how it names the sandbox.
pub struct Wanted<'a> {
    /// The fit the request comes to.
    pub fit: Fit,
    /// Why no member can take this request at all, if so (a network, secrets, ...).
    pub refused: Option<&'a str>,
    /// The request names the sandbox (otherwise its name is its id).
    pub named: bool,
    /// The request names the hostname (otherwise it comes from the name, or the id).
    pub hostname_given: bool,
}

/// Takes a member that fits `wanted` and gives it `rec`'s identity (the
/// record of the create as it would be inserted, its id replaced by the
/// member's). `None` when no member fits or the one taken turned out gone
/// (then destroyed): the caller boots a sandbox as usual.
pub async fn adopt(st: &Shared, wanted: Wanted<'_>, rec: &SandboxRecord) -> EngineResult<Option<Sandbox>> {
    if !st.pools.enabled() {
        return Ok(None);
    }
    let Some(source) = st.pools.source_of(&wanted.fit) else { return Ok(None) };
    if let Some(why) = wanted.refused {
        st.pools.count_with(&source, |c| {
            c.unfit += 1;
            c.last_unfit = Some(why.to_string());
        });
        return Ok(None);
    }
    let Some(member) = st.pools.take(&wanted.fit) else {
        let why = st.pools.fit_of(&source).map(|f| unfit_reason(&f, &wanted.fit));
        st.pools.count_with(&source, |c| match why {
            Some(Some(why)) => {
                c.unfit += 1;
                c.last_unfit = Some(why);
            }
            _ => c.empty += 1,
        });
        return Ok(None);
    };
    // A refill replaces what was taken whatever happens next.
    st.pools.wake.notify_one();
    let started = Instant::now();
    match give(st, &member, rec, &wanted).await {
        Ok(Some(sb)) => {
            st.pools.count_with(&member.source, |c| c.adopted += 1);
            info!(sandbox = %sb.id, source = %member.source, ms = started.elapsed().as_millis() as u64, "adopted a warm-pool sandbox");
            Ok(Some(sb))
        }
        Ok(None) => Ok(None),
        Err(e) => {
            // Half-given (a hostname changed, say): it cannot go back to the pool.
            discard(st, &member.id, &member.source, "adoption_failed").await;
            Err(e)
        }
    }
}

/// Why a member of `have` cannot take a request that comes to `want` (the
/// first difference), `None` when they are the same.
pub fn unfit_reason(have: &Fit, want: &Fit) -> Option<String> {
    let size = |b: Option<u64>| b.map_or("none".to_string(), strata_core::units::format_size);
    if have.tier != want.tier {
        return Some(format!("isolation {} (the pool's: {})", want.tier, have.tier));
    }
    if have.layers != want.layers || have.checkpoint != want.checkpoint {
        return Some("another version of the source".into());
    }
    if have.warm != want.warm {
        return Some(format!("processes: {} (the pool's: {})", want.warm, have.warm));
    }
    if have.userns != want.userns {
        return Some(format!("userns: {} (the pool's: {})", want.userns, have.userns));
    }
    if have.tmp != want.tmp {
        return Some(format!("tmp: {} (the pool's: {})", want.tmp.as_str(), have.tmp.as_str()));
    }
    if have.memory_bytes != want.memory_bytes {
        return Some(format!("memory {} (the pool's: {})", size(want.memory_bytes), size(have.memory_bytes)));
    }
    if have.disk_bytes != want.disk_bytes {
        return Some(format!("disk {} (the pool's: {})", size(want.disk_bytes), size(have.disk_bytes)));
    }
    None
}

/// Gives `member` the identity of `rec`; `None` when it is no longer a live member.
async fn give(st: &Shared, member: &Member, rec: &SandboxRecord, wanted: &Wanted<'_>) -> EngineResult<Option<Sandbox>> {
    let id = member.id.clone();
    let lock = st.lock_for(&id);
    let _g = lock.lock().await;
    let current = match st.db.sandbox_by_id(&id)? {
        Some(r) if r.sandbox.tenant == POOL_TENANT && r.sandbox.state == SandboxState::Running => r,
        _ => return Ok(None),
    };
    let rt = st.runtime_of(&current.sandbox);
    let Some(handle) = handle_of(&current).filter(|h| rt.is_alive(h)) else {
        drop(_g);
        discard(st, &id, &member.source, "init_gone").await;
        return Ok(None);
    };
    let mut adopted = rec.clone();
    adopted.sandbox.id = id.clone();
    if !wanted.named {
        adopted.sandbox.name = id.clone();
    }
    if !wanted.hostname_given {
        // As a create names it: from the name it was given, else from the id.
        adopted.sandbox.hostname =
            strata_core::ids::hostname_for(if wanted.named { &adopted.sandbox.name } else { &id[..12] });
    }
    if adopted.sandbox.hostname != current.sandbox.hostname {
        let spec = crate::lifecycle::spec_for(st, &adopted)?;
        let (rt2, h) = (rt.clone(), handle.clone());
        tokio::task::spawn_blocking(move || rt2.reidentify(&spec, &h))
            .await
            .map_err(|e| EngineError::internal("reidentify task", &e))?
            .map_err(|e| EngineError::internal("giving the pool sandbox its hostname", &e))?;
    }
    let (want, had) = (&adopted.sandbox.limits, &current.sandbox.limits);
    if want.cpus != had.cpus || want.pids != had.pids {
        rt.set_cpus_and_pids(&id, want.cpus, want.pids)
            .map_err(|e| EngineError::internal("giving the pool sandbox its limits", &e))?;
    }
    // Booted in the background at a lower priority: its init gets the normal one back.
    if crate::state::tiers::tier_of(&current.sandbox) == strata_api::Isolation::Namespace {
        if let Err(e) = strata_runtime::set_nice(handle.init_pid, 0) {
            debug!(sandbox = %id, error = %e, "resetting the init's priority");
        }
    }
    adopted.sandbox.expires_at = expiry(adopted.sandbox.ttl.as_deref())?;
    adopted.sandbox.state = SandboxState::Running;
    adopted.sandbox.state_reason = "adopted".into();
    let detail =
        format!("from the warm pool of {} (booted {} ms before)", member.source, member.ready_at.elapsed().as_millis());
    let Some(ev) = st.db.adopt_pooled(&adopted, &detail)? else {
        return Ok(None);
    };
    st.activity.touch(&id);
    st.notify_events(ev.seq);
    st.policy_changed.notify_one();
    Ok(Some(load(st, &id)?.sandbox))
}

/// Destroys a pool member that will not be adopted (logged, never fails).
pub async fn discard(st: &Shared, id: &str, source: &str, reason: &str) {
    match crate::lifecycle::destroy(st, id, true, reason).await {
        Ok(_) => st.pools.count_with(source, |c| c.drained += 1),
        Err(e) => warn!(sandbox = %id, error = %e.body.message, "destroying a warm-pool sandbox"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_api::{Isolation, TmpStorage};

    fn fit() -> Fit {
        Fit {
            tier: Isolation::Namespace,
            layers: vec!["a".into(), "b".into()],
            checkpoint: None,
            warm: false,
            userns: true,
            tmp: TmpStorage::Disk,
            memory_bytes: Some(2 << 30),
            disk_bytes: Some(10 << 30),
        }
    }

    #[test]
    fn unfit_reasons_name_the_first_difference() {
        assert_eq!(unfit_reason(&fit(), &fit()), None);
        let mut w = fit();
        w.memory_bytes = Some(64 << 20);
        assert_eq!(unfit_reason(&fit(), &w).unwrap(), "memory 64.0 MiB (the pool's: 2.0 GiB)");
        let mut w = fit();
        w.layers.push("c".into());
        assert_eq!(unfit_reason(&fit(), &w).unwrap(), "another version of the source");
        let mut w = fit();
        w.userns = false;
        w.disk_bytes = None;
        assert_eq!(unfit_reason(&fit(), &w).unwrap(), "userns: false (the pool's: true)");
        let mut w = fit();
        w.disk_bytes = None;
        assert_eq!(unfit_reason(&fit(), &w).unwrap(), "disk none (the pool's: 10.0 GiB)");
        let mut w = fit();
        w.tier = Isolation::Gvisor;
        assert!(unfit_reason(&fit(), &w).unwrap().starts_with("isolation gvisor"));
    }
}
