//! Archive: stopped and standby sandboxes packed into the object store (a
//! local directory, and an S3 server on loopback) with their local copy freed,
//! restored by resume/start with processes and files intact; tampered archives
//! refused; failed uploads and daemon crashes lose nothing; the archive_after
//! policy.

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
    objects_under(&d.state(&format!("archive/sandboxes/{id}")))
}

/// The files one level below the directories of `root` (a sandbox's archives' objects).
fn objects_under(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
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

/// An S3 server on loopback: s3s-fs (installed by scripts/setup-host.sh)
/// serving a directory whose subdirectories are its buckets.
struct S3Server {
    child: std::process::Child,
    endpoint: String,
    root: tempfile::TempDir,
}

impl S3Server {
    /// Starts one with bucket `bucket`; `None` (the test skips, saying why) where s3s-fs is missing outside CI.
    fn start(bucket: &str) -> Option<S3Server> {
        let bin = std::path::Path::new("/usr/local/bin/s3s-fs");
        if !bin.exists() {
            let why = "no S3 server: /usr/local/bin/s3s-fs is missing (scripts/setup-host.sh installs it)";
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("CI must be able to run this test, but: {why}");
            }
            println!("skipped: {why}");
            return None;
        }
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join(bucket)).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = std::process::Command::new(bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--access-key", "strata-test"])
            .args(["--secret-key", "strata-test-secret"])
            .arg(root.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let endpoint = format!("http://127.0.0.1:{port}");
        assert!(
            common::wait_until(20, || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()),
            "s3s-fs did not listen on {endpoint}"
        );
        Some(S3Server { child, endpoint, root })
    }

    /// The daemon's environment for a store in `bucket/prefix` on this server.
    fn env(&self, url: &str) -> Vec<(&'static str, String)> {
        vec![
            ("STRATA_ARCHIVE_URL", url.to_string()),
            ("AWS_ENDPOINT", self.endpoint.clone()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", "strata-test".into()),
            ("AWS_SECRET_ACCESS_KEY", "strata-test-secret".into()),
            ("AWS_DEFAULT_REGION", "us-east-1".into()),
        ]
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn archives_go_to_an_s3_server_and_come_back_checked() {
    require_criu!();
    let Some(s3) = S3Server::start("strata") else { return };
    let env = s3.env("s3://strata/archives");
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let d = TestDaemon::start_with_env(&env);
    d.import_busybox();
    let in_bucket = |id: &str| objects_under(&s3.root.path().join(format!("strata/archives/sandboxes/{id}")));

    // Standby -> archived in the bucket (nothing of it left locally) -> resumed with its processes.
    let id = d.create(&[]);
    d.cli_ok(&["exec", "-d", &id, "--", "sh", "-c", COUNTER]);
    assert!(common::wait_until(10, || d.cli_ok(&["exec", &id, "--", "cat", "/root/log"]).lines().count() > 3));
    d.cli_ok(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "head -c 3000000 /dev/urandom > /root/blob; sha256sum /root/blob > /root/blob.sum",
    ]);
    d.cli_ok(&["standby", &id]);
    d.cli_ok(&["archive", &id]);
    let sb = state(&d, &id);
    assert_eq!(sb.state, SandboxState::Archived);
    let objects = in_bucket(&id);
    let names: Vec<String> = objects.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    for want in ["upper.tar", "standby.tar", "manifest.json"] {
        assert!(names.iter().any(|n| n == want), "{want} in the bucket: {names:?}");
    }
    assert!(archive_files(&d, &id).is_empty(), "nothing went to the local store");
    assert!(!d.state(&format!("sandboxes/{id}/standby")).exists(), "the local standby image was freed");
    let events = d.cli_ok(&["events", &id]);
    assert!(events.contains("to s3://strata/archives"), "the archive event names the store: {events}");
    rt().block_on(d.client().resume_sandbox(&id)).unwrap();
    assert_eq!(d.cli_ok(&["exec", &id, "--", "sh", "-c", "sha256sum -c /root/blob.sum"]), "/root/blob: OK\n");
    let before = count_in(&d.cli_ok(&["exec", &id, "--", "cat", "/root/log"])).len();
    assert!(common::wait_until(10, || count_in(&d.cli_ok(&["exec", &id, "--", "cat", "/root/log"])).len() > before + 3));
    assert_contiguous(&count_in(&d.cli_ok(&["exec", &id, "--", "cat", "/root/log"])));
    assert!(in_bucket(&id).is_empty(), "a restored archive is removed from the bucket");

    // Stopped -> archived; an object changed in the bucket is refused by its digest, and kept.
    d.cli_ok(&["stop", &id]);
    d.cli_ok(&["archive", &id]);
    let upper = in_bucket(&id).into_iter().find(|p| p.ends_with("upper.tar")).unwrap();
    let original = std::fs::read(&upper).unwrap();
    let mut bad = original.clone();
    bad[original.len() / 2] ^= 0x55;
    std::fs::write(&upper, &bad).unwrap();
    let (status, body) = err_of(rt().block_on(d.client().start_sandbox(&id)));
    assert_eq!((status, body.code), (500, ErrorCode::StandbyImageInvalid), "{}", body.message);
    assert!(body.message.contains("does not match its manifest"), "{}", body.message);
    assert_eq!(state(&d, &id).state_reason, "archive_invalid");
    assert!(upper.exists(), "the object is kept");
    std::fs::write(&upper, &original).unwrap();
    d.cli_ok(&["start", &id]);
    assert_eq!(d.cli_ok(&["exec", &id, "--", "sh", "-c", "sha256sum -c /root/blob.sum"]), "/root/blob: OK\n");

    // The server gone: an archive fails saying so, and the sandbox keeps its files.
    d.cli_ok(&["stop", &id]);
    drop(s3);
    let out = d.cli(&["archive", &id]);
    assert!(!out.status.success(), "an archive to a server that is gone succeeded");
    assert_eq!(state(&d, &id).state, SandboxState::Stopped, "{}", common::stderr(&out));
    d.cli_ok(&["start", &id]);
    assert_eq!(d.cli_ok(&["exec", &id, "--", "sh", "-c", "sha256sum -c /root/blob.sum"]), "/root/blob: OK\n");
}
