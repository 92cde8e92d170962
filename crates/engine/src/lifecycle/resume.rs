//! Resume: the image is checked against its checksums, the overlay root is
//! re-mounted and CRIU restores the same processes (same pids inside, same
//! memory, same open files); processes started through the API get fresh
//! pipes to the daemon and keep streaming their output. A paused sandbox is
//! thawed, a stopped one started, an archived one unpacked first. A missing
//! or corrupt image marks the sandbox `error` with the reason and deletes
//! nothing.

use std::path::Path;
use std::time::Instant;

use strata_api::{ErrorCode, ResumeRequest, ResumeResult, SandboxState, StandbyMode};
use strata_core::lifecycle::{has_processes, next_state};
use strata_core::Action;
use strata_runtime::{MemoryRestore, PageFill, SandboxHandle};
use strata_store::db::SandboxRecord;
use tracing::{info, warn};

use super::freeze_locked;
use crate::error::{EngineError, EngineResult};
use crate::process_image::{image_dir, retire_image, verify, LAST_RESTORE_LOG};
use crate::record::{handle_of, load, now, transition, Change};
use crate::state::Shared;
use crate::{lifecycle, record};

// ---- resume ----

/// Brings a sandbox in standby back (the same processes), recording `reason`.
pub async fn resume(st: &Shared, id: &str, reason: &str) -> EngineResult<ResumeResult> {
    resume_with(st, id, &ResumeRequest::default(), reason).await
}

/// [`resume`] with options.
pub async fn resume_with(st: &Shared, id: &str, req: &ResumeRequest, reason: &str) -> EngineResult<ResumeResult> {
    let (_g, rec) = record::lock_and_load(st, id).await?;
    resume_locked_with(st, &rec, req, reason).await
}

/// An explicit resume of the sandbox `key` names: from standby, paused,
/// stopped or archived, or a retry of a standby image that failed to restore
/// (the sandbox is then `error` with its image still there); 409 with the
/// current state from anything else.
pub async fn resume_parked(st: &Shared, key: &str, req: &ResumeRequest, reason: &str) -> EngineResult<ResumeResult> {
    let rec = record::load_for_transition(st, key)?;
    let retry = rec.sandbox.state == SandboxState::Error && image_dir(st, &rec.sandbox.id).is_dir();
    if !retry
        && !matches!(
            rec.sandbox.state,
            SandboxState::Standby | SandboxState::Paused | SandboxState::Stopped | SandboxState::Archived
        )
    {
        return Err(EngineError::invalid_state(rec.sandbox.state, format!("sandbox {} is {}; only standby, paused, stopped or archived sandboxes (or one whose standby image failed to restore) resume", rec.sandbox.id, rec.sandbox.state)));
    }
    resume_with(st, &rec.sandbox.id, req, reason).await
}

pub(crate) async fn resume_locked(st: &Shared, rec: &SandboxRecord, reason: &str) -> EngineResult<ResumeResult> {
    resume_locked_with(st, rec, &ResumeRequest::default(), reason).await
}

async fn resume_locked_with(
    st: &Shared,
    rec: &SandboxRecord,
    req: &ResumeRequest,
    reason: &str,
) -> EngineResult<ResumeResult> {
    let started = Instant::now();
    let from = rec.sandbox.state;
    // Processes coming back take memory: admitted like a create (429/503), before anything changes.
    let _admitted = lifecycle::admit_start(st, rec)?;
    let unarchived;
    let rec = if from == SandboxState::Archived {
        unarchived = crate::lifecycle::unarchive_locked(st, rec, reason).await?;
        &unarchived
    } else {
        rec
    };
    let id = rec.sandbox.id.clone();
    let processes_restored = match rec.sandbox.state {
        SandboxState::Paused => {
            freeze_locked(st, rec, Action::Unpause, reason).await?;
            true
        }
        SandboxState::Stopped => {
            lifecycle::boot(st, rec, SandboxState::Stopped, Action::Start, reason).await?;
            false
        }
        _ => {
            next_state(rec.sandbox.state, Action::Resume)?;
            restore_locked(st, rec, req.fs_only, reason, started).await?
        }
    };
    crate::hooks::run(st, &load(st, &id)?, crate::hooks::Stage::AfterResume).await;
    Ok(ResumeResult {
        from,
        duration_ms: started.elapsed().as_millis() as u64,
        processes_restored,
        sandbox: load(st, &id)?.sandbox,
    })
}

/// Restores a sandbox in standby; true when its processes came back (false
/// for an fs_only image, or when `fs_only` asks to start it from its filesystem).
pub(crate) async fn restore_locked(
    st: &Shared,
    rec: &SandboxRecord,
    fs_only: bool,
    reason: &str,
    started: Instant,
) -> EngineResult<bool> {
    let id = rec.sandbox.id.clone();
    let dir = image_dir(st, &id);
    let checked = {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || verify(&dir)).await.map_err(|e| EngineError::internal("verify task", &e))?
    };
    let manifest = match checked {
        Ok(m) => m,
        Err(msg) => return Err(mark_error(st, rec, "standby_image_invalid", &msg, started)),
    };
    if manifest.info.mode == StandbyMode::FsOnly || fs_only {
        lifecycle::boot(st, rec, rec.sandbox.state, Action::Resume, reason).await?;
        // Asked for: the processes the image kept are gone with it.
        st.processes.abandon_suspended(&id);
        let _ = strata_store::fsutil::remove_dir_all_if_exists(&dir);
        return Ok(false);
    }
    let Some(helper) = manifest.helper.clone().filter(|h| h.is_file()) else {
        let msg = format!(
            "the strata-init binary the image was made with ({}) is gone",
            manifest.helper.as_deref().unwrap_or(Path::new("?")).display()
        );
        return Err(mark_error(st, rec, "standby_image_invalid", &msg, started));
    };
    let mut spec = lifecycle::mount_spec(st, rec).await?;
    if let Err(e) = crate::network::prepare(st, &id, &mut spec).await {
        return Err(mark_error(st, rec, "resume_failed", &e.body.message, started));
    }
    let mut pipes = st.processes.resume_pipes(&id)?;
    let inherit = crate::processes::inherit_all(&pipes.children);
    let rt = st.runtime_of(&rec.sandbox);
    let tier = rt.clone();
    let images = dir.clone();
    let linked = spec.userns_link.is_some();
    let verified_ms = started.elapsed().as_millis() as u64;
    let memory = if st.lazy_restore { MemoryRestore::Lazy } else { MemoryRestore::Eager };
    let restored = tokio::task::spawn_blocking(move || {
        crate::failpoint("standby-restore")
            .map_err(|e| strata_runtime::RuntimeError::Setup(format!("restoring: {e}")))?;
        rt.restore_processes(&spec, &images, &images, &helper, &inherit, memory)
    })
    .await
    .map_err(|e| EngineError::internal("restore task", &e))?;
    let restored_ms = started.elapsed().as_millis() as u64;
    match restored {
        Ok(handle) => {
            // Crash point (`resume-restored:crash`): processes back, the record not yet written.
            let _ = crate::failpoint("resume-restored");
            if let Err(e) = crate::network::started(st, &id, linked, handle.init_pid).await {
                warn!(sandbox = %id, error = %e.body.message, "naming the restored network namespace");
            }
            let children = std::mem::take(&mut pipes.children);
            if let Err(e) = crate::processes::attach_restored(&*tier, &id, &handle, children) {
                warn!(sandbox = %id, error = %e.body.message, "reattaching the API processes");
            }
            pipes.commit();
            let fill = tier.memory_fill(&id);
            let memory = match (&fill, memory) {
                (Some(_), _) => "memory restored lazily".to_string(),
                (None, MemoryRestore::Eager) => "memory restored eagerly (--lazy-restore off)".into(),
                (None, MemoryRestore::Lazy) => format!(
                    "memory restored eagerly: {}",
                    tier.lazy_restore_unsupported(rec.sandbox.userns.is_some()).unwrap_or_else(|| "?".into())
                ),
            };
            let detail = format!("{} API processes reattached; {memory}", manifest.info.api_processes);
            transition(
                st,
                &id,
                rec.sandbox.state,
                Change::new(Action::Resume, reason).detail(&detail),
                started,
                Some(&handle),
            )?;
            st.db.set_expires_at(&id, record::expiry(rec.sandbox.ttl.as_deref())?.as_deref())?;
            lifecycle::watch_init(st.clone(), id.clone(), handle.clone());
            // CRIU's log of this restore is kept next to the image (replacing the
            // previous one) for diagnosis.
            if let Some(log) = st.runtime_of(&rec.sandbox).restore_leftovers(&dir) {
                let _ = std::fs::rename(log, st.sandbox_dir(&id).join(LAST_RESTORE_LOG));
            }
            match fill {
                // The image is spent: the restored processes have moved on from it.
                None => retire_image(st, &id),
                // Pages still come from it: it stays until the last one is in.
                Some(fill) => watch_fill(st.clone(), id.clone(), handle, fill),
            }
            info!(sandbox = %id, ms = started.elapsed().as_millis() as u64, verified_ms, restored_ms, reason, "resumed");
            Ok(true)
        }
        Err(strata_runtime::RuntimeError::Incompatible(why)) => {
            // Nothing was touched: the sandbox stays in standby with its image
            // (and its API processes suspended) for a host that can restore it.
            drop(pipes);
            Err(EngineError::invalid_state(
                rec.sandbox.state,
                format!("cannot resume sandbox {id} here: the process image cannot be restored on this host: {why}; its image is kept (`strata resume --fs-only` restarts it from its filesystem instead)"),
            ))
        }
        Err(e) => {
            pipes.abandon();
            Err(mark_error(st, rec, "resume_failed", &crate::error::chain(&e), started))
        }
    }
}

/// Follows the lazy fill of a resumed sandbox to its verdict. Every page
/// in: the image is retired and a `memory_resident` event says when. Pages
/// missing (the fill daemon died, failed or hung): what the processes have
/// not read yet would read as zeros, so they are killed and the sandbox goes
/// to `error` with the reason; the image is kept, and `strata resume`
/// restores from it again. Nothing is done to a sandbox that moved on
/// meanwhile (standby published a new image, stop, destroy) beyond retiring
/// the image a stopped (or stopped and restarted) one no longer needs.
pub(crate) fn watch_fill(st: Shared, id: String, handle: SandboxHandle, fill: std::sync::Arc<dyn PageFill>) {
    tokio::spawn(crate::tenancy::as_daemon(async move {
        let verdict = tokio::task::spawn_blocking(move || fill.wait())
            .await
            .unwrap_or_else(|e| Err(format!("the fill's watcher failed: {e}")));
        // Crash point (`lazy-fill-verdict:crash`): the verdict is in, nothing acted on it.
        let _ = crate::failpoint("lazy-fill-verdict");
        let Ok((_g, rec)) = record::lock_and_load(&st, &id).await else { return };
        let same = handle_of(&rec).as_ref() == Some(&handle) && has_processes(rec.sandbox.state);
        match verdict {
            Ok(took) if same => {
                retire_image(&st, &id);
                let detail = format!("every page is back in memory, {} ms after the restore began", took.as_millis());
                info!(sandbox = %id, ms = took.as_millis() as u64, "memory resident");
                if let Ok(ev) = st.db.record_event(&id, rec.sandbox.state, "memory_resident", Some(&detail), &now()) {
                    st.notify_events(ev.seq);
                }
            }
            Err(why) if same => {
                let msg = format!("its lazily restored memory is incomplete ({why}); its processes were killed and its standby image is kept (`strata resume` restores from it again)");
                warn!(sandbox = %id, error = %why, "lazy restore failed");
                let _ = lifecycle::kill_processes(&st, &rec, std::time::Duration::ZERO).await;
                crate::network::release(&st, &id).await;
                let _ = transition(
                    &st,
                    &id,
                    rec.sandbox.state,
                    Change::new(Action::Fail, "lazy_restore_failed").detail(&msg),
                    Instant::now(),
                    None,
                );
            }
            // Moved on without a new image: stopped, or stopped and started
            // again (no fill of a later lazy resume reads it). A standby or a
            // failed resume since has an image of its own there: left alone.
            _ if rec.sandbox.state == SandboxState::Stopped
                || (has_processes(rec.sandbox.state) && st.runtime_of(&rec.sandbox).memory_fill(&id).is_none()) =>
            {
                retire_image(&st, &id)
            }
            _ => {}
        }
    }));
}

/// Marks a sandbox `error` with `msg` (its image is kept) and returns the error to answer with.
pub(crate) fn mark_error(st: &Shared, rec: &SandboxRecord, reason: &str, msg: &str, started: Instant) -> EngineError {
    warn!(sandbox = %rec.sandbox.id, reason, error = msg, "resume failed");
    st.processes.abandon_suspended(&rec.sandbox.id);
    let _ = transition(
        st,
        &rec.sandbox.id,
        rec.sandbox.state,
        Change::new(Action::Fail, reason).detail(msg),
        started,
        None,
    );
    let code = if reason == "standby_image_invalid" { ErrorCode::StandbyImageInvalid } else { ErrorCode::Internal };
    EngineError::new(
        code,
        format!("cannot resume sandbox {}: {msg} (it is now in state error; its files are kept)", rec.sandbox.id),
    )
}
