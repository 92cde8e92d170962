//! cgroup v2: one unified hierarchy.

use std::path::Path;

use strata_api::ResourceLimits;

use super::{read_keyed, read_u64, write, CgroupError};
use crate::ResourceUsage;

const CPU_PERIOD_US: u64 = 100_000;

/// Enables the controllers strata uses on every ancestor of `dir` below the root,
/// so that `dir` gets its control files.
pub(super) fn enable_controllers(dir: &Path) -> Result<(), CgroupError> {
    // dir = <root>/strata/<id>; enable in <root> and <root>/strata.
    let parent = dir.parent().expect("sandbox cgroup has a parent");
    let root = parent.parent().expect("strata cgroup has a parent");
    std::fs::create_dir_all(parent).map_err(|source| CgroupError::Io { path: parent.to_path_buf(), source })?;
    let available = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    let wanted: Vec<&str> =
        ["cpu", "memory", "pids"].into_iter().filter(|c| available.split_whitespace().any(|a| a == *c)).collect();
    let line = wanted.iter().map(|c| format!("+{c}")).collect::<Vec<_>>().join(" ");
    if !line.is_empty() {
        write(&root.join("cgroup.subtree_control"), &line)?;
        write(&parent.join("cgroup.subtree_control"), &line)?;
    }
    Ok(())
}

pub(super) fn apply(dir: &Path, limits: &ResourceLimits) -> Result<(), CgroupError> {
    if let Some(mem) = limits.memory_bytes {
        write(&dir.join("memory.max"), &mem.to_string())?;
        let swap = dir.join("memory.swap.max");
        if swap.exists() {
            write(&swap, "0")?;
        }
    }
    if let Some(cpus) = limits.cpus {
        let quota = (cpus * CPU_PERIOD_US as f64).round() as u64;
        write(&dir.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
    }
    let max = limits.pids.map_or("max".to_string(), |n| n.to_string());
    write(&dir.join("pids.max"), &max)?;
    Ok(())
}

pub(super) fn set_cpus_and_pids(dir: &Path, cpus: Option<f64>, pids: Option<u64>) -> Result<(), CgroupError> {
    let quota = cpus.map_or("max".to_string(), |c| ((c * CPU_PERIOD_US as f64).round() as u64).to_string());
    write(&dir.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
    write(&dir.join("pids.max"), &pids.map_or("max".to_string(), |n| n.to_string()))?;
    Ok(())
}

pub(super) fn usage(dir: &Path) -> ResourceUsage {
    ResourceUsage {
        oom_kills: read_keyed(&dir.join("memory.events"), "oom_kill").unwrap_or(0),
        memory_bytes: read_u64(&dir.join("memory.current")).unwrap_or(0),
        pids: read_u64(&dir.join("pids.current")).unwrap_or(0),
        cpu_usec: std::fs::read_to_string(dir.join("cpu.stat"))
            .ok()
            .and_then(|t| parse_cpu_stat_usage(&t))
            .unwrap_or(0),
    }
}

/// The `usage_usec` line of `cpu.stat` (present even without the cpu controller).
pub(super) fn parse_cpu_stat_usage(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some("usage_usec")).then(|| it.next()?.parse().ok()).flatten()
    })
}
