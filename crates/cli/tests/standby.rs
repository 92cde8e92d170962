//! Pause, standby and resume: the same processes come back (pids, memory,
//! open files, API output streams), fs-only standby, resume on access, hooks,
//! corrupt and missing images, a failing dump, daemon crashes in the middle of
//! standby and resume, and many consecutive cycles.
//!
//! The workload is a counter loop: its count lives only in the shell's memory
//! and is appended to /root/log (the writable layer, readable from the host)
//! every 50 ms, so a resumed process that continues the count proves memory
//! and open files came back.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{rt, TestDaemon};
use strata_api::{ErrorCode, ExecRequest, SandboxState};
use strata_client::{ClientError, Method};

const COUNTER: &str = "i=0; while true; do i=$((i+1)); echo $i >> /root/log; echo tick$i; sleep 0.05; done";

fn err_of<T: std::fmt::Debug>(r: Result<T, ClientError>) -> (u16, strata_api::ApiErrorBody) {
    match r.expect_err("expected an API error") {
        ClientError::Api { status, body } => (status, body),
        e => panic!("unexpected error {e}"),
    }
}

fn log_path(d: &TestDaemon, id: &str) -> PathBuf {
    d.upper(id, "root/log")
}

/// The counter's last value, read from the host (no API call, so it resumes nothing).
fn last_count(d: &TestDaemon, id: &str) -> u64 {
    let text = std::fs::read_to_string(log_path(d, id)).unwrap_or_default();
    text.lines().rev().find_map(|l| l.trim().parse().ok()).unwrap_or(0)
}

/// Every line of the counter's log is the previous one plus one: nothing lost or repeated.
fn assert_log_contiguous(d: &TestDaemon, id: &str) {
    let text = std::fs::read_to_string(log_path(d, id)).unwrap();
    let nums: Vec<u64> =
        text.lines().map(|l| l.trim().parse().unwrap_or_else(|_| panic!("bad log line {l:?}"))).collect();
    for w in nums.windows(2) {
        assert_eq!(w[1], w[0] + 1, "the counter skipped or repeated around {}", w[0]);
    }
}

fn sandbox(d: &TestDaemon, id: &str) -> strata_api::Sandbox {
    rt().block_on(d.client().get_sandbox(id)).unwrap()
}

fn start_counter(d: &TestDaemon, id: &str) -> u64 {
    let p = rt()
        .block_on(d.client().start_process(
            id,
            &ExecRequest { cmd: vec!["sh".into(), "-c".into(), COUNTER.into()], ..Default::default() },
        ))
        .unwrap();
    assert!(common::wait_until(10, || last_count(d, id) >= 3), "the counter runs");
    p.id
}

fn wait_count_above(d: &TestDaemon, id: &str, n: u64) {
    assert!(
        common::wait_until(10, || last_count(d, id) > n),
        "the counter continues past {n} (it is at {})\n{}",
        last_count(d, id),
        d.log()
    );
}

#[test]
fn pause_freezes_and_unpause_thaws() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[]);
    start_counter(&d, &id);
    d.cli_ok(&["pause", &id]);
    assert_eq!(sandbox(&d, &id).state, SandboxState::Paused);
    let frozen = last_count(&d, &id);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(last_count(&d, &id), frozen, "no CPU while paused");
    let (status, body) = err_of(rt().block_on(d.client().pause_sandbox(&id)));
    assert_eq!((status, body.code, body.current_state), (409, ErrorCode::InvalidState, Some(SandboxState::Paused)));
    d.cli_ok(&["unpause", &id]);
    wait_count_above(&d, &id, frozen);
    let (status, body) = err_of(rt().block_on(d.client().unpause_sandbox(&id)));
    assert_eq!((status, body.current_state), (409, Some(SandboxState::Running)));
    assert_log_contiguous(&d, &id);
    // With resume_on_access off, a call that needs it running is a 409 with its
    // state, and it stays paused until asked.
    d.cli_ok(&["update", &id, "--resume-on-access", "false"]);
    assert!(d.cli_ok(&["inspect", &id]).contains("resume_on_access=false"));
    d.cli_ok(&["pause", &id]);
    let out = d.cli(&["exec", &id, "--", "true"]);
    let err = common::stderr(&out);
    assert!(!out.status.success() && err.contains("resume_on_access") && err.contains("409"), "{err}");
    assert_eq!(sandbox(&d, &id).state, SandboxState::Paused);
    d.cli_ok(&["update", &id, "--resume-on-access", "true"]);
    assert_eq!(d.cli_ok(&["exec", &id, "--", "echo", "woke"]), "woke\n", "resumed on access again");
    // A paused sandbox can be destroyed: its frozen processes are thawed to die.
    let init = sandbox(&d, &id).init_pid.unwrap();
    d.cli_ok(&["pause", &id]);
    d.cli_ok(&["rm", "-f", &id]);
    assert!(
        common::wait_until(10, || !std::path::Path::new(&format!("/proc/{init}")).exists()),
        "init {init} of the destroyed paused sandbox is gone"
    );
}

#[test]
fn standby_keeps_processes_memory_and_output_streams() {
    require_criu!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[]);
    let pid = start_counter(&d, &id);
    // Memory-only state in a second process: a value set once, read back later.
    d.cli_ok(&["exec", "-d", &id, "--", "sh", "-c", "secret=$(cat /proc/sys/kernel/random/uuid); echo $secret > /root/secret; while true; do sleep 0.05; echo $secret > /tmp/again; done"]);
    assert!(
        common::wait_until(10, || common::stdout(&d.cli(&["exec", &id, "--", "cat", "/tmp/again"])).trim().len() == 36)
    );
    let secret = d.cli_ok(&["exec", &id, "--", "cat", "/root/secret"]);
    let ns_pid_before = rt().block_on(d.client().get_process(&id, pid)).unwrap().pid;

    let old_init = sandbox(&d, &id).init_pid.unwrap();
    d.cli_ok(&["standby", &id]);
    let sb = sandbox(&d, &id);
    assert_eq!(sb.state, SandboxState::Standby);
    // The dumped init is reaped, not left as a zombie of the daemon.
    assert!(
        common::wait_until(10, || !std::path::Path::new(&format!("/proc/{old_init}")).exists()),
        "init {old_init} was reaped"
    );
    let info = sb.standby.expect("standby info");
    assert_eq!(info.mode, strata_api::StandbyMode::Processes);
    assert!(info.image_bytes > 0 && info.api_processes == 2, "{info:?}");
    assert!(sb.init_pid.is_none(), "no processes while in standby");
    let parked = last_count(&d, &id);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(last_count(&d, &id), parked, "nothing runs in standby");
    // Its memory is released: the sandbox's cgroups are gone.
    assert!(
        !std::path::Path::new(&format!("/sys/fs/cgroup/memory/strata/{id}")).exists()
            && !std::path::Path::new(&format!("/sys/fs/cgroup/strata/{id}")).exists()
    );
    // Standby again: 409 with the state.
    let (status, body) = err_of(rt().block_on(d.client().standby_sandbox(&id, false)));
    assert_eq!((status, body.current_state), (409, Some(SandboxState::Standby)));

    let r = rt().block_on(d.client().resume_sandbox(&id)).unwrap();
    assert!(r.processes_restored && r.from == SandboxState::Standby);
    assert_eq!(r.sandbox.state, SandboxState::Running);
    wait_count_above(&d, &id, parked);
    assert_log_contiguous(&d, &id);
    // Same process (same pid inside), still running, still streaming its output to the daemon.
    let p = rt().block_on(d.client().get_process(&id, pid)).unwrap();
    assert_eq!(p.pid, ns_pid_before);
    assert_eq!(p.status, strata_api::ProcessStatus::Running);
    let logs = d.cli_ok(&["proc", "logs", &id, &pid.to_string()]);
    let after = last_count(&d, &id);
    assert!(
        common::wait_until(10, || d
            .cli_ok(&["proc", "logs", &id, &pid.to_string()])
            .contains(&format!("tick{}", after + 1))),
        "output after resume reaches the daemon: {}",
        &logs[logs.len().saturating_sub(200)..]
    );
    // The memory-only value survived.
    assert_eq!(d.cli_ok(&["exec", &id, "--", "cat", "/tmp/again"]), secret);
    // Signals reach the resumed process (by its new host pid) and its exit is reported.
    d.cli_ok(&["proc", "kill", &id, &pid.to_string()]);
    let p = rt().block_on(d.client().wait(&id, pid, Some("10s"))).unwrap();
    assert_eq!(p.signal, Some(15), "{p:?}");
    // The image is spent after a resume.
    assert!(!d.state(&format!("sandboxes/{id}/standby")).exists());
    let evs = rt().block_on(d.client().events(Some(&id), 0)).unwrap();
    let standby_ev = evs.iter().find(|e| e.to == SandboxState::Standby).expect("standby event");
    assert_eq!(standby_ev.reason, "user");
    assert!(evs
        .iter()
        .any(|e| e.from == Some(SandboxState::Standby) && e.to == SandboxState::Running && e.reason == "user"));
}

#[test]
fn resume_on_access_and_fs_only_standby() {
    require_criu!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[]);
    start_counter(&d, &id);
    // Each sandbox boot has its own boot id (the kernel's is the host's).
    let boot_id = |id: &str| d.cli_ok(&["exec", id, "--", "cat", "/proc/sys/kernel/random/boot_id"]).trim().to_string();
    let booted = boot_id(&id);
    let host = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_eq!(booted.len(), 36, "{booted}");
    assert_ne!(booted, host.trim(), "a sandbox does not show the host's boot id");
    d.cli_ok(&["standby", &id]);
    // An exec resumes the sandbox transparently and says so.
    let resp = rt()
        .block_on(
            d.client().send(
                Method::POST,
                &format!("/v1/sandboxes/{id}/exec"),
                serde_json::to_vec(&ExecRequest { cmd: vec!["echo".into(), "hi".into()], ..Default::default() })
                    .unwrap()
                    .into(),
                "application/json",
            ),
        )
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers().get("strata-resumed-from").unwrap(), "standby");
    assert!(resp.headers().get("strata-resume-ms").unwrap().to_str().unwrap().parse::<u64>().is_ok());
    let evs = rt().block_on(d.client().events(Some(&id), 0)).unwrap();
    assert!(evs.iter().any(|e| e.reason == "resume_on_access" && e.to == SandboxState::Running), "{evs:?}");
    let n = last_count(&d, &id);
    wait_count_above(&d, &id, n);
    assert_eq!(boot_id(&id), booted, "processes restored: the same boot");
    // A file read resumes a paused sandbox.
    d.cli_ok(&["pause", &id]);
    assert!(d.cli_ok(&["fs", "ls", &id, "/root"]).contains("log"));
    assert_eq!(sandbox(&d, &id).state, SandboxState::Running);

    // fs-only: processes are stopped (recorded), the filesystem kept; resume starts init afresh.
    d.cli_ok(&["standby", "--fs-only", &id]);
    let sb = sandbox(&d, &id);
    let info = sb.standby.expect("standby info");
    assert_eq!(info.mode, strata_api::StandbyMode::FsOnly);
    assert!(info.note.unwrap().contains("not kept"));
    let r = rt().block_on(d.client().resume_sandbox(&id)).unwrap();
    assert!(!r.processes_restored);
    let parked = last_count(&d, &id);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(last_count(&d, &id), parked, "fs-only standby does not bring processes back");
    assert!(d.cli_ok(&["exec", &id, "--", "cat", "/root/log"]).lines().count() as u64 >= parked);
    assert_ne!(boot_id(&id), booted, "a filesystem-only resume is a reboot: a new boot id");
    let procs = rt().block_on(d.client().list_processes(&id)).unwrap();
    assert!(procs.iter().all(|p| p.status == strata_api::ProcessStatus::Exited), "{procs:?}");
}

#[test]
fn hooks_run_before_standby_and_after_resume() {
    require_criu!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[
        "--hook-before-standby",
        "date +%s%N > /root/flushed",
        "--hook-after-resume",
        "echo back >> /root/resumed; exit 3",
        "--hook-timeout",
        "5s",
    ]);
    d.cli_ok(&["standby", &id]);
    assert!(d.upper(&id, "root/flushed").exists(), "before_standby ran while the processes were still up");
    d.cli_ok(&["resume", &id]);
    assert_eq!(std::fs::read_to_string(d.upper(&id, "root/resumed")).unwrap(), "back\n");
    let evs = rt().block_on(d.client().events(Some(&id), 0)).unwrap();
    assert!(
        evs.iter().any(|e| e.reason == "hook_ok" && e.detail.as_deref().unwrap_or("").starts_with("before_standby")),
        "{evs:?}"
    );
    // A failing hook is recorded and does not block the transition.
    assert!(
        evs.iter().any(|e| e.reason == "hook_failed" && e.detail.as_deref().unwrap_or("").contains("exit code 3")),
        "{evs:?}"
    );
    assert_eq!(sandbox(&d, &id).state, SandboxState::Running);
    // Bad hook definitions are refused.
    let out = d.cli(&["update", &id, "--hook-timeout", "soon", "--hook-before-stop", "true"]);
    assert!(!out.status.success() && common::stderr(&out).contains("bad_request"), "{}", common::stderr(&out));
}

#[test]
fn corrupt_or_missing_images_mark_the_sandbox_error_and_keep_its_files() {
    require_criu!();
    let d = TestDaemon::start();
    d.import_busybox();
    let a = d.create(&[]);
    let b = d.create(&[]);
    for id in [&a, &b] {
        start_counter(&d, id);
        d.cli_ok(&["standby", id]);
    }
    // a: flip a byte in the biggest image file.
    let dir = d.state(&format!("sandboxes/{a}/standby"));
    let biggest = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name() != "manifest.json")
        .max_by_key(|e| e.metadata().unwrap().len())
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&biggest).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&biggest, bytes).unwrap();
    let (status, body) = err_of(rt().block_on(d.client().resume_sandbox(&a)));
    assert_eq!((status, body.code), (500, ErrorCode::StandbyImageInvalid));
    assert!(
        body.message.contains("corrupt") && body.message.contains(biggest.file_name().unwrap().to_str().unwrap()),
        "{}",
        body.message
    );
    let sb = sandbox(&d, &a);
    assert_eq!(sb.state, SandboxState::Error);
    assert_eq!(sb.state_reason, "standby_image_invalid");
    assert!(dir.exists() && log_path(&d, &a).exists(), "nothing is deleted");
    // b: the image is gone.
    std::fs::remove_dir_all(d.state(&format!("sandboxes/{b}/standby"))).unwrap();
    let (status, body) = err_of(rt().block_on(d.client().resume_sandbox(&b)));
    assert_eq!((status, body.code), (500, ErrorCode::StandbyImageInvalid));
    assert!(body.message.contains("missing"), "{}", body.message);
    assert_eq!(sandbox(&d, &b).state, SandboxState::Error);
    // Either can be started afresh on its kept filesystem.
    d.cli_ok(&["start", &b]);
    assert!(d.cli_ok(&["exec", &b, "--", "cat", "/root/log"]).lines().count() > 2);
    // Unknown ids: 404.
    let (status, body) = err_of(rt().block_on(d.client().standby_sandbox("no-such-sandbox", false)));
    assert_eq!((status, body.code), (404, ErrorCode::SandboxNotFound));
    // Destroyed: 409 with state `destroyed` (its id is remembered), for resume and
    // destroy too; reads of it are 404 (it has nothing left to show); stopped: 409.
    d.cli_ok(&["rm", "-f", &b]);
    let (status, body) = err_of(rt().block_on(d.client().standby_sandbox(&b, false)));
    assert_eq!((status, body.code, body.current_state), (409, ErrorCode::InvalidState, Some(SandboxState::Destroyed)));
    assert!(body.message.contains("destroyed"), "{}", body.message);
    assert_eq!(err_of(rt().block_on(d.client().resume_sandbox(&b))).1.current_state, Some(SandboxState::Destroyed));
    let out = d.cli(&["rm", "-f", &b]);
    assert!(common::stderr(&out).contains("invalid_state"), "{}", common::stderr(&out));
    assert_eq!(err_of(rt().block_on(d.client().get_sandbox(&b))).0, 404);
    let c = d.create(&[]);
    d.cli_ok(&["stop", &c]);
    let (status, body) = err_of(rt().block_on(d.client().standby_sandbox(&c, false)));
    assert_eq!((status, body.current_state), (409, Some(SandboxState::Stopped)));
}

#[test]
fn a_failed_dump_leaves_the_sandbox_running() {
    require_criu!();
    let d = TestDaemon::start_with_env(&[("STRATA_FAILPOINTS", "standby-dump")]);
    d.import_busybox();
    let id = d.create(&[]);
    let pid = start_counter(&d, &id);
    let (status, body) = err_of(rt().block_on(d.client().standby_sandbox(&id, false)));
    assert_eq!(status, 500);
    assert!(body.message.contains("keeps running") && body.message.contains("No space left"), "{}", body.message);
    assert_eq!(sandbox(&d, &id).state, SandboxState::Running);
    let n = last_count(&d, &id);
    wait_count_above(&d, &id, n);
    assert_eq!(rt().block_on(d.client().get_process(&id, pid)).unwrap().status, strata_api::ProcessStatus::Running);
    assert!(
        !d.state(&format!("sandboxes/{id}/standby.tmp")).exists()
            && !d.state(&format!("sandboxes/{id}/standby")).exists()
    );
}

/// Resumes sandbox `id` (in standby) with a daemon (given `env` too) that
/// crashes once the processes are restored, before it records the resume;
/// the restarted daemon must have completed it.
fn resume_across_a_crash(d: &mut TestDaemon, id: &str, env: &[(&str, &str)]) {
    d.env = vec![("STRATA_FAILPOINTS".into(), "resume-restored:crash".into())];
    d.env.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    d.kill9_and_restart();
    let _ = rt().block_on(d.client().resume_sandbox(id));
    d.env.clear();
    d.kill9_and_restart();
    let sb = sandbox(d, id);
    assert_eq!((sb.state, sb.state_reason.as_str()), (SandboxState::Running, "resume_completed"));
}

#[test]
fn daemon_crashes_during_standby_and_resume_lose_nothing() {
    require_criu!();
    // Crash after the image is complete but before standby is recorded.
    let mut d = TestDaemon::start_with_env(&[("STRATA_FAILPOINTS", "standby-published:crash")]);
    d.import_busybox();
    let id = d.create(&[]);
    start_counter(&d, &id);
    let _ = rt().block_on(d.client().standby_sandbox(&id, false));
    d.env.clear();
    d.kill9_and_restart();
    let sb = sandbox(&d, &id);
    assert_eq!((sb.state, sb.state_reason.as_str()), (SandboxState::Standby, "standby_completed"));
    let parked = last_count(&d, &id);

    // Crash after the processes are restored (memory eagerly) but before the
    // resume is recorded: the resume is completed.
    resume_across_a_crash(&mut d, &id, &[("STRATA_LAZY_RESTORE", "off")]);
    wait_count_above(&d, &id, parked);
    assert_log_contiguous(&d, &id);

    // The same crash with memory restored lazily: the fill daemon, left
    // behind, finishes on its own and records it; the restarted daemon
    // completes the resume and follows the fill to its end.
    if strata_runtime::namespace::lazy::unsupported(true).is_none() {
        d.cli_ok(&["standby", &id]);
        let parked = last_count(&d, &id);
        resume_across_a_crash(&mut d, &id, &[]);
        assert!(
            common::wait_until(30, || {
                rt().block_on(d.client().events(Some(&id), 0)).unwrap().iter().any(|e| e.reason == "memory_resident")
            }),
            "{}",
            d.log()
        );
        wait_count_above(&d, &id, parked);
        assert_log_contiguous(&d, &id);
    }

    // A plain kill -9 with a sandbox in standby: still resumable.
    d.cli_ok(&["standby", &id]);
    d.kill9_and_restart();
    assert_eq!(sandbox(&d, &id).state, SandboxState::Standby);
    d.cli_ok(&["resume", &id]);
    let n = last_count(&d, &id);
    wait_count_above(&d, &id, n);
    assert_log_contiguous(&d, &id);
}

#[test]
fn many_standby_resume_cycles_keep_every_file_and_the_count() {
    require_criu!();
    // 1,000 in CI (the figure); STRATA_STANDBY_CYCLES to change it.
    let cycles: u32 = std::env::var("STRATA_STANDBY_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[]);
    // Writes one new file per tick and appends to the log.
    let p = rt()
        .block_on(d.client().start_process(&id, &ExecRequest { cmd: vec!["sh".into(), "-c".into(), "mkdir -p /root/files; i=0; while true; do i=$((i+1)); echo $i > /root/files/$i; echo $i >> /root/log; sleep 0.01; done".into()], ..Default::default() }))
        .unwrap();
    assert!(common::wait_until(10, || last_count(&d, &id) >= 3));
    // And ~5 MiB of random bytes held in memory, checked every 100 cycles: with
    // lazy restore (the default here) every standby but the checked ones
    // follows its resume at once, while pages may still be coming in.
    let held = common::start_held(&d, &id, 4 << 20);
    let c = d.client();
    let runtime = rt();
    for i in 0..cycles {
        runtime.block_on(c.standby_sandbox(&id, false)).unwrap_or_else(|e| panic!("standby #{i}: {e}\n{}", d.log()));
        runtime.block_on(c.resume_sandbox(&id)).unwrap_or_else(|e| panic!("resume #{i}: {e}\n{}", d.log()));
        // (Not twice in a row at the end: a second SIGUSR1 right after the first
        // trap may wait for the shell's next command, which never comes.)
        if i % 100 == 99 && i + 1 < cycles {
            common::assert_intact(&d, &id, &held, &format!("after cycle {}", i + 1));
        }
    }
    common::assert_intact(&d, &id, &held, &format!("after {cycles} cycles"));
    let lazy = runtime
        .block_on(c.events(Some(&id), 0))
        .unwrap()
        .iter()
        .filter(|e| e.detail.as_deref().is_some_and(|d| d.contains("memory restored lazily")))
        .count();
    if strata_runtime::namespace::lazy::unsupported(true).is_none() {
        assert_eq!(lazy, cycles as usize, "every resume was lazy");
    }
    let n = last_count(&d, &id);
    wait_count_above(&d, &id, n);
    d.cli_ok(&["pause", &id]);
    assert_log_contiguous(&d, &id);
    let last = last_count(&d, &id);
    let files = d.upper(&id, "root/files");
    for k in 1..=last {
        let content =
            std::fs::read_to_string(files.join(k.to_string())).unwrap_or_else(|e| panic!("file {k} of {last}: {e}"));
        assert_eq!(content.trim(), k.to_string(), "file {k}");
    }
    let info = runtime.block_on(c.get_process(&id, p.id)).unwrap();
    assert_eq!(info.status, strata_api::ProcessStatus::Running, "the writer survived {cycles} cycles");
    println!(
        "{cycles} standby/resume cycles ({lazy} lazy): counter at {last}, {last} files intact, held memory intact"
    );
}

#[test]
fn idle_sandboxes_go_to_standby_and_come_back_on_access() {
    require_criu!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&["--on-idle", "standby", "--idle-timeout", "2s"]);
    // A background writer that is not an API process (started by a finished exec) keeps nothing awake.
    d.cli_ok(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "(i=0; while true; do i=$((i+1)); echo $i >> /root/log; sleep 0.05; done) >/dev/null 2>&1 &",
    ]);
    assert!(
        common::wait_until(30, || sandbox(&d, &id).state == SandboxState::Standby),
        "idle sandbox went to standby\n{}",
        d.log()
    );
    let evs = rt().block_on(d.client().events(Some(&id), 0)).unwrap();
    let ev = evs.iter().find(|e| e.to == SandboxState::Standby).unwrap();
    assert_eq!(ev.reason, "idle_timeout");
    let parked = last_count(&d, &id);
    assert_eq!(d.cli_ok(&["exec", &id, "--", "echo", "served"]), "served\n");
    wait_count_above(&d, &id, parked);
    assert_log_contiguous(&d, &id);
}

#[test]
fn a_failed_restore_keeps_the_image_and_can_be_retried() {
    require_criu!();
    let mut d = TestDaemon::start_with_env(&[("STRATA_FAILPOINTS", "standby-restore")]);
    d.import_busybox();
    let id = d.create(&[]);
    start_counter(&d, &id);
    d.cli_ok(&["standby", &id]);
    let (status, _) = err_of(rt().block_on(d.client().resume_sandbox(&id)));
    assert_eq!(status, 500);
    let sb = sandbox(&d, &id);
    assert_eq!((sb.state, sb.state_reason.as_str()), (SandboxState::Error, "resume_failed"));
    assert!(d.state(&format!("sandboxes/{id}/standby/manifest.json")).exists(), "the image is kept");
    let parked = last_count(&d, &id);
    d.env.clear();
    d.kill9_and_restart();
    let r = rt().block_on(d.client().resume_sandbox(&id)).unwrap();
    assert!(r.processes_restored && r.from == SandboxState::Error);
    wait_count_above(&d, &id, parked);
    assert_log_contiguous(&d, &id);
}

#[test]
fn a_non_root_server_with_open_connections_survives_standby() {
    require_criu!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[]);
    // A TCP server run by an unprivileged user (CRIU then needs the rlimit and
    // socket-option fixes that scripts/setup-host.sh applies on this kernel).
    d.cli_ok(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "mkdir -p /srv && echo hello-from-before > /srv/index.html && chmod -R a+rX /srv",
    ]);
    d.cli_ok(&["exec", "-d", "--user", "user", &id, "--", "httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/srv"]);
    // An idle established connection held open by a client across the standby.
    d.cli_ok(&[
        "exec",
        "-d",
        &id,
        "--",
        "sh",
        "-c",
        "sleep 0.3; (echo 'GET /index.html HTTP/1.0'; sleep 3; echo) | nc 127.0.0.1 8080 > /root/late-reply",
    ]);
    let fetch = || common::stdout(&d.cli(&["exec", &id, "--", "wget", "-qO-", "http://127.0.0.1:8080/index.html"]));
    assert!(common::wait_until(10, || fetch() == "hello-from-before\n"), "the server answers");
    std::thread::sleep(Duration::from_millis(500));
    d.cli_ok(&["standby", &id]);
    d.cli_ok(&["resume", &id]);
    assert_eq!(fetch(), "hello-from-before\n", "the same server answers after resume");
    let owner = d.cli_ok(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "for p in /proc/[0-9]*; do if [ \"$(cat $p/comm)\" = httpd ]; then stat -c %U $p; fi; done",
    ]);
    assert!(
        !owner.trim().is_empty() && owner.lines().all(|l| l == "user"),
        "httpd (and the child serving the open connection) run as user: {owner:?}"
    );
    assert!(
        common::wait_until(10, || std::fs::read_to_string(d.upper(&id, "root/late-reply"))
            .is_ok_and(|r| r.contains("hello-from-before"))),
        "the connection opened before standby was answered after it"
    );
}
