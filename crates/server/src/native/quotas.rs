//! HTTP handlers of `quotas` (see [`strata_engine::quotas`]).

use crate::error::ApiResult;
use axum::extract::Path;
use axum::Json;
use strata_api::{QuotaOverride, TenantQuota, TenantUsage};

use crate::native::acting::Acting;

/// A tenant's quota: the daemon's defaults, the operator's override, and what is in force.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/quota", tag = "tenants", params(("tenant" = String, Path, description = "Tenant name")),
    responses((status = 200, body = TenantQuota), (status = 400, body = strata_api::ApiErrorBody), (status = 403, body = strata_api::ApiErrorBody)))]
pub async fn get_quota_handler(Acting(engine): Acting, Path(tenant): Path<String>) -> ApiResult<Json<TenantQuota>> {
    Ok(Json(engine.quota(&tenant).await?))
}

/// Sets (replaces) a tenant's quota override; fields left out take the daemon's
/// default, `"unlimited"` lifts a limit. Effective for the next request.
#[utoipa::path(put, path = "/v1/tenants/{tenant}/quota", tag = "tenants", params(("tenant" = String, Path, description = "Tenant name")), request_body = QuotaOverride,
    responses((status = 200, body = TenantQuota), (status = 400, body = strata_api::ApiErrorBody), (status = 403, body = strata_api::ApiErrorBody)))]
pub async fn put_quota_handler(
    Acting(engine): Acting,
    Path(tenant): Path<String>,
    Json(o): Json<QuotaOverride>,
) -> ApiResult<Json<TenantQuota>> {
    Ok(Json(engine.set_quota(&tenant, &o).await?))
}

/// Removes a tenant's quota override: the daemon's defaults hold again.
#[utoipa::path(delete, path = "/v1/tenants/{tenant}/quota", tag = "tenants", params(("tenant" = String, Path, description = "Tenant name")),
    responses((status = 200, body = TenantQuota), (status = 400, body = strata_api::ApiErrorBody), (status = 403, body = strata_api::ApiErrorBody)))]
pub async fn delete_quota_handler(Acting(engine): Acting, Path(tenant): Path<String>) -> ApiResult<Json<TenantQuota>> {
    Ok(Json(engine.remove_quota(&tenant).await?))
}

/// A tenant's usage against its quota: live sandboxes, memory limits of its
/// sandboxes holding memory, nominal disk sizes, fork children in the last
/// minute. A tenant token (or the operator acting as a tenant) sees only its own.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/usage", tag = "tenants", params(("tenant" = String, Path, description = "Tenant name")),
    responses((status = 200, body = TenantUsage), (status = 400, body = strata_api::ApiErrorBody), (status = 403, body = strata_api::ApiErrorBody)))]
pub async fn usage_handler(Acting(engine): Acting, Path(tenant): Path<String>) -> ApiResult<Json<TenantUsage>> {
    Ok(Json(engine.usage(&tenant).await?))
}
