//! Lazy restore: `criu lazy-pages` serves a restored tree's private memory
//! through userfaultfd, so the processes run again before their pages are
//! back (see docs/design/lazy-restore.md for the measurements).
//!
//! What keeps it safe: the fill daemon is this process's child and its exit
//! status is the verdict (0: every page copied in; anything else, or no exit
//! before the deadline: pages are missing and would read as zeros). A marker
//! file ([`PENDING_MARKER`], the fill daemon's pid and start time) in the work
//! directory is written before the restore and goes only with the image once
//! the caller acted on a good verdict (it retires the image); the fill daemon
//! itself writes [`DONE`] once every page is in (scripts/criu-patches/0007).
//! So a daemon that restarts meanwhile follows the fill on ([`Fills::adopt`]):
//! done, still running (waited for), or gone without finishing (failed).
//! Dumps wait for the fill ([`Fills::wait`]), since CRIU would save a missing
//! page as an untouched one.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::{criu, pidfd_open, pidfd_signal, wait_readable};
use crate::{PageFill, RuntimeError};

/// Marker in a restore's work directory from before a lazy restore until the
/// image is retired after a good verdict.
pub const PENDING_MARKER: &str = "strata-lazy.pending";
/// The fill daemon's log, in the restore's work directory.
pub const LOG: &str = "criu-lazy-pages.log";
/// What the fill daemon writes into the work directory once every page is in
/// (scripts/criu-patches/0007).
pub const DONE: &str = "lazy-pages.done";
/// The socket `criu restore --lazy-pages` connects to, in the work directory (CRIU's name).
const SOCKET: &str = "lazy-pages.socket";
/// How long the fill daemon may take to listen.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a fill of `bytes` of pages may take: a floor for a busy host,
/// plus 20 MB/s (the fill measured here runs at ~1.5 GB/s).
pub fn deadline_for(bytes: u64) -> Duration {
    Duration::from_secs(30) + Duration::from_millis(bytes / 20_000)
}

/// Bytes of page data in an images directory (`pages-*.img`).
pub fn page_bytes(images: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(images) else { return 0 };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("pages-"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// Text the patched CRIU (scripts/criu-patches/0006) carries: it makes the
/// userfaultfd of a task in a user namespace from `/dev/userfaultfd`.
const USERNS_PATCH_MARK: &[u8] = b"userfaultfd made from /dev/userfaultfd";
/// Text the patched CRIU (scripts/criu-patches/0007) carries: its fill daemon
/// writes [`DONE`], which a restarted daemon needs to follow a fill on.
const DONE_PATCH_MARK: &[u8] = b"Can't write lazy-pages.done";

/// Whether `bin` contains `mark`.
fn carries(bin: &Path, mark: &[u8]) -> bool {
    std::fs::read(bin).is_ok_and(|b| b.windows(mark.len()).any(|w| w == mark))
}

/// Why a lazy restore cannot happen on this host (`None`: it can), for a
/// sandbox in a user namespace of its own (`userns`) or not. Probed once per
/// process (`criu check` runs).
pub fn unsupported(userns: bool) -> Option<String> {
    static BASE: OnceLock<Option<String>> = OnceLock::new();
    static USERNS: OnceLock<Option<String>> = OnceLock::new();
    let base = BASE.get_or_init(|| {
        let bin = criu::binary()?;
        let ok = Command::new(&bin)
            .env_clear()
            .env("PATH", criu::PATH)
            .args(["check", "--feature", "uffd-noncoop"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            return Some(format!(
                "{} check --feature uffd-noncoop fails: this kernel's userfaultfd lacks what lazy restore needs",
                bin.display()
            ));
        }
        (!carries(&bin, DONE_PATCH_MARK)).then(|| {
            format!(
                "{} does not record a finished fill (it lacks scripts/criu-patches/0007; rerun scripts/setup-host.sh)",
                bin.display()
            )
        })
    });
    if base.is_some() || criu::binary().is_none() {
        return base.clone().or_else(|| Some("criu is not installed".into()));
    }
    if !userns {
        return None;
    }
    USERNS
        .get_or_init(|| {
            let sysctl = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").unwrap_or_default();
            if sysctl.trim() == "1" {
                return None;
            }
            if !Path::new("/dev/userfaultfd").exists() {
                return Some("a task in a user namespace may not make a userfaultfd here: vm.unprivileged_userfaultfd is 0 and there is no /dev/userfaultfd (Linux >= 6.1)".into());
            }
            let bin = criu::binary().expect("checked above");
            (!carries(&bin, USERNS_PATCH_MARK)).then(|| format!("{} cannot make a userfaultfd inside a user namespace (it lacks scripts/criu-patches/0006; rerun scripts/setup-host.sh)", bin.display()))
        })
        .clone()
}

/// One lazy fill: the daemon's verdict once it has one.
#[derive(Debug)]
pub struct Fill {
    verdict: Mutex<Option<Result<Duration, String>>>,
    done: Condvar,
}

impl Fill {
    /// A fill without a verdict yet.
    pub fn new() -> Arc<Fill> {
        Arc::new(Fill { verdict: Mutex::new(None), done: Condvar::new() })
    }

    /// Gives the fill its verdict and wakes every waiter.
    pub fn settle(&self, verdict: Result<Duration, String>) {
        *self.verdict.lock().unwrap_or_else(|p| p.into_inner()) = Some(verdict);
        self.done.notify_all();
    }
}

impl PageFill for Fill {
    fn wait(&self) -> Result<Duration, String> {
        let v = self.verdict.lock().unwrap_or_else(|p| p.into_inner());
        // The daemon's own thread enforces the deadline: this wait ends.
        let v = self.done.wait_while(v, |v| v.is_none()).unwrap_or_else(|p| p.into_inner());
        v.clone().expect("waited until there is a verdict")
    }
}

/// The fills of a runtime, by sandbox id.
#[derive(Debug, Default)]
pub struct Fills {
    by_sandbox: Mutex<HashMap<String, Arc<Fill>>>,
}

/// A fill daemon just started ([`Fills::start`]).
#[derive(Debug)]
pub struct Started {
    /// The daemon.
    pub daemon: Listening,
    /// Its status pipe: one byte arrives once it listens ([`wait_listening`]).
    pub ready: OwnedFd,
}

/// Waits until the fill daemon whose status pipe is `ready` listens (at most
/// 10 s); the restore may start then. `Err`: it exited or hung first.
pub fn wait_listening(ready: std::os::fd::BorrowedFd<'_>) -> Result<(), String> {
    wait_readable(ready, READY_TIMEOUT).map_err(|e| format!("criu lazy-pages did not start listening: {e}"))?;
    let mut byte = [0u8; 1];
    match nix::unistd::read(ready.as_raw_fd(), &mut byte) {
        Ok(1) => Ok(()),
        Ok(_) => Err("criu lazy-pages exited before it listened".into()),
        Err(e) => Err(format!("criu lazy-pages' status pipe: {e}")),
    }
}

/// The error lines of a fill daemon's log in `work` (for a failed restore's message).
pub fn log_errors(work: &Path) -> String {
    criu::log_errors(&work.join(LOG))
}

/// A fill daemon, before and during its restore.
#[derive(Debug)]
pub struct Listening {
    child: Child,
    pidfd: OwnedFd,
    work_dir: PathBuf,
    deadline: Duration,
}

impl Fills {
    /// Starts `criu lazy-pages` for a restore from `images` whose work
    /// directory is `work`, without waiting: the restore must not start
    /// before [`wait_listening`] on the returned `ready` succeeds (`_restore`
    /// waits for it while it prepares the root, so the two start-ups overlap).
    pub fn start(bin: &Path, images: &Path, work: &Path) -> Result<Started, RuntimeError> {
        let _ = std::fs::remove_file(work.join(SOCKET));
        let _ = std::fs::remove_file(work.join(DONE));
        let (ready, status_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| RuntimeError::sys("make the lazy-pages status pipe", std::io::Error::from(e)))?;
        let spawned = {
            let g = crate::spawn_lock();
            crate::inherit_in_next_spawn(&g, status_w.as_fd())
                .map_err(|e| RuntimeError::sys("pass the lazy-pages status pipe", e))?;
            Command::new(bin)
                .env_clear()
                .env("PATH", criu::PATH)
                .arg("lazy-pages")
                .arg("-D")
                .arg(images)
                .arg("-W")
                .arg(work)
                .arg("-o")
                .arg(LOG)
                .arg("-v2")
                .arg("--status-fd")
                .arg(status_w.as_raw_fd().to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
            // `status_w` is dropped with the lock held: no other spawn inherits it.
        };
        let mut child = spawned.map_err(|source| RuntimeError::Spawn { what: "criu lazy-pages", source })?;
        let pid = child.id() as i32;
        let pidfd = match pidfd_open(pid).map_err(|e| RuntimeError::sys("pidfd of criu lazy-pages", e)).and_then(|fd| {
            // Before the restore can start: who fills, for a daemon that restarts meanwhile.
            let start = super::process_start_time(pid).unwrap_or(0);
            write_marker(&work.join(PENDING_MARKER), &format!("{pid} {start}\n"))?;
            Ok(fd)
        }) {
            Ok(fd) => fd,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = std::fs::remove_file(work.join(PENDING_MARKER));
                return Err(e);
            }
        };
        let daemon =
            Listening { child, pidfd, work_dir: work.to_path_buf(), deadline: deadline_for(page_bytes(images)) };
        Ok(Started { daemon, ready })
    }

    /// Follows `daemon` (its restore succeeded) to its verdict as the fill
    /// of `sandbox_id`, counting time from `restore_started`. Failpoints
    /// (tests): `lazy-fill` kills the daemon at once, as if it died mid-fill;
    /// `lazy-fill-stall` stops it for half a second.
    pub fn follow(&self, sandbox_id: &str, mut daemon: Listening, restore_started: Instant) -> Arc<Fill> {
        if crate::failpoint("lazy-fill").is_err() {
            let _ = daemon.child.kill();
        }
        if crate::failpoint("lazy-fill-stall").is_err() {
            stall(&daemon.child);
        }

        self.track(sandbox_id, move || watch(daemon, restore_started))
    }

    /// Follows on, as the fill of `sandbox_id`, a lazy restore from `work`
    /// that a previous daemon started and did not see end (its marker is
    /// there); `None` when there is none.
    pub fn adopt(&self, sandbox_id: &str, work: &Path) -> Option<Arc<Fill>> {
        if !work.join(PENDING_MARKER).exists() {
            return None;
        }
        let work = work.to_path_buf();
        Some(self.track(sandbox_id, move || adopted_verdict(&work)))
    }

    /// Registers a fill of `sandbox_id` whose verdict `verdict` reaches, on a
    /// thread of its own.
    fn track(
        &self,
        sandbox_id: &str,
        verdict: impl FnOnce() -> Result<Duration, String> + Send + 'static,
    ) -> Arc<Fill> {
        let fill = self.open(sandbox_id);
        let (f, id) = (fill.clone(), sandbox_id.to_string());
        let spawned = std::thread::Builder::new().name("lazy-pages".into()).spawn(move || {
            let verdict = verdict();
            match &verdict {
                Ok(d) => debug!(sandbox = %id, ms = d.as_millis() as u64, "memory resident"),
                Err(e) => warn!(sandbox = %id, error = %e, "lazy restore failed"),
            }
            f.settle(verdict);
        });
        if let Err(e) = spawned {
            fill.settle(Err(format!("no thread to follow criu lazy-pages: {e}")));
        }
        fill
    }

    /// Registers a fill of `sandbox_id` with no verdict yet: the caller gives
    /// it one ([`Fill::settle`]).
    pub fn open(&self, sandbox_id: &str) -> Arc<Fill> {
        let fill = Fill::new();
        self.by_sandbox.lock().unwrap_or_else(|p| p.into_inner()).insert(sandbox_id.to_string(), fill.clone());
        fill
    }

    /// Abandons a daemon whose restore failed: it is killed and reaped.
    pub fn abandon(mut daemon: Listening) {
        let _ = daemon.child.kill();
        let _ = daemon.child.wait();
        let _ = std::fs::remove_file(daemon.work_dir.join(PENDING_MARKER));
    }

    /// The fill of `sandbox_id` while it has no verdict, or until its
    /// verdict is collected by [`Fills::wait`].
    pub fn get(&self, sandbox_id: &str) -> Option<Arc<Fill>> {
        self.by_sandbox.lock().unwrap_or_else(|p| p.into_inner()).get(sandbox_id).cloned()
    }

    /// Forgets the fill of `sandbox_id` without waiting (its processes are
    /// gone; the daemon's thread still reaps it).
    pub fn forget(&self, sandbox_id: &str) {
        self.by_sandbox.lock().unwrap_or_else(|p| p.into_inner()).remove(sandbox_id);
    }

    /// Waits for the fill of `sandbox_id` (if any) and forgets it, as a dump
    /// of the sandbox must first: one taken mid-fill would save the pages
    /// still missing as untouched ones. `Err`: pages are missing.
    pub fn wait_to_dump(&self, sandbox_id: &str) -> Result<(), RuntimeError> {
        self.wait(sandbox_id).map_err(|why| {
            RuntimeError::Setup(format!(
                "the memory of sandbox {sandbox_id} is incomplete (its lazy restore failed): {why}"
            ))
        })
    }

    /// Waits for the fill of `sandbox_id` (if any) and forgets it. `Err`:
    /// pages are missing.
    pub fn wait(&self, sandbox_id: &str) -> Result<(), String> {
        let Some(fill) = self.get(sandbox_id) else { return Ok(()) };
        if fill.verdict.lock().unwrap_or_else(|p| p.into_inner()).is_none() {
            info!(sandbox = sandbox_id, "waiting for the lazy restore's last pages before dumping");
        }
        let verdict = fill.wait().map(drop);
        let mut map = self.by_sandbox.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(sandbox_id).is_some_and(|f| Arc::ptr_eq(f, &fill)) {
            map.remove(sandbox_id);
        }
        verdict
    }
}

/// Failpoint `lazy-fill-stall` (tests): stops the daemon of a restore that
/// just ended for half a second, so whatever comes next (a standby's dump)
/// meets a fill still running. (Stopped before the restore ends, it would
/// hold the restore up instead: CRIU waits for it while handing over.)
fn stall(daemon: &Child) {
    use nix::sys::signal::{kill, Signal};
    let pid = nix::unistd::Pid::from_raw(daemon.id() as i32);
    // The pid stays ours: a stopped daemon does not exit, so it is not reaped before SIGCONT.
    let _ = kill(pid, Signal::SIGSTOP);
    let _ = std::thread::Builder::new().name("lazy-stall".into()).spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        let _ = kill(pid, Signal::SIGCONT);
    });
}

/// Writes the pending marker (`text`: the fill daemon's pid and start time),
/// durably: a crash after this leaves it for the next daemon.
fn write_marker(marker: &Path, text: &str) -> Result<(), RuntimeError> {
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(marker)?;
        std::io::Write::write_all(&mut f, text.as_bytes())?;
        f.sync_all()?;
        std::fs::File::open(marker.parent().unwrap_or(Path::new("/")))?.sync_all()
    };
    write().map_err(|e| RuntimeError::sys(format!("write {}", marker.display()), e))
}

/// The verdict on a fill that a previous daemon started from `work` and did
/// not see end (see [`Fills::adopt`]): [`DONE`] is there (every page in), or
/// the fill daemon the marker names still runs (waited for, killed at its
/// deadline, then [`DONE`] decides), or it is gone without writing it.
fn adopted_verdict(work: &Path) -> Result<Duration, String> {
    let marker = work.join(PENDING_MARKER);
    let since = |done: &Path| {
        let t = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        match (t(&marker), t(done)) {
            (Some(a), Some(b)) => b.duration_since(a).unwrap_or_default(),
            _ => Duration::ZERO,
        }
    };
    let done = work.join(DONE);
    if done.exists() {
        return Ok(since(&done));
    }
    let text = std::fs::read_to_string(&marker).unwrap_or_default();
    let mut it = text.split_whitespace().map(|v| v.parse::<u64>().ok());
    if let (Some(Some(pid)), Some(Some(start))) = (it.next(), it.next()) {
        // The same process (a recycled pid has another start time).
        let (pid, same) = (pid as i32, move || super::process_start_time(pid as i32) == Some(start));
        let deadline = deadline_for(page_bytes(work));
        if !super::wait_for_exit_of(pid, start, deadline) {
            super::signal_if(pid, libc::SIGKILL, same);
            return Err(format!(
                "criu lazy-pages (pid {pid}) did not finish within {} s and was killed",
                deadline.as_secs()
            ));
        }
        if done.exists() {
            return Ok(since(&done));
        }
    }
    Err(format!(
        "criu lazy-pages ended without copying every page in while no daemon watched it: {}",
        criu::log_errors(&work.join(LOG))
    ))
}

/// Waits for the daemon's exit (killing it at its deadline) and turns it into a verdict.
fn watch(mut daemon: Listening, restore_started: Instant) -> Result<Duration, String> {
    let exited_in_time = wait_readable(daemon.pidfd.as_fd(), daemon.deadline).is_ok();
    if !exited_in_time {
        // Our own pidfd of the (unreaped) daemon.
        pidfd_signal(daemon.pidfd.as_fd(), libc::SIGKILL);
    }
    let status = daemon.child.wait();
    let took = restore_started.elapsed();
    let log = daemon.work_dir.join(LOG);
    let verdict = match status {
        Ok(s) if s.success() && exited_in_time => Ok(took),
        Ok(_) if !exited_in_time => {
            Err(format!("criu lazy-pages did not finish within {} s and was killed", daemon.deadline.as_secs()))
        }
        Ok(s) => {
            Err(format!("criu lazy-pages ended ({s}) before every page was copied in: {}", criu::log_errors(&log)))
        }
        Err(e) => Err(format!("waiting for criu lazy-pages: {e}")),
    };
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_grows_with_the_pages() {
        assert_eq!(deadline_for(0), Duration::from_secs(30));
        assert_eq!(deadline_for(1 << 30), Duration::from_secs(30) + Duration::from_millis((1u64 << 30) / 20_000));
    }

    #[test]
    fn a_fill_s_verdict_reaches_every_waiter_once_and_is_then_forgotten() {
        let fills = Fills::default();
        assert_eq!(fills.wait("a"), Ok(()), "no fill: nothing to wait for");
        let fill = Fill::new();
        fills.by_sandbox.lock().unwrap().insert("a".into(), fill.clone());
        let waiter = {
            let f = fill.clone();
            std::thread::spawn(move || f.wait())
        };
        fill.settle(Err("pages are missing".into()));
        assert_eq!(waiter.join().unwrap(), Err("pages are missing".into()));
        assert!(fills.get("a").is_some());
        assert_eq!(fills.wait("a"), Err("pages are missing".into()));
        assert!(fills.get("a").is_none(), "collected");
    }

    #[test]
    fn page_bytes_counts_only_page_images() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("pages-1.img"), vec![0u8; 4096]).unwrap();
        std::fs::write(d.path().join("pages-2.img"), vec![0u8; 8192]).unwrap();
        std::fs::write(d.path().join("pagemap-1.img"), vec![0u8; 100]).unwrap();
        assert_eq!(page_bytes(d.path()), 12288);
    }
}
