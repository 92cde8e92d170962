//! The warm pool's book: which sources the daemon keeps sandboxes booted for
//! (`strata daemon --warm-pool SOURCE=N`), the booted and unassigned members
//! of each, what a member was booted with (its [`Fit`]) and the pool's
//! counters. The refill loop is [`crate::pool`]; adoption by a create is
//! [`crate::lifecycle::adopt`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use strata_api::{Isolation, TmpStorage};

/// One `--warm-pool` entry: keep `size` sandboxes of `source` booted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// An image or template name (re-resolved on every refill: a new image
    /// version or a re-pointed template replaces the members).
    pub source: String,
    /// How many booted, unassigned sandboxes to keep.
    pub size: usize,
}

impl std::str::FromStr for PoolConfig {
    type Err = String;

    /// `SOURCE=N`, N from 1 to [`MAX_POOL_SIZE`].
    fn from_str(s: &str) -> Result<Self, String> {
        let (source, n) = s
            .rsplit_once('=')
            .ok_or_else(|| format!("--warm-pool {s:?}: expected IMAGE_OR_TEMPLATE=N, e.g. python=4"))?;
        let size: usize = n.trim().parse().map_err(|_| format!("--warm-pool {s:?}: {n:?} is not a count"))?;
        if size == 0 || size > MAX_POOL_SIZE {
            return Err(format!("--warm-pool {s:?}: the size must be 1 to {MAX_POOL_SIZE}"));
        }
        let source = source.trim();
        if source.is_empty() {
            return Err(format!("--warm-pool {s:?}: no image or template named"));
        }
        Ok(PoolConfig { source: source.to_string(), size })
    }
}

/// The largest pool of one source.
pub const MAX_POOL_SIZE: usize = 256;

/// Everything a sandbox was booted with that a create cannot change
/// afterwards: a create adopts a member only when its own request comes to
/// the same. (What the adoption applies — name, hostname, environment,
/// labels, policy, TTL, CPU and process limits, tenant — is not in it.)
#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    /// The isolation tier.
    pub tier: Isolation,
    /// The layer chain, bottom first.
    pub layers: Vec<String>,
    /// The checkpoint it starts from (a template's), if any.
    pub checkpoint: Option<String>,
    /// Whether it was started with the checkpoint's processes.
    pub warm: bool,
    /// Whether it runs in a user namespace of its own.
    pub userns: bool,
    /// Where its /tmp lives.
    pub tmp: TmpStorage,
    /// Its memory limit (which also sized /tmp on tmpfs).
    pub memory_bytes: Option<u64>,
    /// Its disk's size (the writable layer's filesystem), when it has one.
    pub disk_bytes: Option<u64>,
}

/// A booted, unassigned sandbox.
#[derive(Debug, Clone)]
pub struct Member {
    /// Its sandbox id (which becomes the adopted sandbox's).
    pub id: String,
    /// The pool's source as configured.
    pub source: String,
    /// What it was booted with.
    pub fit: Fit,
    /// When it was ready.
    pub ready_at: Instant,
}

/// Counters of one pool.
#[derive(Debug, Clone, Default)]
pub struct PoolCounters {
    /// Creates that adopted a member.
    pub adopted: u64,
    /// Creates of this source that found no member (the pool was empty).
    pub empty: u64,
    /// Creates of this source whose request no member fits (with the last reason).
    pub unfit: u64,
    /// Why the last unfit create did not fit.
    pub last_unfit: Option<String>,
    /// Members booted.
    pub booted: u64,
    /// Members destroyed unadopted (source changed or gone, init ended, daemon restart).
    pub drained: u64,
    /// The last refill error, if the last refill failed.
    pub last_error: Option<String>,
}

/// The warm pools of one daemon.
#[derive(Default)]
pub struct Pools {
    configs: Vec<PoolConfig>,
    inner: Mutex<Book>,
    /// Wakes the refill loop (an adoption, a drain, a source change).
    pub wake: tokio::sync::Notify,
    closed: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Book {
    members: Vec<Member>,
    /// When a create last took a member.
    last_take: Option<Instant>,
    counters: HashMap<String, PoolCounters>,
    /// The fit each source resolved to at its last refill.
    fits: HashMap<String, Fit>,
}

impl Pools {
    /// Pools for `configs` (a source named twice keeps its last size).
    pub fn new(configs: Vec<PoolConfig>) -> Self {
        let mut merged: Vec<PoolConfig> = Vec::new();
        for c in configs {
            match merged.iter_mut().find(|m| m.source == c.source) {
                Some(m) => m.size = c.size,
                None => merged.push(c),
            }
        }
        Pools { configs: merged, ..Default::default() }
    }

    /// Stops refills for good (the daemon is shutting down).
    pub fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether [`Pools::close`] was called.
    pub fn closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The configured pools.
    pub fn configs(&self) -> &[PoolConfig] {
        &self.configs
    }

    /// Whether any pool is configured.
    pub fn enabled(&self) -> bool {
        !self.configs.is_empty()
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When a create last took a member.
    pub fn last_take(&self) -> Option<Instant> {
        self.book().last_take
    }

    /// Takes a member booted with exactly `fit` (the oldest first), if any.
    pub fn take(&self, fit: &Fit) -> Option<Member> {
        let mut b = self.book();
        let i = b.members.iter().position(|m| &m.fit == fit)?;
        b.last_take = Some(Instant::now());
        Some(b.members.remove(i))
    }

    /// The pool source (as configured) whose current fit shares `fit`'s
    /// source chain: a create of that source that no member fits is counted there.
    pub fn source_of(&self, fit: &Fit) -> Option<String> {
        let b = self.book();
        b.fits.iter().find(|(_, f)| f.layers == fit.layers && f.checkpoint == fit.checkpoint).map(|(s, _)| s.clone())
    }

    /// The current fit of `source`'s members (as of its last refill).
    pub fn fit_of(&self, source: &str) -> Option<Fit> {
        self.book().fits.get(source).cloned()
    }

    /// Records `source`'s fit as resolved now.
    pub fn set_fit(&self, source: &str, fit: Option<Fit>) {
        let mut b = self.book();
        match fit {
            Some(f) => b.fits.insert(source.to_string(), f),
            None => b.fits.remove(source),
        };
    }

    /// Adds a booted member.
    pub fn put(&self, m: Member) {
        let mut b = self.book();
        b.counters.entry(m.source.clone()).or_default().booted += 1;
        b.members.push(m);
    }

    /// Removes and returns the members of `source` for which `stale` holds.
    pub fn remove_where(&self, stale: impl Fn(&Member) -> bool) -> Vec<Member> {
        let mut b = self.book();
        let (gone, kept): (Vec<Member>, Vec<Member>) = std::mem::take(&mut b.members).into_iter().partition(stale);
        b.members = kept;
        gone
    }

    /// How many members `source` has.
    pub fn count(&self, source: &str) -> usize {
        self.book().members.iter().filter(|m| m.source == source).count()
    }

    /// The member ids of `source`.
    pub fn member_ids(&self, source: &str) -> Vec<String> {
        self.book().members.iter().filter(|m| m.source == source).map(|m| m.id.clone()).collect()
    }

    /// Changes `source`'s counters with `f`.
    pub fn count_with(&self, source: &str, f: impl FnOnce(&mut PoolCounters)) {
        f(self.book().counters.entry(source.to_string()).or_default());
    }

    /// `source`'s counters.
    pub fn counters(&self, source: &str) -> PoolCounters {
        self.book().counters.get(source).cloned().unwrap_or_default()
    }
}

tokio::task_local! {
    static BACKGROUND: bool;
}

/// Runs `fut` as background work: a boot inside it runs at a lower CPU
/// priority ([`in_background`]), so a refill gives way to the requests it
/// exists to serve.
pub async fn as_background<F: std::future::Future>(fut: F) -> F::Output {
    BACKGROUND.scope(true, fut).await
}

/// Whether the current task is background work ([`as_background`]).
pub fn in_background() -> bool {
    BACKGROUND.try_with(|b| *b).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fit(layers: &[&str]) -> Fit {
        Fit {
            tier: Isolation::Namespace,
            layers: layers.iter().map(|s| s.to_string()).collect(),
            checkpoint: None,
            warm: false,
            userns: true,
            tmp: TmpStorage::Disk,
            memory_bytes: Some(1 << 30),
            disk_bytes: None,
        }
    }

    #[test]
    fn parses_pool_configs_and_refuses_bad_ones() {
        assert_eq!("python=4".parse::<PoolConfig>().unwrap(), PoolConfig { source: "python".into(), size: 4 });
        assert_eq!("a=b=2".parse::<PoolConfig>().unwrap().source, "a=b");
        for bad in ["python", "python=0", "python=x", "=3", "python=100000"] {
            let e = bad.parse::<PoolConfig>().unwrap_err();
            assert!(e.contains("--warm-pool"), "{bad}: {e}");
        }
    }

    #[test]
    fn takes_only_a_member_of_the_same_fit_oldest_first() {
        let pools = Pools::new(vec![PoolConfig { source: "a".into(), size: 2 }]);
        let now = Instant::now();
        for id in ["m1", "m2"] {
            pools.put(Member { id: id.into(), source: "a".into(), fit: fit(&["l1"]), ready_at: now });
        }
        assert!(pools.take(&fit(&["l2"])).is_none());
        let mut other_tmp = fit(&["l1"]);
        other_tmp.tmp = TmpStorage::Tmpfs;
        assert!(pools.take(&other_tmp).is_none());
        assert_eq!(pools.take(&fit(&["l1"])).unwrap().id, "m1");
        assert_eq!(pools.count("a"), 1);
        assert_eq!(pools.counters("a").booted, 2);
        let gone = pools.remove_where(|m| m.source == "a");
        assert_eq!(gone.len(), 1);
        assert!(pools.take(&fit(&["l1"])).is_none());
    }

    #[test]
    fn a_source_named_twice_keeps_its_last_size() {
        let pools = Pools::new(vec![
            PoolConfig { source: "a".into(), size: 2 },
            PoolConfig { source: "b".into(), size: 1 },
            PoolConfig { source: "a".into(), size: 5 },
        ]);
        assert_eq!(pools.configs().len(), 2);
        assert_eq!(pools.configs()[0].size, 5);
    }
}
