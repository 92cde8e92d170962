//! Archive: a stopped or standby sandbox's own state goes to the archive
//! store ([`crate::archive`]) and its local copy is freed.

use std::time::Instant;

use strata_api::{ErrorCode, SandboxEvent};
use strata_core::lifecycle::next_state;
use strata_core::Action;
use tracing::{info, warn};

use crate::archive::{pack, PACK_DIR};
use crate::error::{EngineError, EngineResult};
use crate::record::{self, transition, Change};
use crate::state::Shared;

/// Archives a stopped or standby sandbox, recording `reason`.
pub async fn archive(st: &Shared, id: &str, reason: &str) -> EngineResult<SandboxEvent> {
    let (_g, rec) = record::lock_and_load(st, id).await?;
    let started = Instant::now();
    let from = rec.sandbox.state;
    next_state(from, Action::Archive)?;
    let id = rec.sandbox.id.clone();
    let dir = st.sandbox_dir(&id);
    let staging = dir.join(PACK_DIR);
    let _ = strata_store::fsutil::remove_dir_all_if_exists(&staging);
    let packed = pack(st, &rec, &staging).await;
    let _ = strata_store::fsutil::remove_dir_all_if_exists(&staging);
    let manifest = packed.map_err(|msg| {
        EngineError::new(ErrorCode::Internal, format!("archiving sandbox {id} failed (it stays {from}): {msg}"))
    })?;
    // Crash point (`archive-pointer:crash`): uploaded and pointed to, not yet recorded.
    let _ = crate::failpoint("archive-pointer");
    let bytes: u64 = manifest.objects.iter().map(|o| o.size).sum();
    let detail = format!("{} to {} ({})", strata_core::units::format_size(bytes), manifest.store, manifest.prefix);
    let ev = transition(st, &id, from, Change::new(Action::Archive, reason).detail(&detail), started, None)?;
    // The archive is recorded: the local copies can go.
    let _ = strata_store::fsutil::remove_dir_all_if_exists(&crate::archive::tmp_dir(&dir));
    st.disks.release(&dir);
    for d in ["upper", "work", "standby", "rootfs"] {
        if let Err(e) = strata_store::fsutil::remove_dir_all_if_exists(&dir.join(d)) {
            warn!(sandbox = %id, error = %e, "freeing {d} after archiving");
        }
    }
    info!(sandbox = %id, bytes, store = %manifest.store, ms = started.elapsed().as_millis() as u64, reason, "archived");
    Ok(ev)
}
