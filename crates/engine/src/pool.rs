//! The warm pool (`strata daemon --warm-pool SOURCE=N`): keeps N sandboxes of
//! each source booted and unassigned, so a create of that source adopts one
//! ([`crate::lifecycle::adopt`]) instead of booting. The refill runs in the
//! background, one boot at a time, at a lower CPU priority; each round
//! resolves the source again, so a new image version or a re-pointed template
//! replaces the members and a deleted source drains its pool. Members are
//! sandboxes of the pool's own tenant ([`strata_store::db::POOL_TENANT`]),
//! which no caller sees; a daemon restart destroys the ones left and boots
//! new ones.

use std::time::{Duration, Instant};

use strata_api::{CreateSandboxRequest, WarmPoolStatus};
use strata_store::db::POOL_TENANT;
use tracing::{info, warn};

use crate::error::{EngineError, EngineResult};
use crate::lifecycle::adopt::discard;
use crate::state::pool::{Fit, Member, PoolConfig};
use crate::state::Shared;

/// How often a pool is looked at without being woken (members that died,
/// a source that changed without a wake-up).
const RECHECK: Duration = Duration::from_secs(10);

/// How long a source whose boot failed waits before the next try.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// A refill starts once no create has taken a member for this long: the
/// adopter's first commands (and the rest of a burst of creates) do not share
/// the host with a boot. Measured on a 2-CPU host: a boot running beside the
/// first exec after an adoption made that exec 1.7x slower, at nice 10 too
/// (mounts and namespace setup contend in the kernel, not for CPU time).
const QUIET: Duration = Duration::from_millis(100);

/// The longest a refill waits for [`QUIET`] during a long run of creates.
const QUIET_AT_MOST: Duration = Duration::from_secs(2);

/// Runs the refill loop forever (spawned by [`crate::open`] when a pool is configured).
pub async fn run(st: Shared) {
    let mut failed_at: std::collections::HashMap<String, Instant> = Default::default();
    loop {
        for cfg in st.pools.configs().to_vec() {
            if failed_at.get(&cfg.source).is_some_and(|t| t.elapsed() < RETRY_AFTER) {
                continue;
            }
            match refill(&st, &cfg).await {
                Ok(()) => {
                    failed_at.remove(&cfg.source);
                    st.pools.count_with(&cfg.source, |c| c.last_error = None);
                }
                Err(e) => {
                    warn!(source = %cfg.source, error = %e.body.message, "warm pool refill");
                    failed_at.insert(cfg.source.clone(), Instant::now());
                    st.pools.count_with(&cfg.source, |c| c.last_error = Some(e.body.message.clone()));
                }
            }
        }
        let wait = if failed_at.is_empty() { RECHECK } else { RETRY_AFTER };
        tokio::select! {
            // Something changed (an adoption, an import, a template): failed sources try again now.
            _ = st.pools.wake.notified() => failed_at.clear(),
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Waits until no create took a member for [`QUIET`] (at most [`QUIET_AT_MOST`]).
async fn quiet(st: &Shared) {
    let waited = Instant::now();
    while let Some(t) = st.pools.last_take().filter(|t| t.elapsed() < QUIET) {
        if waited.elapsed() >= QUIET_AT_MOST {
            break;
        }
        tokio::time::sleep(QUIET.saturating_sub(t.elapsed())).await;
    }
}

/// Destroys every warm-pool sandbox on record: at start, those an earlier
/// daemon left (they are booted again, fresh); at shutdown, this daemon's.
pub async fn sweep_leftovers(st: &Shared) {
    let leftovers = match st.db.pooled_sandboxes() {
        Ok(l) => l,
        Err(e) => {
            warn!(error = %crate::error::chain(&e), "listing warm-pool leftovers");
            return;
        }
    };
    for rec in leftovers {
        retire(st, &rec.sandbox.id, &rec.sandbox.source, "pool_daemon_restart").await;
    }
}

/// Takes member `id` out of the book (if it is there) and destroys it as the pool.
async fn retire(st: &Shared, id: &str, source: &str, reason: &str) {
    st.pools.remove_where(|m| m.id == id);
    as_pool(discard(st, id, source, reason)).await;
}

/// Runs `fut` as the pool's own work: in the pool's tenant (so it sees its members), without quotas.
async fn as_pool<F: std::future::Future>(fut: F) -> F::Output {
    crate::tenancy::run_in_tenant(POOL_TENANT, crate::admission::exempt_from_quotas(fut)).await
}

/// Brings one pool to its size: drains members of a source that changed or
/// went away, and those whose init ended; boots the missing ones, one at a time.
async fn refill(st: &Shared, cfg: &PoolConfig) -> EngineResult<()> {
    // Resolved as the daemon: a template of any tenant can be pooled (a create
    // adopts only when its own resolution, as its caller, comes to the same chain).
    let resolved = crate::caller::sync_as_daemon(|| crate::lifecycle::resolve_source(st, &cfg.source));
    let current = st.pools.fit_of(&cfg.source);
    let stale = match (&resolved, &current) {
        (Err(_), _) => true,
        (Ok(src), Some(f)) => src.layers != f.layers || src.checkpoint != f.checkpoint,
        (Ok(_), None) => false,
    };
    if stale {
        drain(st, &cfg.source, "pool_source_changed").await;
        st.pools.set_fit(&cfg.source, None);
    }
    // A source that went away (or was quarantined) leaves the pool empty, saying why.
    let src = resolved?;
    // Members whose init ended (or that someone destroyed) leave the book.
    for id in st.pools.member_ids(&cfg.source) {
        let live = st.db.sandbox_by_id(&id)?.is_some_and(|r| {
            r.sandbox.state == strata_api::SandboxState::Running
                && crate::record::handle_of(&r).is_some_and(|h| st.runtime_of(&r.sandbox).is_alive(&h))
        });
        if !live {
            retire(st, &id, &cfg.source, "pool_member_died").await;
        }
    }
    while st.pools.count(&cfg.source) < cfg.size && !st.pools.closed() {
        quiet(st).await;
        let started = Instant::now();
        let req = CreateSandboxRequest { source: cfg.source.clone(), ..Default::default() };
        let lineage = crate::lifecycle::Lineage { pooled: true, ..Default::default() };
        let sb = as_pool(crate::state::pool::as_background(crate::lifecycle::create_inner(st, req, lineage))).await?;
        let rec = st.db.sandbox_by_id(&sb.id)?.ok_or_else(|| EngineError::sandbox_not_found(&sb.id))?;
        let fit = Fit {
            tier: crate::state::tiers::tier_of(&rec.sandbox),
            layers: rec.layers.clone(),
            checkpoint: rec.sandbox.base_checkpoint.clone(),
            warm: src.warm,
            userns: rec.sandbox.userns.is_some(),
            tmp: rec.sandbox.tmp,
            memory_bytes: rec.sandbox.limits.memory_bytes,
            disk_bytes: rec.sandbox.limits.disk_bytes,
        };
        if st.pools.closed() {
            // Booted while the daemon began to shut down: nothing will adopt it.
            as_pool(discard(st, &sb.id, &cfg.source, "pool_daemon_shutdown")).await;
            break;
        }
        st.pools.set_fit(&cfg.source, Some(fit.clone()));
        st.pools.put(Member { id: sb.id.clone(), source: cfg.source.clone(), fit, ready_at: Instant::now() });
        info!(sandbox = %sb.id, source = %cfg.source, ms = started.elapsed().as_millis() as u64, "warm pool: booted a member");
    }
    Ok(())
}

/// Destroys every member of `source` (its source changed or went away).
async fn drain(st: &Shared, source: &str, reason: &str) {
    for m in st.pools.remove_where(|m| m.source == source) {
        as_pool(discard(st, &m.id, source, reason)).await;
    }
}

/// Destroys the members whose sandbox `uses` holds for (e.g. of an image about
/// to be removed), and wakes the refill so the pool follows what is left.
pub async fn drain_users(st: &Shared, uses: impl Fn(&strata_store::db::SandboxRecord) -> bool) {
    let Ok(members) = st.db.pooled_sandboxes() else { return };
    for rec in members.into_iter().filter(|r| uses(r)) {
        retire(st, &rec.sandbox.id, &rec.sandbox.source, "pool_source_removed").await;
    }
    st.pools.wake.notify_one();
}

/// The pools as configured, with their members and counters (`GET /v1/warm-pool`).
pub fn status(st: &Shared) -> Vec<WarmPoolStatus> {
    st.pools
        .configs()
        .iter()
        .map(|cfg| {
            let c = st.pools.counters(&cfg.source);
            let fit = st.pools.fit_of(&cfg.source);
            WarmPoolStatus {
                source: cfg.source.clone(),
                size: cfg.size as u64,
                ready: st.pools.count(&cfg.source) as u64,
                isolation: fit.as_ref().map(|f| f.tier),
                image_layers: fit.as_ref().map(|f| f.layers.len() as u64),
                checkpoint: fit.and_then(|f| f.checkpoint),
                adopted: c.adopted,
                missed_empty: c.empty,
                missed_unfit: c.unfit,
                last_unfit: c.last_unfit,
                booted: c.booted,
                drained: c.drained,
                last_error: c.last_error,
            }
        })
        .collect()
}
