//! What bringing up a sandbox's root and init takes, for every operation that
//! does it (create, start, resume, warm forks): its disk, its mount spec (the
//! layer chain, flattened when deep), admission of its memory, the boot itself.

use std::time::Instant;

use strata_api::{ErrorCode, SandboxState};
use strata_core::{ids, units, Action};
use strata_runtime::{SandboxHandle, SandboxSpec};
use strata_store::db::SandboxRecord;
use tracing::{info, warn};

use super::watch_init;
use crate::error::{EngineError, EngineResult};
use crate::record::{expiry, transition, Change};
use crate::state::Shared;

/// Whether `rec` is a microVM whose disk holds a file system its guest froze
/// into a snapshot (see [`strata_runtime::microvm::FROZEN_MARK`]).
fn frozen_by_snapshot(st: &Shared, rec: &SandboxRecord) -> bool {
    crate::state::tiers::tier_of(&rec.sandbox) == strata_api::Isolation::Microvm
        && st.sandbox_dir(&rec.sandbox.id).join(strata_runtime::microvm::FROZEN_MARK).exists()
}

/// Makes sure the sandbox's own disk (when it has one) exists and is mounted.
pub(crate) async fn ensure_disk(st: &Shared, rec: &SandboxRecord) -> EngineResult<()> {
    // A microVM's disk frozen by a guest in a snapshot (standby, or a standby
    // stopped since): exactly as that guest left it; a host mount that writes would
    // corrupt it (the tier shows it read-only, and hands it to the next boot).
    if frozen_by_snapshot(st, rec) {
        return Ok(());
    }
    let (Some(bytes), true) =
        (rec.sandbox.limits.disk_bytes, strata_runtime::disk::enforced(rec.sandbox.limits.disk_quota.as_deref()))
    else {
        return Ok(());
    };
    let (dir, pool) = (st.sandbox_dir(&rec.sandbox.id), st.disks.clone());
    tokio::task::spawn_blocking(move || pool.ensure(&dir, bytes))
        .await
        .map_err(|e| EngineError::internal("disk task", &e))?
        .map_err(|e| {
            EngineError::new(
                ErrorCode::Internal,
                format!("the disk of sandbox {} ({}): {e}", rec.sandbox.id, units::format_size(bytes)),
            )
        })
}

/// The runtime's description of `rec` (its disk must be in place: [`ensure_disk`]).
pub(crate) fn spec_for(st: &Shared, rec: &SandboxRecord) -> EngineResult<SandboxSpec> {
    let dir = st.sandbox_dir(&rec.sandbox.id);
    let lower_dirs = rec
        .layers
        .iter()
        .map(|d| st.layers.fs_dir(d).map_err(|e| EngineError::internal("layer", &e)))
        .collect::<EngineResult<Vec<_>>>()?;
    for d in &rec.layers {
        if !st.layers.contains(d) {
            return Err(EngineError::new(
                ErrorCode::Internal,
                format!("layer {d} of sandbox {} is missing from the layer store", rec.sandbox.id),
            ));
        }
    }
    Ok(SandboxSpec {
        id: rec.sandbox.id.clone(),
        hostname: rec.sandbox.hostname.clone(),
        lower_dirs,
        upper_dir: strata_runtime::disk::upper_dir(&dir),
        work_dir: strata_runtime::disk::work_dir(&dir),
        rootfs_dir: dir.join("rootfs"),
        limits: rec.sandbox.limits.clone(),
        log_path: dir.join("init.log"),
        machine_id: machine_id(&rec.sandbox.id),
        fork_generation: rec.sandbox.fork_generation,
        secrets: st.secrets.get(&rec.sandbox.id)?.files(),
        secrets_owner: rec.image_config.user.clone().filter(|u| !u.is_empty()),
        // Filled in by crate::network::prepare for egress sandboxes.
        netns_path: None,
        resolv_conf: None,
        userns: rec.sandbox.userns,
        tmp: rec.sandbox.tmp,
        // Filled in by crate::network::prepare for egress sandboxes in a user namespace.
        userns_link: None,
    })
}

/// Chains longer than this are mounted through one flattened lower directory
/// (overlayfs takes a bounded number of lower layers). Checkpoints, layers and
/// their ids stay as they are; only the mount changes.
pub const SQUASH_AT: usize = 24;

/// Where the flattened form of a deep chain is kept: `layers/squashed/<sha256 of the chain>`.
pub fn squashed_dir(layers: &strata_store::LayerStore, chain_dirs: &[std::path::PathBuf]) -> std::path::PathBuf {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for d in chain_dirs {
        h.update(d.as_os_str().as_encoded_bytes());
        h.update(b"\n");
    }
    layers.root().join("squashed").join(hex::encode(h.finalize()))
}

/// Replaces a deep chain of lower directories with its flattened form, building
/// it (staged, then renamed into place) the first time.
pub(crate) fn flatten_if_deep(
    mut spec: SandboxSpec,
    layers: &strata_store::LayerStore,
) -> Result<SandboxSpec, strata_runtime::RuntimeError> {
    if spec.lower_dirs.len() <= SQUASH_AT {
        return Ok(spec);
    }
    let dir = squashed_dir(layers, &spec.lower_dirs);
    if !dir.join("fs").is_dir() {
        let t = Instant::now();
        let staging = layers.root().join("staging").join(format!("squash-{}", ids::new_id()));
        let fs_dir = staging.join("fs");
        let build = || -> Result<(), String> {
            std::fs::create_dir_all(&fs_dir).map_err(|e| e.to_string())?;
            strata_image::squash::squash(&spec.lower_dirs, &fs_dir).map_err(|e| crate::error::chain(&e))?;
            std::fs::create_dir_all(dir.parent().expect("squashed/ parent")).map_err(|e| e.to_string())?;
            match std::fs::rename(&staging, &dir) {
                Ok(()) => Ok(()),
                // Built concurrently by another start of the same chain: use that one.
                Err(_) if dir.join("fs").is_dir() => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        };
        let res = build();
        let _ = strata_store::fsutil::remove_dir_all_if_exists(&staging);
        res.map_err(|e| {
            strata_runtime::RuntimeError::Setup(format!("flattening a {}-layer chain: {e}", spec.lower_dirs.len()))
        })?;
        info!(layers = spec.lower_dirs.len(), ms = t.elapsed().as_millis() as u64, "flattened a deep layer chain");
    }
    spec.lower_dirs = vec![dir.join("fs")];
    Ok(spec)
}

/// A sandbox's /etc/machine-id: stable across its restarts, different for every sandbox (and fork).
pub(crate) fn machine_id(id: &str) -> String {
    use sha2::Digest;
    hex::encode(&sha2::Sha256::digest(format!("strata machine-id {id}").as_bytes())[..16])
}

/// The mount description of `rec`'s root (deep chains flattened), as its init would get it.
pub(crate) async fn mount_spec(st: &Shared, rec: &SandboxRecord) -> EngineResult<SandboxSpec> {
    ensure_disk(st, rec).await?;
    let spec = spec_for(st, rec)?;
    let layers = st.layers.clone();
    tokio::task::spawn_blocking(move || flatten_if_deep(spec, &layers))
        .await
        .map_err(|e| EngineError::internal("flatten task", &e))?
        .map_err(|e| EngineError::internal("flatten", &e))
}

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
        // A running microVM's guest is its disk's only writer (the tier mounts it when the VM stops);
        // a disk a snapshot's guest froze is shown read-only until that guest resumes or a cold boot.
        if crate::state::tiers::tier_of(&rec.sandbox) == strata_api::Isolation::Microvm {
            if matches!(rec.sandbox.state, SandboxState::Running | SandboxState::Paused) {
                continue;
            }
            if frozen_by_snapshot(st, &rec) {
                let id = rec.sandbox.id.clone();
                let shown = tokio::task::spawn_blocking(move || strata_runtime::disk::show_frozen_guest_disk(&dir));
                if let Ok(Err(e)) = shown.await {
                    warn!(sandbox = %id, error = %e, "mounting the disk of a microVM saved in a snapshot");
                }
                continue;
            }
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
