//! Warm checkpoints: a checkpoint that also keeps its sandbox's running
//! processes, and sandboxes that start with those processes running.
//!
//! `CheckpointRequest::processes` copies the process tree with CRIU (leaving
//! it running) while the sandbox is frozen for its filesystem change set, so
//! the processes and the filesystem are taken at one instant. The image goes
//! to `<state>/checkpoints/<id>/processes/` (the standby image format: files
//! with a manifest of sizes and CRC32s, written last), with `captured.json`
//! listing the processes started through the API. It is immutable, and shared
//! by every sandbox started from the checkpoint: a create, each fork child, a
//! template's sandboxes, a rollback in place. Each restores it on its own root
//! (the checkpoint's layers and a fresh writable layer, so the same content
//! the processes were copied with), in its own namespaces and cgroup, with
//! fresh pipes for the API processes (they keep their ids), and then takes
//! its own identity: hostname, sandbox id, machine id and fork generation are
//! rewritten where the restore brought back the source's.
//!
//! What is not fresh in a restored copy: the processes' memory is the
//! source's, so user-space random generators, cached hostnames and
//! environment variables set at their start (`STRATA_SANDBOX_ID`) are the
//! source's too (`/run/strata/generation` tells a workload it was copied);
//! established TCP connections come back closed. Secrets never enter a warm
//! checkpoint: a sandbox with secrets cannot take one, and a sandbox with
//! secrets cannot start from one (their values would be in process memory,
//! and a restored tree has no secrets mount).

use std::path::{Path, PathBuf};
use std::time::Instant;

use strata_api::{ErrorCode, ProcessImage, SandboxState, StandbyInfo, StandbyMode};
use strata_core::Action;
use strata_runtime::SandboxHandle;
use strata_store::db::SandboxRecord;
use tracing::{info, warn};

use crate::error::{EngineError, EngineResult};
use crate::processes::CapturedProcess;
use crate::record::{now, transition, Change};
use crate::state::Shared;
use crate::{lifecycle, record};

/// The API processes of a warm checkpoint, next to its image.
const CAPTURED: &str = "captured.json";

/// The writable layer's manifest at a microVM's warm checkpoint, next to its
/// image: its copies start on the checkpoint's disk, so it is their base.
const LAYER_MANIFEST: &str = "layer-manifest.json";

/// The source sandbox's limits, next to a warm checkpoint's image: what a
/// sandbox started from it gets for each limit it does not set (a microVM
/// copy must have its source's memory, vCPUs and disk).
const LIMITS: &str = "limits.json";

/// The limits of the sandbox a warm checkpoint was taken of (`None`: not a
/// warm checkpoint, or one made before they were kept).
pub fn saved_limits(st: &Shared, checkpoint_id: &str) -> Option<strata_api::ResourceLimits> {
    serde_json::from_slice(&std::fs::read(image_dir(st, checkpoint_id).join(LIMITS)).ok()?).ok()
}

/// Keeps `manifest` (the guest's layer at the checkpoint) in the image being made in `staging`.
pub fn keep_layer_manifest(staging: &Path, manifest: &strata_image::changes::TreeManifest) -> std::io::Result<()> {
    let json = serde_json::to_vec(manifest).expect("manifest serializes");
    strata_store::fsutil::write_atomic(&staging.join(LAYER_MANIFEST), &json, 0o600)
}

/// Where the process image of checkpoint `id` is kept.
pub fn image_dir(st: &Shared, checkpoint_id: &str) -> PathBuf {
    st.state_dir.join("checkpoints").join(checkpoint_id).join("processes")
}

/// Where a warm checkpoint's image is written before it is complete.
pub fn staging_dir(st: &Shared, checkpoint_id: &str) -> PathBuf {
    st.state_dir.join("checkpoints").join(checkpoint_id).join("processes.tmp")
}

/// Refuses a warm checkpoint of `rec` that cannot be taken, with the reason.
pub fn check_capturable(st: &Shared, rec: &SandboxRecord) -> EngineResult<()> {
    let (id, state) = (&rec.sandbox.id, rec.sandbox.state);
    if state != SandboxState::Running {
        return Err(EngineError::invalid_state(state, format!("cannot keep the processes of sandbox {id} while it is {state}: only a running sandbox has processes to keep")));
    }
    if !st.secrets.get(id)?.is_empty() {
        return Err(EngineError::invalid_state(state, format!("cannot keep the processes of sandbox {id} in a checkpoint: it has secrets, whose values would be in process memory; checkpoint without processes")));
    }
    if let Some(why) = st.runtime_of(&rec.sandbox).process_dump_unsupported() {
        return Err(EngineError::new(
            ErrorCode::Unsupported,
            format!("cannot keep the processes of sandbox {id}: {why}"),
        ));
    }
    Ok(())
}

/// Completes a warm checkpoint's image once its processes were copied into
/// `staging`: the list of API processes, the manifest (sizes and CRC32s,
/// files synced), then the rename into place.
pub fn publish(
    st: &Shared,
    checkpoint_id: &str,
    staging: &Path,
    helper: PathBuf,
    captured: &[CapturedProcess],
    limits: &strata_api::ResourceLimits,
    dump_ms: u64,
) -> std::io::Result<ProcessImage> {
    let json = serde_json::to_vec(captured).expect("captured processes serialize");
    strata_store::fsutil::write_atomic(&staging.join(CAPTURED), &json, 0o600)?;
    let json = serde_json::to_vec(limits).expect("limits serialize");
    strata_store::fsutil::write_atomic(&staging.join(LIMITS), &json, 0o600)?;
    let info = StandbyInfo {
        mode: StandbyMode::Processes,
        created_at: now(),
        image_bytes: 0,
        api_processes: captured.len(),
        dump_ms,
        note: None,
    };
    let m = crate::process_image::seal(staging, info, Some(helper))?;
    crate::process_image::publish(staging, &image_dir(st, checkpoint_id))?;
    Ok(ProcessImage { bytes: m.info.image_bytes, api_processes: captured.len() as u32, dump_ms })
}

/// Removes a checkpoint's process image (and its staging leftovers).
pub fn remove(st: &Shared, checkpoint_id: &str) {
    let _ = strata_store::fsutil::remove_dir_all_if_exists(&st.state_dir.join("checkpoints").join(checkpoint_id));
}

/// Removes process images whose checkpoint has no record (a crash between
/// saving the image and recording the checkpoint), at daemon start.
pub fn sweep(st: &Shared) -> EngineResult<()> {
    let Ok(entries) = std::fs::read_dir(st.state_dir.join("checkpoints")) else { return Ok(()) };
    let known: std::collections::HashSet<String> = st.db.list_checkpoints(None)?.into_iter().map(|c| c.id).collect();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !known.contains(&name) {
            info!(checkpoint = %name, "removing the process image of an unrecorded checkpoint");
            let _ = strata_store::fsutil::remove_dir_all_if_exists(&e.path());
        } else {
            // A warm checkpoint interrupted before its image was published keeps no staging.
            let _ = strata_store::fsutil::remove_dir_all_if_exists(&e.path().join("processes.tmp"));
        }
    }
    Ok(())
}

/// Whether sandbox `sandbox_id` (of tier `tier`) may start from a warm
/// checkpoint: not with secrets of its own, not on a tier that cannot restore processes.
pub fn check_startable(
    st: &Shared,
    tier: strata_api::Isolation,
    sandbox_id: &str,
    has_secrets: bool,
    checkpoint: &str,
) -> EngineResult<()> {
    if has_secrets {
        return Err(EngineError::bad_request(format!(
            "sandbox {sandbox_id} has secrets, and checkpoint {checkpoint} would start it with processes copied from a sandbox without them; start it without processes (processes: false)"
        )));
    }
    if let Some(why) = st.runtime_for(tier).process_dump_unsupported() {
        return Err(EngineError::new(ErrorCode::Unsupported, format!("checkpoint {checkpoint} keeps processes, which cannot be restored here: {why}; start without processes (processes: false)")));
    }
    Ok(())
}

/// Starts `rec` (in state `from`) with the processes of warm checkpoint
/// `checkpoint_id`, on its current root (which must hold that checkpoint's
/// filesystem), and records `action`. The counterpart of
/// [`lifecycle::boot`] for warm starts.
pub async fn boot(
    st: &Shared,
    rec: &SandboxRecord,
    checkpoint_id: &str,
    from: SandboxState,
    action: Action,
    reason: &str,
) -> EngineResult<SandboxHandle> {
    let started = Instant::now();
    let id = rec.sandbox.id.clone();
    let fail_as = |code: ErrorCode, msg: String| {
        let _ = transition(st, &id, from, Change::new(Action::Fail, "start_failed").detail(&msg), started, None);
        EngineError::new(
            code,
            format!("sandbox {id} failed to start from the processes of checkpoint {checkpoint_id}: {msg}"),
        )
    };
    let fail = |msg: String| fail_as(ErrorCode::Internal, msg);
    let images = image_dir(st, checkpoint_id);
    let checked = {
        let dir = images.clone();
        tokio::task::spawn_blocking(move || crate::process_image::verify(&dir))
            .await
            .map_err(|e| EngineError::internal("verify task", &e))?
    };
    let manifest = checked.map_err(&fail)?;
    let helper = manifest.helper.clone().filter(|h| h.is_file()).ok_or_else(|| {
        fail(format!(
            "the strata-init binary the image was made with ({}) is gone",
            manifest.helper.as_deref().unwrap_or(Path::new("?")).display()
        ))
    })?;
    let captured: Vec<CapturedProcess> = std::fs::read(images.join(CAPTURED))
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        .map_err(|e| fail(format!("{CAPTURED}: {e}")))?;
    // A copy of a guest's VM runs on the checkpoint's disk: the checkpoint's
    // manifest is its base (its next checkpoint holds what changed since).
    if st.runtime_of(&rec.sandbox).layer_in_guest() {
        let base = st.checkpoint_manifest(&id, checkpoint_id);
        let kept = std::fs::create_dir_all(base.parent().expect("has parent"))
            .and_then(|()| std::fs::read(images.join(LAYER_MANIFEST)))
            .and_then(|json| strata_store::fsutil::write_atomic(&base, &json, 0o600));
        kept.map_err(|e| fail(format!("{LAYER_MANIFEST}: {e}")))?;
    }
    let mut spec = lifecycle::mount_spec(st, rec).await.map_err(|e| fail(e.body.message))?;
    crate::network::prepare(st, &id, &mut spec).await.map_err(|e| fail(e.body.message))?;
    let mut adopted = st.processes.adopt(&id, &captured)?;
    let inherit = crate::processes::inherit_all(&adopted.children);
    let work = st.sandbox_dir(&id).join("restore");
    let rt = st.runtime_of(&rec.sandbox);
    let tier = rt.clone();
    let linked = spec.userns_link.is_some();
    let restored = tokio::task::spawn_blocking(move || {
        let handle =
            rt.restore_processes(&spec, &images, &work, &helper, &inherit, strata_runtime::MemoryRestore::Eager)?;
        if let Err(e) = rt.reidentify(&spec, &handle) {
            let _ = rt.stop(&spec.id, &handle, std::time::Duration::ZERO);
            let _ = rt.cleanup(&spec.id);
            return Err(e);
        }
        Ok(handle)
    })
    .await
    .map_err(|e| EngineError::internal("restore task", &e))?;
    let handle = restored.map_err(|e| match e {
        // The new sandbox does not fit the image (a microVM copy of another shape): the request's fault.
        strata_runtime::RuntimeError::Shape(why) => fail_as(ErrorCode::BadRequest, why),
        e => fail(crate::error::chain(&e)),
    })?;
    if let Err(e) = crate::network::started(st, &id, linked, handle.init_pid).await {
        warn!(sandbox = %id, error = %e.body.message, "naming the restored network namespace");
    }
    let children = std::mem::take(&mut adopted.children);
    crate::processes::attach_restored(&*tier, &id, &handle, children).map_err(|e| fail(e.body.message))?;
    adopted.commit(st);
    let detail =
        format!("processes of checkpoint {checkpoint_id} restored ({} started through the API)", captured.len());
    transition(st, &id, from, Change::new(action, reason).detail(&detail), started, Some(&handle))?;
    st.db.set_expires_at(&id, record::expiry(rec.sandbox.ttl.as_deref())?.as_deref())?;
    lifecycle::watch_init(st.clone(), id.clone(), handle.clone());
    info!(sandbox = %id, checkpoint = checkpoint_id, ms = started.elapsed().as_millis() as u64, "started warm");
    Ok(handle)
}
