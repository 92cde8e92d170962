//! Tenant quotas (the routes are the server's): the operator's per-tenant overrides
//! (`GET|PUT|DELETE /v1/tenants/{tenant}/quota`, operator-only like token
//! management) and a tenant's usage against its quota
//! (`GET /v1/tenants/{tenant}/usage`, also for the tenant itself). The checks
//! themselves are in [`crate::admission`].

use strata_api::{QuotaOverride, TenantQuota};

use crate::error::{EngineError, EngineResult};
use crate::state::Shared;

/// `tenant` if it is a valid tenant name (400 naming the field otherwise).
pub fn checked_tenant(tenant: &str) -> EngineResult<()> {
    crate::tenancy::validate_tenant(tenant).map_err(|e| EngineError::bad_request(format!("tenant: {e}")))
}

/// The quota record of `tenant` as the routes answer it.
pub fn quota_record(st: &Shared, tenant: &str) -> EngineResult<TenantQuota> {
    let defaults = st.admission.tenant_defaults();
    let (overrides, updated_at) = match st.db.tenant_quota(tenant)? {
        Some((o, t)) => (o, Some(t)),
        None => (QuotaOverride::default(), None),
    };
    Ok(TenantQuota {
        tenant: tenant.to_string(),
        effective: defaults.with_override(&overrides),
        overrides,
        defaults,
        updated_at,
    })
}

/// Sets (replaces) a tenant's quota override; effective for the next request.
pub fn set_override(st: &Shared, tenant: &str, o: &QuotaOverride) -> EngineResult<TenantQuota> {
    checked_tenant(tenant)?;
    st.db.put_tenant_quota(tenant, o, &crate::record::now())?;
    let q = quota_record(st, tenant)?;
    tracing::info!(tenant = %tenant, effective = ?q.effective, "tenant quota set");
    Ok(q)
}

/// Removes a tenant's quota override: the daemon's defaults hold again.
pub fn remove_override(st: &Shared, tenant: &str) -> EngineResult<TenantQuota> {
    checked_tenant(tenant)?;
    if st.db.delete_tenant_quota(tenant)? {
        tracing::info!(tenant = %tenant, "tenant quota override removed");
    }
    quota_record(st, tenant)
}

/// A tenant's usage against its quota; a caller acting in a tenant sees only its own.
pub fn usage(st: &Shared, tenant: &str) -> EngineResult<strata_api::TenantUsage> {
    checked_tenant(tenant)?;
    if let Some(own) = crate::tenancy::scope().filter(|own| own != tenant) {
        return Err(EngineError::new(
            strata_api::ErrorCode::Forbidden,
            format!("a caller acting in tenant {own:?} sees only its own usage"),
        ));
    }
    st.admission.usage(&st.db, tenant)
}
