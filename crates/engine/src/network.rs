//! Per-sandbox networks (docs/network.md): validation of `network` specs,
//! their durable store (`<state>/network/<id>.json`), the host plumbing of
//! egress sandboxes (netns + veth + nftables chains, from strata-net), the
//! filtering DNS resolver, counters and rate-limited logging of denied flows.
//!
//! Lifecycle hooks: [`register`] at create, [`prepare`] before init starts or
//! is restored (it creates whatever plumbing is missing, so start after stop,
//! resume after a reboot and forks all get theirs), [`release`] when the
//! processes are gone for good (stop, loss) and [`forget`] at destroy. Standby
//! keeps the plumbing, so the restored processes find the same address and
//! their TCP connections survive.

use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path as FsPath;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_api::{ErrorCode, FlowCounter, NetworkInfo, NetworkMode, NetworkSpec, SandboxState};
use strata_net::nft::{self, SandboxNet, TableConfig};
use strata_net::{dns, link, Rule};
use strata_runtime::SandboxSpec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::{debug, info, warn};

use crate::error::{EngineError, EngineResult};
use crate::record::handle_of;
use crate::state::Shared;

pub use crate::state::network::*;

/// Interface name prefix of host-side veths.
pub const IF_PREFIX: &str = "sx";
/// Most often a sandbox's denied flows are logged.
pub const DENY_LOG_EVERY: Duration = Duration::from_secs(10);

fn ifname(id: &str) -> String {
    format!("{IF_PREFIX}{}", &id[..id.len().min(13)])
}

/// Checks a `network` spec; returns it normalized with its parsed rules.
pub fn validate(spec: &NetworkSpec) -> Result<(NetworkSpec, Vec<Rule>), NetworkError> {
    let rules =
        strata_net::rules::parse_spec(&spec.allow, &spec.deny).map_err(|e| NetworkError::Invalid(e.to_string()))?;
    if spec.mode == NetworkMode::None && !rules.is_empty() {
        let list: Vec<String> = spec.allow.iter().chain(&spec.deny).map(|r| format!("{r:?}")).collect();
        return Err(NetworkError::Invalid(format!(
            "network rules [{}]: allow and deny rules need network mode \"egress\" (mode is \"none\")",
            list.join(", ")
        )));
    }
    let of = |deny: bool| rules.iter().filter(|r| r.deny == deny).map(|r| r.to_string()).collect();
    Ok((NetworkSpec { mode: spec.mode, allow: of(false), deny: of(true) }, rules))
}

/// Checks a create request's network before anything is recorded.
pub fn check(st: &Shared, spec: Option<&NetworkSpec>) -> EngineResult<Option<(NetworkSpec, Vec<Rule>)>> {
    let Some(spec) = spec else { return Ok(None) };
    let (spec, rules) = validate(spec)?;
    if spec.mode == NetworkMode::Egress {
        st.network.pool()?;
        if let Some(why) = strata_net::unsupported() {
            return Err(NetworkError::Unavailable(why).into());
        }
    }
    Ok(Some((spec, rules)))
}

/// Records a new sandbox's network (from [`check`]).
pub fn register(st: &Shared, id: &str, checked: Option<(NetworkSpec, Vec<Rule>)>) -> EngineResult<()> {
    if let Some((spec, rules)) = checked {
        st.network.put(id, spec, rules)?;
    }
    Ok(())
}

/// Starts the table and the resolver on first use (and sweeps leftovers of a
/// previous run of this daemon).
async fn ensure_base(st: &Shared) -> Result<&Base, NetworkError> {
    let r = st
        .network
        .base
        .get_or_init(|| async {
            let pool = match st.network.pool() {
                Ok(p) => p,
                Err(e) => return Err(e.to_string()),
            };
            let table = TableConfig::table_name(&pool);
            let port = match start_resolver(st.clone()).await {
                Ok(p) => p,
                Err(e) => return Err(format!("starting the DNS filter: {e}")),
            };
            let cfg = TableConfig { table: table.clone(), pool, resolver_port: port };
            let script = nft::base_script(&cfg);
            let res = tokio::task::spawn_blocking(move || {
                link::enable_forwarding()?;
                strata_net::nft_apply(&script)
            })
            .await;
            match res {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(crate::error::chain(&e)),
                Err(e) => return Err(e.to_string()),
            }
            info!(table = %table, resolver_port = port, pool = %pool.cidr, "egress networking ready");
            tokio::spawn(watch_denials(st.clone(), table.clone()));
            Ok(Base { table })
        })
        .await;
    match r {
        Ok(b) => Ok(b),
        Err(e) => Err(NetworkError::Unavailable(e.clone())),
    }
}

/// Creates whatever egress plumbing of sandbox `id` is missing and points
/// `spec` at it (its network namespace and resolv.conf). Nothing for `none`.
pub async fn prepare(st: &Shared, id: &str, spec: &mut SandboxSpec) -> EngineResult<()> {
    let Some(entry) = st.network.entries().get(id).cloned() else { return Ok(()) };
    let base = ensure_base(st).await?;
    let link =
        st.network.pool()?.link(entry.slot).ok_or_else(|| NetworkError::PoolFull("slot outside the pool".into()))?;
    if spec.userns.is_some() {
        // A sandbox in a user namespace makes its network namespace itself
        // (it could not join one the host owns); the tier plugs the link in.
        // Its rules go in first: they name the interface, so its first
        // packet is filtered. What an earlier run of it left goes.
        rules_before_link(st, id, &base.table, &entry).await?;
        spec.userns_link = Some(strata_runtime::spec::UsernsLink { ifname: ifname(id), link });
    } else {
        attach(st, id, &base.table, &entry, None).await?;
        if st.runtime_by_id(id).name() == strata_api::Isolation::Gvisor.as_str() {
            // gVisor's netstack took the address with it when the sandbox last ran.
            let ns = st.network.netns_path(id);
            tokio::task::spawn_blocking(move || link::readdress(&ns, &link))
                .await
                .map_err(|e| EngineError::internal("network task", &e))?
                .map_err(NetworkError::from)?;
        }
        spec.netns_path = Some(st.network.netns_path(id));
        spec.link = Some(link);
    }
    spec.resolv_conf = Some(format!(
        "# written by strata: DNS goes through strata's filter (see docs/network.md)\nnameserver {}\noptions ndots:1\n",
        link.gateway
    ));
    Ok(())
}

/// For a sandbox in a user namespace, before its init starts or is restored:
/// removes the veth and namespace of its previous run (they died with its
/// processes, or will be replaced) and applies its chains, interface included.
async fn rules_before_link(st: &Shared, id: &str, table: &str, entry: &Entry) -> EngineResult<()> {
    let pool = st.network.pool()?;
    let link = pool.link(entry.slot).ok_or_else(|| NetworkError::PoolFull(pool.cidr.to_string()))?;
    let (ns, ifn, table, rules, id2) =
        (st.network.netns_path(id), ifname(id), table.to_string(), entry.rules.clone(), id.to_string());
    tokio::task::spawn_blocking(move || -> Result<(), NetworkError> {
        link::detach(&ifn);
        link::remove_netns(&ns);
        let sb = SandboxNet { key: &id2, ifname: &ifn, address: link.address, rules: &rules };
        strata_net::nft_apply(&nft::sandbox_script(&table, &pool, &sb, true, &[]))?;
        Ok(())
    })
    .await
    .map_err(|e| EngineError::internal("network task", &e))??;
    Ok(())
}

/// After the init of a sandbox in a user namespace started (or was
/// restored) with the link [`prepare`] gave its spec (`linked`): names its
/// network namespace where the plumbing keeps it, so live rule changes and
/// release find it. Nothing for other sandboxes (theirs was made before).
pub async fn started(st: &Shared, id: &str, linked: bool, pid: i32) -> EngineResult<()> {
    if !linked {
        return Ok(());
    }
    let ns = st.network.netns_path(id);
    tokio::task::spawn_blocking(move || {
        link::remove_netns(&ns);
        link::adopt_netns(pid, &ns)
    })
    .await
    .map_err(|e| EngineError::internal("network task", &e))?
    .map_err(NetworkError::from)?;
    Ok(())
}

/// Makes netns, veth and chains of `id` exist. `live_pid`: the sandbox runs
/// in its own namespace already (a live switch to egress): adopt that one.
async fn attach(st: &Shared, id: &str, table: &str, entry: &Entry, live_pid: Option<i32>) -> EngineResult<()> {
    let pool = st.network.pool()?;
    let link = pool.link(entry.slot).ok_or_else(|| NetworkError::PoolFull(pool.cidr.to_string()))?;
    let (ns, ifn, table, rules, id2) =
        (st.network.netns_path(id), ifname(id), table.to_string(), entry.rules.clone(), id.to_string());
    tokio::task::spawn_blocking(move || -> Result<(), NetworkError> {
        let t = Instant::now();
        if !link::netns_exists(&ns) {
            match live_pid {
                Some(pid) => link::adopt_netns(pid, &ns)?,
                None => link::create_netns(&ns)?,
            }
            link::detach(&ifn); // a stale host end of an older namespace
        }
        if !link::link_exists(&ifn) {
            link::attach(&ns, &ifn, &link)?;
        }
        let sb = SandboxNet { key: &id2, ifname: &ifn, address: link.address, rules: &rules };
        strata_net::nft_apply(&nft::sandbox_script(&table, &pool, &sb, true, &[]))?;
        debug!(sandbox = %id2, ms = t.elapsed().as_millis() as u64, "egress plumbing ready");
        Ok(())
    })
    .await
    .map_err(|e| EngineError::internal("network task", &e))??;
    Ok(())
}

/// Removes a sandbox's plumbing (veth, chains, netns); its entry stays.
pub async fn release(st: &Shared, id: &str) {
    let Some(table) = table_name(st) else { return };
    let (ns, ifn, id2) = (st.network.netns_path(id), ifname(id), id.to_string());
    let has_ns = ns.exists();
    if !has_ns && !link::link_exists(&ifn) && st.network.entries().get(id).is_none() {
        return;
    }
    let _ = tokio::task::spawn_blocking(move || remove_plumbing(&table, &id2, &ifn, &ns)).await;
}

fn remove_plumbing(table: &str, id: &str, ifn: &str, ns: &FsPath) {
    link::detach(ifn);
    let all = nft::parse_objects(&strata_net::nft_json(&["list", "table", "inet", table]));
    let mut mine = nft::sandbox_objects(id, &all);
    if all.veths.iter().any(|v| v == ifn) {
        mine.veths.push(ifn.to_string());
    }
    if !(mine.chains.is_empty() && mine.sets.is_empty() && mine.counters.is_empty() && mine.veths.is_empty()) {
        if let Err(e) = strata_net::nft_apply(&nft::remove_script(table, &mine, None)) {
            warn!(sandbox = id, error = %crate::error::chain(&e), "removing nftables chains");
        }
    }
    link::remove_netns(ns);
}

fn table_name(st: &Shared) -> Option<String> {
    st.network.pool.as_ref().ok().map(TableConfig::table_name)
}

/// Releases the plumbing and drops the entry (destroy).
pub async fn forget(st: &Shared, id: &str) {
    release(st, id).await;
    st.network.delete_entry(id);
    st.network.dns.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
}

/// [`forget`] off the caller's path (destroy): deleting a veth waits for the
/// kernel's RCU grace periods (tens of ms). The slot stays taken until the
/// removal is done, so no new sandbox gets the address of a link still there.
pub fn forget_later(st: &Shared, id: &str) {
    if st.network.entries().get(id).is_none() && !st.network.netns_path(id).exists() {
        return;
    }
    st.network.pending.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let (st, id) = (st.clone(), id.to_string());
    tokio::spawn(async move {
        forget(&st, &id).await;
        st.network.pending.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    });
}

/// Removes plumbing that belongs to no sandbox of this daemon, and re-applies
/// the chains of running egress sandboxes (daemon restart). Called at start.
pub async fn reconcile(st: &Shared) {
    let recs = match st.db.list_sandboxes() {
        Ok(r) => r,
        Err(e) => {
            warn!(error = %e, "network reconcile: listing sandboxes");
            return;
        }
    };
    let known: HashMap<String, SandboxState> = recs.iter().map(|r| (r.sandbox.id.clone(), r.sandbox.state)).collect();
    // Entries of sandboxes that no longer exist.
    let stale: Vec<String> = st.network.entries().keys().filter(|id| !known.contains_key(*id)).cloned().collect();
    for id in &stale {
        st.network.delete_entry(id);
    }
    let keep = |id: &str| {
        matches!(known.get(id), Some(SandboxState::Running | SandboxState::Paused | SandboxState::Standby))
            && st.network.entries().contains_key(id)
    };
    // Namespaces made by this daemon.
    if let Ok(rd) = std::fs::read_dir(&st.network.netns_dir) {
        for e in rd.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            if !keep(&id) {
                info!(sandbox = %id, "removing a leftover network namespace");
                let (ns, ifn) = (e.path(), ifname(&id));
                let table = table_name(st);
                let _ = tokio::task::spawn_blocking(move || match table {
                    Some(t) => remove_plumbing(&t, &id, &ifn, &ns),
                    None => link::remove_netns(&ns),
                })
                .await;
            }
        }
    }
    // (keep() locks the entries itself: collect the ids first.)
    let ids: Vec<String> = st.network.entries().keys().cloned().collect();
    let live: Vec<String> = ids.into_iter().filter(|id| keep(id)).collect();
    let Ok(pool) = st.network.pool() else { return };
    let table = TableConfig::table_name(&pool);
    let table_exists = !strata_net::nft_json(&["list", "table", "inet", &table]).is_empty();
    if live.is_empty() && !table_exists {
        return;
    }
    // Chains and veths of sandboxes that are gone (a crash between stop and cleanup).
    let (table2, live2, pool2) = (table.clone(), live.clone(), pool);
    let _ = tokio::task::spawn_blocking(move || {
        let all = nft::parse_objects(&strata_net::nft_json(&["list", "table", "inet", &table2]));
        for key in all.keys() {
            if !live2.contains(&key) {
                let mine = nft::sandbox_objects(&key, &all);
                let _ = strata_net::nft_apply(&nft::remove_script(&table2, &mine, None));
            }
        }
        let live_ifs: HashSet<String> = live2.iter().map(|i| ifname(i)).collect();
        for v in link::veths_in(IF_PREFIX, &pool2.cidr) {
            if !live_ifs.contains(&v) {
                info!(interface = %v, "removing a leftover sandbox veth");
                link::detach(&v);
            }
        }
    })
    .await;
    if live.is_empty() {
        return;
    }
    let base = match ensure_base(st).await {
        Ok(b) => b,
        Err(e) => {
            warn!(error = %e, "egress networking unavailable at start");
            return;
        }
    };
    for id in live {
        let Some(entry) = st.network.entries().get(&id).cloned() else { continue };
        let running = known.get(&id).is_some_and(|s| *s != SandboxState::Standby);
        if running && !link::netns_exists(&st.network.netns_path(&id)) {
            continue; // nothing to attach to; its next start prepares afresh
        }
        if let Err(e) = attach(st, &id, &base.table, &entry, None).await {
            warn!(sandbox = %id, error = %e.body.message, "re-applying egress rules");
        }
    }
}

/// At daemon shutdown: removes the table when no sandbox uses it (running
/// egress sandboxes keep theirs; the next start adopts them).
pub async fn shutdown(st: &Shared) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while st.network.pending.load(std::sync::atomic::Ordering::SeqCst) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let Some(table) = table_name(st) else { return };
    let _ = tokio::task::spawn_blocking(move || {
        let json = strata_net::nft_json(&["list", "table", "inet", &table]);
        if json.is_empty() {
            return;
        }
        let objs = nft::parse_objects(&json);
        if objs.veths.is_empty() && objs.keys().is_empty() {
            let _ = strata_net::nft_apply(&format!("delete table inet {table}\n"));
        }
    })
    .await;
}

/// Inspects a sandbox's network.
pub async fn info(st: &Shared, id: &str) -> EngineResult<NetworkInfo> {
    let entry = st.network.entries().get(id).cloned();
    let spec = entry.as_ref().map(|e| e.spec.clone()).unwrap_or_default();
    let dns = st.network.dns.lock().unwrap_or_else(|p| p.into_inner()).get(id).copied().unwrap_or_default();
    let mut out = NetworkInfo {
        sandbox_id: id.to_string(),
        spec,
        address: None,
        gateway: None,
        attached: false,
        allowed: FlowCounter::default(),
        denied: FlowCounter::default(),
        received: FlowCounter::default(),
        dns_answered: dns.answered,
        dns_refused: dns.refused,
        recent_denied: Vec::new(),
    };
    let Some(entry) = entry else { return Ok(out) };
    if let Some(l) = st.network.pool.as_ref().ok().and_then(|p| p.link(entry.slot)) {
        out.address = Some(l.address.to_string());
        out.gateway = Some(l.gateway.to_string());
    }
    let Some(table) = table_name(st) else { return Ok(out) };
    let id2 = id.to_string();
    let (attached, counters, denied) = tokio::task::spawn_blocking(move || {
        let attached = link::link_exists(&ifname(&id2));
        let c = nft::parse_counters(&strata_net::nft_json(&["list", "counters", "table", "inet", &table]));
        let d = nft::parse_denied(&strata_net::nft_json(&["list", "set", "inet", &table, &format!("d_{id2}")]));
        (attached, c, d)
    })
    .await
    .map_err(|e| EngineError::internal("network task", &e))?;
    let get = |n: &str| {
        counters.get(&format!("{n}_{id}")).map(|(p, b)| FlowCounter { packets: *p, bytes: *b }).unwrap_or_default()
    };
    out.attached = attached;
    out.allowed = get("ok");
    out.denied = get("no");
    out.received = get("rx");
    out.recent_denied = denied;
    Ok(out)
}

/// Changes a sandbox's network (live when it runs).
pub async fn update(st: &Shared, id: &str, req: NetworkSpec) -> EngineResult<NetworkInfo> {
    let (_g, rec) = crate::record::lock_and_load(st, id).await?;
    let id = rec.sandbox.id.clone();
    let (spec, rules) = validate(&req)?;
    if spec.mode == NetworkMode::Egress {
        crate::quarantine::refuse_sandbox(&rec.sandbox, "be given egress")?;
        check(st, Some(&spec))?;
    }
    // The Rule of Two: egress on a sandbox that already holds the other two capabilities needs an approval.
    let view = crate::record::with_secret_names(st, rec.sandbox.clone());
    let facts = crate::record::exposure_facts(st, &view);
    let grants = strata_core::rule_of_two::grants(&strata_core::rule_of_two::Exposure {
        network: Some(&spec),
        ..crate::record::exposure(&view, &facts)
    });
    crate::approvals::gate(st, &rec.sandbox.tenant, "update network of", &id, &grants)?;
    let old = st.network.entries().get(&id).cloned();
    let live = matches!(rec.sandbox.state, SandboxState::Running | SandboxState::Paused | SandboxState::Standby);
    match (old.as_ref().map(|e| e.spec.mode).unwrap_or_default(), spec.mode) {
        (_, NetworkMode::None) => {
            st.network.put(&id, spec.clone(), rules)?;
            if live {
                release(st, &id).await;
            }
        }
        (NetworkMode::Egress, NetworkMode::Egress) => {
            st.network.put(&id, spec.clone(), rules.clone())?;
            if live && link::link_exists(&ifname(&id)) {
                let base = ensure_base(st).await?;
                let pool = st.network.pool()?;
                let entry = st.network.entries().get(&id).cloned().expect("just put");
                let link = pool.link(entry.slot).expect("slot in pool");
                let old_sets: Vec<String> = old
                    .map(|o| o.rules)
                    .unwrap_or_default()
                    .iter()
                    .filter(|r| matches!(r.target, strata_net::Target::Host(_)))
                    .map(|r| nft::host_set(&id, r))
                    .collect();
                let new_sets: Vec<String> = rules
                    .iter()
                    .filter(|r| matches!(r.target, strata_net::Target::Host(_)))
                    .map(|r| nft::host_set(&id, r))
                    .collect();
                let stale: Vec<String> = old_sets.into_iter().filter(|s| !new_sets.contains(s)).collect();
                let (table, ifn, id2) = (base.table.clone(), ifname(&id), id.clone());
                tokio::task::spawn_blocking(move || {
                    let sb = SandboxNet { key: &id2, ifname: &ifn, address: link.address, rules: &rules };
                    strata_net::nft_apply(&nft::sandbox_script(&table, &pool, &sb, false, &stale))
                })
                .await
                .map_err(|e| EngineError::internal("network task", &e))?
                .map_err(NetworkError::from)?;
            }
        }
        (NetworkMode::None, NetworkMode::Egress) => {
            let running = matches!(rec.sandbox.state, SandboxState::Running | SandboxState::Paused);
            if running && crate::state::tiers::tier_of(&rec.sandbox) != strata_api::Isolation::Namespace {
                return Err(EngineError::new(
                    ErrorCode::Unsupported,
                    format!(
                        "sandbox {id} runs on the {} tier, whose network cannot be switched while it runs: stop it, change the network, start it",
                        rec.sandbox.runtime
                    ),
                ));
            }
            st.network.put(&id, spec.clone(), rules)?;
            if running {
                let base = ensure_base(st).await?;
                let entry = st.network.entries().get(&id).cloned().expect("just put");
                let pid = handle_of(&rec).map(|h| h.init_pid);
                if let Err(e) = attach(st, &id, &base.table, &entry, pid).await {
                    st.network.delete_entry(&id);
                    return Err(e);
                }
            }
        }
    }
    info!(sandbox = %id, mode = spec.mode.as_str(), rules = spec.allow.len(), deny = spec.deny.len(), "network changed");
    if let Ok(ev) = st.db.record_event(
        &id,
        rec.sandbox.state,
        "network_changed",
        Some(&format!(
            "mode {}, allow [{}], deny [{}]",
            spec.mode.as_str(),
            spec.allow.join(", "),
            spec.deny.join(", ")
        )),
        &crate::record::now(),
    ) {
        st.notify_events(ev.seq);
    }
    drop(_g);
    info(st, &id).await
}

// ---- DNS filter ----

/// Binds the resolver (UDP and TCP on the same port of all addresses; the
/// nftables prerouting chain redirects sandboxes' port-53 traffic there) and
/// serves it. Returns the port.
async fn start_resolver(st: Shared) -> std::io::Result<u16> {
    let mut last = None;
    for _ in 0..8 {
        let udp = tokio::net::UdpSocket::bind("0.0.0.0:0").await?;
        let port = udp.local_addr()?.port();
        match tokio::net::TcpListener::bind(("0.0.0.0", port)).await {
            Ok(tcp) => {
                let udp = Arc::new(udp);
                tokio::spawn(serve_udp(st.clone(), udp));
                tokio::spawn(serve_tcp(st, tcp));
                return Ok(port);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no port")))
}

async fn serve_udp(st: Shared, sock: Arc<tokio::net::UdpSocket>) {
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, from) = match sock.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                warn!(error = %e, "DNS filter: receive");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let msg = buf[..n].to_vec();
        let (st, sock) = (st.clone(), sock.clone());
        tokio::spawn(async move {
            if let Some(reply) = answer(&st, from, &msg, false).await {
                let _ = sock.send_to(&reply, from).await;
            }
        });
    }
}

async fn serve_tcp(st: Shared, listener: tokio::net::TcpListener) {
    loop {
        let Ok((mut conn, from)) = listener.accept().await else { continue };
        let st = st.clone();
        tokio::spawn(async move {
            // One or more length-prefixed queries, each answered in turn.
            loop {
                let len = match tokio::time::timeout(Duration::from_secs(10), conn.read_u16()).await {
                    Ok(Ok(l)) => l as usize,
                    _ => return,
                };
                let mut msg = vec![0u8; len];
                if conn.read_exact(&mut msg).await.is_err() {
                    return;
                }
                let Some(reply) = answer(&st, from, &msg, true).await else { return };
                let mut out = (reply.len() as u16).to_be_bytes().to_vec();
                out.extend_from_slice(&reply);
                if conn.write_all(&out).await.is_err() {
                    return;
                }
            }
        });
    }
}

fn bump(st: &Shared, id: &str, answered: bool) {
    let mut m = st.network.dns.lock().unwrap_or_else(|p| p.into_inner());
    let s = m.entry(id.to_string()).or_default();
    if answered {
        s.answered += 1;
    } else {
        s.refused += 1;
    }
}

/// Answers one query from `from`: names no rule of that sandbox allows get
/// NXDOMAIN; allowed ones are forwarded upstream and their IPv4 answers are
/// pinned into the rule's nftables set before the reply leaves.
async fn answer(st: &Shared, from: SocketAddr, msg: &[u8], tcp: bool) -> Option<Vec<u8>> {
    let SocketAddr::V4(v4) = from else { return None };
    // Only sandboxes of this daemon get answers (by their address, which their
    // chain forces them to use as source).
    let (id, rules) = st.network.by_address(*v4.ip())?;
    let q = match dns::parse_query(msg) {
        Ok(q) => q,
        Err(e) => {
            debug!(sandbox = %id, error = %e, "DNS filter: unparsable query");
            return dns::reply(msg, dns::RCODE::FormatError);
        }
    };
    let matching = strata_net::rules::host_rules_for(&rules, &q.name);
    // With every public address open, every name may resolve (nothing to pin).
    let open = strata_net::rules::opens_every_name(&rules);
    if matching.is_empty() && !open {
        bump(st, &id, false);
        log_limited(st, &id, &format!("DNS query for {} refused (no allow rule matches)", q.name));
        return dns::refuse(msg);
    }
    bump(st, &id, true);
    if q.kind == dns::QueryKind::Aaaa {
        // No IPv6 egress: an empty answer makes clients use IPv4 at once.
        return dns::reply(msg, dns::RCODE::NoError);
    }
    let Some(upstream) = st.network.upstream else {
        warn!("DNS filter: no upstream resolver (set --dns-upstream)");
        return dns::reply(msg, dns::RCODE::ServerFailure);
    };
    let resp = match forward(upstream, msg, tcp).await {
        Ok(r) => r,
        Err(e) => {
            warn!(sandbox = %id, name = %q.name, error = %e, "DNS filter: upstream failed");
            return dns::reply(msg, dns::RCODE::ServerFailure);
        }
    };
    let qid = dns::message_id(msg)?;
    let addrs: Vec<(Ipv4Addr, u32)> = match dns::answers(&resp, qid) {
        Ok(a) => a,
        Err(e) => {
            warn!(sandbox = %id, error = %e, "DNS filter: bad upstream response");
            return dns::reply(msg, dns::RCODE::ServerFailure);
        }
    };
    // Answers in reserved ranges (a name pointing at 169.254.169.254 or the
    // host) are never pinned: the chain drops those before the host sets anyway.
    let pin: Vec<(Ipv4Addr, u32)> = addrs.into_iter().filter(|(a, _)| !strata_net::rules::is_reserved(*a)).collect();
    if !pin.is_empty() && !matching.is_empty() {
        let table = table_name(st)?;
        let script: String = matching.iter().map(|r| nft::pin_script(&table, &nft::host_set(&id, r), &pin)).collect();
        let res = tokio::task::spawn_blocking(move || strata_net::nft_apply(&script)).await;
        if !matches!(res, Ok(Ok(()))) {
            warn!(sandbox = %id, name = %q.name, "DNS filter: pinning the answer failed; answering SERVFAIL");
            return dns::reply(msg, dns::RCODE::ServerFailure);
        }
    }
    debug!(sandbox = %id, name = %q.name, pinned = pin.len(), "DNS answer pinned");
    Some(resp)
}

async fn forward(upstream: SocketAddr, msg: &[u8], tcp: bool) -> std::io::Result<Vec<u8>> {
    let deadline = Duration::from_secs(4);
    if tcp {
        let mut c = tokio::time::timeout(deadline, tokio::net::TcpStream::connect(upstream))
            .await
            .map_err(|_| std::io::ErrorKind::TimedOut)??;
        let mut out = (msg.len() as u16).to_be_bytes().to_vec();
        out.extend_from_slice(msg);
        c.write_all(&out).await?;
        let len =
            tokio::time::timeout(deadline, c.read_u16()).await.map_err(|_| std::io::ErrorKind::TimedOut)?? as usize;
        let mut buf = vec![0u8; len];
        tokio::time::timeout(deadline, c.read_exact(&mut buf)).await.map_err(|_| std::io::ErrorKind::TimedOut)??;
        return Ok(buf);
    }
    let s = tokio::net::UdpSocket::bind("0.0.0.0:0").await?;
    s.connect(upstream).await?;
    s.send(msg).await?;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(deadline, s.recv(&mut buf)).await.map_err(|_| std::io::ErrorKind::TimedOut)??;
    buf.truncate(n);
    Ok(buf)
}

// ---- denied flows ----

/// Logs `what` for sandbox `id` at most once per [`DENY_LOG_EVERY`] (the
/// rest are counted and summarized in the next line).
fn log_limited(st: &Shared, id: &str, what: &str) {
    let mut m = st.network.logged.lock().unwrap_or_else(|p| p.into_inner());
    let e = m.entry(id.to_string()).or_insert((None, 0));
    if e.0.is_some_and(|t| t.elapsed() < DENY_LOG_EVERY) {
        e.1 += 1;
        return;
    }
    let suppressed = std::mem::take(&mut e.1);
    e.0 = Some(Instant::now());
    drop(m);
    warn!(sandbox = id, suppressed, "network: {what}");
    if let Ok(Some(rec)) = st.db.sandbox_by_id(id) {
        if let Ok(ev) = st.db.record_event(id, rec.sandbox.state, "network_denied", Some(what), &crate::record::now()) {
            st.notify_events(ev.seq);
        }
    }
}

/// Runs forever once egress is in use: every 2 s, sandboxes whose denied
/// counter grew get a (rate-limited) log line and event naming recent destinations.
async fn watch_denials(st: Shared, table: String) {
    let mut last: HashMap<String, u64> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tick.tick().await;
        let ids: Vec<String> = st.network.entries().keys().cloned().collect();
        if ids.is_empty() {
            continue;
        }
        let t = table.clone();
        let Ok(counters) = tokio::task::spawn_blocking(move || {
            nft::parse_counters(&strata_net::nft_json(&["list", "counters", "table", "inet", &t]))
        })
        .await
        else {
            continue;
        };
        for id in ids {
            let Some((packets, _)) = counters.get(&format!("no_{id}")).copied() else { continue };
            let before = last.insert(id.clone(), packets).unwrap_or(0);
            if packets > before {
                let t = table.clone();
                let key = id.clone();
                let dsts = tokio::task::spawn_blocking(move || {
                    nft::parse_denied(&strata_net::nft_json(&["list", "set", "inet", &t, &format!("d_{key}")]))
                })
                .await
                .unwrap_or_default();
                log_limited(
                    &st,
                    &id,
                    &format!("{} packet(s) denied; recent destinations: [{}]", packets - before, dsts.join(", ")),
                );
            }
        }
    }
}
