//! `strata _init`: the helper that becomes a sandbox's pid 1.
//!
//! Protocol with `NamespaceRuntime::start`: the config arrives as JSON
//! on stdin; status lines ([`InitReport`]) go to stdout. The outer process joins
//! the cgroup, unshares the namespaces and forks; the child is pid 1 of the new
//! pid namespace, builds the root filesystem, reports `ready`, closes every
//! inherited descriptor and then only reaps zombies and relays stop requests.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;

use nix::sched::CloneFlags;
use nix::unistd::{fork, ForkResult};
use serde::{Deserialize, Serialize};

use super::mounts;
use crate::spec::SandboxSpec;
use crate::sys::{LinuxSys, Sys};

/// What `_init` receives on stdin.
#[derive(Debug, Serialize, Deserialize)]
pub struct InitConfig {
    /// The sandbox.
    pub spec: SandboxSpec,
    /// Cgroup files to write "0" to (join) before unsharing.
    pub cgroup_join_files: Vec<PathBuf>,
    /// Seconds init waits after relaying SIGTERM before it exits (killing the rest).
    pub stop_grace_secs: u64,
    /// The static `strata-init` binary, bind-mounted at [`SELF_PATH`].
    pub init_binary: PathBuf,
}

/// Status lines `_init` writes on stdout.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum InitReport {
    /// Host pid of the sandbox's pid 1.
    Pid {
        /// The pid.
        pid: i32,
    },
    /// The root filesystem is ready.
    Ready,
    /// Setup failed.
    Error {
        /// Why.
        message: String,
        /// The image's own tree made it impossible (the caller's input), not the host.
        #[serde(default)]
        image: bool,
    },
}

fn report(r: &InitReport) {
    let mut line = serde_json::to_vec(r).expect("InitReport serializes");
    line.push(b'\n');
    let _ = std::io::stdout().write_all(&line);
    let _ = std::io::stdout().flush();
}

fn fail(message: String) -> ! {
    fail_with(mounts::SetupError::Host(message))
}

fn fail_with(e: mounts::SetupError) -> ! {
    eprintln!("strata init: {e}");
    let image = matches!(e, mounts::SetupError::Image(_));
    report(&InitReport::Error { message: e.to_string(), image });
    std::process::exit(1)
}

/// Entry point of `strata _init`. Never returns.
pub fn main() -> ! {
    let mut input = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut input) {
        fail(format!("read config: {e}"));
    }
    let cfg: InitConfig = serde_json::from_str(&input).unwrap_or_else(|e| fail(format!("parse config: {e}")));
    // "0" moves the writing (single-threaded) process itself; see SandboxCgroup::join_files.
    for f in &cfg.cgroup_join_files {
        if let Err(e) = std::fs::write(f, "0") {
            fail(format!("join cgroup {}: {e}", f.display()));
        }
    }
    let sys = LinuxSys;
    // A sandbox with a user namespace: the host mounts its idmapped root first
    // (in a private mount namespace), then this process becomes the root of
    // that user namespace, so that every namespace made next is owned by it
    // (what CRIU needs to dump the tree, and what keeps the host's namespaces
    // out of the sandbox root's reach).
    // What the sandbox's root needs of the host (its root directory, the
    // helper binary) is reached here, while this process is host root: the
    // state directory is closed to the sandbox's ids. The root becomes the
    // working directory (the mount namespaces made next carry it along).
    let from_host = match cfg.spec.userns {
        Some(u) => {
            let ns = sys.user_namespace(u.host_base, u.size).unwrap_or_else(|e| {
                fail(format!("create the user namespace ({} ids from host id {}): {e}", u.size, u.host_base))
            });
            let s = &cfg.spec;
            let idmap = mounts::Idmap { userns: ns.as_fd(), host_root: u.host_base };
            if let Err(e) =
                mounts::mount_user_root(&sys, &s.lower_dirs, &s.upper_dir, &s.work_dir, &s.rootfs_dir, idmap)
            {
                fail_with(e);
            }
            let helper = mounts::clone_helper_mount(&sys, &cfg.init_binary).unwrap_or_else(|e| fail_with(e));
            if let Err(e) = sys.chdir(&s.rootfs_dir) {
                fail(format!("chdir {}: {e}", s.rootfs_dir.display()));
            }
            if let Err(e) = strata_init::creds::join_userns_as_root(ns.as_fd()) {
                fail(e);
            }
            Some(helper)
        }
        None => None,
    };
    if let Err(e) = enter_namespaces(&sys, &cfg.spec) {
        fail(e);
    }
    // SAFETY: this process is single-threaded (a fresh exec of the strata binary
    // that started no threads), so the child may run arbitrary code after fork.
    match unsafe { fork() } {
        Err(e) => fail(format!("fork: {e}")),
        Ok(ForkResult::Parent { child }) => {
            report(&InitReport::Pid { pid: child.as_raw() });
            std::process::exit(0)
        }
        Ok(ForkResult::Child) => pid1(&sys, cfg, from_host),
    }
}

/// Joins the daemon's prepared network namespace (`spec.netns_path`, for
/// egress) and unshares the others: mount, uts, ipc, pid (for the children),
/// cgroup, and network unless one was joined.
pub fn enter_namespaces(sys: &dyn Sys, spec: &SandboxSpec) -> Result<(), String> {
    let mut flags = CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWUTS
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWCGROUP;
    match &spec.netns_path {
        // A user namespace can join no namespace of the host's: its link is plugged in from outside.
        Some(_) if spec.userns.is_some() => {
            return Err(
                "a sandbox in a user namespace makes its own network namespace (its link is attached from the host)"
                    .into(),
            )
        }
        // The daemon's prepared namespace (egress): join it.
        Some(p) => {
            let ns = std::fs::File::open(p).map_err(|e| format!("open network namespace {}: {e}", p.display()))?;
            sys.setns(ns.as_fd(), CloneFlags::CLONE_NEWNET)
                .map_err(|e| format!("join network namespace {}: {e}", p.display()))?;
        }
        None => flags |= CloneFlags::CLONE_NEWNET,
    }
    sys.unshare(flags).map_err(|e| format!("unshare namespaces: {e}"))
}

/// Everything pid 1 sets up before it reports ready, in its new namespaces:
/// the root filesystem, hostname, loopback, the pivot into the root, the
/// identity files, resolv.conf, secrets, and the helper binary at
/// [`SELF_PATH`]. Returns the helper mount (pid 1 executes it).
///
/// `userns_helper`: pid 1 is the root of the sandbox's user namespace, which
/// owns its other namespaces; the host mounted its root overlay already and
/// made it pid 1's working directory ([`mounts::RootSource::Inherited`]),
/// and opened this helper mount for it (no path of the host is resolved from
/// here on: the state directory is closed to the sandbox's ids).
pub fn setup_sandbox(sys: &dyn Sys, cfg: &InitConfig, userns_helper: Option<OwnedFd>) -> mounts::SetupResult<OwnedFd> {
    let spec = &cfg.spec;
    let in_userns = userns_helper.is_some();
    // The helper binary, opened before pivot_root hides the host: pid 1 re-executes
    // it from inside the sandbox (see [`SELF_PATH`]).
    let helper = match userns_helper {
        Some(h) => h,
        None => mounts::clone_helper_mount(sys, &cfg.init_binary)?,
    };
    let (source, root) = if in_userns {
        (mounts::RootSource::Inherited, std::path::Path::new("."))
    } else {
        let overlay =
            mounts::RootSource::Overlay { lower: &spec.lower_dirs, upper: &spec.upper_dir, work: &spec.work_dir };
        (overlay, spec.rootfs_dir.as_path())
    };
    mounts::build_rootfs(sys, source, root, mounts::TmpMount::of(spec))?;
    sys.sethostname(&spec.hostname).map_err(|e| format!("sethostname: {e}"))?;
    mounts::loopback_up(sys)?;
    mounts::pivot_into(sys, root)?;
    let root = sys.root_after_pivot(&spec.rootfs_dir);
    mounts::write_identity_files(sys, &root, &spec.hostname, &spec.id, &spec.machine_id, spec.fork_generation)?;
    if let Some(conf) = &spec.resolv_conf {
        mounts::bind_resolv_conf(sys, &root, conf)?;
    }
    mounts::mount_secrets(sys, &root, &spec.secrets, spec.secrets_owner.as_deref())?;
    mounts::attach_helper(sys, &helper, &root.join(SELF_PATH.trim_start_matches('/')))?;
    Ok(helper)
}

fn pid1(sys: &dyn Sys, cfg: InitConfig, userns_helper: Option<OwnedFd>) -> ! {
    let helper = setup_sandbox(sys, &cfg, userns_helper).unwrap_or_else(|e| fail_with(e));
    report(&InitReport::Ready);
    detach_stdio(helper.as_raw_fd());
    if let Err(e) = nix::unistd::setsid() {
        eprintln!("strata init: setsid: {e}");
    }
    // Pid 1 continues as strata-init seen from inside the sandbox, so that every
    // mapping of the sandbox's processes lies in its own mount tree (which is
    // what lets CRIU dump the tree for standby). It executes the helper mount
    // itself (no path is resolved), which is also the binary every exec helper
    // later executes through `/proc/<pid 1>/exe`.
    let argv = [
        c"strata".to_owned(),
        c"_pid1".to_owned(),
        std::ffi::CString::new(cfg.stop_grace_secs.to_string()).expect("digits"),
    ];
    let err = strata_init::enter::exec_fd(&helper, &argv, &[]);
    eprintln!("strata init: exec {SELF_PATH}: {err}");
    std::process::exit(1)
}

pub use strata_init::SELF_PATH;

/// Closes every inherited descriptor but `keep` (close-on-exec; at least 3:
/// stdio was open when it was made) and points 0, 1, 2 at the sandbox's
/// /dev/null, so nothing of the host stays open inside (which would also block
/// checkpointing).
fn detach_stdio(keep: i32) {
    if keep < 3 {
        fail(format!("the helper descriptor {keep} collides with stdio"));
    }
    // SAFETY: close_range only closes descriptors; none is in use by Rust objects here
    // (stdin was read to the end, stdout/stderr are replaced below; `keep` is skipped).
    unsafe {
        if keep > 3 {
            libc::syscall(libc::SYS_close_range, 3u32, (keep - 1) as u32, 0u32);
        }
        libc::syscall(libc::SYS_close_range, (keep + 1) as u32, u32::MAX, 0u32);
    }
    // SAFETY: open returns a new descriptor; dup2 onto 0-2 replaces the host's stdio.
    unsafe {
        let fd = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if fd >= 0 {
            for target in 0..3 {
                libc::dup2(fd, target);
            }
            libc::close(fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::Path;

    use nix::errno::Errno;

    use super::*;
    use crate::spec::SecretFile;
    use crate::sys::{RecordingSys, SysCall};

    fn spec(dir: &Path) -> SandboxSpec {
        let d = |n: &str| {
            let p = dir.join(n);
            fs::create_dir_all(&p).unwrap();
            p
        };
        SandboxSpec {
            id: "sb-1".into(),
            hostname: "box".into(),
            lower_dirs: vec![d("l1")],
            upper_dir: d("up"),
            work_dir: d("wk"),
            rootfs_dir: d("root"),
            limits: Default::default(),
            log_path: dir.join("init.log"),
            machine_id: "0123456789abcdef0123456789abcdef".into(),
            fork_generation: 2,
            secrets: vec![],
            secrets_owner: None,
            netns_path: None,
            resolv_conf: None,
            userns: None,
            tmp: strata_api::TmpStorage::Tmpfs,
            userns_link: None,
            link: None,
        }
    }

    fn config(dir: &Path) -> InitConfig {
        let init_binary = dir.join("strata-init");
        fs::write(&init_binary, b"binary").unwrap();
        InitConfig { spec: spec(dir), cgroup_join_files: vec![], stop_grace_secs: 10, init_binary }
    }

    #[test]
    fn namespaces_are_unshared_with_a_new_network_unless_one_is_given() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = spec(dir.path());
        let sys = RecordingSys::new();
        enter_namespaces(&sys, &spec).unwrap();
        assert_eq!(
            sys.calls().iter().map(|c| c.describe(dir.path())).collect::<Vec<_>>(),
            ["unshare NEWCGROUP|NEWIPC|NEWNET|NEWNS|NEWPID|NEWUTS"]
        );
        // Egress: the daemon's prepared namespace is joined first, and no new one made.
        let netns = dir.path().join("netns");
        fs::write(&netns, b"").unwrap();
        spec.netns_path = Some(netns);
        let sys = RecordingSys::new();
        enter_namespaces(&sys, &spec).unwrap();
        assert_eq!(
            sys.calls().iter().map(|c| c.describe(dir.path())).collect::<Vec<_>>(),
            ["setns $ROOT/netns NEWNET", "unshare NEWCGROUP|NEWIPC|NEWNS|NEWPID|NEWUTS"]
        );
        // A sandbox in a user namespace joins none of the host's namespaces.
        let mut with_userns = spec.clone();
        with_userns.userns = Some(strata_api::UserNamespace { host_base: 1_000_000_000, size: 65_536 });
        let sys = RecordingSys::new();
        assert!(enter_namespaces(&sys, &with_userns).unwrap_err().contains("makes its own network namespace"));
        assert!(sys.calls().is_empty());
        let sys = RecordingSys::new();
        sys.fail_when(|c| matches!(c, SysCall::Setns { .. }), Errno::EINVAL);
        let err = enter_namespaces(&sys, &spec).unwrap_err();
        assert_eq!(err, format!("join network namespace {}/netns: EINVAL: Invalid argument", dir.path().display()));
        assert_eq!(sys.names(), ["setns"]);
    }

    #[test]
    fn pid1_setup_runs_the_whole_sequence() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path());
        let root = cfg.spec.rootfs_dir.clone();
        fs::create_dir_all(root.join("etc")).unwrap();
        fs::write(root.join("etc/hosts"), "127.0.0.1 localhost\n").unwrap();
        cfg.spec.resolv_conf = Some("nameserver 10.0.0.53\n".into());
        cfg.spec.secrets = vec![SecretFile { name: "TOKEN".into(), data: b"t".to_vec() }];
        let sys = RecordingSys::new();
        let helper = setup_sandbox(&sys, &cfg, None).unwrap();
        // The helper mount stands for the init binary (the fake opened the file itself).
        assert_eq!(fs::read_link(format!("/proc/self/fd/{}", helper.as_raw_fd())).unwrap(), cfg.init_binary);
        let got: Vec<String> = sys.calls().iter().map(|c| c.describe(&root)).collect();
        // The root filesystem's own sequence is checked in mounts::tests; here the order of the steps.
        let at = |prefix: &str| got.iter().position(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("{prefix}"));
        assert_eq!(got[0], format!("open_tree {} 0x80001", cfg.init_binary.display()));
        assert_eq!(got[1], "mount - / - PRIVATE|REC -");
        let steps = [
            at("mount overlay $ROOT overlay"),
            at("sethostname box"),
            at("loopback_up"),
            at("pivot_root . ."),
            at("mount tmpfs $ROOT/run/strata tmpfs"),
            at("mount $ROOT/run/strata/resolv.conf $ROOT/etc/resolv.conf - BIND"),
            at("mount tmpfs $ROOT/run/secrets tmpfs"),
            at("move_mount"),
        ];
        assert!(steps.windows(2).all(|w| w[0] < w[1]), "{steps:?}\n{got:#?}");
        assert_eq!(
            got[got.len() - 2..],
            [
                format!("move_mount {} $ROOT/run/strata/init", cfg.init_binary.display()),
                "mount - $ROOT/run/strata/init - BIND|NODEV|NOSUID|RDONLY|REMOUNT -".into(),
            ]
        );
        assert_eq!(fs::read_to_string(root.join("run/strata/hostname")).unwrap(), "box\n");
        assert_eq!(fs::read_to_string(root.join("run/strata/generation")).unwrap(), "2\n");
        assert_eq!(fs::read(root.join("run/secrets/TOKEN")).unwrap(), b"t");
        assert!(root.join("run/strata/init").is_file());
    }

    #[test]
    fn pid1_setup_stops_at_the_first_failure() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());
        let sys = RecordingSys::new();
        sys.fail_when(|c| matches!(c, SysCall::Sethostname { .. }), Errno::EPERM);
        let err = setup_sandbox(&sys, &cfg, None).unwrap_err();
        assert_eq!(err, mounts::SetupError::Host("sethostname: EPERM: Operation not permitted".into()));
        assert_eq!(sys.names().last(), Some(&"sethostname"));
        assert!(!sys.names().contains(&"pivot_root"));
        // A helper binary that is gone fails first, before any mount.
        let sys = RecordingSys::new();
        let cfg = InitConfig { init_binary: dir.path().join("missing"), ..config(dir.path()) };
        let err = setup_sandbox(&sys, &cfg, None).unwrap_err();
        assert!(err.to_string().starts_with("open_tree "), "{err}");
        assert_eq!(sys.names(), ["open_tree"]);
    }
}
