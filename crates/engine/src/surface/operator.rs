//! What only the operator may do: tokens, quota overrides, importing and
//! removing images, collecting garbage, the host's capabilities and metrics,
//! verifying the audit chain, deciding approvals. Each method refuses a
//! tenant itself ([`Engine::operator_only`]), whatever the front end checked.
//! A tenant's own usage and audit entries are here too (open to it).

use strata_api::{
    Approval, AuditEntry, AuditVerification, CreateTokenRequest, CreatedToken, DoctorReport, GcReport, ImportEvent,
    ImportImageRequest, ImportReport, PullImageRequest, QuotaOverride, TenantQuota, TenantUsage, TokenInfo, TokenQuery,
};
use tokio::sync::mpsc::Sender;

use super::Engine;
use crate::error::{EngineError, EngineResult};
use crate::{approvals, audit_log, images, quotas, tenancy};

impl Engine {
    // ---- tokens ----

    /// Creates an API token; the secret is in the answer only.
    pub async fn create_token(&self, req: CreateTokenRequest) -> EngineResult<CreatedToken> {
        self.operator_only("creating API tokens")?;
        self.run(async { tenancy::create_token(&self.st, req) }).await
    }

    /// API tokens (never their secrets).
    pub async fn list_tokens(&self, q: &TokenQuery) -> EngineResult<Vec<TokenInfo>> {
        self.operator_only("listing API tokens")?;
        self.run(async { tenancy::list_tokens(&self.st, q) }).await
    }

    /// Revokes a token by id or name.
    pub async fn revoke_token(&self, key: &str, q: &TokenQuery) -> EngineResult<TokenInfo> {
        self.operator_only("revoking API tokens")?;
        self.run(async { tenancy::revoke_token(&self.st, key, q) }).await
    }

    // ---- quotas ----

    /// A tenant's quota: the daemon's defaults, the override, what is in force.
    pub async fn quota(&self, tenant: &str) -> EngineResult<TenantQuota> {
        self.operator_only("tenant quotas")?;
        quotas::checked_tenant(tenant)?;
        quotas::quota_record(&self.st, tenant)
    }

    /// Sets (replaces) a tenant's quota override.
    pub async fn set_quota(&self, tenant: &str, o: &QuotaOverride) -> EngineResult<TenantQuota> {
        self.operator_only("tenant quotas")?;
        quotas::set_override(&self.st, tenant, o)
    }

    /// Removes a tenant's quota override.
    pub async fn remove_quota(&self, tenant: &str) -> EngineResult<TenantQuota> {
        self.operator_only("tenant quotas")?;
        quotas::remove_override(&self.st, tenant)
    }

    /// A tenant's usage against its quota (a tenant sees only its own).
    pub async fn usage(&self, tenant: &str) -> EngineResult<TenantUsage> {
        self.run(async { quotas::usage(&self.st, tenant) }).await
    }

    // ---- images ----

    /// Imports an image from a path on the daemon's host (`progress` gets its events).
    pub async fn import_image(
        &self,
        req: ImportImageRequest,
        progress: Option<Sender<ImportEvent>>,
    ) -> EngineResult<ImportReport> {
        self.operator_only("importing images")?;
        self.run(images::import(&self.st, req, progress)).await
    }

    /// Pulls an image from a registry (`progress` gets its events).
    pub async fn pull_image(
        &self,
        req: PullImageRequest,
        progress: Option<Sender<ImportEvent>>,
    ) -> EngineResult<ImportReport> {
        self.operator_only("pulling images")?;
        self.run(images::pull(&self.st, req, progress)).await
    }

    /// Removes an image (its layers go when nothing else uses them).
    pub async fn remove_image(&self, name: &str) -> EngineResult<()> {
        self.operator_only("removing images")?;
        self.run(images::remove(&self.st, name)).await
    }

    // ---- the host ----

    /// Deletes expired checkpoints nobody needs and unreferenced layers (every tenant's).
    pub async fn gc(&self) -> EngineResult<GcReport> {
        self.operator_only("garbage collection")?;
        self.run(crate::checkpoints::gc(&self.st)).await
    }

    /// What this host supports.
    pub async fn doctor(&self) -> EngineResult<DoctorReport> {
        self.operator_only("the host's capabilities")?;
        crate::events::doctor(&self.st).await
    }

    /// The warm pools (`--warm-pool`): how full each is and what became of its members.
    pub async fn warm_pools(&self) -> EngineResult<Vec<strata_api::WarmPoolStatus>> {
        self.operator_only("the warm pools")?;
        Ok(crate::pool::status(&self.st))
    }

    /// Prometheus metrics (OpenMetrics text; series of every sandbox).
    pub async fn metrics(&self) -> EngineResult<String> {
        self.operator_only("metrics")?;
        let st = self.st.clone();
        tokio::task::spawn_blocking(move || st.metrics.render(&st.db, &|sb| st.runtime_of(sb).usage(&sb.id)))
            .await
            .map_err(|e| EngineError::internal("metrics", &e))
    }

    // ---- audit and approvals ----

    /// The last `limit` audit entries the caller sees.
    pub async fn audit_entries(&self, limit: Option<u32>) -> EngineResult<Vec<AuditEntry>> {
        self.run(async { audit_log::list(&self.st, limit) }).await
    }

    /// Recomputes the audit log's hash chain (every entry).
    pub async fn verify_audit(&self) -> EngineResult<AuditVerification> {
        self.operator_only("verifying the audit log")?;
        audit_log::verify(&self.st)
    }

    /// Approves or denies a pending approval: a human decides, never the agent that asked.
    pub async fn decide_approval(&self, id: &str, approve: bool, reason: Option<String>) -> EngineResult<Approval> {
        self.operator_only("deciding approvals")?;
        self.run(async { approvals::decide(&self.st, id, approve, reason) }).await
    }
}
