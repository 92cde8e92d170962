//! What keeps a sandbox awake: recent API activity, open connections and
//! keep-alive leases.
//!
//! * Activity is kept in memory: the time of the last sandbox-scoped call that
//!   uses the sandbox's contents (exec, processes, files, checkpoint, restore,
//!   diff, export) and a count of such requests still open (an [`ActivityGuard`]
//!   lives as long as the request and its streamed response body: exec streams,
//!   log follows, uploads, downloads). Metadata reads (inspect, list, events,
//!   lease list) and lifecycle commands do not count.
//! * After a daemon restart nothing is known, so every sandbox counts as active
//!   at the daemon's start time.
//! * Leases are durable (SQLite): while one is held, the sandbox is not idle. A
//!   lease that is released or lapses counts as activity at that moment, so the
//!   idle timeout runs from then.

use std::collections::HashMap;
use std::time::SystemTime;

use strata_api::{ErrorCode, Lease, LeaseRequest};
use strata_core::{ids, units};
use tracing::info;

use crate::error::{EngineError, EngineResult};
use crate::record::{load, now};
use crate::state::Shared;

pub use crate::state::activity::*;

/// Whether a lease is still held at `at`.
pub fn is_held(lease: &Lease, at: SystemTime) -> bool {
    humantime::parse_rfc3339_weak(&lease.expires_at).is_ok_and(|t| t > at)
}

fn expiry_after(duration: &str) -> EngineResult<String> {
    let d = units::parse_duration(duration)?;
    let t = SystemTime::now()
        .checked_add(d)
        .ok_or_else(|| EngineError::bad_request(format!("lease duration {duration:?} is too long")))?;
    Ok(humantime::format_rfc3339_millis(t).to_string())
}

fn lease_not_found(sandbox: &str, lease: &str) -> EngineError {
    EngineError::new(
        ErrorCode::LeaseNotFound,
        format!("sandbox {sandbox} holds no lease {lease:?} (it may have expired)"),
    )
}

/// Takes a keep-alive lease on a sandbox.
pub fn create_lease(st: &Shared, sandbox: &str, req: &LeaseRequest) -> EngineResult<Lease> {
    let expires_at = expiry_after(&req.duration)?;
    let rec = load(st, sandbox)?;
    let lease = Lease { id: ids::new_id(), sandbox_id: rec.sandbox.id.clone(), created_at: now(), expires_at };
    st.db.insert_lease(&lease)?;
    info!(sandbox = %lease.sandbox_id, lease = %lease.id, expires_at = %lease.expires_at, "lease taken");
    Ok(lease)
}

/// Extends a held lease to `for` from now.
pub fn renew_lease(st: &Shared, sandbox: &str, lease: &str, req: &LeaseRequest) -> EngineResult<Lease> {
    let expires_at = expiry_after(&req.duration)?;
    let rec = load(st, sandbox)?;
    let id = &rec.sandbox.id;
    match st.db.get_lease(id, lease)? {
        Some(l) if is_held(&l, SystemTime::now()) => {}
        _ => return Err(lease_not_found(id, lease)),
    }
    let l = st.db.renew_lease(id, lease, &expires_at)?.ok_or_else(|| lease_not_found(id, lease))?;
    info!(sandbox = %id, lease, expires_at = %l.expires_at, "lease renewed");
    Ok(l)
}

/// Releases a lease of a sandbox; the sandbox's idle time counts from now.
/// The lease is looked up and deleted *as this sandbox's* (by sandbox id and
/// lease id together): a lease of another sandbox is unknown here and stays.
pub fn release_lease(st: &Shared, sandbox: &str, lease: &str) -> EngineResult<()> {
    let rec = load(st, sandbox)?;
    let id = &rec.sandbox.id;
    let held = st.db.get_lease(id, lease)?.is_some_and(|l| is_held(&l, SystemTime::now()));
    // An expired lease is gone either way; its row is removed too.
    let existed = st.db.delete_leases(&[(id, lease)])? > 0;
    if !(held && existed) {
        return Err(lease_not_found(id, lease));
    }
    st.activity.touch(id);
    info!(sandbox = %id, lease, "lease released");
    Ok(())
}

/// The leases a sandbox holds now.
pub fn list_leases(st: &Shared, sandbox: &str) -> EngineResult<Vec<Lease>> {
    let rec = load(st, sandbox)?;
    let at = SystemTime::now();
    Ok(st.db.list_leases(Some(&rec.sandbox.id))?.into_iter().filter(|l| is_held(l, at)).collect())
}

/// Removes lapsed leases, counting each lapse as activity on its sandbox, and
/// returns the number of leases each sandbox holds.
pub fn sweep_leases(st: &Shared) -> EngineResult<HashMap<String, usize>> {
    let at = SystemTime::now();
    let mut held: HashMap<String, usize> = HashMap::new();
    let mut lapsed = Vec::new();
    for l in st.db.list_leases(None)? {
        if is_held(&l, at) {
            *held.entry(l.sandbox_id).or_default() += 1;
        } else {
            st.activity.touch(&l.sandbox_id);
            info!(sandbox = %l.sandbox_id, lease = %l.id, "lease lapsed");
            lapsed.push((l.sandbox_id, l.id));
        }
    }
    if !lapsed.is_empty() {
        st.db.delete_leases(&lapsed.iter().map(|(s, l)| (s.as_str(), l.as_str())).collect::<Vec<_>>())?;
    }
    Ok(held)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    #[test]
    fn leases_lapse_at_their_expiry() {
        let l = Lease {
            id: "1".into(),
            sandbox_id: "s".into(),
            created_at: now(),
            expires_at: expiry_after("1h").unwrap(),
        };
        assert!(is_held(&l, SystemTime::now()));
        assert!(!is_held(&l, SystemTime::now() + Duration::from_secs(7200)));
        assert!(expiry_after("soon").is_err());
    }
}
