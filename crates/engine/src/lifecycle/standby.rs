//! Standby: the whole process tree (memory, open files, pids) is dumped with
//! CRIU into a process image ([`crate::process_image`]) and the processes end,
//! releasing the sandbox's CPU and RAM; its writable layer stays untouched on
//! disk. `fs_only` (asked for explicitly) stops the processes instead and
//! records that on the sandbox. Without process checkpointing and without
//! `fs_only`, standby fails with the reason: processes are never dropped
//! silently. A crash leaves either no image (the processes still run, or are
//! lost and reported so) or a complete one that the next daemon start turns
//! into a sandbox in standby ([`reconcile_standby`]).

use std::time::Instant;

use strata_api::{ErrorCode, SandboxEvent, SandboxState, StandbyInfo, StandbyMode, StandbyRequest};
use strata_core::lifecycle::next_state;
use strata_core::Action;
use strata_runtime::InterruptedRestore;
use strata_store::db::SandboxRecord;
use tracing::{info, warn};

use crate::error::{EngineError, EngineResult};
use crate::process_image::{image_dir, publish, read_manifest, retire_image, seal, STAGING_DIR};
use crate::record::{handle_of, now, transition, Change};
use crate::state::Shared;
use crate::{lifecycle, record};

// ---- standby ----

/// Puts a sandbox into standby (processes dumped), recording `reason`.
pub async fn standby(st: &Shared, id: &str, reason: &str) -> EngineResult<SandboxEvent> {
    standby_with(st, id, &StandbyRequest::default(), reason).await
}

/// [`standby`] with options.
pub async fn standby_with(st: &Shared, id: &str, req: &StandbyRequest, reason: &str) -> EngineResult<SandboxEvent> {
    let (_g, rec) = record::lock_and_load(st, id).await?;
    let started = Instant::now();
    let from = rec.sandbox.state;
    next_state(from, Action::Standby)?;
    let id = rec.sandbox.id.clone();
    let handle = handle_of(&rec)
        .ok_or_else(|| EngineError::new(ErrorCode::Internal, format!("sandbox {id} is {from} but has no init")))?;
    if req.fs_only {
        return standby_fs_only(st, &rec, "asked for with fs_only".into(), reason, started).await;
    }
    // Secrets exposed as environment variables live in the processes' memory,
    // and a microVM's secret files in its guest's RAM: a process image would
    // capture their values, so such a sandbox never gets one.
    let secrets = st.secrets.get(&id)?;
    let in_guest_ram = st.runtime_of(&rec.sandbox).process_image_holds_secrets() && !secrets.is_empty();
    let held = match in_guest_ram {
        true => secrets.refs().into_iter().map(|r| r.name).collect::<Vec<_>>().join(", "),
        false => secrets.env_names().join(", "),
    };
    if !held.is_empty() {
        let why = match in_guest_ram {
            true => format!("its secrets {held} are files in its guest's RAM, and the VM's memory snapshot would capture their values"),
            false => format!("its secrets {held} are environment variables of its processes, and a process image would capture their values"),
        };
        if reason == "user" {
            return Err(EngineError::invalid_state(from, format!("cannot keep the processes of sandbox {id}: {why}; `strata standby --fs-only` stops them and keeps only the filesystem")));
        }
        // An automatic standby degrades explicitly (recorded on the sandbox).
        return standby_fs_only(st, &rec, why, reason, started).await;
    }
    if let Some(why) = st.runtime_of(&rec.sandbox).process_dump_unsupported() {
        return Err(EngineError::new(
            ErrorCode::Unsupported,
            format!("cannot keep the processes of sandbox {id}: {why}; `strata standby --fs-only` stops them and keeps only the filesystem"),
        ));
    }
    if from == SandboxState::Paused {
        // CRIU seizes the tasks itself; a frozen cgroup would stall it.
        let (rt, sid) = (st.runtime_of(&rec.sandbox), id.clone());
        tokio::task::spawn_blocking(move || rt.set_frozen(&sid, false))
            .await
            .map_err(|e| EngineError::internal("thaw task", &e))?
            .map_err(|e| EngineError::internal("thaw", &e))?;
    }
    crate::hooks::run(st, &rec, crate::hooks::Stage::BeforeStandby).await;
    // The last compute sample before the processes go (the live baseline is dropped by the transition).
    crate::accounting::sample(st, &id);
    let staging = st.sandbox_dir(&id).join(STAGING_DIR);
    let _ = strata_store::fsutil::remove_dir_all_if_exists(&staging);
    let suspended = st.processes.suspend(&id).await;
    let (rt, sid, dir) = (st.runtime_of(&rec.sandbox), id.clone(), staging.clone());
    let dumped = tokio::task::spawn_blocking(move || {
        crate::failpoint("standby-dump")
            .map_err(|e| strata_runtime::RuntimeError::Setup(format!("writing the standby image: {e}")))?;
        let t = Instant::now();
        let helper = rt.dump_processes(&sid, &handle, &dir)?;
        Ok::<_, strata_runtime::RuntimeError>((helper, t.elapsed()))
    })
    .await
    .map_err(|e| EngineError::internal("dump task", &e))?;
    let (helper, dump_time) = match dumped {
        Ok(x) => x,
        Err(e) => {
            // A failed dump leaves the processes running (those a tier had
            // detached from their pipes get them back).
            crate::processes::reattach_running(st, &id, &handle_of(&rec).expect("checked above"));
            let _ = strata_store::fsutil::remove_dir_all_if_exists(&staging);
            if from == SandboxState::Paused {
                let _ = st.runtime_of(&rec.sandbox).set_frozen(&id, true);
            }
            let msg = crate::error::chain(&e);
            warn!(sandbox = %id, error = %msg, "standby failed; the sandbox keeps running");
            return Err(EngineError::new(
                ErrorCode::Internal,
                format!("standby of sandbox {id} failed (it keeps running): {msg}"),
            ));
        }
    };
    // The processes are gone from here on: the image must become durable, or the sandbox is lost.
    let info = StandbyInfo {
        mode: StandbyMode::Processes,
        created_at: now(),
        image_bytes: 0,
        api_processes: suspended,
        dump_ms: dump_time.as_millis() as u64,
        note: None,
    };
    // Sealing (checksums, fsync) and releasing the sandbox's runtime leftovers
    // (its cgroup; on the gVisor tier a `runsc delete`) touch nothing in common:
    // both run at once, off the async workers.
    let (rt, sid, image) = (st.runtime_of(&rec.sandbox), id.clone(), image_dir(st, &id));
    let sealed = tokio::task::spawn_blocking(move || {
        std::thread::scope(|s| {
            let cleanup = s.spawn(|| rt.cleanup(&sid));
            let sealed = (|| {
                crate::failpoint("standby-seal")?;
                let m = seal(&staging, info, Some(helper))?;
                publish(&staging, &image)?;
                Ok::<_, std::io::Error>(m)
            })();
            if let Ok(Err(e)) = cleanup.join() {
                warn!(sandbox = %sid, error = %crate::error::chain(&e), "releasing the sandbox's runtime after its dump");
            }
            sealed
        })
    })
    .await
    .map_err(|e| EngineError::internal("seal task", &e))?;
    let manifest = match sealed {
        Ok(m) => m,
        Err(e) => {
            st.processes.abandon_suspended(&id);
            let msg = format!("the processes were dumped but the image could not be saved: {e}");
            let _ = transition(st, &id, from, Change::new(Action::Fail, "standby_failed").detail(&msg), started, None);
            return Err(EngineError::new(ErrorCode::Internal, format!("standby of sandbox {id} failed: {msg}")));
        }
    };
    // Crash point (`standby-published:crash`): the image is complete, the record not yet written.
    let _ = crate::failpoint("standby-published");
    let detail = format!(
        "process tree dumped ({suspended} started through the API), image {}",
        strata_core::units::format_size(manifest.info.image_bytes)
    );
    let ev = transition(st, &id, from, Change::new(Action::Standby, reason).detail(&detail), started, None)?;
    st.db.set_expires_at(&id, None)?;
    info!(sandbox = %id, bytes = manifest.info.image_bytes, dump_ms = manifest.info.dump_ms, total_ms = started.elapsed().as_millis() as u64, reason, "standby");
    Ok(ev)
}

pub(crate) async fn standby_fs_only(
    st: &Shared,
    rec: &SandboxRecord,
    why: String,
    reason: &str,
    started: Instant,
) -> EngineResult<SandboxEvent> {
    let id = rec.sandbox.id.clone();
    crate::hooks::run(st, rec, crate::hooks::Stage::BeforeStandby).await;
    crate::accounting::final_sample(st, &id);
    lifecycle::kill_processes(st, rec, lifecycle::STOP_GRACE).await?;
    let dir = st.sandbox_dir(&id);
    let staging = dir.join(STAGING_DIR);
    let _ = strata_store::fsutil::remove_dir_all_if_exists(&staging);
    let info = StandbyInfo {
        mode: StandbyMode::FsOnly,
        created_at: now(),
        image_bytes: 0,
        api_processes: 0,
        dump_ms: 0,
        note: Some(format!("processes were stopped, not kept: {why}")),
    };
    let saved = std::fs::create_dir_all(&staging)
        .and_then(|_| seal(&staging, info, None))
        .and_then(|_| publish(&staging, &image_dir(st, &id)));
    if let Err(e) = saved {
        let msg = format!("recording the filesystem-only standby: {e}");
        let _ = transition(
            st,
            &id,
            rec.sandbox.state,
            Change::new(Action::Fail, "standby_failed").detail(&msg),
            started,
            None,
        );
        return Err(EngineError::new(ErrorCode::Internal, msg));
    }
    st.processes.abandon_suspended(&id);
    let ev = transition(
        st,
        &id,
        rec.sandbox.state,
        Change::new(Action::Standby, reason).detail(&format!("filesystem only: {why}")),
        started,
        None,
    )?;
    st.db.set_expires_at(&id, None)?;
    Ok(ev)
}

/// After a daemon (re)start: a sandbox recorded as running whose init is gone
/// but whose standby image is complete was put into standby by a daemon that
/// died before recording it: record it now. Returns whether it did.
pub fn complete_interrupted(st: &Shared, rec: &SandboxRecord) -> EngineResult<bool> {
    let dir = image_dir(st, &rec.sandbox.id);
    let _ = strata_store::fsutil::remove_dir_all_if_exists(&st.sandbox_dir(&rec.sandbox.id).join(STAGING_DIR));
    if read_manifest(&dir).is_err() {
        return Ok(false);
    }
    let _ = st.runtime_of(&rec.sandbox).cleanup(&rec.sandbox.id);
    transition(
        st,
        &rec.sandbox.id,
        rec.sandbox.state,
        Change::new(Action::Standby, "standby_completed").detail("the daemon stopped after the image was saved"),
        Instant::now(),
        None,
    )?;
    Ok(true)
}

/// After a daemon (re)start, for a sandbox recorded in standby: a resume that
/// the previous daemon started but did not record is completed when its
/// restored pid 1 runs, otherwise whatever it left is removed and the sandbox
/// stays in standby (its image is still there).
pub fn reconcile_standby(st: &Shared, rec: &SandboxRecord) -> EngineResult<()> {
    let id = &rec.sandbox.id;
    let dir = image_dir(st, id);
    let rt = st.runtime_of(&rec.sandbox);
    match rt.interrupted_restore(id, &dir) {
        InterruptedRestore::None => {}
        InterruptedRestore::Running(handle) => {
            transition(
                st,
                id,
                SandboxState::Standby,
                Change::new(Action::Resume, "resume_completed")
                    .detail("the daemon stopped after the processes were restored"),
                Instant::now(),
                Some(&handle),
            )?;
            lifecycle::watch_init(st.clone(), id.clone(), handle.clone());
            match rt.adopt_fill(id, &dir) {
                // Restored lazily: the fill is followed on; the image stays until it ends.
                Some(fill) => lifecycle::watch_fill(st.clone(), id.clone(), handle, fill),
                None => retire_image(st, id),
            }
            info!(sandbox = %id, "completed a resume interrupted by the daemon's stop");
        }
        InterruptedRestore::Gone => {
            let _ = st.runtime_of(&rec.sandbox).cleanup(id);
            st.runtime_of(&rec.sandbox).restore_leftovers(&dir);
        }
    }
    Ok(())
}
