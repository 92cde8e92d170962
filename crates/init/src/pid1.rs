//! Pid 1 of a sandbox after its setup: reaps every process and relays stop
//! requests.

use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::{creds, user};

/// Entry point of `strata _pid1 GRACE_SECS [--spawner]`: pid 1 after
/// re-executing itself from [`crate::SELF_PATH`]. With `--spawner` (the gVisor
/// tier) it also starts the processes asked for through the API
/// ([`crate::spawner`]). Never returns.
pub fn pid1_main() -> ! {
    let grace: u64 = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(10);
    let spawner = std::env::args().nth(3).as_deref() == Some("--spawner");
    // Sandbox processes (which lack CAP_SYS_PTRACE) may not ptrace init or open /proc/1/exe.
    // SAFETY: prctl(PR_SET_DUMPABLE) takes integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    // On the gVisor tier pid 1 starts with runsc's stdio, the sandbox's log on
    // the host: nothing in the sandbox may reach that file through /proc/1/fd.
    // (The namespace tier's setup already pointed them at /dev/null.)
    // SAFETY: open/dup2 on descriptors 0-2, which no Rust object owns here.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null >= 0 {
            for fd in 0..3 {
                libc::dup2(null, fd);
            }
            libc::close(null);
        }
    }
    let root = user::ResolvedUser { uid: 0, gid: 0, groups: vec![0], home: "/".into(), name: None };
    if spawner {
        // It starts root processes with root's capabilities, and others as their user.
        let _ = creds::drop_to(&root, &creds::KEPT);
        crate::spawner::serve(grace)
    }
    let _ = creds::drop_to(&root, &[caps::Capability::CAP_KILL]);
    let _ = creds::no_new_privs();
    reap_loop(grace)
}

/// Pid 1's life: reap every child; on SIGTERM/SIGINT relay SIGTERM to all
/// processes of the namespace and exit once they are gone or `grace` has passed
/// (the kernel then kills whatever is left).
pub(crate) fn reap_loop(grace_secs: u64) -> ! {
    let mut set = SigSet::empty();
    for s in [Signal::SIGCHLD, Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGALRM] {
        set.add(s);
    }
    let _ = set.thread_block();
    let mut stopping = false;
    loop {
        // While stopping, poll: processes started by `strata exec` are not init's
        // children, so their exit sends no SIGCHLD here.
        let timeout = stopping.then_some(std::time::Duration::from_millis(50));
        if let Some(sig) = wait_signal(&set, timeout) {
            on_stop_signal(sig, &mut stopping, grace_secs);
        }
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(_) => continue,
                Err(nix::errno::Errno::ECHILD) => {
                    if stopping && no_other_processes() {
                        finish();
                    }
                    break;
                }
                Err(_) => break,
            }
        }
        if stopping && no_other_processes() {
            finish();
        }
    }
}

/// Pid 1's answer to a stop signal (both loops): on the first SIGTERM/SIGINT,
/// SIGTERM to every process and an alarm after `grace_secs`; on that alarm, exit
/// (the kernel kills whatever is left).
pub(crate) fn on_stop_signal(sig: Signal, stopping: &mut bool, grace_secs: u64) {
    match sig {
        Signal::SIGTERM | Signal::SIGINT if !*stopping => {
            *stopping = true;
            let _ = kill(Pid::from_raw(-1), Signal::SIGTERM);
            let asked = STOP_GRACE.load(std::sync::atomic::Ordering::Relaxed);
            let grace = if asked > 0 { asked } else { grace_secs };
            // SAFETY: alarm() only arms a timer.
            unsafe { libc::alarm(grace.clamp(1, 3600) as u32) };
        }
        Signal::SIGALRM if *stopping => finish(),
        _ => {}
    }
}

/// The grace a stop asked for (seconds; 0: pid 1's own).
static STOP_GRACE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How pid 1 ends once its processes are gone (`None`: it exits; a microVM's
/// powers the machine off).
static FINISH: std::sync::OnceLock<fn() -> !> = std::sync::OnceLock::new();

/// The next stop gives processes `secs` between SIGTERM and SIGKILL.
pub fn set_stop_grace(secs: u64) {
    STOP_GRACE.store(secs, std::sync::atomic::Ordering::Relaxed);
}

/// Pid 1 ends with `f` instead of exiting.
pub(crate) fn finish_with(f: fn() -> !) {
    let _ = FINISH.set(f);
}

/// Pid 1's end: its finish hook, else exit.
pub(crate) fn finish() -> ! {
    match FINISH.get() {
        Some(f) => f(),
        None => std::process::exit(0),
    }
}

/// Waits for one of `set` (blocked), up to `timeout`.
fn wait_signal(set: &SigSet, timeout: Option<std::time::Duration>) -> Option<Signal> {
    let Some(t) = timeout else { return set.wait().ok() };
    let ts = libc::timespec { tv_sec: t.as_secs() as libc::time_t, tv_nsec: t.subsec_nanos() as libc::c_long };
    // SAFETY: `set` is a valid sigset_t, the info pointer may be null, `ts` outlives the call.
    let r = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &ts) };
    if r > 0 {
        Signal::try_from(r).ok()
    } else {
        None
    }
}

/// True when pid 1 is the only process left in its pid namespace (kernel
/// threads, which a microVM's pid 1 sees, do not count).
pub(crate) fn no_other_processes() -> bool {
    match std::fs::read_dir("/proc") {
        Ok(rd) => !rd.filter_map(Result::ok).any(|e| {
            e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()).is_some_and(|p| p != 1 && !is_kernel_thread(p))
        }),
        Err(_) => true,
    }
}

/// Whether `pid` is a kernel thread (PF_KTHREAD in /proc/PID/stat's flags).
fn is_kernel_thread(pid: i32) -> bool {
    const PF_KTHREAD: u64 = 0x0020_0000;
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // Fields after the command (which may hold spaces): state is field 3, flags field 9.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    rest.split_ascii_whitespace().nth(6).and_then(|f| f.parse::<u64>().ok()).is_some_and(|f| f & PF_KTHREAD != 0)
}
