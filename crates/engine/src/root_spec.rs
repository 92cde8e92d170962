//! A sandbox's root as its init gets it, below every operation that boots
//! one (create, start, resume, warm forks, a microVM booted to read its disk):
//! its own disk in place, and its mount spec (the layer chain, flattened
//! when deep; identity, limits, secrets).

use std::time::Instant;

use strata_api::ErrorCode;
use strata_core::{ids, units};
use strata_runtime::SandboxSpec;
use strata_store::db::SandboxRecord;
use tracing::info;

use crate::error::{EngineError, EngineResult};
use crate::state::Shared;

/// Whether `rec` is a microVM that has its disk: a guest has written its
/// blocks, so the host never mounts it again (see [`strata_runtime::disk::lend_to_guest`]).
pub(crate) fn disk_lent_to_guest(st: &Shared, rec: &SandboxRecord) -> bool {
    crate::state::tiers::tier_of(&rec.sandbox) == strata_api::Isolation::Microvm
        && st.sandbox_dir(&rec.sandbox.id).join(strata_runtime::disk::IMAGE).exists()
}

/// Makes sure the sandbox's own disk (when it has one) exists and is mounted.
pub(crate) async fn ensure_disk(st: &Shared, rec: &SandboxRecord) -> EngineResult<()> {
    // A microVM's disk is made once (here from the pool, or by the tier) and then the guest's alone.
    if disk_lent_to_guest(st, rec) {
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
        link: None,
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
