//! Archive: stopped and standby sandboxes packed into the object store (local
//! directory here) with their local copy freed, restored by resume/start with
//! processes and files intact; tampered archives refused; failed uploads and
//! daemon crashes lose nothing; the archive_after policy.

mod common;

use std::time::Duration;

use common::{rt, TestDaemon};
use strata_api::{ErrorCode, SandboxState};
use strata_client::ClientError;

const COUNTER: &str = "i=0; while true; do i=$((i+1)); echo $i >> /root/log; sleep 0.05; done";

fn err_of<T: std::fmt::Debug>(r: Result<T, ClientError>) -> (u16, strata_api::ApiErrorBody) {
    match r.expect_err("expected an API error") {
        ClientError::Api { status, body } => (status, body),
        e => panic!("unexpected error {e}"),
    }
}

fn state(d: &TestDaemon, id: &str) -> strata_api::Sandbox {
    rt().block_on(d.client().get_sandbox(id)).unwrap()
}

fn count_in(text: &str) -> Vec<u64> {
    text.lines().map(|l| l.trim().parse().unwrap()).collect()
}

fn assert_contiguous(nums: &[u64]) {
    for w in nums.windows(2) {
        assert_eq!(w[1], w[0] + 1, "the counter skipped or repeated around {}", w[0]);
    }
}

/// Objects of the sandbox's archives in the local store.
fn archive_files(d: &TestDaemon, id: &str) -> Vec<std::path::PathBuf> {
    let root = d.state(&format!("archive/sandboxes/{id}"));
    let mut out = Vec::new();
    for e in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
            out.push(f.path());
        }
    }
    out
}

#[test]
fn standby_and_stopped_sandboxes_archive_and_come_back() {
    require_host!();
    if strata_runtime::namespace::criu::unsupported().is_some() && std::env::var("CI").is_err() {
        println!("skipped: {}", strata_runtime::namespace::criu::unsupported().unwrap());
        return;
    }
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[]);
    d.cli_ok(&["exec", "-d", &id, "--", "sh", "-c", COUNTER]);
    d.cli_ok(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "rm /bin/vi; mkdir -p /opt/keep && echo kept > /opt/keep/file && ln -s file /opt/keep/link",
    ]);
    std::thread::sleep(Duration::from_millis(300));
    // Running: 409 with the state.
    let (status, body) = err_of(rt().block_on(d.client().archive_sandbox(&id)));
    assert_eq!((status, body.current_state), (409, Some(SandboxState::Running)));
    assert_eq!(err_of(rt().block_on(d.client().archive_sandbox("nope"))).1.code, ErrorCode::SandboxNotFound);

    d.cli_ok(&["standby", &id]);
    d.cli_ok(&["archive", &id]);
    let sb = state(&d, &id);
    assert_eq!(sb.state, SandboxState::Archived);
    for gone in ["upper", "standby"] {
        assert!(!d.state(&format!("sandboxes/{id}/{gone}")).exists(), "{gone} was freed");
    }
    let objects = archive_files(&d, &id);
    assert_eq!(objects.len(), 3, "upper.tar, standby.tar, manifest.json: {objects:?}");

    // resume: unarchived back to standby, then the same processes resume.
    let r = rt().block_on(d.client().resume_sandbox(&id)).unwrap();
    assert_eq!((r.from, r.processes_restored), (SandboxState::Archived, true));
    let before = count_in(&d.cli_ok(&["exec", &id, "--", "cat", "/root/log"])).len();
    assert!(common::wait_until(10, || count_in(&d.cli_ok(&["exec", &id, "--", "cat", "/root/log"])).len() > before));
    assert_contiguous(&count_in(&d.cli_ok(&["exec", &id, "--", "cat", "/root/log"])));
    assert_eq!(d.cli_ok(&["exec", &id, "--", "cat", "/opt/keep/link"]), "kept\n");
    assert!(!d.cli(&["exec", &id, "--", "test", "-e", "/bin/vi"]).status.success(), "a deletion stays a deletion");
    assert!(archive_files(&d, &id).is_empty(), "a restored archive is removed from the store");

    // stopped -> archived -> start.
    d.cli_ok(&["stop", &id]);
    d.cli_ok(&["archive", &id]);
    d.cli_ok(&["start", &id]);
    assert_eq!(d.cli_ok(&["exec", &id, "--", "cat", "/opt/keep/file"]), "kept\n");
    let evs = rt().block_on(d.client().events(Some(&id), 0)).unwrap();
    assert!(evs.iter().any(|e| e.from == Some(SandboxState::Archived) && e.to == SandboxState::Standby));
    assert!(evs.iter().any(|e| e.from == Some(SandboxState::Archived) && e.to == SandboxState::Stopped));
}

#[test]
fn tampered_archives_are_refused_and_nothing_is_lost() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[]);
    d.cli_ok(&["exec", &id, "--", "sh", "-c", "echo precious > /root/data"]);
    d.cli_ok(&["stop", &id]);
    d.cli_ok(&["archive", &id]);
    let upper = archive_files(&d, &id).into_iter().find(|p| p.ends_with("upper.tar")).unwrap();
    let original = std::fs::read(&upper).unwrap();
    let mut bad = original.clone();
    bad[100] ^= 0x55;
    std::fs::write(&upper, &bad).unwrap();
    let (status, body) = err_of(rt().block_on(d.client().start_sandbox(&id)));
    assert_eq!((status, body.code), (500, ErrorCode::StandbyImageInvalid));
    assert!(body.message.contains("does not match its manifest"), "{}", body.message);
    let sb = state(&d, &id);
    assert_eq!((sb.state, sb.state_reason.as_str()), (SandboxState::Error, "archive_invalid"));
    assert!(upper.exists(), "the archive is kept");
    // Fixed store: start restores it (never an empty layer).
    std::fs::write(&upper, &original).unwrap();
    d.cli_ok(&["start", &id]);
    assert_eq!(d.cli_ok(&["exec", &id, "--", "cat", "/root/data"]), "precious\n");
}

#[test]
fn failed_uploads_and_crashes_keep_the_local_copy() {
    require_host!();
    let mut d = TestDaemon::start_with_env(&[("STRATA_FAILPOINTS", "archive-upload")]);
    d.import_busybox();
    let id = d.create(&[]);
    d.cli_ok(&["exec", &id, "--", "sh", "-c", "echo precious > /root/data"]);
    d.cli_ok(&["stop", &id]);
    let (status, body) = err_of(rt().block_on(d.client().archive_sandbox(&id)));
    assert_eq!(status, 500);
    assert!(body.message.contains("stays stopped"), "{}", body.message);
    assert_eq!(state(&d, &id).state, SandboxState::Stopped);
    assert!(d.upper(&id, "root/data").exists(), "the writable layer is kept");

    // A crash after the upload, before the archive is recorded: rolled back at restart.
    d.env = vec![("STRATA_FAILPOINTS".into(), "archive-pointer:crash".into())];
    d.kill9_and_restart();
    let _ = rt().block_on(d.client().archive_sandbox(&id));
    d.env.clear();
    d.kill9_and_restart();
    assert_eq!(state(&d, &id).state, SandboxState::Stopped);
    assert!(!d.state(&format!("sandboxes/{id}/archived.json")).exists());
    assert!(archive_files(&d, &id).is_empty(), "the unrecorded archive was removed from the store");
    d.cli_ok(&["start", &id]);
    assert_eq!(d.cli_ok(&["exec", &id, "--", "cat", "/root/data"]), "precious\n");
}

#[test]
fn archive_after_policy_archives_parked_sandboxes() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&["--archive-after", "1s"]);
    d.cli_ok(&["exec", &id, "--", "sh", "-c", "echo precious > /root/data"]);
    d.cli_ok(&["stop", &id]);
    assert!(common::wait_until(30, || state(&d, &id).state == SandboxState::Archived), "{}", d.log());
    let evs = rt().block_on(d.client().events(Some(&id), 0)).unwrap();
    assert_eq!(evs.iter().find(|e| e.to == SandboxState::Archived).unwrap().reason, "archive_after");
    // Any call that needs the files brings it back.
    assert_eq!(d.cli_ok(&["exec", &id, "--", "cat", "/root/data"]), "precious\n");
}
