//! Pause, standby and resume.
//!
//! * **pause / unpause**: the cgroup freezer stops every process; memory stays.
//! * **standby**: the whole process tree (memory, open files, pids) is dumped
//!   with CRIU into `<sandbox>/standby/` and the processes end, releasing the
//!   sandbox's CPU and RAM; its writable layer stays untouched on disk.
//!   `fs_only` (asked for explicitly) stops the processes instead and records
//!   that on the sandbox. Without process checkpointing and without `fs_only`,
//!   standby fails with the reason: processes are never dropped silently.
//! * **resume**: the images are checked against their checksums, the overlay
//!   root is re-mounted and CRIU restores the same processes (same pids inside,
//!   same memory, same open files); processes started through the API get fresh
//!   pipes to the daemon and keep streaming their output.
//!
//! The images are written to `standby.tmp/` and renamed to `standby/` only once
//! complete (with `manifest.json`, which lists every file's size and CRC32), so
//! a crash leaves either no image (the processes still run, or are lost and
//! reported so) or a complete one that the next daemon start turns into a
//! sandbox in standby. A missing or corrupt image marks the sandbox `error`
//! with the reason and deletes nothing.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use strata_api::{ErrorCode, ResumeResult, SandboxEvent, SandboxState, StandbyInfo, StandbyMode, StandbyRequest};
use strata_core::lifecycle::next_state;
use strata_core::Action;
use strata_store::db::SandboxRecord;
use tracing::{info, warn};

use crate::error::{EngineError, EngineResult};
use crate::sandboxes::{self, handle_of, load, now, transition, Change};
use crate::state::Shared;

/// Directory of a complete standby image, inside the sandbox's directory.
const IMAGE_DIR: &str = "standby";
/// Where an image is written before it is complete.
const STAGING_DIR: &str = "standby.tmp";
/// The manifest, written last.
const MANIFEST: &str = "manifest.json";
/// CRIU's log of the sandbox's last successful restore, in the sandbox's directory.
const LAST_RESTORE_LOG: &str = "criu-restore.last.log";
/// Prefix of a used image's directory while it is removed in the background
/// (renamed first, so the removal of a large image is off the resume's path).
const SPENT_PREFIX: &str = "standby.spent.";

/// `manifest.json` of a process image (a standby image, or a warm checkpoint's).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Manifest {
    pub(crate) info: StandbyInfo,
    /// The strata-init binary the dumped processes run (bound again on restore).
    #[serde(default)]
    pub(crate) helper: Option<PathBuf>,
    /// Every image file with its size and CRC32.
    files: Vec<FileSum>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct FileSum {
    name: String,
    size: u64,
    crc32: u32,
}

pub fn image_dir(st: &Shared, id: &str) -> PathBuf {
    st.sandbox_dir(id).join(IMAGE_DIR)
}

/// The standby image's description, when the sandbox has one.
pub fn info(st: &Shared, id: &str) -> Option<StandbyInfo> {
    read_manifest(&image_dir(st, id)).ok().map(|m| m.info)
}

fn read_manifest(dir: &Path) -> Result<Manifest, String> {
    let p = dir.join(MANIFEST);
    let bytes = std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", p.display()))
}

fn crc_of(path: &Path) -> std::io::Result<(u64, u32)> {
    let mut h = crc32fast::Hasher::new();
    let size = strata_store::fsutil::for_each_chunk(path, |c| h.update(c))?;
    Ok((size, h.finalize()))
}

/// Sums every regular file of `dir` (but the manifest).
fn sum_files(dir: &Path) -> std::io::Result<Vec<FileSum>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name == MANIFEST || !e.file_type()?.is_file() {
            continue;
        }
        let (size, crc32) = crc_of(&e.path())?;
        out.push(FileSum { name, size, crc32 });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Checks an image against its manifest: every listed file present with its size and CRC32.
pub(crate) fn verify(dir: &Path) -> Result<Manifest, String> {
    if !dir.is_dir() {
        return Err(format!("the process image {} is missing", dir.display()));
    }
    let m = read_manifest(dir)?;
    for f in &m.files {
        let p = dir.join(&f.name);
        match crc_of(&p) {
            Ok((size, crc)) if size == f.size && crc == f.crc32 => {}
            Ok((size, crc)) => {
                return Err(format!(
                    "process image file {} is corrupt ({size} bytes, crc32 {crc:08x}; expected {} bytes, crc32 {:08x})",
                    f.name, f.size, f.crc32
                ))
            }
            Err(e) => return Err(format!("process image file {}: {e}", f.name)),
        }
    }
    Ok(m)
}

/// Writes `manifest.json` into `dir` (temp + fsync + rename) and syncs the files it lists.
pub(crate) fn seal(dir: &Path, info: StandbyInfo, helper: Option<PathBuf>) -> std::io::Result<Manifest> {
    let files = sum_files(dir)?;
    for f in &files {
        std::fs::File::open(dir.join(&f.name))?.sync_all()?;
    }
    let m = Manifest { info: StandbyInfo { image_bytes: files.iter().map(|f| f.size).sum(), ..info }, helper, files };
    strata_store::fsutil::write_atomic(
        &dir.join(MANIFEST),
        &serde_json::to_vec_pretty(&m).expect("manifest serializes"),
        0o600,
    )?;
    Ok(m)
}

/// Renames a complete staging directory into place (replacing an old image) and syncs the parent.
pub(crate) fn publish(staging: &Path, dir: &Path) -> std::io::Result<()> {
    strata_store::fsutil::remove_dir_all_if_exists(dir)?;
    std::fs::rename(staging, dir)?;
    std::fs::File::open(dir.parent().expect("has parent"))?.sync_all()
}

// ---- pause / unpause ----

/// Freezes every process of a running sandbox.
pub async fn pause(st: &Shared, id: &str) -> EngineResult<SandboxEvent> {
    freeze(st, id, Action::Pause, "user").await
}

/// Thaws a paused sandbox.
pub async fn unpause(st: &Shared, id: &str, reason: &str) -> EngineResult<SandboxEvent> {
    freeze(st, id, Action::Unpause, reason).await
}

async fn freeze(st: &Shared, id: &str, action: Action, reason: &str) -> EngineResult<SandboxEvent> {
    let (_g, rec) = sandboxes::lock_and_load(st, id).await?;
    freeze_locked(st, &rec, action, reason).await
}

async fn freeze_locked(st: &Shared, rec: &SandboxRecord, action: Action, reason: &str) -> EngineResult<SandboxEvent> {
    let started = Instant::now();
    let from = rec.sandbox.state;
    next_state(from, action)?;
    let (rt, sid, frozen) = (st.runtime.clone(), rec.sandbox.id.clone(), action == Action::Pause);
    tokio::task::spawn_blocking(move || rt.set_frozen(&sid, frozen))
        .await
        .map_err(|e| EngineError::internal("freezer task", &e))?
        .map_err(|e| EngineError::internal(if frozen { "freeze" } else { "thaw" }, &e))?;
    transition(st, &rec.sandbox.id, from, Change::new(action, reason), started, handle_of(rec).as_ref())
}

// ---- standby ----

/// Puts a sandbox into standby (processes dumped), recording `reason`.
pub async fn standby(st: &Shared, id: &str, reason: &str) -> EngineResult<SandboxEvent> {
    standby_with(st, id, &StandbyRequest::default(), reason).await
}

/// [`standby`] with options.
pub async fn standby_with(st: &Shared, id: &str, req: &StandbyRequest, reason: &str) -> EngineResult<SandboxEvent> {
    let (_g, rec) = sandboxes::lock_and_load(st, id).await?;
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
    // which a process image would capture: such a sandbox never gets one.
    let env_secrets = st.secrets.get(&id)?.env_names().join(", ");
    if !env_secrets.is_empty() {
        let why = format!("its secrets {env_secrets} are environment variables of its processes, and a process image would capture their values");
        if reason == "user" {
            return Err(EngineError::invalid_state(from, format!("cannot keep the processes of sandbox {id}: {why}; `strata standby --fs-only` stops them and keeps only the filesystem")));
        }
        // An automatic standby degrades explicitly (recorded on the sandbox).
        return standby_fs_only(st, &rec, why, reason, started).await;
    }
    if let Some(why) = st.runtime.process_dump_unsupported() {
        return Err(EngineError::new(
            ErrorCode::Unsupported,
            format!("cannot keep the processes of sandbox {id}: {why}; `strata standby --fs-only` stops them and keeps only the filesystem"),
        ));
    }
    if from == SandboxState::Paused {
        // CRIU seizes the tasks itself; a frozen cgroup would stall it.
        let (rt, sid) = (st.runtime.clone(), id.clone());
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
    let (rt, sid, dir) = (st.runtime.clone(), id.clone(), staging.clone());
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
            // CRIU leaves the processes running when a dump fails.
            st.processes.unsuspend(&id);
            let _ = strata_store::fsutil::remove_dir_all_if_exists(&staging);
            if from == SandboxState::Paused {
                let _ = st.runtime.set_frozen(&id, true);
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
    let sealed = (|| {
        crate::failpoint("standby-seal")?;
        let m = seal(&staging, info, Some(helper))?;
        publish(&staging, &image_dir(st, &id))?;
        Ok::<_, std::io::Error>(m)
    })();
    let _ = st.runtime.cleanup(&id);
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

async fn standby_fs_only(
    st: &Shared,
    rec: &SandboxRecord,
    why: String,
    reason: &str,
    started: Instant,
) -> EngineResult<SandboxEvent> {
    let id = rec.sandbox.id.clone();
    crate::hooks::run(st, rec, crate::hooks::Stage::BeforeStandby).await;
    crate::accounting::final_sample(st, &id);
    sandboxes::kill_processes(st, rec, sandboxes::STOP_GRACE).await?;
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

// ---- resume ----

/// Brings a sandbox in standby back (the same processes), recording `reason`.
pub async fn resume(st: &Shared, id: &str, reason: &str) -> EngineResult<ResumeResult> {
    let (_g, rec) = sandboxes::lock_and_load(st, id).await?;
    resume_locked(st, &rec, reason).await
}

/// Makes a sandbox runnable for a call that needs its processes or files:
/// resumes it from standby, thaws it when paused, starts it when stopped.
/// `None` when it was running already.
pub async fn ensure_running(st: &Shared, id: &str) -> EngineResult<Option<ResumeResult>> {
    let rec = load(st, id)?;
    if rec.sandbox.state == SandboxState::Running {
        return Ok(None);
    }
    let lock = st.lock_for(&rec.sandbox.id);
    let _g = lock.lock().await;
    let rec = load(st, &rec.sandbox.id)?;
    match rec.sandbox.state {
        SandboxState::Standby | SandboxState::Paused | SandboxState::Stopped | SandboxState::Archived => {
            resume_locked(st, &rec, "resume_on_access").await.map(Some)
        }
        _ => Ok(None),
    }
}

async fn resume_locked(st: &Shared, rec: &SandboxRecord, reason: &str) -> EngineResult<ResumeResult> {
    let started = Instant::now();
    let from = rec.sandbox.state;
    // Processes coming back take memory: admitted like a create (429/503), before anything changes.
    let _admitted = sandboxes::admit_start(st, rec)?;
    let unarchived;
    let rec = if from == SandboxState::Archived {
        unarchived = crate::archive::unarchive_locked(st, rec, reason).await?;
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
            sandboxes::boot(st, rec, SandboxState::Stopped, Action::Start, reason).await?;
            false
        }
        _ => {
            next_state(rec.sandbox.state, Action::Resume)?;
            restore_locked(st, rec, reason, started).await?
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

/// Restores a sandbox in standby; true when its processes came back (false for fs_only).
async fn restore_locked(st: &Shared, rec: &SandboxRecord, reason: &str, started: Instant) -> EngineResult<bool> {
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
    if manifest.info.mode == StandbyMode::FsOnly {
        sandboxes::boot(st, rec, rec.sandbox.state, Action::Resume, reason).await?;
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
    let mut spec = sandboxes::mount_spec(st, rec).await?;
    if let Err(e) = crate::network::prepare(st, &id, &mut spec).await {
        return Err(mark_error(st, rec, "resume_failed", &e.body.message, started));
    }
    let pipes = st.processes.resume_pipes(&id)?;
    let inherit: Vec<(std::os::fd::RawFd, u64)> =
        pipes.inherit.iter().map(|(fd, ino)| (std::os::fd::AsRawFd::as_raw_fd(fd), *ino)).collect();
    let rt = st.runtime.clone();
    let images = dir.clone();
    let verified_ms = started.elapsed().as_millis() as u64;
    let restored = tokio::task::spawn_blocking(move || {
        crate::failpoint("standby-restore")
            .map_err(|e| strata_runtime::RuntimeError::Setup(format!("restoring: {e}")))?;
        rt.restore_processes(&spec, &images, &images, &helper, &inherit)
    })
    .await
    .map_err(|e| EngineError::internal("restore task", &e))?;
    let restored_ms = started.elapsed().as_millis() as u64;
    match restored {
        Ok(handle) => {
            // Crash point (`resume-restored:crash`): processes back, the record not yet written.
            let _ = crate::failpoint("resume-restored");
            pipes.commit();
            let detail = format!("{} API processes reattached", manifest.info.api_processes);
            transition(
                st,
                &id,
                rec.sandbox.state,
                Change::new(Action::Resume, reason).detail(&detail),
                started,
                Some(&handle),
            )?;
            st.db.set_expires_at(&id, sandboxes::expiry(rec.sandbox.ttl.as_deref())?.as_deref())?;
            sandboxes::watch_init(st.clone(), id.clone(), handle);
            // The image is spent: the restored processes have moved on from it. CRIU's log
            // of this restore is kept next to it (replacing the previous one) for diagnosis.
            let _ = std::fs::rename(
                dir.join(strata_runtime::namespace::criu::RESTORE_LOG),
                st.sandbox_dir(&id).join(LAST_RESTORE_LOG),
            );
            retire_image(st, &id);
            info!(sandbox = %id, ms = started.elapsed().as_millis() as u64, verified_ms, restored_ms, reason, "resumed");
            Ok(true)
        }
        Err(e) => {
            pipes.abandon();
            Err(mark_error(st, rec, "resume_failed", &crate::error::chain(&e), started))
        }
    }
}

/// Marks a sandbox `error` with `msg` (its image is kept) and returns the error to answer with.
fn mark_error(st: &Shared, rec: &SandboxRecord, reason: &str, msg: &str, started: Instant) -> EngineError {
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

/// Drops a sandbox's standby image (it was stopped or destroyed from standby).
pub fn discard(st: &Shared, id: &str) {
    st.processes.abandon_suspended(id);
    for d in [IMAGE_DIR, STAGING_DIR] {
        let _ = strata_store::fsutil::remove_dir_all_if_exists(&st.sandbox_dir(id).join(d));
    }
    sweep_spent(st, id);
}

/// Moves a used standby image out of the way (one rename) and removes it in the
/// background: unlinking ~100 MiB of pages is not on the resume's critical path.
/// A daemon that dies before the removal finishes sweeps it at start ([`sweep_spent`]).
fn retire_image(st: &Shared, id: &str) {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let spent = st.sandbox_dir(id).join(format!("{SPENT_PREFIX}{}.{n}", std::process::id()));
    let dir = image_dir(st, id);
    let target = match std::fs::rename(&dir, &spent) {
        Ok(()) => spent,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            warn!(sandbox = %id, error = %e, "moving the used standby image aside; removing it in place");
            dir
        }
    };
    let id = id.to_string();
    tokio::task::spawn_blocking(move || {
        if let Err(e) = strata_store::fsutil::remove_dir_all_if_exists(&target) {
            warn!(sandbox = %id, error = %e, "removing the used standby image");
        }
    });
}

/// Removes used images a previous daemon left half-removed ([`retire_image`]).
pub fn sweep_spent(st: &Shared, id: &str) {
    let Ok(entries) = std::fs::read_dir(st.sandbox_dir(id)) else { return };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(SPENT_PREFIX) {
            let _ = strata_store::fsutil::remove_dir_all_if_exists(&e.path());
        }
    }
}

/// A running sandbox (re-adopted after a daemon restart) has no use for a
/// standby image: one left there was restored from by a daemon that died
/// before removing it.
pub fn drop_stale_image(st: &Shared, id: &str) {
    if image_dir(st, id).is_dir() {
        info!(sandbox = %id, "removing a standby image already restored from");
        retire_image(st, id);
    }
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
    let _ = st.runtime.cleanup(&rec.sandbox.id);
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
    let pidfile = image_dir(st, id).join(strata_runtime::namespace::criu::PIDFILE);
    let Some(pid) = std::fs::read_to_string(&pidfile).ok().and_then(|s| s.trim().parse::<i32>().ok()) else {
        return Ok(());
    };
    let in_sandbox = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(id.as_str()));
    let start = strata_runtime::namespace::process_start_time(pid);
    match start {
        Some(init_start_time) if in_sandbox => {
            let handle = strata_runtime::SandboxHandle { init_pid: pid, init_start_time };
            transition(
                st,
                id,
                SandboxState::Standby,
                Change::new(Action::Resume, "resume_completed")
                    .detail("the daemon stopped after the processes were restored"),
                Instant::now(),
                Some(&handle),
            )?;
            sandboxes::watch_init(st.clone(), id.clone(), handle);
            retire_image(st, id);
            info!(sandbox = %id, "completed a resume interrupted by the daemon's stop");
        }
        _ => {
            let _ = st.runtime.cleanup(id);
            let _ = std::fs::remove_file(&pidfile);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_images_verify_and_corruption_is_named() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("pages-1.img"), vec![7u8; 100_000]).unwrap();
        std::fs::write(d.path().join("core-1.img"), b"core").unwrap();
        let info = StandbyInfo {
            mode: StandbyMode::Processes,
            created_at: "t".into(),
            image_bytes: 0,
            api_processes: 1,
            dump_ms: 3,
            note: None,
        };
        let m = seal(d.path(), info, None).unwrap();
        assert_eq!(m.info.image_bytes, 100_004);
        assert_eq!(m.files.len(), 2);
        assert!(verify(d.path()).is_ok());
        // Flip one byte: refused, naming the file.
        let mut bytes = std::fs::read(d.path().join("pages-1.img")).unwrap();
        bytes[500] ^= 1;
        std::fs::write(d.path().join("pages-1.img"), bytes).unwrap();
        let err = verify(d.path()).unwrap_err();
        assert!(err.contains("pages-1.img") && err.contains("corrupt"), "{err}");
        // A missing file is named too; a missing directory says so.
        std::fs::remove_file(d.path().join("core-1.img")).unwrap();
        assert!(verify(d.path()).unwrap_err().contains("core-1.img"));
        assert!(verify(&d.path().join("nope")).unwrap_err().contains("missing"));
    }
}
