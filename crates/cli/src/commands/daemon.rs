//! Running the daemon (`strata daemon`) and what runs beside it: `doctor`, `mcp` and
//! the hidden `openapi`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use strata_client::Client;

use crate::args::daemon::DaemonArgs;
use crate::args::JsonOutput;
use crate::output;

/// `strata daemon`: serves the API on `socket` until it is stopped.
pub(super) async fn daemon(socket: PathBuf, a: DaemonArgs) -> Result<i32> {
    init_logging();
    let helper_exe = std::env::current_exe().context("locating the strata binary")?;
    let admission = admission_config(&a);
    strata_server::run(strata_server::Config {
        engine: strata_engine::Config {
            state_dir: a.state_dir,
            helper_exe,
            init_binary: a.init_binary,
            database: a.database,
            archive_url: a.archive_url,
            prices: a.prices,
            network: strata_engine::network::NetworkConfig { pool: a.network_pool, dns_upstream: a.dns_upstream },
            admission,
            disk_pool: a.disk_pool,
            approval_timeout: a.approval_timeout,
            preview_domain: a.preview_domain,
            default_isolation: a.default_isolation,
            default_userns: a.default_userns.0,
            default_check_every: a.check_every,
            warm_pools: a.warm_pool,
            lazy_restore: a.lazy_restore.0,
        },
        socket,
        listen: a.listen,
    })
    .await?;
    Ok(0)
}

fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("STRATA_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}

/// The admission settings of `strata daemon` (absent flags: the built-in defaults).
fn admission_config(a: &DaemonArgs) -> strata_engine::admission::AdmissionConfig {
    use strata_engine::admission::{AdmissionConfig, DefaultLimit};
    let d = AdmissionConfig::default();
    AdmissionConfig {
        default_memory: a.default_memory.unwrap_or(DefaultLimit::Builtin),
        default_cpus: a.default_cpus.unwrap_or(DefaultLimit::Builtin),
        default_pids: a.default_pids.unwrap_or(DefaultLimit::Builtin),
        // `--default-disk 0` meant no default disk before `none` existed.
        default_disk: match a.default_disk {
            Some(DefaultLimit::Value(0)) => DefaultLimit::NoLimit,
            other => other.unwrap_or(DefaultLimit::Builtin),
        },
        memory_overcommit: a.memory_overcommit.map_or(d.memory_overcommit, |r| r.0),
        memory_reserve: a.memory_reserve.unwrap_or(d.memory_reserve),
        disk_overcommit: a.disk_overcommit.map_or(d.disk_overcommit, |r| r.0),
        disk_reserve: a.disk_reserve.unwrap_or(d.disk_reserve),
        tenant_quota: a.tenant_quota.unwrap_or(d.tenant_quota),
    }
}

/// `strata mcp`: an MCP server on stdin/stdout whose tool calls go to the daemon.
pub(super) async fn mcp(c: Client) -> Result<i32> {
    // stdout carries the protocol: nothing else may be printed there.
    strata_mcp::serve_stdio(strata_mcp::StrataMcp::new(strata_mcp::ClientBackend::new(c))).await?;
    Ok(0)
}

/// `strata openapi`.
pub(super) fn openapi() -> Result<i32> {
    println!("{}", strata_server::openapi::spec_json());
    Ok(0)
}

/// `strata pool`.
pub(super) async fn pool(c: &Client, JsonOutput { json }: JsonOutput) -> Result<i32> {
    let pools = c.warm_pools().await?;
    if json {
        output::json(&pools);
        return Ok(0);
    }
    if pools.is_empty() {
        println!("no warm pools (start the daemon with --warm-pool IMAGE_OR_TEMPLATE=N)");
        return Ok(0);
    }
    let rows = pools
        .iter()
        .map(|p| {
            let note = match (&p.last_error, &p.last_unfit) {
                (Some(e), _) => format!("refill failing: {e}"),
                (None, Some(u)) => format!("last unfit: {u}"),
                _ => String::new(),
            };
            vec![
                p.source.clone(),
                format!("{}/{}", p.ready, p.size),
                p.adopted.to_string(),
                p.missed_empty.to_string(),
                p.missed_unfit.to_string(),
                p.booted.to_string(),
                p.drained.to_string(),
                note,
            ]
        })
        .collect();
    output::table(&["SOURCE", "READY", "ADOPTED", "MISSED(EMPTY)", "MISSED(UNFIT)", "BOOTED", "DRAINED", "NOTE"], rows);
    Ok(0)
}

/// `strata doctor`.
pub(super) async fn doctor(c: &Client, JsonOutput { json }: JsonOutput) -> Result<i32> {
    // The daemon's view when it runs; probe locally otherwise (doctor must work before setup).
    let report = match c.doctor().await {
        Ok(r) => r,
        Err(_) => tokio::task::spawn_blocking(strata_runtime::probe::doctor).await?,
    };
    if json {
        output::json(&report);
        return Ok(0);
    }
    println!("kernel {} · cgroups {}", report.kernel, report.cgroup_version);
    for f in &report.features {
        let mark = if f.available { "ok " } else { "-- " };
        let extra = if f.available { String::new() } else { format!("  (disables: {})", f.disables) };
        println!("  {mark} {:<18} {}{extra}", f.name, f.detail);
    }
    println!("tiers:");
    for t in &report.tiers {
        println!("  {} {:<10} {}", if t.available { "ok " } else { "-- " }, t.name, t.detail);
    }
    print_tier_matrix(&report.tiers);
    if !report.names_like_ids.is_empty() {
        println!("names that could be read as ids (from before such names were refused; use their ids):");
        for n in &report.names_like_ids {
            println!(
                "  {:<12} {:<20} id {}{}",
                n.kind,
                n.name,
                n.id,
                n.tenant.as_deref().map(|t| format!("  tenant {t}")).unwrap_or_default()
            );
        }
    }
    Ok(0)
}

/// Each tier x each capability: yes / no, then why for every "no" (and what
/// each "yes" rests on, once per distinct reason).
fn print_tier_matrix(tiers: &[strata_api::TierReport]) {
    let Some(first) = tiers.first() else { return };
    let caps: Vec<&str> = first.capabilities.iter().map(|c| c.name.as_str()).collect();
    if caps.is_empty() {
        return;
    }
    print!("\n  {:<16}", "capability");
    for t in tiers {
        print!(" {:<10}", t.name);
    }
    println!();
    for cap in &caps {
        print!("  {cap:<16}");
        for t in tiers {
            let cell = t.capabilities.iter().find(|c| c.name == *cap);
            print!(" {:<10}", if cell.is_some_and(|c| c.available) { "yes" } else { "no" });
        }
        println!();
    }
    for t in tiers {
        let mut seen = std::collections::BTreeSet::new();
        for c in t.capabilities.iter().filter(|c| !c.available) {
            if seen.insert(c.detail.as_str()) {
                let same: Vec<&str> = t
                    .capabilities
                    .iter()
                    .filter(|o| !o.available && o.detail == c.detail)
                    .map(|o| o.name.as_str())
                    .collect();
                println!("  {} no ({}): {}", t.name, same.join(", "), c.detail);
            }
        }
    }
}
