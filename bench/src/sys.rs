//! Host measurements: /proc readers, timed child processes, directory sizes.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A `Key:   123 kB` field of /proc/PID/status (or /proc/meminfo), in KiB.
fn kb_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// VmRSS of a process in KiB.
pub fn rss_kib(pid: i32) -> Option<u64> {
    kb_field(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?, "VmRSS")
}

/// Proportional set size of a process in KiB (/proc/PID/smaps_rollup).
pub fn pss_kib(pid: i32) -> Option<u64> {
    kb_field(&std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?, "Pss")
}

/// MemAvailable of the host in KiB.
pub fn mem_available_kib() -> Result<u64> {
    kb_field(&std::fs::read_to_string("/proc/meminfo")?, "MemAvailable").context("MemAvailable missing from /proc/meminfo")
}

/// Pids of all processes on the host.
pub fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|rd| rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

/// The pid-namespace link of a process (`pid:[4026532...]`).
pub fn pid_ns(pid: i32) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok().map(|p| p.to_string_lossy().into_owned())
}

/// Direct children of a process (all its threads' children).
pub fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in rd.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
                out.extend(s.split_whitespace().filter_map(|x| x.parse::<i32>().ok()));
            }
        }
    }
    out
}

/// Runs `argv` to completion with stdout captured, returns the wall time from
/// spawn to reaped exit, and checks exit status 0 and (if given) stdout.
pub fn timed(argv: &[&str], expect_stdout: Option<&str>) -> Result<Duration> {
    let t = Instant::now();
    let out = Command::new(argv[0]).args(&argv[1..]).stdin(Stdio::null()).output().with_context(|| format!("spawn {}", argv[0]))?;
    let el = t.elapsed();
    if !out.status.success() {
        bail!("`{}` failed ({}): {}", argv.join(" "), out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    if let Some(want) = expect_stdout {
        if out.stdout != want.as_bytes() {
            bail!("`{}` printed {:?}, expected {want:?}", argv.join(" "), String::from_utf8_lossy(&out.stdout));
        }
    }
    Ok(el)
}

/// Runs `argv`, returns (wall time, stdout); fails on non-zero exit.
pub fn timed_output(argv: &[&str]) -> Result<(Duration, String)> {
    let t = Instant::now();
    let out = Command::new(argv[0]).args(&argv[1..]).stdin(Stdio::null()).output().with_context(|| format!("spawn {}", argv[0]))?;
    let el = t.elapsed();
    if !out.status.success() {
        bail!("`{}` failed ({}): {}", argv.join(" "), out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok((el, String::from_utf8_lossy(&out.stdout).into_owned()))
}

/// Bytes of disk allocated under `dir` (`du -s -B1 -x`: hard links counted once).
pub fn disk_usage(dir: &Path) -> Result<u64> {
    if !dir.exists() {
        return Ok(0);
    }
    let (_, out) = timed_output(&["du", "-s", "-x", "-B1", &dir.to_string_lossy()])?;
    out.split_whitespace().next().and_then(|v| v.parse().ok()).with_context(|| format!("parse du output {out:?}"))
}

/// Apparent bytes of the files under `dir` (`du -s -b -x`).
pub fn apparent_size(dir: &Path) -> Result<u64> {
    let (_, out) = timed_output(&["du", "-s", "-x", "-b", &dir.to_string_lossy()])?;
    out.split_whitespace().next().and_then(|v| v.parse().ok()).with_context(|| format!("parse du output {out:?}"))
}

/// Flushes all file systems (so a timed step does not pay for earlier writeback).
pub fn sync_all() {
    // SAFETY: sync(2) takes no arguments.
    unsafe { libc::sync() };
}

/// Reads a file fully (to pull it into the page cache).
pub fn warm_cache(path: &Path) -> Result<u64> {
    let mut f = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    std::io::copy(&mut f, &mut std::io::sink()).with_context(|| format!("read {}", path.display()))
}

/// Sends a signal.
pub fn kill(pid: i32, sig: i32) {
    // SAFETY: kill(2) with integer arguments.
    unsafe { libc::kill(pid, sig) };
}

/// Short machine facts: (kernel, nproc, cpu model, memory).
pub fn machine() -> (String, usize, String, String) {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let nproc = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("model name").map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())))
        .unwrap_or_else(|| "unknown".into());
    let mem = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| kb_field(&s, "MemTotal")).map(|k| format!("{:.1} GiB", k as f64 / 1048576.0)).unwrap_or_default();
    (kernel, nproc, cpu, mem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields() {
        let s = "Name:\tx\nVmRSS:\t    1234 kB\nVmRSSX: 9 kB\n";
        assert_eq!(kb_field(s, "VmRSS"), Some(1234));
        assert_eq!(kb_field(s, "Pss"), None);
        assert!(rss_kib(std::process::id() as i32).unwrap() > 0);
        assert!(mem_available_kib().unwrap() > 0);
    }
}
