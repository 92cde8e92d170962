//! The TTL reaper: sandboxes past their expiry are destroyed, and once a
//! minute checkpoint retention and layer garbage collection run. A daemon
//! loop above the operations (it calls [`crate::lifecycle`] and
//! [`crate::checkpoints`]).

use std::time::{Duration, Instant, SystemTime};

use strata_api::Lifecycle;
use strata_core::lifecycle::has_processes;
use tracing::warn;

use crate::error::EngineError;
use crate::lifecycle::{destroy, stop, STOP_GRACE};
use crate::record::parse_time;
use crate::state::Shared;

/// Runs forever: applies TTL expiry (ephemeral: destroy; persistent: stop).
pub async fn ttl_reaper(st: Shared) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut last_gc = Instant::now();
    loop {
        tick.tick().await;
        // Checkpoint retention and layer garbage collection, once a minute.
        if last_gc.elapsed() >= Duration::from_secs(60) {
            last_gc = Instant::now();
            if let Err(e) = crate::checkpoints::gc(&st).await {
                warn!(error = %e.body.message, "automatic garbage collection failed");
            }
        }
        // Only sandboxes with a deadline are loaded: idle hosts with many parked
        // sandboxes stay idle.
        let Ok(ids) = st.db.with_expiry() else { continue };
        let now = SystemTime::now();
        for id in ids {
            let Ok(Some(rec)) = st.db.sandbox_by_id(&id) else { continue };
            let Some(exp) = rec.sandbox.expires_at.as_deref().and_then(parse_time) else { continue };
            if exp > now {
                continue;
            }
            let id = rec.sandbox.id.clone();
            let result = if rec.sandbox.lifecycle == Lifecycle::Ephemeral {
                destroy(&st, &id, true, "ttl_expired").await.map(|_| ())
            } else if has_processes(rec.sandbox.state) {
                stop(&st, &id, "ttl_expired", STOP_GRACE).await.map(|_| ())
            } else {
                st.db.set_expires_at(&id, None).map_err(EngineError::from)
            };
            if let Err(e) = result {
                warn!(sandbox = %id, error = %e.body.message, "TTL action failed");
            }
        }
    }
}
