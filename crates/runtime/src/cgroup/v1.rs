//! cgroup v1: one hierarchy per controller.

use std::path::PathBuf;

use strata_api::ResourceLimits;

use super::{read_keyed, read_u64, write, CgroupError};
use crate::ResourceUsage;

/// Controllers a sandbox joins, in this order (`memory` first: its directory is
/// the one listed for pids and counters).
pub const CONTROLLERS: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];

const CFS_PERIOD_US: u64 = 100_000;

fn dir_of<'a>(dirs: &'a [PathBuf], controller: &str) -> Option<&'a PathBuf> {
    dirs.iter()
        .find(|d| d.parent().and_then(|p| p.parent()).and_then(|c| c.file_name()).is_some_and(|n| n == controller))
}

pub(super) fn apply(dirs: &[PathBuf], limits: &ResourceLimits) -> Result<(), CgroupError> {
    if let (Some(mem), Some(d)) = (limits.memory_bytes, dir_of(dirs, "memory")) {
        write(&d.join("memory.limit_in_bytes"), &mem.to_string())?;
        // Also cap swap so the limit is a limit (the file exists only with swap accounting).
        let memsw = d.join("memory.memsw.limit_in_bytes");
        if memsw.exists() {
            write(&memsw, &mem.to_string())?;
        }
    }
    if let (Some(cpus), Some(d)) = (limits.cpus, dir_of(dirs, "cpu")) {
        write(&d.join("cpu.cfs_period_us"), &CFS_PERIOD_US.to_string())?;
        write(&d.join("cpu.cfs_quota_us"), &((cpus * CFS_PERIOD_US as f64).round() as u64).to_string())?;
    }
    if let Some(d) = dir_of(dirs, "pids") {
        let max = limits.pids.map_or("max".to_string(), |n| n.to_string());
        write(&d.join("pids.max"), &max)?;
    }
    Ok(())
}

pub(super) fn set_cpus_and_pids(dirs: &[PathBuf], cpus: Option<f64>, pids: Option<u64>) -> Result<(), CgroupError> {
    if let Some(d) = dir_of(dirs, "cpu") {
        write(&d.join("cpu.cfs_period_us"), &CFS_PERIOD_US.to_string())?;
        let quota = cpus.map_or("-1".to_string(), |c| ((c * CFS_PERIOD_US as f64).round() as u64).to_string());
        write(&d.join("cpu.cfs_quota_us"), &quota)?;
    }
    if let Some(d) = dir_of(dirs, "pids") {
        write(&d.join("pids.max"), &pids.map_or("max".to_string(), |n| n.to_string()))?;
    }
    Ok(())
}

pub(super) fn usage(dirs: &[PathBuf]) -> ResourceUsage {
    let mut u = ResourceUsage::default();
    if let Some(d) = dir_of(dirs, "memory") {
        u.oom_kills = read_keyed(&d.join("memory.oom_control"), "oom_kill").unwrap_or(0);
        u.memory_bytes = read_u64(&d.join("memory.usage_in_bytes")).unwrap_or(0);
    }
    if let Some(d) = dir_of(dirs, "pids") {
        u.pids = read_u64(&d.join("pids.current")).unwrap_or(0);
    }
    if let Some(d) = dir_of(dirs, "cpuacct") {
        u.cpu_usec =
            std::fs::read_to_string(d.join("cpuacct.usage")).ok().and_then(|t| parse_cpuacct_usage(&t)).unwrap_or(0);
    }
    u
}

/// `cpuacct.usage` (cumulative nanoseconds) as microseconds.
pub(super) fn parse_cpuacct_usage(text: &str) -> Option<u64> {
    text.trim().parse::<u64>().ok().map(|ns| ns / 1000)
}
