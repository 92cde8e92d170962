//! `strata-init _enter`: runs one process inside a running sandbox. The daemon
//! spawns it from the host, executing the very file the sandbox's pid 1 runs
//! ([`open_init_exe`]: `/proc/<init>/exe`, opened through init's `/proc`
//! directory after its start time was checked), so that its mappings lie in
//! the sandbox's own mount tree.
//!
//! Like `nsenter`: join the cgroup, `setns` into init's namespaces and fork
//! twice, so that the process's parent inside the sandbox is the sandbox's pid 1
//! (the whole tree can then be dumped for standby). The inner child is the
//! shim ([`crate::exec::shim`], no second exec: on this host every start of a
//! static glibc binary costs ~0.7 ms of `cpuid` probing, measured with perf),
//! which forks the process, lowers itself to the
//! sandbox's root, installs the seccomp filter, resolves the user against the
//! sandbox's own /etc/passwd, drops to that user, execs, and reports on the
//! descriptor named by `STRATA_REPORT_FD` ([`ExecReport`] JSON lines) until the
//! process ends.
//!
//! ## Privilege order
//!
//! This helper holds every host capability and joins namespaces whose files
//! the sandbox controls, so it never resolves, opens or executes a path inside
//! the sandbox:
//!
//! 1. It makes itself non-dumpable first (nothing in the sandbox may open its
//!    `/proc` entries or descriptors once it is visible there).
//! 2. The daemon opened its program from the host: `/proc/<init>` (checking
//!    the kernel start time, so a recycled pid is never used) and, relative to
//!    it, `exe`: the strata-init binary pid 1 runs, through the read-only bind
//!    mount init made before any sandbox code ran (a regular file on a
//!    read-only mount, or refused). That runs the pinned binary whatever the
//!    sandbox did to `/run` (a moved directory, a planted file), and the
//!    process's mappings lie in the sandbox's own mount tree (CRIU can dump
//!    it). Still on the host, `_enter` opens `/proc/<init>` again (start time
//!    checked), checks that it runs that same file on that same mount, and
//!    opens init's namespaces relative to it.
//! 3. Only then does it join the cgroup and the namespaces and fork; the shim
//!    is non-dumpable from its first instruction on and lowers its credentials
//!    before it reads a single file of the sandbox ([`crate::exec`]).

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

pub use crate::exec::REPORT_FD_ENV;
use crate::exec::{die, ExecSpec, Reporter};
use nix::fcntl::OFlag;
use nix::sched::{setns, CloneFlags};
use nix::sys::stat::Mode;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult};
use serde::{Deserialize, Serialize};

/// Environment variable carrying the [`EnterConfig`] JSON.
pub const CONFIG_ENV: &str = "STRATA_ENTER_CONFIG";

/// What `_enter` receives.
#[derive(Debug, Serialize, Deserialize)]
pub struct EnterConfig {
    /// Host pid of the sandbox's init.
    pub init_pid: i32,
    /// Kernel start time of that process (field 22 of `/proc/<pid>/stat`): a
    /// pid that was recycled by another process is refused.
    pub init_start_time: u64,
    /// Cgroup files to write "0" to (join).
    pub cgroup_join_files: Vec<PathBuf>,
    /// The process.
    pub exec: ExecSpec,
}

/// The namespaces joined, in order (the mount namespace last: it changes our view of /proc).
const NAMESPACES: [(&str, CloneFlags); 6] = [
    ("ipc", CloneFlags::CLONE_NEWIPC),
    ("uts", CloneFlags::CLONE_NEWUTS),
    ("net", CloneFlags::CLONE_NEWNET),
    ("cgroup", CloneFlags::CLONE_NEWCGROUP),
    ("pid", CloneFlags::CLONE_NEWPID),
    ("mnt", CloneFlags::CLONE_NEWNS),
];

/// Makes the calling process non-dumpable: processes without CAP_SYS_PTRACE
/// (everything inside a sandbox) can then neither ptrace it nor open its
/// `/proc/<pid>/fd`, `environ`, `mem` and the like.
pub fn make_undumpable() {
    // SAFETY: prctl(PR_SET_DUMPABLE) takes integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
}

/// Entry point of `strata _enter`. Never returns.
pub fn main() -> ! {
    make_undumpable();
    let mut rep = Reporter::from_env();
    let raw = std::env::var(CONFIG_ENV).unwrap_or_else(|_| die(&mut rep, format!("{CONFIG_ENV} is not set")));
    let cfg: EnterConfig = serde_json::from_str(&raw).unwrap_or_else(|e| die(&mut rep, format!("parse config: {e}")));
    // Everything below is opened on the host, relative to init's /proc directory
    // (which stays bound to that very process even if its pid is reused).
    let proc_dir = open_init_dir(cfg.init_pid, cfg.init_start_time).unwrap_or_else(|e| die(&mut rep, e));
    let helper = open_helper(proc_dir.as_raw_fd()).unwrap_or_else(|e| die(&mut rep, e));
    if !runs_from(&helper) {
        die(&mut rep, "the exec helper does not run from the sandbox init's executable (its processes could not be dumped): spawn it through open_init_exe".into());
    }
    drop(helper);
    let mut namespaces = Vec::new();
    for (name, flag) in NAMESPACES {
        match openat_owned(proc_dir.as_raw_fd(), &format!("ns/{name}"), OFlag::O_RDONLY | OFlag::O_CLOEXEC) {
            Ok(f) => namespaces.push((name, flag, f)),
            Err(e) => die(
                &mut rep,
                format!("open the {name} namespace of pid {}: {e} (is the sandbox running?)", cfg.init_pid),
            ),
        }
    }
    // A sandbox in a user namespace of its own: joined last (joining it first
    // would give up the host capabilities the other setns calls need).
    let userns = match (
        openat_owned(proc_dir.as_raw_fd(), "ns/user", OFlag::O_RDONLY | OFlag::O_CLOEXEC),
        nix::sys::stat::stat("/proc/self/ns/user"),
    ) {
        (Ok(f), Ok(own)) => match nix::sys::stat::fstat(f.as_raw_fd()) {
            Ok(theirs) if (theirs.st_dev, theirs.st_ino) != (own.st_dev, own.st_ino) => Some(f),
            Ok(_) => None,
            Err(e) => die(&mut rep, format!("stat the user namespace of pid {}: {e}", cfg.init_pid)),
        },
        (Err(e), _) | (_, Err(e)) => die(&mut rep, format!("open the user namespace of pid {}: {e}", cfg.init_pid)),
    };
    drop(proc_dir);
    // "0" moves the writing (single-threaded) process itself; see SandboxCgroup::join_files.
    for f in &cfg.cgroup_join_files {
        if let Err(e) = std::fs::write(f, "0") {
            die(&mut rep, format!("join cgroup {}: {e}", f.display()));
        }
    }
    for (name, flag, f) in &namespaces {
        if let Err(e) = setns(f.as_fd(), *flag) {
            die(&mut rep, format!("setns {name}: {e}"));
        }
    }
    drop(namespaces);
    if let Some(ns) = userns {
        if let Err(e) = crate::creds::join_userns_as_root(ns.as_fd()) {
            die(&mut rep, e);
        }
        // A change of credentials resets dumpability to the system default: keep it off.
        make_undumpable();
    }
    // Outer (host) -> A (inside the pid namespace) -> B: A exits at once, so B is
    // reparented to the sandbox's pid 1 and the whole process tree lies inside
    // the sandbox (CRIU can dump it for standby). B is the shim, which runs the
    // process and reports its exit. B waits until the outer helper has reaped
    // A, so that the sandbox never sees A as a zombie next to the process.
    let (go_r, go_w) = match nix::unistd::pipe2(OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => die(&mut rep, format!("pipe: {e}")),
    };
    // SAFETY: single-threaded process (fresh exec, no threads started), so the
    // child may allocate and run arbitrary code before exec.
    match unsafe { fork() } {
        Err(e) => die(&mut rep, format!("fork: {e}")),
        Ok(ForkResult::Child) => {
            drop(go_w);
            // SAFETY: still single-threaded.
            match unsafe { fork() } {
                Err(e) => die(&mut rep, format!("fork: {e}")),
                Ok(ForkResult::Child) => {
                    let mut byte = [0u8; 1];
                    // EOF (the outer helper died) also lets B go on.
                    let _ = nix::unistd::read(go_r.as_raw_fd(), &mut byte);
                    drop(go_r);
                    if let Err(e) = nix::unistd::setsid() {
                        die(&mut rep, format!("setsid: {e}"));
                    }
                    crate::exec::shim(cfg.exec, rep)
                }
                Ok(ForkResult::Parent { .. }) => std::process::exit(0),
            }
        }
        Ok(ForkResult::Parent { child }) => {
            drop(go_r);
            let code = loop {
                match waitpid(child, None) {
                    Ok(WaitStatus::Exited(_, code)) => break code,
                    Ok(WaitStatus::Signaled(..)) => break 127,
                    Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => die(&mut rep, format!("wait: {e}")),
                }
            };
            let _ = nix::unistd::write(&go_w, b"g");
            std::process::exit(code)
        }
    }
}

fn openat_owned(dir: RawFd, path: &str, flags: OFlag) -> nix::Result<OwnedFd> {
    let fd = nix::fcntl::openat(Some(dir), path, flags, Mode::empty())?;
    // SAFETY: openat returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The kernel start time (field 22 of `stat`) of the process whose /proc
/// directory is `proc_dir`.
fn start_time_at(proc_dir: RawFd) -> Option<u64> {
    let fd = openat_owned(proc_dir, "stat", OFlag::O_RDONLY | OFlag::O_CLOEXEC).ok()?;
    let mut buf = [0u8; 1024];
    let n = nix::unistd::read(fd.as_raw_fd(), &mut buf).ok()?;
    parse_start_time(std::str::from_utf8(&buf[..n]).ok()?)
}

/// Field 22 of a `/proc/<pid>/stat` line (the command name, field 2, may hold
/// spaces and parentheses: fields are counted after its last `)`).
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The strata-init binary pid 1 runs (`/proc/<init>/exe`), opened `O_PATH`
/// from the host: a regular file on a read-only mount (the bind mount init
/// made before anything in the sandbox ran).
fn open_helper(proc_dir: RawFd) -> Result<OwnedFd, String> {
    let fd = openat_owned(proc_dir, "exe", OFlag::O_PATH | OFlag::O_CLOEXEC)
        .map_err(|e| format!("open the sandbox init's executable: {e}"))?;
    let st = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(|e| format!("stat the sandbox init's executable: {e}"))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err("the sandbox init's executable is not a regular file".into());
    }
    let vfs = nix::sys::statvfs::fstatvfs(&fd).map_err(|e| format!("statvfs the sandbox init's executable: {e}"))?;
    if !vfs.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY) {
        return Err("the sandbox init's executable is not on a read-only mount".into());
    }
    Ok(fd)
}

/// Whether this process runs the file `helper` names, on the same mount
/// (`/proc/self/exe` against it: inode, device and mount id).
fn runs_from(helper: &OwnedFd) -> bool {
    let id = |dir: RawFd, path: &std::ffi::CStr, flags: i32| -> Option<(u32, u32, u64, u64)> {
        // SAFETY: a zeroed statx buffer is a valid out-parameter.
        let mut sx: libc::statx = unsafe { std::mem::zeroed() };
        // SAFETY: statx with a valid descriptor or AT_FDCWD, a NUL-terminated path and our buffer.
        let r = unsafe { libc::statx(dir, path.as_ptr(), flags, libc::STATX_INO | libc::STATX_MNT_ID, &mut sx) };
        (r == 0 && sx.stx_mask & libc::STATX_MNT_ID != 0).then_some((
            sx.stx_dev_major,
            sx.stx_dev_minor,
            sx.stx_ino,
            sx.stx_mnt_id,
        ))
    };
    let theirs = id(helper.as_raw_fd(), c"", libc::AT_EMPTY_PATH);
    let ours = id(libc::AT_FDCWD, c"/proc/self/exe", 0);
    theirs.is_some() && theirs == ours
}

/// The executable of the sandbox init `init_pid` (started at `start_time`),
/// opened `O_PATH` from the host for the daemon to spawn `_enter` from (as
/// `/proc/self/fd/N`): refused when that pid is no longer that init, or the
/// file is not a regular file on a read-only mount.
pub fn open_init_exe(init_pid: i32, start_time: u64) -> Result<OwnedFd, String> {
    open_helper(open_init_dir(init_pid, start_time)?.as_raw_fd())
}

/// `/proc/<init_pid>`, opened `O_PATH` (it stays bound to that very process
/// even if its pid is reused) once its kernel start time is `start_time`.
fn open_init_dir(init_pid: i32, start_time: u64) -> Result<OwnedFd, String> {
    let fd = nix::fcntl::open(
        format!("/proc/{init_pid}").as_str(),
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("open /proc/{init_pid}: {e} (is the sandbox running?)"))?;
    // SAFETY: open returned a new descriptor that nothing else owns.
    let proc_dir = unsafe { OwnedFd::from_raw_fd(fd) };
    if start_time_at(proc_dir.as_raw_fd()) != Some(start_time) {
        return Err(format!("the sandbox's init (pid {init_pid}) is no longer running"));
    }
    Ok(proc_dir)
}

/// Executes the file behind `fd` (`execveat(fd, "", AT_EMPTY_PATH)`); returns
/// only on failure.
pub fn exec_fd(fd: &OwnedFd, argv: &[CString], env: &[CString]) -> std::io::Error {
    let mut argv_p: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_p.push(std::ptr::null());
    let mut env_p: Vec<*const libc::c_char> = env.iter().map(|a| a.as_ptr()).collect();
    env_p.push(std::ptr::null());
    // SAFETY: execveat with a descriptor we own, an empty NUL-terminated path and
    // NULL-terminated arrays of NUL-terminated strings that outlive the call.
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            fd.as_raw_fd(),
            c"".as_ptr(),
            argv_p.as_ptr(),
            env_p.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    std::io::Error::last_os_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_field_22_even_with_odd_command_names() {
        let stat = "1234 (a) b (c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(stat), Some(987654));
        assert_eq!(parse_start_time("garbage"), None);
    }
}
