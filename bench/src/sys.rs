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
    kb_field(&std::fs::read_to_string("/proc/meminfo")?, "MemAvailable")
        .context("MemAvailable missing from /proc/meminfo")
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
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("spawn {}", argv[0]))?;
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
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("spawn {}", argv[0]))?;
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

/// CPU time (user + system, all threads including exited ones) of a process in ms
/// (clock-tick resolution, normally 10 ms).
pub fn cpu_ms(pid: i32) -> Option<u64> {
    cpu_split_ms(pid).map(|(u, k)| u + k)
}

/// User and system CPU time of a process in ms (/proc/PID/stat utime, stime).
pub fn cpu_split_ms(pid: i32) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
    // After the comm field: state is field 3, utime 14 and stime 15.
    let (u, k): (u64, u64) = (f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?);
    // SAFETY: sysconf with a valid name.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some((u * 1000 / hz, k * 1000 / hz))
}

/// Start time of a process (field 22 of /proc/PID/stat, clock ticks after boot):
/// with the pid, it tells a process from a later one that reuses the pid.
pub fn start_time(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// A process's pid in its innermost pid namespace (the last `NSpid` field).
pub fn inner_pid(pid: i32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| l.strip_prefix("NSpid:"))?.split_whitespace().last()?.parse().ok()
}

/// A `Key: 123 kB` field of /proc/PID/status, in KiB.
pub fn status_kib(pid: i32, key: &str) -> Option<u64> {
    kb_field(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?, key)
}

/// The memory cgroup directory of sandbox `id`, while it exists (cgroup v1 memory
/// controller, or v2).
pub fn sandbox_memcg(id: &str) -> Option<std::path::PathBuf> {
    [format!("/sys/fs/cgroup/memory/strata/{id}"), format!("/sys/fs/cgroup/strata/{id}")]
        .into_iter()
        .map(std::path::PathBuf::from)
        .find(|d| d.join("memory.usage_in_bytes").exists() || d.join("memory.current").exists())
}

/// Whether any cgroup directory of sandbox `id` exists (any controller, v1 or v2).
pub fn sandbox_cgroup_exists(id: &str) -> bool {
    let v1 = std::fs::read_dir("/sys/fs/cgroup")
        .map(|rd| rd.flatten().any(|c| c.path().join("strata").join(id).exists()))
        .unwrap_or(false);
    v1 || Path::new("/sys/fs/cgroup/strata").join(id).exists()
}

/// Charged memory of a memory cgroup in KiB (v1 `memory.usage_in_bytes`, v2 `memory.current`).
pub fn memcg_usage_kib(dir: &Path) -> Option<u64> {
    ["memory.usage_in_bytes", "memory.current"]
        .iter()
        .find_map(|f| std::fs::read_to_string(dir.join(f)).ok()?.trim().parse::<u64>().ok())
        .map(|b| b / 1024)
}

/// Page cache charged to a memory cgroup in KiB (v1 `total_cache`, v2 `file`, from memory.stat).
pub fn memcg_cache_kib(dir: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
    ["total_cache", "file"]
        .iter()
        .find_map(|k| s.lines().find_map(|l| l.strip_prefix(k)?.strip_prefix(' ')?.trim().parse::<u64>().ok()))
        .map(|b| b / 1024)
}

/// Host pids of the processes in a cgroup directory and its child cgroups.
pub fn cgroup_pids(dir: &Path) -> Vec<i32> {
    let mut out: Vec<i32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(cgroup_pids(&e.path()));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The state letter of a process (`R`, `S`, `Z`, ...; field 3 of /proc/PID/stat).
pub fn proc_state(pid: i32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(')')?.1.split_whitespace().next()?.chars().next()
}

/// Zombie (exited, not reaped) children of a process.
pub fn zombie_children(parent: i32) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).ok().and_then(|s| {
                let f: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().take(2).collect();
                Some(f.first() == Some(&"Z") && f.get(1).and_then(|x| x.parse::<i32>().ok()) == Some(parent))
            }) == Some(true)
        })
        .collect()
}

/// Short machine facts: (kernel, nproc, cpu model, memory).
pub fn machine() -> (String, usize, String, String) {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let nproc = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name").map(|r| r.trim_start_matches([' ', '\t', ':']).to_string()))
        })
        .unwrap_or_else(|| "unknown".into());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| kb_field(&s, "MemTotal"))
        .map(|k| format!("{:.1} GiB", k as f64 / 1048576.0))
        .unwrap_or_default();
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
        let me = std::process::id() as i32;
        assert!(start_time(me).is_some());
        assert!(cpu_ms(me).is_some());
        assert!(inner_pid(me).is_some());
        assert!(status_kib(me, "VmRSS").is_some());
    }
}
