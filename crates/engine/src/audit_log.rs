//! The audit log as front ends use it: [`append`] (every front end records
//! through it: the native API's middleware in `strata-server`, the E2B layer,
//! MCP), [`list`] and [`verify`]. What is recorded and why: [`crate::audit`].

/// Appends one entry to the audit log (a failure is logged: the request's
/// answer stands). Every front end records through this: the native API's
/// middleware, the E2B layer, MCP.
pub fn append(
    st: &crate::state::Shared,
    actor: &str,
    tenant: Option<&str>,
    method: &str,
    route: &str,
    target: Option<&str>,
    status: u16,
) {
    let entry =
        strata_store::db::NewAudit { time: &crate::record::now(), actor, tenant, method, route, target, status };
    if let Err(e) = st.db.append_audit(&entry) {
        tracing::error!(error = %e, %method, %route, "audit log append failed");
    }
}

/// The last `limit` audit entries (default 100), oldest first; a caller acting
/// in a tenant sees that tenant's entries only.
pub fn list(st: &crate::state::Shared, limit: Option<u32>) -> crate::error::EngineResult<Vec<strata_api::AuditEntry>> {
    Ok(st.db.audit_entries_of(crate::tenancy::scope().as_deref(), Some(limit.unwrap_or(100)))?)
}

/// Recomputes the hash chain and reports the first entry that does not fit.
pub fn verify(st: &crate::state::Shared) -> crate::error::EngineResult<strata_api::AuditVerification> {
    let entries = st.db.audit_entries(None)?;
    let bad = strata_store::db::audit_verify(&entries);
    Ok(strata_api::AuditVerification {
        ok: bad.is_none(),
        entries: entries.len() as u64,
        first_bad: bad.as_ref().map(|b| b.0),
        reason: bad.map(|b| b.1),
    })
}
