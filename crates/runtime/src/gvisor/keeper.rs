//! `strata _runsc_keep`: the parent of one gVisor sandbox on the host.
//!
//! `runsc run -detach` (and `restore -detach`) exits once the sandbox runs and
//! leaves its processes (runsc-sandbox, the gofer, the systrap stubs) to
//! whoever reaps orphans. The keeper is that process for one sandbox: a child
//! subreaper that runs the runsc command, reports the sandbox's pid to the
//! daemon, then reaps every process runsc left until the sandbox is gone and
//! exits with the sandbox's exit status (runsc-sandbox exits with its init's).
//! The daemon watches the keeper as it watches a namespace sandbox's init, and
//! nothing runsc leaves behind becomes a zombie of the daemon's.
//!
//! It is also the sandbox's exec broker ([`KeepConfig::broker`],
//! [`strata_init::channel::serve_broker`] on a thread of its own, started
//! as runsc starts; pid 1 tries every few milliseconds until it listens): pid 1's
//! connections to the host end here, and host processes take them.
//!
//! runsc 20240729 refuses `--network=sandbox` in any network namespace on
//! Linux 6.x (gVisor issue #10704: it takes the presence of
//! `/proc/sys/net/core/rmem_default` for "the root namespace"). With
//! [`KeepConfig::mask_proc_sys_net`] the runsc command runs in a private mount
//! namespace with an empty read-only tmpfs over `/proc/sys/net`
//! ([`mask_proc_sys_net`]), which hides that file in every network namespace.

use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::mount::MsFlags;
use nix::sched::CloneFlags;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::sys::Sys;

/// Environment variable carrying the [`KeepConfig`] JSON.
pub const CONFIG_ENV: &str = "STRATA_RUNSC_KEEP";

/// How long the runsc command may take before the keeper gives up on it.
const RUNSC_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the keeper goes on reaping after the sandbox itself has exited.
const LINGER: Duration = Duration::from_secs(5);

/// What the keeper runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeepConfig {
    /// The runsc command line (`runsc --root … run -detach --bundle B --pid-file P ID`).
    pub argv: Vec<String>,
    /// The pid file that command writes.
    pub pid_file: PathBuf,
    /// Run it under the `/proc/sys/net` mask (`--network=sandbox`).
    pub mask_proc_sys_net: bool,
    /// The exec broker: the socket pid 1 connects to (in the channel
    /// directory) and the control socket host processes ask on.
    #[serde(default)]
    pub broker: Option<(PathBuf, PathBuf)>,
}

/// The keeper's one line to the daemon on its stdout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KeepReport {
    /// The sandbox runs; its runsc-sandbox process.
    Ready {
        /// Host pid of runsc-sandbox.
        sandbox_pid: i32,
    },
    /// The runsc command failed (its own messages are in the sandbox's log).
    Failed {
        /// What failed.
        message: String,
    },
}

/// Hides `/proc/sys/net` (see the module docs): in a new private mount
/// namespace, an empty read-only tmpfs over it.
pub fn mask_proc_sys_net(sys: &dyn Sys) -> nix::Result<()> {
    sys.unshare(CloneFlags::CLONE_NEWNS)?;
    sys.mount(None, std::path::Path::new("/"), None, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None)?;
    sys.mount(
        Some(std::path::Path::new("strata-mask")),
        std::path::Path::new("/proc/sys/net"),
        Some("tmpfs"),
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("size=4k"),
    )
}

/// Reads the daemon-side report (one JSON line) from a keeper's stdout
/// (this one's, or a microVM's keeper's).
pub fn read_report<R: serde::de::DeserializeOwned>(stdout: impl std::io::Read) -> Option<R> {
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line).ok()?;
    serde_json::from_str(line.trim()).ok()
}

/// Writes a keeper's report to the daemon: one JSON line on stdout.
pub(crate) fn report<R: Serialize>(r: &R) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", serde_json::to_string(r).expect("report serializes"));
    let _ = out.flush();
}

fn fail(message: String) -> ! {
    eprintln!("strata keeper: {message}");
    report(&KeepReport::Failed { message });
    std::process::exit(1)
}

/// Entry point of `strata _runsc_keep`. Never returns.
pub fn main() -> ! {
    let raw = std::env::var(CONFIG_ENV).unwrap_or_else(|_| fail(format!("{CONFIG_ENV} is not set")));
    let cfg: KeepConfig = serde_json::from_str(&raw).unwrap_or_else(|e| fail(format!("parse config: {e}")));
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        fail(format!("become a subreaper: {}", std::io::Error::last_os_error()));
    }
    let Some((program, args)) = cfg.argv.split_first() else { fail("empty runsc command".into()) };
    let mut cmd = Command::new(program);
    // runsc's stdio stays the sandbox's for its whole life: never the report
    // pipe (the daemon would wait for its end). Its output goes to our stderr,
    // the sandbox's log (opened for appending).
    let log = std::os::fd::AsFd::as_fd(&std::io::stderr())
        .try_clone_to_owned()
        .unwrap_or_else(|e| fail(format!("dup stderr: {e}")));
    cmd.args(args).env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin").stdin(Stdio::null()).stdout(log);
    if cfg.mask_proc_sys_net {
        // SAFETY: the closure runs in the forked child before exec and makes
        // system calls only (this process is single-threaded).
        unsafe { cmd.pre_exec(|| mask_proc_sys_net(&crate::sys::LinuxSys).map_err(std::io::Error::from)) };
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| fail(format!("spawn {program}: {e}")));
    // Started after the spawn (whose child runs code between fork and exec),
    // while runsc starts or restores the sandbox: pid 1 tries until it listens.
    if let Some((pid1_socket, control)) = cfg.broker.clone() {
        std::thread::spawn(move || {
            if let Err(e) = strata_init::channel::serve_broker(&pid1_socket, &control) {
                eprintln!("strata keeper: the exec broker stopped: {e}");
            }
        });
    }
    let deadline = Instant::now() + RUNSC_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                fail(format!("{program} did not finish in {RUNSC_TIMEOUT:?}"))
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => fail(format!("wait for runsc: {e}")),
        }
    };
    let pid = std::fs::read_to_string(&cfg.pid_file).ok().and_then(|s| s.trim().parse::<i32>().ok());
    let sandbox = match (status.success(), pid) {
        (true, Some(pid)) => pid,
        (true, None) => fail(format!("runsc wrote no pid to {}", cfg.pid_file.display())),
        (false, _) => fail(format!("runsc failed ({status}); see the sandbox's log")),
    };
    report(&KeepReport::Ready { sandbox_pid: sandbox });
    // The daemon has what it needs: let go of its pipe.
    // SAFETY: open/dup2 on descriptor 1, which no Rust object owns.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if null >= 0 {
            libc::dup2(null, 1);
            libc::close(null);
        }
    }
    std::process::exit(reap_until_gone(Pid::from_raw(sandbox)))
}

/// Reaps every child until the sandbox (`sandbox`) has exited and nothing is
/// left (or [`LINGER`] after its exit); returns its exit code (128 + signal).
fn reap_until_gone(sandbox: Pid) -> i32 {
    let mut code: Option<i32> = None;
    let mut gone_at: Option<Instant> = None;
    loop {
        let flags = if gone_at.is_some() { Some(WaitPidFlag::WNOHANG) } else { None };
        match waitpid(Pid::from_raw(-1), flags) {
            Ok(WaitStatus::Exited(pid, c)) if pid == sandbox => code = Some(c),
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == sandbox => code = Some(128 + sig as i32),
            // The gofer and the stubs exit within milliseconds of the sandbox:
            // a standby waits for this process to go.
            Ok(WaitStatus::StillAlive) => std::thread::sleep(Duration::from_millis(1)),
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return code.unwrap_or(1), // ECHILD: nothing left
        }
        if code.is_some() && gone_at.is_none() {
            gone_at = Some(Instant::now());
        }
        if gone_at.is_some_and(|t| t.elapsed() > LINGER) {
            return code.unwrap_or(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::{RecordingSys, SysCall};

    #[test]
    fn the_mask_covers_proc_sys_net_in_a_private_mount_namespace() {
        let sys = RecordingSys::default();
        mask_proc_sys_net(&sys).unwrap();
        let calls = sys.calls();
        assert_eq!(calls[0], SysCall::Unshare { flags: CloneFlags::CLONE_NEWNS });
        assert!(matches!(&calls[1], SysCall::Mount { target, flags, .. }
            if target == std::path::Path::new("/") && flags.contains(MsFlags::MS_PRIVATE | MsFlags::MS_REC)));
        assert!(matches!(&calls[2], SysCall::Mount { target, fstype: Some(t), flags, .. }
            if target == std::path::Path::new("/proc/sys/net") && t == "tmpfs" && flags.contains(MsFlags::MS_RDONLY)));
    }

    #[test]
    fn reports_read_back() {
        let r = KeepReport::Ready { sandbox_pid: 42 };
        let line = format!("{}\n", serde_json::to_string(&r).unwrap());
        assert_eq!(read_report::<KeepReport>(line.as_bytes()), Some(r));
        assert_eq!(read_report::<KeepReport>(&b""[..]), None);
    }
}
