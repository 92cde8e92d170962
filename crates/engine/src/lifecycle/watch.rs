//! The init watcher: a sandbox whose init exits outside strata's control is
//! marked `stopped` or `lost` with the reason.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use strata_api::Lifecycle;
use strata_core::lifecycle::has_processes;
use strata_core::Action;
use strata_runtime::SandboxHandle;
use tracing::warn;

use super::{destroy, kill_processes};
use crate::record::{handle_of, transition, Change};
use crate::state::Shared;

pub(crate) fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a freshly created descriptor that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Watches a sandbox's init: when it dies without strata asking, the sandbox
/// becomes `lost` (reason `oom` when the OOM killer fired), and an ephemeral
/// one is destroyed.
pub fn watch_init(st: Shared, id: String, handle: SandboxHandle) {
    // What follows an init's end is the daemon's work, whoever started the sandbox.
    tokio::spawn(crate::tenancy::as_daemon(async move {
        let fd = match pidfd_open(handle.init_pid) {
            Ok(fd) => fd,
            Err(e) => {
                warn!(sandbox = %id, error = %e, "cannot watch init");
                return;
            }
        };
        // SAFETY: `fd` is an owned, open pidfd that the AsyncFd keeps until dropped.
        match unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) } {
            Ok(afd) => {
                let _ = afd.readable().await;
                // A task that CRIU had seized (standby) becomes reapable only once CRIU
                // lets go of it: wait for that off the async threads.
                let fd = afd.into_inner();
                let _ = tokio::task::spawn_blocking(move || reap_pidfd(fd.as_raw_fd())).await;
            }
            Err(e) => {
                warn!(sandbox = %id, error = %e, "cannot watch init");
                return;
            }
        }
        on_init_exit(&st, &id, &handle).await;
    }));
}

/// Reaps the process behind a (still open, exited) pidfd if it is our child:
/// sandbox inits are reparented to the daemon, which is a child subreaper.
/// Blocks until the exit can be collected (a ptrace-stopped exit, e.g. under
/// CRIU, becomes reapable when the tracer detaches); returns at once with
/// ECHILD when the process is not our child (re-adopted after a restart).
pub(crate) fn reap_pidfd(raw: std::os::fd::RawFd) {
    loop {
        // SAFETY: siginfo_t is plain data; waitid with P_PIDFD only writes into it, and `raw` is open.
        let r = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(libc::P_PIDFD, raw as libc::id_t, &mut info, libc::WEXITED)
        };
        if r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

pub(crate) async fn on_init_exit(st: &Shared, id: &str, handle: &SandboxHandle) {
    let lock = st.lock_for(id);
    let _g = lock.lock().await;
    let Ok(Some(rec)) = st.db.sandbox_by_id(id) else { return };
    if !has_processes(rec.sandbox.state) || handle_of(&rec).as_ref() != Some(handle) {
        return; // stopped or restarted on purpose
    }
    let usage = st.runtime_of(&rec.sandbox).usage(id);
    let reason = if usage.oom_kills > rec.sandbox.oom_kills { "oom" } else { "init_exited" };
    warn!(sandbox = id, reason, "sandbox init exited unexpectedly");
    let _ = kill_processes(st, &rec, Duration::from_millis(100)).await;
    crate::network::release(st, id).await;
    let _ = st.db.set_oom_kills(id, usage.oom_kills.max(rec.sandbox.oom_kills));
    let _ = transition(
        st,
        id,
        rec.sandbox.state,
        Change::new(Action::Lose, reason).detail("the sandbox's init process exited"),
        Instant::now(),
        None,
    );
    if rec.sandbox.lifecycle == Lifecycle::Ephemeral {
        drop(_g);
        let _ = destroy(st, id, true, reason).await;
    }
}
