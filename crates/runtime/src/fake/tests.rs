use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::spec::ExecReport;

thread_local! {
    /// Each test (its own thread) gets directories of its own, removed with the thread.
    static DIRS: tempfile::TempDir = tempfile::tempdir().expect("a temporary directory");
}

fn spec(id: &str) -> SandboxSpec {
    let base = DIRS.with(|d| d.path().join(id));
    SandboxSpec {
        id: id.into(),
        hostname: format!("{id}-host"),
        lower_dirs: vec![],
        upper_dir: base.join("up"),
        work_dir: base.join("wk"),
        rootfs_dir: base.join("root"),
        limits: Default::default(),
        log_path: base.join("log"),
        machine_id: format!("{id}-machine"),
        fork_generation: 0,
        secrets: vec![],
        secrets_owner: None,
        netns_path: None,
        resolv_conf: None,
        userns: None,
        tmp: strata_api::TmpStorage::Disk,
        userns_link: None,
        link: None,
    }
}

fn fake() -> (tempfile::TempDir, FakeRuntime) {
    let dir = tempfile::tempdir().unwrap();
    let rt = FakeRuntime::new(dir.path().join("run"));
    (dir, rt)
}

#[test]
fn handles_are_unique_and_never_a_host_process() {
    let (_d, rt) = fake();
    let a = rt.start(&spec("a")).unwrap();
    let b = rt.start(&spec("b")).unwrap();
    assert_eq!(a, SandboxHandle { init_pid: FIRST_PID, init_start_time: 1 });
    assert_eq!(b, SandboxHandle { init_pid: FIRST_PID + 1, init_start_time: 2 });
    assert!(rt.is_alive(&a) && rt.is_alive(&b));
    // Above PID_MAX_LIMIT: a host call on the pid reaches nobody.
    let r = nix::sys::signal::kill(nix::unistd::Pid::from_raw(a.init_pid), None);
    assert_eq!(r, Err(nix::errno::Errno::ESRCH));
    // A second start while the init lives is a bookkeeping bug.
    let err = rt.start(&spec("a")).unwrap_err();
    assert!(err.to_string().contains("already has a live init"), "{err}");
    // A handle the fake never gave out is not alive.
    assert!(!rt.is_alive(&SandboxHandle { init_pid: 1, init_start_time: 1 }));
}

#[test]
fn lifecycle_state_and_calls_are_tracked() {
    let (_d, rt) = fake();
    let h = rt.start(&spec("a")).unwrap();
    rt.set_frozen("a", true).unwrap();
    assert!(rt.sandbox("a").unwrap().frozen);
    assert_eq!(rt.usage("a").pids, 1);
    rt.stop("a", &h, Duration::from_secs(10)).unwrap();
    let sb = rt.sandbox("a").unwrap();
    assert!(!sb.alive && !sb.frozen && sb.stopped && sb.cgroup);
    assert!(!rt.is_alive(&h));
    rt.cleanup("a").unwrap();
    assert!(!rt.sandbox("a").unwrap().cgroup);
    // Without a cgroup there is nothing to freeze.
    assert!(matches!(rt.set_frozen("a", true), Err(RuntimeError::Cgroup(_))));
    assert_eq!(rt.ops("a"), [Op::Start, Op::SetFrozen, Op::Usage, Op::Stop, Op::IsAlive, Op::Cleanup, Op::SetFrozen]);
    assert_eq!(rt.actions("a"), [Op::Start, Op::SetFrozen, Op::Stop, Op::Cleanup, Op::SetFrozen]);
    let stop = rt.calls().into_iter().find(|c| c.op == Op::Stop).unwrap();
    assert_eq!(stop.detail, "grace=10s");
    // A new start after cleanup gets a new handle.
    let h2 = rt.start(&spec("a")).unwrap();
    assert_ne!(h, h2);
    assert!(rt.is_alive(&h2) && !rt.is_alive(&h));
}

#[test]
fn cleanup_of_a_live_sandbox_fails_like_a_busy_cgroup() {
    let (_d, rt) = fake();
    rt.start(&spec("a")).unwrap();
    let err = rt.cleanup("a").unwrap_err();
    let RuntimeError::Cgroup(CgroupError::Io { source, .. }) = &err else { panic!("{err:?}") };
    assert_eq!(source.raw_os_error(), Some(libc::EBUSY));
    // Unknown sandboxes have nothing to clean up.
    rt.cleanup("nobody").unwrap();
}

#[test]
fn injected_failures_hit_the_next_matching_call_once() {
    let (d, rt) = fake();
    let a = rt.start(&spec("a")).unwrap();
    let b = rt.start(&spec("b")).unwrap();
    rt.fail_next_for("b", Op::DumpProcesses, RuntimeError::Setup("criu said no".into()));
    rt.fail_next(Op::DumpProcesses, RuntimeError::Unsupported("no criu".into()));
    // The per-sandbox failure is queued first but only "b" matches it; "a" takes the general one.
    let err = rt.dump_processes("a", &a, &d.path().join("img-a")).unwrap_err();
    assert!(matches!(err, RuntimeError::Unsupported(ref m) if m == "no criu"), "{err:?}");
    // A failed dump leaves the processes running and writes nothing.
    assert!(rt.is_alive(&a));
    assert!(!d.path().join("img-a").join(IMAGE_FILE).exists());
    let err = rt.dump_processes("b", &b, &d.path().join("img-b")).unwrap_err();
    assert_eq!(err.to_string(), "sandbox setup failed: criu said no");
    // Once only.
    rt.dump_processes("a", &a, &d.path().join("img-a")).unwrap();
    // The failed calls are recorded too.
    assert_eq!(rt.actions("a"), [Op::Start, Op::DumpProcesses, Op::DumpProcesses]);
}

#[test]
#[should_panic(expected = "is_alive returns no Result")]
fn queries_cannot_be_made_to_fail() {
    let (_d, rt) = fake();
    rt.fail_next(Op::IsAlive, RuntimeError::Setup("x".into()));
}

#[test]
fn standby_dumps_then_restores() {
    let (d, rt) = fake();
    let h = rt.start(&spec("a")).unwrap();
    let images = d.path().join("standby");
    let helper = rt.dump_processes("a", &h, &images).unwrap();
    // Something for callers that look, and a helper that exists.
    assert!(images.join(IMAGE_FILE).is_file());
    assert_eq!(helper, rt.helper_path());
    assert!(helper.is_file());
    // The dump ended the processes: cleanup works.
    assert!(!rt.is_alive(&h));
    rt.cleanup("a").unwrap();
    assert_eq!(rt.actions("a"), [Op::Start, Op::DumpProcesses, Op::Cleanup]);
    let restored =
        rt.restore_processes(&spec("a"), &images, &images, &helper, &[(7, 99)], crate::MemoryRestore::Eager).unwrap();
    assert_ne!(restored, h);
    assert!(rt.is_alive(&restored));
    let sb = rt.sandbox("a").unwrap();
    assert!(sb.cgroup && !sb.frozen && !sb.stopped);
    let call = rt.calls().into_iter().find(|c| c.op == Op::RestoreProcesses).unwrap();
    assert!(call.detail.ends_with("inherit=1"), "{}", call.detail);
}

#[test]
fn dump_and_copy_check_the_freezer_state_the_real_tier_needs() {
    let (d, rt) = fake();
    let h = rt.start(&spec("a")).unwrap();
    rt.set_frozen("a", true).unwrap();
    let err = rt.dump_processes("a", &h, &d.path().join("x")).unwrap_err();
    assert!(err.to_string().contains("thaw it first"), "{err}");
    rt.set_frozen("a", false).unwrap();
    let err = rt.copy_processes("a", &h, &d.path().join("x")).unwrap_err();
    assert!(err.to_string().contains("not frozen"), "{err}");
    rt.set_frozen("a", true).unwrap();
    let images = d.path().join("copy");
    rt.copy_processes("a", &h, &images).unwrap();
    // A copy leaves them running and frozen.
    let sb = rt.sandbox("a").unwrap();
    assert!(sb.alive && sb.frozen);
    let image: FakeImage = serde_json::from_slice(&std::fs::read(images.join(IMAGE_FILE)).unwrap()).unwrap();
    assert_eq!(image.mode, "copy");
}

#[test]
fn a_warm_restore_brings_the_source_identity_until_reidentified() {
    let (d, rt) = fake();
    let h = rt.start(&spec("src")).unwrap();
    rt.set_frozen("src", true).unwrap();
    let images = d.path().join("ckpt");
    let helper = rt.copy_processes("src", &h, &images).unwrap();
    let work = d.path().join("restore-work");
    let child = spec("child");
    let hc = rt.restore_processes(&child, &images, &work, &helper, &[], crate::MemoryRestore::Eager).unwrap();
    assert!(work.is_dir());
    assert_eq!(rt.sandbox("child").unwrap().identity.hostname, "src-host");
    rt.reidentify(&child, &hc).unwrap();
    assert_eq!(rt.sandbox("child").unwrap().identity, FakeIdentity::of(&child));
    // The source is untouched.
    assert!(rt.is_alive(&h));
}

#[test]
fn restore_needs_images_a_helper_and_support() {
    let (d, rt) = fake();
    let empty = d.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let err = rt
        .restore_processes(&spec("a"), &empty, &empty, Path::new("/bin/sh"), &[], crate::MemoryRestore::Eager)
        .unwrap_err();
    assert!(err.to_string().contains("no fake process image"), "{err}");
    let h = rt.start(&spec("b")).unwrap();
    let images = d.path().join("img");
    rt.dump_processes("b", &h, &images).unwrap();
    let err = rt
        .restore_processes(&spec("b"), &images, &images, &d.path().join("gone"), &[], crate::MemoryRestore::Eager)
        .unwrap_err();
    assert!(err.to_string().contains("no helper binary"), "{err}");
    assert_eq!(rt.process_dump_unsupported(), None);
    rt.set_process_dump_unsupported(Some("criu is not installed".into()));
    assert_eq!(rt.process_dump_unsupported().as_deref(), Some("criu is not installed"));
    let err = rt
        .restore_processes(&spec("b"), &images, &images, &rt.helper_path(), &[], crate::MemoryRestore::Eager)
        .unwrap_err();
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err:?}");
    let h = rt.start(&spec("c")).unwrap();
    let err = rt.dump_processes("c", &h, &d.path().join("c")).unwrap_err();
    assert!(matches!(err, RuntimeError::Unsupported(_)), "{err:?}");
}

#[test]
fn a_dead_init_refuses_what_needs_it() {
    let (d, rt) = fake();
    let h = rt.start(&spec("a")).unwrap();
    assert!(rt.kill("a"));
    assert!(!rt.kill("a"));
    assert!(!rt.is_alive(&h));
    let msg = "sandbox setup failed: sandbox init is not running";
    assert_eq!(rt.exec_command("a", &h, &ExecSpec::default()).unwrap_err().to_string(), msg);
    assert_eq!(rt.dump_processes("a", &h, &d.path().join("x")).unwrap_err().to_string(), msg);
    assert_eq!(rt.reidentify(&spec("a"), &h).unwrap_err().to_string(), msg);
    assert_eq!(rt.usage("a").pids, 0);
    // Stop of a dead init is fine, as on the real tier.
    rt.stop("a", &h, Duration::ZERO).unwrap();
    rt.cleanup("a").unwrap();
}

#[test]
fn signals_count_known_processes_and_sigkill_ends_pid_1() {
    let (_d, rt) = fake();
    let h = rt.start(&spec("a")).unwrap();
    let _ = rt.exec_command("a", &h, &ExecSpec::default()).unwrap();
    assert_eq!(rt.sandbox("a").unwrap().exec_pids, [2]);
    assert_eq!(rt.signal("a", 2, libc::SIGTERM, true), 1);
    assert_eq!(rt.signal("a", 3, libc::SIGTERM, false), 0);
    assert_eq!(rt.signal("a", 1, libc::SIGTERM, false), 1);
    assert!(rt.is_alive(&h));
    assert_eq!(rt.signal("a", 1, libc::SIGKILL, false), 1);
    assert!(!rt.is_alive(&h));
    assert_eq!(rt.signal("a", 2, libc::SIGKILL, false), 0);
    let sig = rt.calls().into_iter().find(|c| c.op == Op::Signal).unwrap();
    assert_eq!(sig.detail, format!("ns_pid=2 signal={} group=true", libc::SIGTERM));
}

#[test]
fn usage_is_what_was_set() {
    let (_d, rt) = fake();
    let u = ResourceUsage { oom_kills: 1, memory_bytes: 4096, pids: 3, cpu_usec: 5 };
    rt.set_usage("a", u.clone());
    assert_eq!(rt.usage("a"), u);
    assert_eq!(rt.usage("other"), ResourceUsage::default());
}

#[test]
fn adopted_handles_are_alive_and_never_reissued() {
    let (_d, rt) = fake();
    let old = SandboxHandle { init_pid: FIRST_PID + 10, init_start_time: 50 };
    rt.adopt("a", old.clone());
    assert!(rt.is_alive(&old));
    let new = rt.start(&spec("b")).unwrap();
    assert!(new.init_pid > old.init_pid && new.init_start_time > old.init_start_time);
}

#[test]
fn the_fake_is_a_runtime_trait_object() {
    let (d, rt) = fake();
    let rt: Arc<dyn Runtime> = Arc::new(rt);
    assert_eq!(rt.name(), "fake");
    assert_eq!(rt.run_dir(), d.path().join("run"));
}

/// Runs `cmd` the way the daemon does: the report pipe's write end inherited
/// under the spawn lock and named in STRATA_REPORT_FD. Returns the report
/// lines, stdout and stderr.
fn run(mut cmd: std::process::Command, stdin: &[u8]) -> (Vec<ExecReport>, Vec<u8>, Vec<u8>) {
    use std::io::Write;
    use std::os::fd::{FromRawFd, OwnedFd};
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    // A descriptor number of two digits or more, as in a daemon with many open.
    let high = nix::fcntl::fcntl(w.as_raw_fd(), nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(100)).unwrap();
    drop(w);
    // SAFETY: fcntl returned a new descriptor that nothing else owns.
    let w = unsafe { OwnedFd::from_raw_fd(high) };
    cmd.env(crate::namespace::enter::REPORT_FD_ENV, w.as_raw_fd().to_string());
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = {
        let _g = crate::spawn_lock();
        // SAFETY: F_SETFD on a descriptor we own, inheritable only while the lock is held.
        unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETFD, 0) };
        let child = cmd.spawn().unwrap();
        drop(w);
        child
    };
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    let mut reports = String::new();
    std::fs::File::from(r).read_to_string(&mut reports).unwrap();
    let reports = reports.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    (reports, out.stdout, out.stderr)
}

#[test]
fn exec_reports_what_the_caller_expects() {
    let (_d, rt) = fake();
    let h = rt.start(&spec("a")).unwrap();
    rt.set_exec(|sandbox, exec| {
        if exec.argv.first().map(String::as_str) == Some("cat") {
            FakeExec::exited(0).echoing_stdin()
        } else {
            FakeExec::exited(3).with_stdout(format!("{sandbox} %s \\n \0 end")).with_stderr("oops\n")
        }
    });
    let ls = ExecSpec { argv: vec!["ls".into()], ..Default::default() };
    let (reports, stdout, stderr) = run(rt.exec_command("a", &h, &ls).unwrap().cmd, b"");
    assert_eq!(reports, [ExecReport::NsPid { pid: 2 }, ExecReport::Exited { code: 3 }]);
    // Bytes arrive verbatim: no printf interpretation, NUL included.
    assert_eq!(stdout, b"a %s \\n \0 end");
    assert_eq!(stderr, b"oops\n");
    let cat = ExecSpec { argv: vec!["cat".into()], ..Default::default() };
    let (reports, stdout, _) = run(rt.exec_command("a", &h, &cat).unwrap().cmd, b"hello\n");
    assert_eq!(reports, [ExecReport::NsPid { pid: 3 }, ExecReport::Exited { code: 0 }]);
    assert_eq!(stdout, b"hello\n");
    let call = rt.calls().into_iter().find(|c| c.op == Op::ExecCommand).unwrap();
    assert_eq!(call.detail, r#"argv=["ls"]"#);
}

#[test]
fn exec_can_end_by_signal_or_never_start() {
    let (_d, rt) = fake();
    let h = rt.start(&spec("a")).unwrap();
    rt.set_exec(|_, _| FakeExec::signaled(libc::SIGKILL));
    let (reports, _, _) = run(rt.exec_command("a", &h, &ExecSpec::default()).unwrap().cmd, b"");
    assert_eq!(reports, [ExecReport::NsPid { pid: 2 }, ExecReport::Signaled { signal: libc::SIGKILL }]);
    rt.set_exec(|_, _| FakeExec::spawn_error("no such file: nope"));
    let (reports, _, _) = run(rt.exec_command("a", &h, &ExecSpec::default()).unwrap().cmd, b"");
    assert_eq!(reports, [ExecReport::SpawnError { message: "no such file: nope".into() }]);
    // Without a report descriptor the command still runs (and says nothing).
    let out = rt.exec_command("a", &h, &ExecSpec::default()).unwrap().cmd.stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(127));
    assert!(out.stdout.is_empty());
}
