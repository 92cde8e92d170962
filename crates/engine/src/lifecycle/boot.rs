//! What bringing up a sandbox's init takes, for every operation that does it
//! (create, start, resume, warm forks): its root ([`crate::root_spec`]: its
//! disk, its mount spec), admission of its memory, the boot itself.

use std::time::Instant;

use strata_api::{ErrorCode, SandboxState};
use strata_core::Action;
use strata_runtime::SandboxHandle;
use strata_store::db::SandboxRecord;
use tracing::warn;

use super::watch_init;
use crate::error::{EngineError, EngineResult};
use crate::record::{expiry, transition, Change};
pub(crate) use crate::root_spec::{disk_lent_to_guest, ensure_disk, flatten_if_deep, mount_spec, spec_for};
pub use crate::root_spec::{squashed_dir, SQUASH_AT};
use crate::state::Shared;

/// The nice value of background boots ([`crate::state::pool::as_background`]).
const BACKGROUND_NICE: i32 = 10;

/// Starts init for `rec` (in `from` state) and records `action`; the caller
/// holds the sandbox's operation lock.
pub(crate) async fn boot(
    st: &Shared,
    rec: &SandboxRecord,
    from: SandboxState,
    action: Action,
    reason: &str,
) -> EngineResult<SandboxHandle> {
    let started = Instant::now();
    // A failure before init starts is recorded (`start_failed`) and answered.
    let failed = |e: EngineError| -> EngineError {
        let change = Change::new(Action::Fail, "start_failed").detail(&e.body.message);
        match transition(st, &rec.sandbox.id, from, change, started, None) {
            Ok(_) => e,
            Err(recording) => recording,
        }
    };
    ensure_disk(st, rec).await.map_err(failed)?;
    let mut spec = spec_for(st, rec)?;
    crate::network::prepare(st, &rec.sandbox.id, &mut spec).await.map_err(failed)?;
    let rt = st.runtime_of(&rec.sandbox);
    let layers = st.layers.clone();
    let linked = spec.userns_link.is_some();
    // A background boot (a warm-pool refill) runs, and leaves its init, at a
    // lower priority; the adoption gives the init the normal one back.
    // (The namespace tier only: on another, the processes a boot starts are
    // the tier's own, e.g. runsc's sentry, which no adoption could reach.)
    let background = crate::state::pool::in_background()
        && crate::state::tiers::tier_of(&rec.sandbox) == strata_api::Isolation::Namespace;
    let result = tokio::task::spawn_blocking(move || {
        if background {
            let _ = strata_runtime::set_nice(0, BACKGROUND_NICE);
        }
        let r = flatten_if_deep(spec, &layers).and_then(|spec| rt.start(&spec));
        if background {
            let _ = strata_runtime::set_nice(0, 0);
        }
        r
    })
    .await
    .map_err(|e| EngineError::internal("start task", &e))?;
    match result {
        Ok(handle) => {
            if let Err(e) = crate::network::started(st, &rec.sandbox.id, linked, handle.init_pid).await {
                warn!(sandbox = %rec.sandbox.id, error = %e.body.message, "naming the sandbox's network namespace");
            }
            transition(st, &rec.sandbox.id, from, Change::new(action, reason), started, Some(&handle))?;
            st.db.set_expires_at(&rec.sandbox.id, expiry(rec.sandbox.ttl.as_deref())?.as_deref())?;
            watch_init(st.clone(), rec.sandbox.id.clone(), handle.clone());
            Ok(handle)
        }
        Err(e) => {
            let msg = crate::error::chain(&e);
            transition(
                st,
                &rec.sandbox.id,
                from,
                Change::new(Action::Fail, "start_failed").detail(&msg),
                started,
                None,
            )?;
            // An image that cannot run is the caller's input (400), anything else the host's (500).
            let code = if matches!(e, strata_runtime::RuntimeError::Image(_)) {
                ErrorCode::BadRequest
            } else {
                ErrorCode::Internal
            };
            Err(EngineError::new(code, format!("sandbox {} failed to start: {msg}", rec.sandbox.id)))
        }
    }
}

/// After a daemon (re)start: mounts the disk of every sandbox that has one (idempotent;
/// they stay mounted across daemon restarts unless the host rebooted).
pub async fn mount_disks(st: &Shared) {
    let Ok(list) = st.db.list_sandboxes() else { return };
    for rec in list {
        let l = &rec.sandbox.limits;
        let (Some(bytes), true) = (l.disk_bytes, strata_runtime::disk::enforced(l.disk_quota.as_deref())) else {
            continue;
        };
        let dir = st.sandbox_dir(&rec.sandbox.id);
        if rec.sandbox.state == SandboxState::Archived || !dir.join(strata_runtime::disk::IMAGE).exists() {
            continue;
        }
        // A microVM's disk is its guest's: never mounted on the host.
        if disk_lent_to_guest(st, &rec) {
            continue;
        }
        let (id, pool) = (rec.sandbox.id.clone(), st.disks.clone());
        match tokio::task::spawn_blocking(move || pool.ensure(&dir, bytes)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(sandbox = %id, error = %e, "mounting the sandbox's disk"),
            Err(e) => warn!(sandbox = %id, error = %e, "mounting the sandbox's disk"),
        }
    }
}

/// Admits a sandbox that is about to get processes again (start, resume,
/// a warm restore) against the host's memory and its tenant's memory quota;
/// `None` when it holds memory already.
pub fn admit_start(st: &Shared, rec: &SandboxRecord) -> EngineResult<Option<crate::admission::Reservation>> {
    if crate::admission::holds_memory(rec.sandbox.state) || rec.sandbox.state == SandboxState::Destroyed {
        return Ok(None);
    }
    let s = &rec.sandbox;
    st.admission.admit(&st.db, &s.id, &s.tenant, &s.limits, crate::admission::Purpose::Start).map(Some)
}
