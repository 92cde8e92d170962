//! Unarchive: an archived sandbox's files come back from the archive store
//! ([`crate::archive`], checked against its manifest first); it is then
//! `stopped`, or `standby` when it was archived from standby. Start and resume
//! call it; a sandbox whose archive cannot be brought back becomes `error`
//! with the reason, and the archive is kept.

use std::time::Instant;

use strata_api::{ErrorCode, SandboxState};
use strata_core::lifecycle::next_state;
use strata_core::Action;
use strata_store::db::SandboxRecord;
use tracing::{info, warn};

use crate::archive::{delete_remote, pointer, pointer_path, unpack, UNPACK_DIR};
use crate::error::{EngineError, EngineResult};
use crate::record::{load, transition, Change};
use crate::state::Shared;

/// Brings an archived sandbox's files back; it is then `stopped`, or `standby`
/// when it was archived from standby. The caller holds the sandbox's lock.
pub async fn unarchive_locked(st: &Shared, rec: &SandboxRecord, reason: &str) -> EngineResult<SandboxRecord> {
    let started = Instant::now();
    let id = rec.sandbox.id.clone();
    let Some(m) = pointer(st, &id) else {
        return Err(fail(
            st,
            rec,
            &format!("its local archive record {} is missing", pointer_path(st, &id).display()),
            started,
        ));
    };
    if m.store != st.archive.url {
        return Err(fail(
            st,
            rec,
            &format!("it was archived to {}, but this daemon's archive store is {}", m.store, st.archive.url),
            started,
        ));
    }
    let action = if m.from == SandboxState::Standby { Action::UnarchiveStandby } else { Action::Unarchive };
    next_state(rec.sandbox.state, action)?;
    let dir = st.sandbox_dir(&id);
    let staging = dir.join(UNPACK_DIR);
    let _ = strata_store::fsutil::remove_dir_all_if_exists(&staging);
    // A sandbox with a disk gets a fresh one, and its upper layer is unpacked straight onto it.
    // A microVM's comes back as its disk image (`disk.tar`): nothing to make.
    let in_guest = crate::guest_layer::in_guest(st, rec);
    let upper_target =
        match (rec.sandbox.limits.disk_bytes, strata_runtime::disk::enforced(rec.sandbox.limits.disk_quota.as_deref()))
        {
            _ if in_guest => None,
            (Some(bytes), true) => {
                let (d, pool) = (dir.clone(), st.disks.clone());
                match tokio::task::spawn_blocking(move || pool.ensure(&d, bytes)).await {
                    Ok(Ok(())) => Some(strata_runtime::disk::upper_dir(&dir)),
                    Ok(Err(e)) => return Err(fail(st, rec, &format!("making its disk: {e}"), started)),
                    Err(e) => return Err(fail(st, rec, &format!("making its disk: {e}"), started)),
                }
            }
            _ => None,
        };
    let tmp_target = crate::archive::tmp_dir(&dir);
    let _ = strata_store::fsutil::remove_dir_all_if_exists(&tmp_target);
    let res = unpack(st, &m, &staging, upper_target.as_deref(), Some(&tmp_target)).await;
    if let Err(msg) = res {
        let _ = strata_store::fsutil::remove_dir_all_if_exists(&staging);
        return Err(fail(st, rec, &msg, started));
    }
    // Swap the unpacked state into place, then record it.
    let moved = (|| {
        for d in ["upper", "standby"] {
            let src = staging.join(d);
            if src.exists() {
                strata_store::fsutil::remove_dir_all_if_exists(&dir.join(d))?;
                std::fs::rename(&src, dir.join(d))?;
            }
        }
        if in_guest {
            // Archived without a disk (never booted since a restore): the next boot makes one.
            let image = strata_runtime::disk::IMAGE;
            let unpacked = staging.join(crate::archive::DISK_TAR.trim_end_matches(".tar")).join(image);
            return match unpacked.exists() {
                true => std::fs::rename(unpacked, dir.join(image)),
                false => Ok(()),
            };
        }
        std::fs::create_dir_all(strata_runtime::disk::work_dir(&dir))
    })();
    let _ = strata_store::fsutil::remove_dir_all_if_exists(&staging);
    if let Err(e) = moved {
        return Err(fail(st, rec, &format!("moving the unpacked files into place: {e}"), started));
    }
    transition(
        st,
        &id,
        rec.sandbox.state,
        Change::new(action, reason).detail(&format!("from {}", m.prefix)),
        started,
        None,
    )?;
    let _ = std::fs::remove_file(pointer_path(st, &id));
    delete_remote(st, &m).await;
    info!(sandbox = %id, ms = started.elapsed().as_millis() as u64, "unarchived");
    load(st, &id)
}

fn fail(st: &Shared, rec: &SandboxRecord, msg: &str, started: Instant) -> EngineError {
    warn!(sandbox = %rec.sandbox.id, error = msg, "unarchive failed");
    let _ = transition(
        st,
        &rec.sandbox.id,
        rec.sandbox.state,
        Change::new(Action::Fail, "archive_invalid").detail(msg),
        started,
        None,
    );
    EngineError::new(
        ErrorCode::StandbyImageInvalid,
        format!(
            "cannot restore sandbox {} from its archive: {msg} (it is now in state error; the archive is kept)",
            rec.sandbox.id
        ),
    )
}
