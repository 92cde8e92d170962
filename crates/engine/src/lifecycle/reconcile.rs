//! Reconciliation at daemon start: every sandbox's record is brought in line
//! with what is on the host (re-adopted, completed, or marked lost), and
//! orphaned directories are removed.

use std::time::{Duration, Instant};

use strata_api::{Lifecycle, SandboxState};
use strata_core::Action;
use tracing::{info, warn};

use super::{destroy, kill_processes, release_resources, watch_init};
use crate::error::EngineError;
use crate::record::{handle_of, transition, Change};
use crate::state::Shared;

/// Brings the daemon's view in line with reality after a (re)start: running
/// sandboxes whose init still lives are re-adopted, the others marked lost;
/// creations interrupted by a crash are failed; ephemeral leftovers are destroyed.
pub async fn reconcile(st: &Shared) -> Result<(), EngineError> {
    sweep_orphans(st)?;
    for rec in st.db.list_sandboxes()? {
        crate::archive::reconcile(st, &rec).await;
        let id = rec.sandbox.id.clone();
        crate::process_image::sweep_spent(st, &id);
        let state = rec.sandbox.state;
        let rt = st.runtime_of(&rec.sandbox);
        let alive = handle_of(&rec).is_some_and(|h| rt.is_alive(&h));
        let ephemeral = rec.sandbox.lifecycle == Lifecycle::Ephemeral;
        // Resumed lazily, and the previous daemon stopped before it acted on the
        // fill's verdict: the fill is followed on from here.
        let fill = match state {
            SandboxState::Running | SandboxState::Paused => {
                rt.adopt_fill(&id, &crate::process_image::image_dir(st, &id))
            }
            _ => None,
        };
        match state {
            SandboxState::Running | SandboxState::Paused if alive => {
                info!(sandbox = %id, "re-adopted running sandbox");
                if state == SandboxState::Running {
                    // A daemon that died mid-checkpoint may have left it frozen.
                    if let Err(e) = rt.set_frozen(&id, false) {
                        warn!(sandbox = %id, error = %crate::error::chain(&e), "thawing a re-adopted sandbox");
                    }
                }
                let handle = handle_of(&rec).expect("alive implies handle");
                watch_init(st.clone(), id.clone(), handle.clone());
                match fill {
                    // The image stays until every page is in.
                    Some(fill) => crate::lifecycle::watch_fill(st.clone(), id.clone(), handle, fill),
                    None => crate::process_image::drop_stale_image(st, &id),
                }
            }
            SandboxState::Running | SandboxState::Paused if fill.is_some() => {
                // Its init died while its memory was coming back: the image is
                // intact and is what a resume restores from again.
                let _ = kill_processes(st, &rec, Duration::from_millis(100)).await;
                transition(
                    st,
                    &id,
                    state,
                    Change::new(Action::Fail, "resume_failed").detail(INIT_GONE_MID_FILL),
                    Instant::now(),
                    None,
                )?;
            }
            SandboxState::Running | SandboxState::Paused if crate::lifecycle::complete_interrupted(st, &rec)? => {
                info!(sandbox = %id, "completed a standby interrupted by the daemon's stop");
            }
            SandboxState::Running | SandboxState::Paused => {
                let _ = kill_processes(st, &rec, Duration::from_millis(100)).await;
                transition(
                    st,
                    &id,
                    state,
                    Change::new(Action::Lose, "init_gone").detail("init was gone when the daemon started"),
                    Instant::now(),
                    None,
                )?;
                if ephemeral {
                    destroy(st, &id, true, "init_gone").await?;
                }
            }
            SandboxState::Creating => {
                let _ = kill_processes(st, &rec, Duration::from_millis(100)).await;
                transition(
                    st,
                    &id,
                    state,
                    Change::new(Action::Fail, "interrupted").detail("the daemon stopped during creation"),
                    Instant::now(),
                    None,
                )?;
                if ephemeral {
                    destroy(st, &id, true, "interrupted").await?;
                }
            }
            SandboxState::Standby => crate::lifecycle::reconcile_standby(st, &rec)?,
            _ if ephemeral && state != SandboxState::Destroyed => {
                destroy(st, &id, true, "ephemeral_leftover").await?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Why a sandbox resumed lazily is `error` when its init was gone at a daemon start.
const INIT_GONE_MID_FILL: &str = "init was gone when the daemon started, while the sandbox's memory was still coming back from its standby image (lazy restore); the image is kept (`strata resume` restores from it again)";

/// Removes directories and cgroups of sandboxes that have no record (left by a
/// crash between a destroy's commit and its background cleanup).
pub fn sweep_orphans(st: &Shared) -> Result<(), EngineError> {
    let known: std::collections::HashSet<String> = st.db.list_sandboxes()?.into_iter().map(|r| r.sandbox.id).collect();
    // Pipeline runs that may still run a stage keep their stages' secrets too.
    let mut keep = known.clone();
    keep.extend(crate::secrets::live_secret_keys(st)?);
    st.secrets.sweep(&keep);
    let Ok(entries) = std::fs::read_dir(&st.sandboxes_dir) else { return Ok(()) };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !known.contains(&name) {
            info!(sandbox = %name, "removing leftovers of a destroyed sandbox");
            // Its tier is not recorded any more: every tier this daemon runs releases what it has of it.
            if let Some(gv) = &st.gvisor {
                if let Err(e) = gv.cleanup(&name) {
                    warn!(sandbox = %name, error = %crate::error::chain(&e), "releasing gvisor leftovers");
                }
            }
            release_resources(st, st.runtime.as_ref(), &name);
        }
    }
    Ok(())
}
