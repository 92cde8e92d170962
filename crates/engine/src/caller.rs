//! Who is calling: the [`Caller`] of a request (or the daemon itself,
//! [`Caller::daemon`]) and the tenant it acts in, carried by the task that
//! serves it ([`run_as`], [`as_daemon`]; spawned work keeps it with
//! [`spawn`]). Visibility fails closed: a task with no caller sees nothing
//! ([`visible`] is false, [`scope`] matches no tenant) and the check is
//! logged as a bug. The lowest layer of tenancy: it reads no state; the
//! resolvers and tokens are [`crate::tenancy`]'s.

use std::future::Future;

use strata_api::DEFAULT_TENANT;

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The Unix-socket caller or the holder of `<state>/api-token`: every tenant, token management.
    Operator {
        /// As the audit log names it (`uid:0`, `token:<fingerprint>`).
        actor: String,
    },
    /// The holder of a tenant token: its tenant only.
    Tenant {
        /// The token's tenant.
        tenant: String,
        /// Token id.
        token_id: String,
        /// Token name.
        token_name: String,
    },
}

/// An authenticated caller and the tenant it acts in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Who.
    pub principal: Principal,
    /// For the operator: the tenant named with `X-Strata-Tenant`, if any.
    pub acting_as: Option<String>,
    /// The approval the request cites (`X-Strata-Approval`), for the Rule of Two.
    pub approval: Option<String>,
}

impl Caller {
    /// The operator, acting in no particular tenant.
    pub fn operator(actor: impl Into<String>) -> Self {
        Caller { principal: Principal::Operator { actor: actor.into() }, acting_as: None, approval: None }
    }

    /// The daemon's own work (reconciliation at start, the policy loop, reapers,
    /// init watchers): the operator, in every tenant. Background work runs as
    /// this explicitly ([`as_daemon`]); work with no caller sees nothing.
    pub fn daemon() -> Self {
        Caller::operator("daemon")
    }

    /// The only tenant this caller sees; `None` means every tenant.
    pub fn scope(&self) -> Option<&str> {
        match &self.principal {
            Principal::Tenant { tenant, .. } => Some(tenant),
            Principal::Operator { .. } => self.acting_as.as_deref(),
        }
    }

    /// Whether the caller may see an object of `tenant`. The warm pool's
    /// unadopted sandboxes ([`strata_store::db::POOL_TENANT`]) are seen only
    /// by the pool's own work, which acts in that tenant.
    pub fn sees(&self, tenant: &str) -> bool {
        match self.scope() {
            None => tenant != strata_store::db::POOL_TENANT,
            Some(t) => t == tenant,
        }
    }

    /// Whether the caller is the operator (token management, host-wide routes).
    pub fn is_operator(&self) -> bool {
        matches!(self.principal, Principal::Operator { .. })
    }

    /// The tenant new root objects (sandboxes from images, pipeline runs) go to.
    pub fn creating_tenant(&self) -> String {
        self.scope().unwrap_or(DEFAULT_TENANT).to_string()
    }

    /// The audit log's name for the caller.
    pub fn actor(&self) -> String {
        match &self.principal {
            Principal::Operator { actor } => actor.clone(),
            Principal::Tenant { token_id, token_name, .. } => format!("token:{token_id}:{token_name}"),
        }
    }
}

tokio::task_local! {
    static CALLER: Caller;
}

/// The scope of a task with no caller: a tenant no object has (tenant names
/// are never empty), so every lookup and listing filtered by it finds nothing.
pub(crate) const NO_TENANT: &str = "";

/// A tenancy check made by a task that has no caller. That is a bug (request
/// work runs as its caller, background work as [`Caller::daemon`]), so it is
/// logged loudly; the check answers "nothing" (fail closed).
pub(crate) fn no_caller(check: &'static str) {
    tracing::error!(check, "tenancy check outside any caller: refused (background work must run as Caller::daemon)");
}

/// The caller of the request this task serves ([`Caller::daemon`] in the
/// daemon's own background work); `None` when the task has none.
pub fn current() -> Option<Caller> {
    CALLER.try_with(Caller::clone).ok()
}

/// Whether the current caller may see an object of `tenant`; `false` without a caller.
pub fn visible(tenant: &str) -> bool {
    CALLER.try_with(|c| c.sees(tenant)).unwrap_or_else(|_| {
        no_caller("visible");
        false
    })
}

/// The only tenant the current caller sees (`None`: every tenant, the operator
/// or the daemon). Without a caller, a tenant that owns nothing.
pub fn scope() -> Option<String> {
    CALLER.try_with(|c| c.scope().map(str::to_string)).unwrap_or_else(|_| {
        no_caller("scope");
        Some(NO_TENANT.to_string())
    })
}

/// The tenant new root objects of the current caller go to (`default` for
/// the daemon's own work; a task with no caller gets `default` too, logged).
pub fn creating_tenant() -> String {
    CALLER.try_with(Caller::creating_tenant).unwrap_or_else(|_| {
        no_caller("creating_tenant");
        DEFAULT_TENANT.to_string()
    })
}

/// Whether the current caller may make the daemon read paths on its host
/// (secret `host_file`, template build `COPY` context): the operator and the
/// daemon's own work, never a tenant token, never a task with no caller.
pub fn may_read_host_paths() -> bool {
    CALLER.try_with(Caller::is_operator).unwrap_or_else(|_| {
        no_caller("may_read_host_paths");
        false
    })
}

/// Runs `fut` as the daemon itself ([`Caller::daemon`]): every background loop,
/// reconciliation, watcher and automatic transition starts here.
pub async fn as_daemon<F: Future>(fut: F) -> F::Output {
    CALLER.scope(Caller::daemon(), fut).await
}

/// Runs `f` as the daemon itself, synchronously (a lookup work of another caller makes as the daemon).
pub fn sync_as_daemon<R>(f: impl FnOnce() -> R) -> R {
    CALLER.sync_scope(Caller::daemon(), f)
}

/// Runs `fut` as `caller` (what [`crate::Engine`] does for each call it makes).
pub async fn run_as<F: Future>(caller: Caller, fut: F) -> F::Output {
    CALLER.scope(caller, fut).await
}

/// Runs `fut` as the daemon acting in `tenant` (resumed pipeline runs).
pub async fn run_in_tenant<F: Future>(tenant: &str, fut: F) -> F::Output {
    let caller = Caller {
        principal: Principal::Operator { actor: "daemon".into() },
        acting_as: Some(tenant.to_string()),
        approval: None,
    };
    CALLER.scope(caller, fut).await
}

/// `tokio::spawn` that keeps the current caller: work a request starts in the
/// background sees and creates what the request would. Spawned from a task with
/// no caller, the work has none either (and sees nothing).
pub fn spawn<F>(fut: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match current() {
        Some(c) => tokio::spawn(CALLER.scope(c, fut)),
        None => tokio::spawn(fut),
    }
}
