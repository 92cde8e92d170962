//! Checkpoints, restores, forks and change sets (diff/export).
//!
//! A checkpoint seals what changed in a sandbox's private writable layer since
//! its last checkpoint into a new content-addressed layer. The sandbox is frozen
//! (cgroup freezer) while the change set is read, so cost follows the bytes
//! changed, not the size of the root filesystem. The layer is written to the
//! store first (staged, then renamed), then the checkpoint row and the
//! sandbox's new head are committed in one transaction: a crash leaves either no
//! visible checkpoint (and an unreferenced layer for GC) or a complete one. The
//! sandbox keeps running on its writable layer; the manifest of that layer at
//! checkpoint time (`manifests/<checkpoint>.json`) makes the next checkpoint
//! incremental.

use std::path::PathBuf;
use std::time::Instant;

use strata_api::{
    ChangeKind, Checkpoint, CheckpointRequest, CreateSandboxRequest, ErrorCode, FileChange, ForkRequest, ForkResult,
    ResourceLimits, RestoreRequest, RestoreResult, SandboxState,
};
use strata_core::ids;
use strata_image::changes::{self, TreeManifest};
use strata_store::db::SandboxRecord;
use tracing::{info, warn};

use crate::error::{EngineError, EngineResult};
use crate::guest_layer::GuestView;
use crate::record::{load, now};
use crate::state::Shared;
use crate::tenancy;
use crate::{lifecycle, record};

/// Most children one fork request may create.
pub const MAX_FORK: u32 = 64;

fn manifest_path(st: &Shared, sandbox_id: &str, checkpoint_id: &str) -> PathBuf {
    st.checkpoint_manifest(sandbox_id, checkpoint_id)
}

/// 404 for a checkpoint.
pub fn not_found(name: &str) -> EngineError {
    EngineError::new(ErrorCode::CheckpointNotFound, format!("no checkpoint with id or name {name:?}"))
}

/// What the next checkpoint of `rec` builds on: the chain below its new layer,
/// the manifest of the writable layer at the last checkpoint (empty when the
/// layer is fresh), and the parent checkpoint.
struct Base {
    chain: Vec<String>,
    manifest: TreeManifest,
    parent: Option<String>,
}

fn base_of(st: &Shared, rec: &SandboxRecord) -> EngineResult<Base> {
    let parent = rec.sandbox.head_checkpoint.clone();
    if let Some(head) = &parent {
        let p = manifest_path(st, &rec.sandbox.id, head);
        if let (Ok(bytes), Some((c, _))) = (std::fs::read(&p), st.db.checkpoint_by_id(head)?) {
            let manifest =
                serde_json::from_slice(&bytes).map_err(|e| EngineError::internal("checkpoint manifest", &e))?;
            return Ok(Base { chain: c.layers, manifest, parent });
        }
    }
    Ok(Base { chain: rec.layers.clone(), manifest: TreeManifest::default(), parent })
}

/// The writable layer's manifest at the sandbox's last checkpoint (empty when it has none)
/// and the layer directories below it, top first: what "changed since the last checkpoint" compares with.
pub(crate) fn head_manifest(st: &Shared, rec: &SandboxRecord) -> EngineResult<(TreeManifest, Vec<PathBuf>)> {
    Ok((base_of(st, rec)?.manifest, st.layer_dirs(&rec.layers)?))
}

/// Takes a checkpoint of a sandbox whose operation lock the caller holds.
///
/// A copy of the processes is tried again (a few times, up to ~3 s) when CRIU
/// meets a zombie that still has threads: a multi-threaded process (an exec
/// helper) that has just exited is one until its threads are gone, a moment
/// later. Nothing was taken by the failed try (the sandbox kept running).
pub async fn checkpoint_locked(st: &Shared, rec: &SandboxRecord, req: CheckpointRequest) -> EngineResult<Checkpoint> {
    let mut tries = 0u64;
    loop {
        match checkpoint_once(st, rec, req.clone()).await {
            Err(e)
                if req.processes && tries < 5 && e.body.message.contains("Zombies with threads are not supported") =>
            {
                tries += 1;
                tracing::info!(sandbox = %rec.sandbox.id, tries, "a process was exiting during the copy: trying again");
                tokio::time::sleep(std::time::Duration::from_millis(200 * tries)).await;
            }
            other => return other,
        }
    }
}

async fn checkpoint_once(st: &Shared, rec: &SandboxRecord, req: CheckpointRequest) -> EngineResult<Checkpoint> {
    let started = Instant::now();
    let state = rec.sandbox.state;
    if !matches!(state, SandboxState::Running | SandboxState::Stopped) {
        return Err(EngineError::invalid_state(
            state,
            format!("cannot checkpoint sandbox {} while it is {state}", rec.sandbox.id),
        ));
    }
    // Flush rules first: declared paths never reach a checkpoint (nor a fork or template made from it).
    crate::scan::flush(st, rec).await?;
    let id = ids::new_id();
    let name = match req.name {
        Some(n) => {
            ids::validate_new_name(&n, false)?;
            n
        }
        None => format!("{}-{}", rec.sandbox.name, &id[..8]),
    };
    if st.db.checkpoint_name_taken(&name)? {
        return Err(EngineError::new(ErrorCode::NameConflict, format!("a checkpoint named {name:?} exists")));
    }
    let expires_at = match (&req.ttl, req.pinned) {
        (Some(t), false) => record::expiry(Some(t))?,
        _ => None,
    };
    // A warm checkpoint copies the processes too, at the same frozen instant.
    let warm = match req.processes {
        true => {
            crate::lifecycle::warm::check_capturable(st, rec)?;
            let handle = record::handle_of(rec).ok_or_else(|| {
                EngineError::new(ErrorCode::Internal, format!("sandbox {} is running but has no init", rec.sandbox.id))
            })?;
            let staging = crate::lifecycle::warm::staging_dir(st, &id);
            let _ = strata_store::fsutil::remove_dir_all_if_exists(&staging);
            Some((handle, staging, st.processes.capture(&rec.sandbox.id).await))
        }
        false => None,
    };
    let base = base_of(st, rec)?;
    let classify_lowers = st.layer_dirs(&base.chain)?;
    let upper = st.upper_dir(&rec.sandbox.id);
    let manifest_file = manifest_path(st, &rec.sandbox.id, &id);
    // Layer commit and the checkpoint row go together against concurrent garbage collection.
    let _gc = st.image_lock.lock().await;
    // A tier that copies processes without their pipes to the daemon has them
    // let go first (before the freeze: that takes running processes); they
    // are given fresh pipes once the copy is taken.
    let detached = match &warm {
        Some((handle, _, _)) if st.runtime_of(&rec.sandbox).attaches_by_command() => {
            st.processes.suspend(&rec.sandbox.id).await;
            let (rt, sid, h) = (st.runtime_of(&rec.sandbox), rec.sandbox.id.clone(), handle.clone());
            let guard = tokio::task::spawn_blocking(move || rt.detach_processes(&sid, &h))
                .await
                .map_err(|e| EngineError::internal("detach task", &e))?;
            match guard {
                Ok(g) => Some((g, handle.clone())),
                Err(e) => {
                    crate::processes::reattach_running(st, &rec.sandbox.id, handle);
                    return Err(EngineError::new(
                        ErrorCode::Internal,
                        format!("copying the processes of sandbox {} failed (it keeps running; no checkpoint was taken): {}", rec.sandbox.id, crate::error::chain(&e)),
                    ));
                }
            }
        }
        _ => None,
    };
    let reattach = |detached: Option<(Option<strata_runtime::DetachGuard>, strata_runtime::SandboxHandle)>| {
        if let Some((guard, handle)) = detached {
            drop(guard);
            crate::processes::reattach_running(st, &rec.sandbox.id, &handle);
        }
    };
    let (rt, layers, sid) = (st.runtime_of(&rec.sandbox), st.layers.clone(), rec.sandbox.id.clone());
    let running = state == SandboxState::Running;
    let base_manifest = base.manifest.clone();
    let copy_into = warm.as_ref().map(|(h, dir, _)| (h.clone(), dir.clone()));
    type Copied = Option<Result<(PathBuf, u64), strata_runtime::RuntimeError>>;
    let in_guest = crate::guest_layer::in_guest(st, rec);
    let sealed = if in_guest {
        // A microVM: its guest tells what changed (its disk frozen meanwhile) and
        // writes those entries out; they are sealed from their staged copy.
        let pick = crate::guest_layer::Pick::Changes { base: base_manifest.clone(), lowers: classify_lowers.clone() };
        // A warm checkpoint copies the VM while the guest's disk is still frozen
        // from the read: the copies' disk is the layer's state.
        let copied = std::sync::Arc::new(std::sync::Mutex::new(None));
        let hook: Box<dyn FnMut() + Send> = match copy_into.clone() {
            Some((handle, dir)) => {
                let (rt, sid, copied) = (rt.clone(), sid.clone(), copied.clone());
                Box::new(move || {
                    let t = Instant::now();
                    let r = rt.copy_processes(&sid, &handle, &dir).map(|h| (h, t.elapsed().as_millis() as u64));
                    *copied.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                })
            }
            None => Box::new(|| {}),
        };
        let view = crate::guest_layer::read_with(st, rec, pick, true, hook).await;
        let copied: Copied = copied.lock().unwrap_or_else(|p| p.into_inner()).take();
        let view = view?;
        tokio::task::spawn_blocking(
            move || -> Result<(strata_image::ImportedLayer, TreeManifest, usize, u64, Copied), EngineError> {
                let dir =
                    view.dir().ok_or_else(|| EngineError::new(ErrorCode::Internal, "the guest wrote no layer"))?;
                let (layer, now, changed) =
                    seal(&dir, Some(view.now.clone()), &base_manifest, &classify_lowers, &layers, || {})?;
                Ok((layer, now, changed, view.frozen_ms, copied))
            },
        )
        .await
        .map_err(|e| EngineError::internal("checkpoint task", &e))
    } else {
        tokio::task::spawn_blocking(
            move || -> Result<(strata_image::ImportedLayer, TreeManifest, usize, u64, Copied), EngineError> {
                if running {
                    rt.set_frozen(&sid, true).map_err(|e| EngineError::internal("freeze", &e))?;
                }
                let frozen_at = Instant::now();
                let frozen_ms = std::sync::atomic::AtomicU64::new(0);
                let copied = std::sync::Mutex::new(None);
                // Thawed as soon as the change set has been read (and, for a warm
                // checkpoint, the processes copied): hashing the layer and syncing it
                // to disk do not need the sandbox to hold still.
                let thaw = || {
                    if let Some((handle, dir)) = &copy_into {
                        let t = Instant::now();
                        let r =
                            rt.copy_processes(&sid, handle, dir).map(|helper| (helper, t.elapsed().as_millis() as u64));
                        *copied.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                    }
                    if running {
                        frozen_ms.store(frozen_at.elapsed().as_millis() as u64, std::sync::atomic::Ordering::Relaxed);
                        if let Err(e) = rt.set_frozen(&sid, false) {
                            warn!(sandbox = %sid, error = %crate::error::chain(&e), "thaw after checkpoint failed");
                        }
                    }
                };
                let (layer, now, changed) = seal(&upper, None, &base_manifest, &classify_lowers, &layers, thaw)?;
                Ok((
                    layer,
                    now,
                    changed,
                    frozen_ms.into_inner(),
                    copied.into_inner().unwrap_or_else(|p| p.into_inner()),
                ))
            },
        )
        .await
        .map_err(|e| EngineError::internal("checkpoint task", &e))
    };
    reattach(detached);
    let discard_staging = || {
        if let Some((_, dir, _)) = &warm {
            let _ = strata_store::fsutil::remove_dir_all_if_exists(dir);
        }
    };
    let (layer, now_manifest, changed, frozen_ms, copied) = match sealed.and_then(|r| r) {
        Ok(x) => x,
        Err(e) => {
            discard_staging();
            return Err(e);
        }
    };
    let processes = match (warm.as_ref(), copied) {
        (Some((_, staging, captured)), Some(Ok((helper, dump_ms)))) => {
            // A guest's copies start with this checkpoint's disk: their next change
            // set is what changed since its manifest, kept with the image.
            let kept = match in_guest {
                true => crate::lifecycle::warm::keep_layer_manifest(staging, &now_manifest),
                false => Ok(()),
            };
            match kept.and_then(|()| {
                crate::lifecycle::warm::publish(st, &id, staging, helper, captured, &rec.sandbox.limits, dump_ms)
            }) {
                Ok(image) => Some(image),
                Err(e) => {
                    discard_staging();
                    crate::lifecycle::warm::remove(st, &id);
                    return Err(EngineError::internal("saving the checkpoint's processes", &e));
                }
            }
        }
        (Some(_), Some(Err(e))) => {
            discard_staging();
            return Err(EngineError::new(
                ErrorCode::Internal,
                format!(
                    "copying the processes of sandbox {} failed (it keeps running; no checkpoint was taken): {}",
                    rec.sandbox.id,
                    crate::error::chain(&e)
                ),
            ));
        }
        (Some(_), None) => {
            discard_staging();
            return Err(EngineError::new(ErrorCode::Internal, "the processes were not copied"));
        }
        (None, _) => None,
    };
    let json = serde_json::to_vec(&now_manifest).expect("manifest serializes");
    std::fs::create_dir_all(manifest_file.parent().expect("has parent"))
        .map_err(|e| EngineError::internal("manifest dir", &e))?;
    strata_store::fsutil::write_atomic(&manifest_file, &json, 0o600)
        .map_err(|e| EngineError::internal("write checkpoint manifest", &e))?;
    // An empty change set adds no layer: the chain stays the parent's (overlayfs
    // also refuses the same directory twice in one stack).
    let mut chain = base.chain;
    let added = (changed > 0).then(|| layer.key.clone());
    if let Some(d) = &added {
        if chain.contains(d) {
            // Byte-identical to a layer lower in the chain (same files, same mtimes):
            // overlayfs cannot stack one directory twice.
            return Err(EngineError::new(
                ErrorCode::Internal,
                format!("checkpoint layer {d} repeats a layer already in the chain; touch a changed file and retry"),
            ));
        }
        chain.push(d.clone());
    }
    let ckpt = Checkpoint {
        id,
        tenant: rec.sandbox.tenant.clone(),
        name,
        sandbox_id: rec.sandbox.id.clone(),
        parent: base.parent,
        layer_size: if added.is_some() { layer.size } else { 0 },
        layer: added,
        layers: chain,
        image: image_name(st, rec),
        image_id: rec.sandbox.image_id.clone(),
        changed_paths: changed as u64,
        labels: req.labels,
        created_at: now(),
        expires_at,
        pinned: req.pinned,
        capabilities: rec.sandbox.policy.capabilities.clone(),
        frozen_ms,
        duration_ms: started.elapsed().as_millis() as u64,
        processes,
        isolation: crate::state::tiers::tier_of(&rec.sandbox),
        userns: rec.sandbox.userns.is_some(),
        tmp: rec.sandbox.tmp,
        // A checkpoint of a quarantined sandbox is quarantined too.
        quarantine: crate::quarantine::inherited(&rec.sandbox),
    };
    // Crash point (`checkpoint-layer:crash`): the layer is stored, the checkpoint not yet recorded.
    let _ = crate::failpoint("checkpoint-layer");
    if let Err(e) = st.db.insert_checkpoint(&ckpt, &rec.image_config) {
        let _ = std::fs::remove_file(&manifest_file);
        crate::lifecycle::warm::remove(st, &ckpt.id);
        return Err(e.into());
    }
    if let Ok(ev) = st.db.record_event(
        &rec.sandbox.id,
        state,
        "checkpoint",
        Some(&format!("{} ({}, {} paths, {} bytes)", ckpt.id, ckpt.name, ckpt.changed_paths, ckpt.layer_size)),
        &ckpt.created_at,
    ) {
        st.notify_events(ev.seq);
    }
    info!(sandbox = %rec.sandbox.id, checkpoint = %ckpt.id, bytes = ckpt.layer_size, frozen_ms, "checkpoint");
    crate::accounting::on_checkpoint(st, &rec.sandbox.id, &ckpt.id, running);
    st.metrics.observe("checkpoint", started.elapsed());
    Ok(ckpt)
}

fn image_name(st: &Shared, rec: &SandboxRecord) -> String {
    match rec.sandbox.base_checkpoint.as_deref().and_then(|c| st.db.checkpoint_by_id(c).ok().flatten()) {
        Some((c, _)) => c.image,
        None => rec.sandbox.source.clone(),
    }
}

/// Reads the change set of `upper` since `base` and unpacks it as a new layer.
/// `now` is the manifest of `upper` when it was taken elsewhere (a microVM's
/// guest); otherwise `upper` is walked. `after_read` runs exactly once, as
/// soon as `upper` is no longer read (also on every error path), before the
/// layer is hashed to the end and synced.
fn seal(
    upper: &std::path::Path,
    now: Option<TreeManifest>,
    base: &TreeManifest,
    lowers: &[PathBuf],
    store: &strata_store::LayerStore,
    after_read: impl FnOnce() + Send,
) -> EngineResult<(strata_image::ImportedLayer, TreeManifest, usize)> {
    let mut after_read = Some(after_read);
    let mut release = || {
        if let Some(f) = after_read.take() {
            f()
        }
    };
    let prepared = (|| {
        let now = match now {
            Some(now) => now,
            None => changes::scan(upper, &strata_runtime::spec::IDENTITY_PATHS)?,
        };
        let changed = changes::diff(base, &now, lowers).len();
        crate::failpoint("checkpoint-write")
            .map_err(|e| EngineError::new(ErrorCode::Internal, format!("writing the checkpoint layer: {e}")))?;
        Ok::<_, EngineError>((now, changed, strata_image::chunk_pipe::chunk_pipe()))
    })();
    let (now, changed, (reader, writer)) = match prepared {
        Ok(p) => p,
        Err(e) => {
            release();
            return Err(e);
        }
    };
    let layer = std::thread::scope(|s| {
        let now = &now;
        let producer = s.spawn(move || {
            let written = changes::write_layer_tar(upper, base, now, lowers, writer);
            release();
            written
        });
        // The sandbox's own content: keep its modes as they are (no_new_privs makes setuid inert).
        let opts = strata_image::ImportOptions { trusted: true, ..Default::default() };
        let mut warnings = Vec::new();
        let unpacked = strata_image::unpack_layer(reader, store, &opts, &mut warnings, &mut |_| {});
        let produced = producer.join().map_err(|_| EngineError::new(ErrorCode::Internal, "layer writer panicked"))?;
        match (produced, unpacked) {
            // The writer stopped because the unpacker gave up first: the unpacker's error is the cause.
            (Err(strata_image::ImageError::Io { source, .. }), Err(u))
                if source.kind() == std::io::ErrorKind::BrokenPipe =>
            {
                Err(u.into())
            }
            (produced, unpacked) => {
                produced?;
                Ok::<_, EngineError>(unpacked?)
            }
        }
    })?;
    // unpack_layer syncs the layer's filesystem before committing it, so the
    // checkpoint is durable before its record makes it visible.
    Ok((layer, now, changed))
}

/// Takes a checkpoint of a sandbox.
pub async fn checkpoint(st: &Shared, sandbox: &str, req: CheckpointRequest) -> EngineResult<Checkpoint> {
    let (_g, rec) = record::lock_and_load(st, sandbox).await?;
    checkpoint_locked(st, &rec, req).await
}

/// Rolls a sandbox back to a checkpoint (keeping the current state as a checkpoint first when asked).
pub async fn restore(st: &Shared, sandbox: &str, req: RestoreRequest) -> EngineResult<RestoreResult> {
    let rec = load(st, sandbox)?;
    let (ckpt, config) = tenancy::find_checkpoint(st, &req.checkpoint)?.ok_or_else(|| not_found(&req.checkpoint))?;
    if ckpt.retired_at().is_some() {
        return Err(EngineError::checkpoint_retired(&ckpt));
    }
    // Rolling a sandbox that is not quarantined onto a quarantined checkpoint
    // would carry the state out of quarantine.
    if rec.sandbox.quarantine.is_none() {
        crate::quarantine::refuse_checkpoint(&ckpt, "be restored into a sandbox that is not quarantined")?;
    }
    let lock = st.lock_for(&rec.sandbox.id);
    let g = lock.lock().await;
    let rec = load(st, &rec.sandbox.id)?;
    let state = rec.sandbox.state;
    if !matches!(state, SandboxState::Running | SandboxState::Stopped | SandboxState::Error | SandboxState::Lost) {
        return Err(EngineError::invalid_state(
            state,
            format!("cannot restore sandbox {} while it is {state}", rec.sandbox.id),
        ));
    }
    // A warm checkpoint brings its processes back too, unless asked otherwise.
    let warm = match (ckpt.processes.is_some(), req.processes) {
        (true, None | Some(true)) => {
            crate::lifecycle::warm::check_startable(
                st,
                crate::state::tiers::tier_of(&rec.sandbox),
                &rec.sandbox.id,
                !st.secrets.get(&rec.sandbox.id)?.is_empty(),
                &ckpt.id,
            )?;
            true
        }
        (false, Some(true)) => {
            return Err(EngineError::bad_request(format!("checkpoint {} kept no processes", ckpt.id)))
        }
        _ => false,
    };
    // Processes coming back into a sandbox that holds no memory now: admitted like a start.
    let _admitted = if warm { lifecycle::admit_start(st, &rec)? } else { None };
    let kept =
        if req.keep_current { Some(checkpoint_locked(st, &rec, CheckpointRequest::default()).await?) } else { None };
    let rec = load(st, &rec.sandbox.id)?;
    let was_running = state == SandboxState::Running;
    if was_running {
        lifecycle::stop_locked(st, &rec, "restore", std::time::Duration::ZERO).await?;
    } else if warm && matches!(state, SandboxState::Error | SandboxState::Lost) {
        // Leftovers of a crashed run must go before the processes come back.
        lifecycle::kill_processes(st, &rec, std::time::Duration::from_secs(1)).await?;
    }
    let dir = st.sandbox_dir(&rec.sandbox.id);
    for sub in [strata_runtime::disk::upper_dir(&dir), strata_runtime::disk::work_dir(&dir), dir.join("manifests")] {
        strata_store::fsutil::remove_dir_all_if_exists(&sub)
            .map_err(|e| EngineError::internal("discard writable layer", &e))?;
    }
    if crate::guest_layer::in_guest(st, &rec) {
        // A guest's writable layer is on its disk, which the host does not mount: the
        // disk goes (the next boot makes a fresh one; a warm restore copies the checkpoint's).
        match std::fs::remove_file(dir.join(strata_runtime::disk::IMAGE)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(EngineError::internal("discard the microVM's disk", &e))
            }
            _ => {}
        }
    }
    st.db.set_chain(&rec.sandbox.id, &ckpt.layers, &config, Some(&ckpt.id), Some(&ckpt.id))?;
    if let Ok(ev) = st.db.record_event(
        &rec.sandbox.id,
        load(st, &rec.sandbox.id)?.sandbox.state,
        "restore",
        Some(&format!("rolled back to {} ({})", ckpt.id, ckpt.name)),
        &now(),
    ) {
        st.notify_events(ev.seq);
    }
    let sandbox = if warm {
        let rec = load(st, &rec.sandbox.id)?;
        crate::lifecycle::warm::boot(st, &rec, &ckpt.id, rec.sandbox.state, strata_core::Action::Start, "restore")
            .await?;
        drop(g);
        load(st, &rec.sandbox.id)?.sandbox
    } else {
        drop(g);
        if was_running {
            lifecycle::start_because(st, &rec.sandbox.id, "restore").await?
        } else {
            load(st, &rec.sandbox.id)?.sandbox
        }
    };
    Ok(RestoreResult { sandbox, kept })
}

/// The limits of a fork's children: each field the request gives, else the
/// source sandbox's (when it still exists); the daemon's defaults fill the rest
/// at create. The disk status is the children's own.
fn fork_limits(requested: Option<&ResourceLimits>, source: Option<&ResourceLimits>) -> ResourceLimits {
    let (r, s) = (requested.cloned().unwrap_or_default(), source.cloned().unwrap_or_default());
    ResourceLimits {
        memory_bytes: r.memory_bytes.or(s.memory_bytes),
        cpus: r.cpus.or(s.cpus),
        pids: r.pids.or(s.pids),
        disk_bytes: r.disk_bytes.or(s.disk_bytes),
        disk_quota: None,
    }
}

/// What a fork starts from.
enum ForkSource {
    Checkpoint(Box<Checkpoint>),
    /// A live sandbox, checkpointed once the fork may go ahead.
    Live(Box<SandboxRecord>),
}

/// Forks `count` sandboxes from a checkpoint, or from a live sandbox (checkpointed first).
pub async fn fork(st: &Shared, req: ForkRequest) -> EngineResult<ForkResult> {
    let started = Instant::now();
    if req.count == 0 || req.count > MAX_FORK {
        return Err(EngineError::bad_request(format!(
            "fork count must be between 1 and {MAX_FORK}, got {}",
            req.count
        )));
    }
    let source = match tenancy::find_sandbox_or_checkpoint(st, &req.source, tenancy::NamesFirst::Checkpoint)? {
        Some(tenancy::SandboxOrCheckpoint::Checkpoint(c)) if c.0.retired_at().is_some() => {
            return Err(EngineError::checkpoint_retired(&c.0))
        }
        Some(tenancy::SandboxOrCheckpoint::Checkpoint(c)) => {
            crate::quarantine::refuse_checkpoint(&c.0, "be forked")?;
            ForkSource::Checkpoint(Box::new(c.0))
        }
        Some(tenancy::SandboxOrCheckpoint::Sandbox(r)) => {
            crate::quarantine::refuse_sandbox(&r.sandbox, "be forked")?;
            ForkSource::Live(r)
        }
        None => {
            return Err(EngineError::new(
                ErrorCode::SandboxNotFound,
                format!("no checkpoint or sandbox named {:?}", req.source),
            ))
        }
    };
    // The Rule of Two once for all children, before a live source is checkpointed:
    // they inherit its declared capabilities and (unless the request names one) its network.
    let (parent_id, source_name, inherited, tenant) = match &source {
        ForkSource::Checkpoint(c) => (c.sandbox_id.clone(), c.name.clone(), c.capabilities.clone(), c.tenant.clone()),
        ForkSource::Live(r) => (
            r.sandbox.id.clone(),
            r.sandbox.name.clone(),
            r.sandbox.policy.capabilities.clone(),
            r.sandbox.tenant.clone(),
        ),
    };
    // The children's tier: one they can run on, checked before anything is made.
    if let Some(want) = req.isolation {
        let (from, warm) = match &source {
            ForkSource::Checkpoint(c) => (c.isolation, c.processes.is_some() && req.processes != Some(false)),
            ForkSource::Live(r) => (crate::state::tiers::tier_of(&r.sandbox), req.processes == Some(true)),
        };
        if warm && want != from {
            return Err(EngineError::bad_request(format!(
                "{source_name}'s processes run on the {from} tier and cannot start on the {want} tier; fork them on {from}, or without processes (processes: false)"
            )));
        }
        st.tiers.resolve(Some(want))?;
    }
    let parent = st.db.sandbox_by_id(&parent_id)?;
    let limits = fork_limits(req.limits.as_ref(), parent.as_ref().map(|p| &p.sandbox.limits));
    // The whole fork against the tenant's quotas (forks per minute included) and
    // the host, before a live source is checkpointed: a refused fork makes nothing.
    let mut admitted = limits.clone();
    st.admission.apply_defaults(&mut admitted);
    st.admission.validate(&admitted)?;
    st.admission.admit_fork(&st.db, &tenant, &admitted, u64::from(req.count), false)?;
    let network = req
        .network
        .clone()
        .or_else(|| parent.as_ref().map(|p| st.network.spec_of(&p.sandbox.id)))
        .filter(|n| n.mode != strata_api::NetworkMode::None || !n.allow.is_empty());
    let grants = strata_core::rule_of_two::grants(&strata_core::rule_of_two::Exposure {
        inherited: Some((&source_name, &inherited)),
        network: network.as_ref(),
        ..Default::default()
    });
    crate::approvals::gate(st, &tenant, "fork", &format!("{source_name} x{}", req.count), &grants)?;
    // Past the gate: the children count in the forks-per-minute window from here on.
    st.admission.admit_fork(&st.db, &tenant, &admitted, u64::from(req.count), true)?;
    let ckpt = match source {
        ForkSource::Checkpoint(c) => *c,
        ForkSource::Live(rec) => {
            let processes = req.processes == Some(true);
            checkpoint(
                st,
                &rec.sandbox.id,
                CheckpointRequest {
                    labels: [("strata.fork".to_string(), "source".to_string())].into(),
                    processes,
                    ..Default::default()
                },
            )
            .await?
        }
    };
    let generation = parent.as_ref().map_or(0, |p| p.sandbox.fork_generation) + 1;
    let prefix = req
        .name_prefix
        .clone()
        .unwrap_or_else(|| parent.as_ref().map_or(ckpt.name.clone(), |p| p.sandbox.name.clone()));
    let mut names = Vec::new();
    for i in 1..=req.count {
        let mut n = format!("{prefix}-{i}");
        if n.len() > 63 || ids::validate_new_name(&n, false).is_err() || st.db.sandbox_name_taken(&n)? {
            n = format!("fork-{}", ids::new_id());
        }
        names.push(n);
    }
    let creates = names.clone().into_iter().map(|name| {
        let allow_setuid = parent.as_ref().is_some_and(|p| p.sandbox.allow_setuid);
        let req = CreateSandboxRequest {
            source: ckpt.id.clone(),
            name: Some(name),
            lifecycle: req.lifecycle,
            ttl: req.ttl.clone(),
            limits: limits.clone(),
            network: network.clone(),
            allow_setuid,
            processes: req.processes,
            isolation: req.isolation,
            ..Default::default()
        };
        lifecycle::create_with(
            st,
            req,
            lifecycle::Lineage { fork_generation: generation, rule_of_two_checked: true, ..Default::default() },
        )
    });
    let results = futures_util::future::join_all(creates).await;
    let mut ids_out = Vec::new();
    let mut first_err = None;
    for r in results {
        match r {
            Ok(sb) => ids_out.push(sb.id),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_err {
        // Remove every child of this fork, including one left in `error` by a
        // failed start — and only those: a sandbox another caller created under
        // one of these names in the meantime (its create made ours fail) is not
        // made from this fork's checkpoint, so it is left alone.
        for name in &names {
            if let Ok(Some(rec)) = st.db.find_sandbox(name, None).map(|r| {
                r.filter(|r| r.sandbox.name == *name && r.sandbox.base_checkpoint.as_deref() == Some(ckpt.id.as_str()))
            }) {
                let _ = lifecycle::destroy(st, &rec.sandbox.id, true, "fork_failed").await;
            }
        }
        return Err(e);
    }
    st.metrics.observe("fork", started.elapsed());
    Ok(ForkResult { checkpoint: ckpt.id, sandboxes: ids_out, duration_ms: started.elapsed().as_millis() as u64 })
}

/// What a diff or export compares.
pub(crate) enum Comparison {
    /// Against the last checkpoint (or the creation source): the writable layer's
    /// changes since its manifest. For a microVM, `guest` holds its manifest
    /// and (for an export) the changed entries, staged at `upper`.
    Head { upper: PathBuf, base: TreeManifest, lowers: Vec<PathBuf>, guest: Option<GuestView> },
    /// Against an arbitrary checkpoint: the sandbox's view (writable layer over
    /// its chain) against that checkpoint's chain, over the paths the two do not
    /// share. For a microVM, `_guest` holds its whole layer, staged (the first of `now`).
    Stacks { now: Vec<PathBuf>, then: Vec<PathBuf>, touched_layers: Vec<PathBuf>, _guest: Option<GuestView> },
}

/// What `rec` is compared with (`against`: a checkpoint; `None`: its last
/// one). A microVM's layer is read through its guest: its entries only for
/// a diff, also the changed ones (or all, against another checkpoint) for
/// an `export`.
pub(crate) async fn comparison(
    st: &Shared,
    rec: &SandboxRecord,
    against: Option<&str>,
    export: bool,
) -> EngineResult<Comparison> {
    if !matches!(
        rec.sandbox.state,
        SandboxState::Running | SandboxState::Stopped | SandboxState::Error | SandboxState::Lost
    ) {
        return Err(EngineError::invalid_state(rec.sandbox.state, "the writable layer is not on local disk"));
    }
    let base = base_of(st, rec)?;
    let mut upper = st.upper_dir(&rec.sandbox.id);
    let target = match against {
        None => None,
        Some(a) => Some(tenancy::find_checkpoint(st, a)?.ok_or_else(|| not_found(a))?.0),
    };
    let in_guest = crate::guest_layer::in_guest(st, rec);
    match target {
        Some(c) if base.parent.as_deref() != Some(c.id.as_str()) => {
            let guest = match in_guest {
                true => Some(crate::guest_layer::read(st, rec, crate::guest_layer::Pick::Everything, false).await?),
                false => None,
            };
            if let Some(dir) = guest.as_ref().and_then(GuestView::dir) {
                upper = dir;
            }
            let mut now = vec![upper.clone()];
            now.extend(st.layer_dirs(&rec.layers)?);
            let then = st.layer_dirs(&c.layers)?;
            let shared = rec.layers.iter().zip(&c.layers).take_while(|(a, b)| a == b).count();
            let mut touched_layers = vec![upper];
            for d in rec.layers[shared..].iter().chain(&c.layers[shared..]) {
                touched_layers.push(st.layers.fs_dir(d).map_err(|e| EngineError::internal("layer", &e))?);
            }
            Ok(Comparison::Stacks { now, then, touched_layers, _guest: guest })
        }
        _ => {
            let lowers = st.layer_dirs(&rec.layers)?;
            let guest = match (in_guest, export) {
                (false, _) => None,
                (true, false) => {
                    Some(crate::guest_layer::read(st, rec, crate::guest_layer::Pick::Nothing, false).await?)
                }
                (true, true) => {
                    let pick =
                        crate::guest_layer::Pick::Changes { base: base.manifest.clone(), lowers: lowers.clone() };
                    Some(crate::guest_layer::read(st, rec, pick, false).await?)
                }
            };
            if let Some(dir) = guest.as_ref().and_then(GuestView::dir) {
                upper = dir;
            }
            Ok(Comparison::Head { upper, base: base.manifest, lowers, guest })
        }
    }
}

/// The changes of a comparison, with the providing layer for stack comparisons.
pub(crate) fn compute(cmp: &Comparison) -> EngineResult<Vec<changes::StackChange>> {
    let exclude = &strata_runtime::spec::IDENTITY_PATHS;
    match cmp {
        Comparison::Head { upper, base, lowers, guest } => {
            let now = match guest {
                Some(g) => g.now.clone(),
                None => changes::scan(upper, exclude)?,
            };
            Ok(changes::diff(base, &now, lowers).into_iter().map(|c| (c, None)).collect())
        }
        Comparison::Stacks { now, then, touched_layers, .. } => {
            let mut touched = std::collections::BTreeSet::new();
            for l in touched_layers {
                touched.extend(changes::scan(l, exclude)?.entries.into_keys());
            }
            Ok(changes::diff_stacks(now, then, &touched)?)
        }
    }
}

/// Sandboxes, checkpoints and templates that build on checkpoint `id`.
pub fn dependents_of(st: &Shared, id: &str) -> EngineResult<Vec<String>> {
    let mut dependents: Vec<String> = st
        .db
        .list_sandboxes()?
        .into_iter()
        .filter(|s| {
            s.sandbox.base_checkpoint.as_deref() == Some(id) || s.sandbox.head_checkpoint.as_deref() == Some(id)
        })
        .map(|s| format!("sandbox {}", s.sandbox.id))
        .collect();
    dependents.extend(
        st.db
            .list_checkpoints(None)?
            .into_iter()
            .filter(|x| x.parent.as_deref() == Some(id))
            .map(|x| format!("checkpoint {}", x.id)),
    );
    dependents.extend(
        st.db.list_templates()?.into_iter().filter(|(_, ck, _)| ck == id).map(|(n, _, _)| format!("template {n}")),
    );
    Ok(dependents)
}

/// Deletes a checkpoint's record and manifest (its layers go with the next layer GC).
pub fn remove_checkpoint(st: &Shared, c: &Checkpoint) -> EngineResult<()> {
    st.db.delete_checkpoint(&c.id)?;
    let _ = std::fs::remove_file(manifest_path(st, &c.sandbox_id, &c.id));
    crate::lifecycle::warm::remove(st, &c.id);
    Ok(())
}

/// Deletes expired checkpoints that nothing needs (repeatedly, so expired chains
/// go leaf first), then layers nothing references.
pub async fn gc(st: &Shared) -> EngineResult<strata_api::GcReport> {
    let _g = st.image_lock.lock().await;
    let mut report = strata_api::GcReport::default();
    let now = std::time::SystemTime::now();
    loop {
        let mut progressed = false;
        for c in st.db.list_checkpoints(None)? {
            let expired = !c.pinned
                && c.expires_at
                    .as_deref()
                    .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
                    .is_some_and(|t| t <= now);
            if expired && dependents_of(st, &c.id)?.is_empty() {
                remove_checkpoint(st, &c)?;
                info!(checkpoint = %c.id, "checkpoint retention expired");
                report.checkpoints_expired.push(c.id);
                progressed = true;
            }
        }
        if !progressed {
            break;
        }
    }
    let (removed, bytes) = crate::images::gc_layers_counted(st)?;
    report.layers_removed = removed;
    report.bytes_freed = bytes;
    Ok(report)
}

/// Builds the lineage tree of the component containing `id`.
pub fn lineage(st: &Shared, id: &str) -> EngineResult<strata_api::Lineage> {
    use std::collections::{BTreeMap, BTreeSet};
    use strata_api::LineageNode;
    // Only what the caller may see: another tenant's objects are neither nodes nor edges.
    let sandboxes: Vec<_> =
        st.db.list_sandboxes()?.into_iter().filter(|r| tenancy::visible(&r.sandbox.tenant)).collect();
    let ckpts: Vec<_> = st.db.list_checkpoints(None)?.into_iter().filter(|c| tenancy::visible(&c.tenant)).collect();
    let templates: Vec<_> = st
        .db
        .list_templates()?
        .into_iter()
        .filter(|(n, _, _)| st.db.template_tenant(n).ok().flatten().is_some_and(|t| tenancy::visible(&t)))
        .collect();
    let focus = match tenancy::find_sandbox_or_checkpoint(st, id, tenancy::NamesFirst::Sandbox)? {
        Some(tenancy::SandboxOrCheckpoint::Sandbox(r)) => format!("sandbox:{}", r.sandbox.id),
        Some(tenancy::SandboxOrCheckpoint::Checkpoint(c)) => format!("checkpoint:{}", c.0.id),
        None => {
            return Err(EngineError::new(ErrorCode::SandboxNotFound, format!("no sandbox or checkpoint named {id:?}")))
        }
    };
    // Parent edges between node keys "kind:id".
    let mut parent: BTreeMap<String, String> = BTreeMap::new();
    let mut nodes: BTreeMap<String, LineageNode> = BTreeMap::new();
    let sandbox_ids: BTreeSet<&str> = sandboxes.iter().map(|s| s.sandbox.id.as_str()).collect();
    for s in &sandboxes {
        let key = format!("sandbox:{}", s.sandbox.id);
        let p = match &s.sandbox.base_checkpoint {
            Some(c) => format!("checkpoint:{c}"),
            None => format!("image:{}", s.sandbox.source),
        };
        parent.insert(key.clone(), p);
        let detail = format!(
            "{}{}",
            s.sandbox.state,
            if s.sandbox.fork_generation > 0 {
                format!(", fork generation {}", s.sandbox.fork_generation)
            } else {
                String::new()
            }
        );
        nodes.insert(
            key.clone(),
            LineageNode {
                kind: "sandbox".into(),
                id: s.sandbox.id.clone(),
                name: s.sandbox.name.clone(),
                parent: None,
                detail,
            },
        );
    }
    for c in &ckpts {
        let key = format!("checkpoint:{}", c.id);
        // Checkpoints hang off their parent checkpoint or the image; sandboxes off
        // checkpoints or images. Edges only point to older checkpoints, so the
        // graph is a tree even after restores (where a sandbox moves below a
        // checkpoint that was taken from it).
        let p = match &c.parent {
            Some(pc) if ckpts.iter().any(|x| &x.id == pc) => format!("checkpoint:{pc}"),
            _ => format!("image:{}", c.image),
        };
        parent.insert(key.clone(), p);
        let from = if sandbox_ids.contains(c.sandbox_id.as_str()) {
            format!("from sandbox {}", c.sandbox_id)
        } else {
            format!("from sandbox {} (gone)", c.sandbox_id)
        };
        let detail = format!(
            "{from}, {} layer, {} paths changed{}",
            strata_core::units::format_size(c.layer_size),
            c.changed_paths,
            if c.pinned { ", pinned" } else { "" }
        );
        nodes.insert(
            key,
            LineageNode { kind: "checkpoint".into(), id: c.id.clone(), name: c.name.clone(), parent: None, detail },
        );
    }
    for (name, ck, _) in &templates {
        let key = format!("template:{name}");
        parent.insert(key.clone(), format!("checkpoint:{ck}"));
        nodes.insert(
            key,
            LineageNode {
                kind: "template".into(),
                id: name.clone(),
                name: name.clone(),
                parent: None,
                detail: "template".into(),
            },
        );
    }
    for p in parent.values() {
        if let Some(img) = p.strip_prefix("image:") {
            nodes.entry(p.clone()).or_insert_with(|| LineageNode {
                kind: "image".into(),
                id: img.into(),
                name: img.into(),
                parent: None,
                detail: "image".into(),
            });
        }
    }
    // The component of `focus`: everything sharing its root.
    let root_of = |k: &str| {
        let mut cur = k.to_string();
        let mut seen = BTreeSet::new();
        while let Some(p) = parent.get(&cur) {
            if !seen.insert(cur.clone()) {
                break;
            }
            cur = p.clone();
        }
        cur
    };
    let root = root_of(&focus);
    let mut out = Vec::new();
    // Parents before children: breadth-first from the root, each node once.
    let mut visited = BTreeSet::new();
    let mut queue = std::collections::VecDeque::from([root.clone()]);
    while let Some(k) = queue.pop_front() {
        if !visited.insert(k.clone()) {
            continue;
        }
        if let Some(mut n) = nodes.get(&k).cloned() {
            n.parent = parent.get(&k).map(|p| p.split_once(':').map(|(_, id)| id.to_string()).unwrap_or_default());
            out.push(n);
        }
        for (child, p) in &parent {
            if *p == k {
                queue.push_back(child.clone());
            }
        }
    }
    Ok(strata_api::Lineage {
        focus: focus.split_once(':').map(|(_, id)| id.to_string()).unwrap_or_default(),
        nodes: out,
    })
}
/// The files a sandbox changed, against its last checkpoint (or its creation
/// source) or, with `against`, against any checkpoint.
pub async fn diff(st: &Shared, id: &str, against: Option<&str>) -> EngineResult<Vec<FileChange>> {
    let rec = load(st, id)?;
    let cmp = comparison(st, &rec, against, false).await?;
    let list = tokio::task::spawn_blocking(move || -> EngineResult<Vec<FileChange>> {
        Ok(compute(&cmp)?
            .into_iter()
            .map(|(c, _)| FileChange {
                path: c.path,
                change: match c.change {
                    changes::ChangeKind::Added => ChangeKind::Added,
                    changes::ChangeKind::Modified => ChangeKind::Modified,
                    changes::ChangeKind::Deleted => ChangeKind::Deleted,
                },
                kind: serde_json::to_value(c.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                size: c.size,
            })
            .collect())
    })
    .await
    .map_err(|e| EngineError::internal("diff task", &e))??;
    Ok(list)
}

/// The same change set as [`diff`], as an OCI layer tar (deletions as `.wh.`
/// entries) written while it is read. Exporting files is external
/// communication for the Rule of Two. The change set is computed first (its
/// errors are the answer); the tar then streams through bounded buffers.
pub async fn export(st: &Shared, id: &str, against: Option<&str>) -> EngineResult<crate::transfer::ByteStream> {
    let rec = load(st, id)?;
    // The Rule of Two: exporting files is external communication.
    let view = record::with_secret_names(st, rec.sandbox.clone());
    let facts = record::exposure_facts(st, &view);
    let grants = strata_core::rule_of_two::grants(&strata_core::rule_of_two::Exposure {
        export: true,
        ..record::exposure(&view, &facts)
    });
    crate::approvals::gate(st, &rec.sandbox.tenant, "export files of", &rec.sandbox.id, &grants)?;
    let cmp = comparison(st, &rec, against, true).await?;
    // The change set is computed first (its errors are the answer); the tar is
    // then written while it is sent, through bounded buffers, never whole in memory.
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<EngineResult<()>>();
    let (mut out, stream) = crate::transfer::download_channel();
    let sandbox = rec.sandbox.id.clone();
    crate::transfer::spawn(move || {
        let written = match &cmp {
            Comparison::Head { upper, base, lowers, guest } => {
                let now = match guest {
                    Some(g) => Ok(g.now.clone()),
                    None => changes::scan(upper, &strata_runtime::spec::IDENTITY_PATHS),
                };
                match now {
                    Ok(now) => {
                        let _ = ready_tx.send(Ok(()));
                        changes::write_layer_tar(upper, base, &now, lowers, &mut out)
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.into()));
                        return;
                    }
                }
            }
            Comparison::Stacks { now, .. } => match compute(&cmp) {
                Ok(list) => {
                    let _ = ready_tx.send(Ok(()));
                    changes::write_stack_tar(now, &list, &mut out)
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            },
        };
        match written.map_err(|e| std::io::Error::other(e.to_string())).and_then(|_| std::io::Write::flush(&mut out)) {
            Ok(()) => {}
            Err(e) => {
                if !out.is_closed() {
                    tracing::warn!(sandbox = %sandbox, error = %e, "export cut short");
                }
                out.fail(e);
            }
        }
    })
    .map_err(|e| EngineError::internal("export thread", &e))?;
    match ready_rx.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            return Err(EngineError::new(ErrorCode::Internal, "export: the export thread ended without an answer"))
        }
    }
    Ok(stream)
}

/// The checkpoints the current caller may see: of the sandbox `sandbox`
/// names (404 when it names none of the caller's), or all of them.
pub fn list(st: &Shared, sandbox: Option<&str>) -> EngineResult<Vec<Checkpoint>> {
    match sandbox {
        Some(key) => {
            let rec = crate::record::load(st, key)?;
            Ok(st.db.list_checkpoints(Some(&rec.sandbox.id))?)
        }
        None => Ok(st.db.list_checkpoints(None)?.into_iter().filter(|c| crate::tenancy::visible(&c.tenant)).collect()),
    }
}

/// Deletes the checkpoint `key` names for the current caller, and the layers
/// nothing else uses; 409 (`in_use`, with the dependents) while sandboxes or
/// checkpoints still build on it.
pub async fn delete(st: &Shared, key: &str) -> EngineResult<()> {
    let _g = st.image_lock.lock().await;
    let (c, _) = crate::tenancy::find_checkpoint(st, key)?.ok_or_else(|| not_found(key))?;
    // Warm-pool sandboxes started from it are the daemon's own: they go first.
    crate::pool::drain_users(st, |r| r.sandbox.base_checkpoint.as_deref() == Some(c.id.as_str())).await;
    let dependents = dependents_of(st, &c.id)?;
    if !dependents.is_empty() {
        let mut e = EngineError::new(
            ErrorCode::InUse,
            format!("checkpoint {} is still needed by {}", c.id, dependents.join(", ")),
        );
        e.body.dependents = dependents;
        return Err(e);
    }
    remove_checkpoint(st, &c)?;
    crate::images::gc_layers(st)?;
    Ok(())
}

/// Deletes a checkpoint now when nothing builds on it, or else retires it:
/// unusable as a source from now on, its bytes freed by the retention GC once
/// the last sandbox, checkpoint or template that needs it is gone. Says
/// which, with the dependents that keep it.
pub async fn retire(st: &Shared, key: &str) -> EngineResult<strata_api::CheckpointDeleted> {
    let _g = st.image_lock.lock().await;
    let (c, _) = crate::tenancy::find_checkpoint(st, key)?.ok_or_else(|| not_found(key))?;
    let dependents = dependents_of(st, &c.id)?;
    if dependents.is_empty() {
        remove_checkpoint(st, &c)?;
        crate::images::gc_layers(st)?;
        return Ok(strata_api::CheckpointDeleted { id: c.id, deleted: true, kept_by: dependents });
    }
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let mut labels = c.labels.clone();
    labels.insert(Checkpoint::RETIRED_LABEL.to_string(), now.clone());
    st.db.retire_checkpoint(&c.id, &labels, &now)?;
    info!(checkpoint = %c.id, kept_by = %dependents.join(", "), "checkpoint retired");
    Ok(strata_api::CheckpointDeleted { id: c.id, deleted: false, kept_by: dependents })
}

/// The checkpoint `key` names for the current caller (404 otherwise).
pub fn get(st: &Shared, key: &str) -> EngineResult<Checkpoint> {
    Ok(crate::tenancy::find_checkpoint(st, key)?.ok_or_else(|| not_found(key))?.0)
}
