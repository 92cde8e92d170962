//! Secrets: injected as files on a read-only tmpfs at /run/secrets (and
//! optionally as env vars), redacted from output, logs and events, and never
//! written into checkpoints, exports, forks, templates, standby images or
//! archives. Every artifact is searched for the value — a random 32-byte
//! secret (hex), so a false positive is impossible — raw, base64-encoded, and
//! inside gzip files (CRIU writes tmpfs contents as `tmpfs-dev-*.tar.gz`).

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine;
use common::{rt, TestDaemon};
use strata_api::{CreateSandboxRequest, ErrorCode, ExecRequest, SandboxState, SecretSpec};
use strata_client::ClientError;

/// 32 random bytes, hex-encoded (64 characters).
fn random_secret() -> String {
    let mut b = [0u8; 32];
    std::fs::File::open("/dev/urandom").unwrap().read_exact(&mut b).unwrap();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn err_of<T: std::fmt::Debug>(r: Result<T, ClientError>) -> (u16, strata_api::ApiErrorBody) {
    match r.expect_err("expected an API error") {
        ClientError::Api { status, body } => (status, body),
        e => panic!("unexpected error {e}"),
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The bytes of a file's allocated extents (SEEK_DATA/SEEK_HOLE): sandbox disk
/// images and the disk pool's templates are sparse and gigabytes large, but
/// only their written blocks can hold anything (raw blocks are scanned too, so
/// deleted files count). Every file is read this way.
fn read_allocated(p: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::fd::AsRawFd;
    let mut f = std::fs::File::open(p)?;
    let len = f.metadata()?.len() as i64;
    let mut out = Vec::new();
    let mut pos = 0i64;
    while pos < len {
        // SAFETY: lseek on an open descriptor.
        let data = unsafe { libc::lseek(f.as_raw_fd(), pos, libc::SEEK_DATA) };
        if data < 0 {
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(f.as_raw_fd(), data, libc::SEEK_HOLE) };
        let end = if hole < 0 { len } else { hole };
        f.seek(SeekFrom::Start(data as u64))?;
        let mut chunk = Vec::new();
        (&mut f).take((end - data) as u64).read_to_end(&mut chunk)?;
        // Keep the chunks apart so no false match spans a hole.
        out.extend_from_slice(&chunk);
        out.push(0);
        pos = end;
    }
    Ok(out)
}

/// Every file under `root` (symlinks not followed, `exclude` skipped) whose
/// bytes — or, for gzip files, decompressed bytes — contain one of `needles`.
fn files_containing(root: &Path, needles: &[Vec<u8>], exclude: Option<&Path>) -> Vec<PathBuf> {
    let mut hits = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            if exclude.is_some_and(|x| p.starts_with(x)) {
                continue;
            }
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                // A live sandbox's mounted root would show the running tree, not stored state.
                if p.file_name().is_some_and(|n| n == "rootfs") {
                    continue;
                }
                stack.push(p);
            } else if ft.is_file() {
                let Ok(mut bytes) = read_allocated(&p) else { continue };
                if bytes.starts_with(&[0x1f, 0x8b]) {
                    let out = Command::new("gzip").arg("-dc").arg(&p).output().unwrap();
                    bytes.extend_from_slice(&out.stdout);
                }
                if needles.iter().any(|n| contains(&bytes, n)) {
                    hits.push(p);
                }
            }
        }
    }
    hits
}

/// The raw value and its base64 form.
fn needles(secret: &str) -> Vec<Vec<u8>> {
    vec![secret.as_bytes().to_vec(), base64::engine::general_purpose::STANDARD.encode(secret).into_bytes()]
}

/// Asserts that nothing under the daemon's state directory but its secrets
/// store (nor its log) holds the secret.
fn assert_nowhere(d: &TestDaemon, secret: &str, when: &str) {
    let store = d.state("secrets");
    let hits = files_containing(&d.state_dir, &needles(secret), Some(&store));
    assert!(hits.is_empty(), "{when}: the secret was found in {hits:?}");
    assert!(!contains(d.log().as_bytes(), secret.as_bytes()), "{when}: the secret is in the daemon's log");
}

fn exec_out(d: &TestDaemon, id: &str, script: &str) -> String {
    d.cli_ok(&["exec", id, "--", "sh", "-c", script])
}

/// `/run/secrets/API_TOKEN` holds `secret`, read-only (0400 in a 0500
/// directory, root's), and its value is redacted in output.
fn assert_the_file_inside(d: &TestDaemon, id: &str, secret: &str) {
    assert_eq!(exec_out(d, id, "rev /run/secrets/API_TOKEN"), rev(secret));
    assert_eq!(exec_out(d, id, "cat /run/secrets/API_TOKEN"), "***");
    assert_eq!(exec_out(d, id, "stat -c '%a %u' /run/secrets/API_TOKEN /run/secrets"), "400 0\n500 0\n");
    assert!(
        !d.cli(&["exec", id, "--", "sh", "-c", "echo x > /run/secrets/API_TOKEN"]).status.success(),
        "the secrets tmpfs is read-only"
    );
}

fn rev(s: &str) -> String {
    s.chars().rev().collect()
}

#[test]
fn the_search_finds_a_value_in_plain_and_gzip_files() {
    // The control for every absence asserted below.
    let dir = tempfile::tempdir().unwrap();
    let secret = random_secret();
    std::fs::write(dir.path().join("plain"), format!("x{secret}y")).unwrap();
    std::fs::write(dir.path().join("b64"), base64::engine::general_purpose::STANDARD.encode(&secret)).unwrap();
    std::fs::write(dir.path().join("packed"), &secret).unwrap();
    assert!(Command::new("gzip").arg(dir.path().join("packed")).status().unwrap().success());
    let mut hits = files_containing(dir.path(), &needles(&secret), None);
    hits.sort();
    assert_eq!(hits, vec![dir.path().join("b64"), dir.path().join("packed.gz"), dir.path().join("plain")]);
    assert!(files_containing(dir.path(), &needles(&random_secret()), None).is_empty());
}

#[test]
fn secrets_are_files_redacted_and_kept_out_of_every_artifact() {
    require_criu!();
    let mut d = TestDaemon::start();
    d.import_busybox();
    let secret = random_secret();
    let file = common::write_file(d.dir.path(), "token", secret.as_bytes());
    let id = d.create(&["--name", "s1", "--secret", &format!("API_TOKEN=@{}", file.display())]);
    std::fs::remove_file(&file).unwrap();

    // Inside: a read-only file of the right content, redacted on the way out.
    assert_the_file_inside(&d, &id, &secret);
    // A value split across two writes (two reads by the daemon) is still caught.
    assert_eq!(
        exec_out(&d, &id, "head -c 20 /run/secrets/API_TOKEN; sleep 0.2; tail -c +21 /run/secrets/API_TOKEN; echo"),
        "***\n"
    );
    // Run to completion over the API, the argv of the process record, and a background process's log.
    let r = rt()
        .block_on(d.client().exec(
            &id,
            &ExecRequest {
                cmd: vec!["sh".into(), "-c".into(), format!("cat /run/secrets/API_TOKEN >&2; echo {secret}")],
                ..Default::default()
            },
        ))
        .unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    assert_eq!(b64.decode(&r.stdout_b64).unwrap(), b"***\n");
    assert_eq!(b64.decode(&r.stderr_b64).unwrap(), b"***");
    assert_eq!(r.process.cmd[2], "cat /run/secrets/API_TOKEN >&2; echo ***");
    let bg = d.cli_ok(&["exec", "-d", &id, "--", "cat", "/run/secrets/API_TOKEN"]).trim().to_string();
    assert!(
        common::wait_until(10, || d.cli_ok(&["proc", "logs", &id, &bg]) == "***"),
        "the log is redacted: {}",
        d.cli_ok(&["proc", "logs", &id, &bg])
    );
    // The file API does not serve them, and a tar of a directory above them leaves them out.
    let (status, body) = err_of(rt().block_on(d.client().download(&id, "/run/secrets/API_TOKEN", false)));
    assert_eq!((status, body.code), (400, ErrorCode::BadRequest), "{}", body.message);
    assert_eq!(err_of(rt().block_on(d.client().download(&id, "/run/secrets", true))).0, 400);
    let tar = rt().block_on(d.client().download(&id, "/run", true)).unwrap();
    assert!(!contains(&tar, secret.as_bytes()), "a tar of /run holds the secret");
    let names: Vec<String> = tar::Archive::new(&tar[..])
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().any(|n| n.contains("run/strata")) && !names.iter().any(|n| n.contains("secrets")),
        "/run: {names:?}"
    );
    // The sandbox shows names, never values.
    let sb = rt().block_on(d.client().get_sandbox(&id)).unwrap();
    assert_eq!(sb.secrets, vec![strata_api::SecretRef { name: "API_TOKEN".into(), env: false, bytes: 64 }]);
    assert!(!d.cli_ok(&["inspect", &id, "--json"]).contains(&secret));

    // Checkpoint, diff, export: the tmpfs is not part of the writable layer.
    d.cli_ok(&["exec", &id, "--", "sh", "-c", "echo kept > /root/kept"]);
    let diff = d.cli_ok(&["diff", &id]);
    assert!(diff.contains("/root/kept") && !diff.contains("secrets"), "{diff}");
    d.cli_ok(&["checkpoint", &id, "--name", "c1"]);
    let export = d.dir.path().join("export.tar");
    d.cli_ok(&["export", &id, "-o", export.to_str().unwrap()]);
    assert!(files_containing(&export, &needles(&secret), None).is_empty(), "the export holds the secret");
    assert_nowhere(&d, &secret, "after a checkpoint");

    // A fork and a template start without the parent's secrets.
    let child = d.cli_ok(&["fork", "c1", "-n", "1"]).trim().to_string();
    assert_eq!(
        exec_out(&d, &child, "cat /root/kept; test -e /run/secrets/API_TOKEN && echo leaked; echo end"),
        "kept\nend\n"
    );
    assert!(rt().block_on(d.client().get_sandbox(&child)).unwrap().secrets.is_empty());
    d.cli_ok(&["template", "create", "t1", "--from", "c1"]);
    let from_tpl = d.cli_ok(&["create", "t1"]).trim().to_string();
    assert_eq!(exec_out(&d, &from_tpl, "ls /run/secrets 2>/dev/null; echo end"), "end\n");
    assert_nowhere(&d, &secret, "after a fork and a template");

    // Standby: the secrets tmpfs is external to the image, even with a process holding the file open.
    let holder = d
        .cli_ok(&[
            "exec",
            "-d",
            &id,
            "--",
            "sh",
            "-c",
            "exec 3</run/secrets/API_TOKEN; while true; do sleep 0.05; done",
        ])
        .trim()
        .to_string();
    assert!(common::wait_until(10, || exec_out(&d, &id, "ls -l /proc/*/fd/3 2>/dev/null; true")
        .contains("/run/secrets/API_TOKEN")));
    d.cli_ok(&["standby", &id]);
    assert_eq!(rt().block_on(d.client().get_sandbox(&id)).unwrap().state, SandboxState::Standby);
    assert!(d.state(&format!("sandboxes/{id}/standby")).is_dir());
    assert_nowhere(&d, &secret, "in standby");

    // Resume re-injects it; the held descriptor points at it again.
    d.cli_ok(&["resume", &id]);
    assert_eq!(exec_out(&d, &id, "rev /run/secrets/API_TOKEN"), rev(&secret));
    assert_eq!(exec_out(&d, &id, "cat /run/secrets/API_TOKEN"), "***");
    let holder_pid = rt().block_on(d.client().get_process(&id, holder.parse().unwrap())).unwrap().pid.unwrap();
    assert_eq!(exec_out(&d, &id, &format!("rev /proc/{holder_pid}/fd/3")), rev(&secret));

    // Archive (from standby) and back, across a daemon restart (the store is read from disk).
    d.cli_ok(&["standby", &id]);
    d.kill9_and_restart();
    d.cli_ok(&["archive", &id]);
    assert_eq!(rt().block_on(d.client().get_sandbox(&id)).unwrap().state, SandboxState::Archived);
    assert_nowhere(&d, &secret, "archived");
    assert_eq!(exec_out(&d, &id, "rev /run/secrets/API_TOKEN"), rev(&secret));

    // Events, audit, logs: names at most, never the value.
    for args in [&["events", "--json"][..], &["audit", "--json", "--limit", "1000"][..]] {
        assert!(!d.cli_ok(args).contains(&secret), "{args:?} shows the secret");
    }
    // Destroying the sandbox removes its secrets from the store.
    let stored = d.state(&format!("secrets/{id}.json"));
    assert!(stored.is_file());
    d.cli_ok(&["rm", "-f", &id]);
    assert!(!stored.exists());
    assert_nowhere(&d, &secret, "at the end");
}

#[test]
fn env_secrets_reach_processes_and_keep_standby_to_the_filesystem() {
    require_criu!();
    let mut d = TestDaemon::start();
    d.import_busybox();
    let secret = random_secret();
    let out = Command::new(common::strata_bin())
        .args(["create", "busybox", "--secret", "T=env:MY_VAR", "--secret", "OTHER=env", "--secret-env", "T"])
        .env("STRATA_SOCKET", &d.socket)
        .env("MY_VAR", &secret)
        .env("OTHER", "other-value")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let id = common::stdout(&out).trim().to_string();
    assert_eq!(
        exec_out(
            &d,
            &id,
            "echo \"$T\"; test \"$T\" = \"$(cat /run/secrets/T)\" && echo same; echo \"${OTHER:-unset}\""
        ),
        "***\nsame\nunset\n"
    );
    assert_eq!(exec_out(&d, &id, "cat /run/secrets/OTHER"), "***");

    // A process image would hold the env value: an explicit standby is refused, naming why.
    let (status, body) = err_of(rt().block_on(d.client().standby_sandbox(&id, false)));
    assert_eq!((status, body.code, body.current_state), (409, ErrorCode::InvalidState, Some(SandboxState::Running)));
    assert!(
        body.message.contains("T are environment variables") && body.message.contains("--fs-only"),
        "{}",
        body.message
    );
    d.cli_ok(&["standby", "--fs-only", &id]);
    assert_nowhere(&d, &secret, "in fs-only standby");

    // An automatic (idle) standby keeps only the filesystem, and says why.
    let out = Command::new(common::strata_bin())
        .args([
            "create",
            "busybox",
            "--secret",
            "T=env:MY_VAR",
            "--secret-env",
            "T",
            "--on-idle",
            "standby",
            "--idle-timeout",
            "1s",
        ])
        .env("STRATA_SOCKET", &d.socket)
        .env("MY_VAR", &secret)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let idle = common::stdout(&out).trim().to_string();
    assert!(
        common::wait_until(30, || rt().block_on(d.client().get_sandbox(&idle)).unwrap().state == SandboxState::Standby),
        "the idle sandbox goes to standby"
    );
    let info = rt().block_on(d.client().get_sandbox(&idle)).unwrap().standby.expect("standby info");
    assert_eq!(info.mode, strata_api::StandbyMode::FsOnly);
    assert!(info.note.as_deref().unwrap_or("").contains("environment variables"), "{:?}", info.note);

    // The store outlives the daemon: after a restart, the resumed sandbox has its secrets again.
    d.kill9_and_restart();
    d.cli_ok(&["resume", &id]);
    assert_eq!(exec_out(&d, &id, "rev /run/secrets/T; echo \"$T\""), format!("{}***\n", rev(&secret)));
    assert_nowhere(&d, &secret, "after a restart");
}

#[test]
fn bad_secrets_are_refused_and_create_nothing() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let b64 = base64::engine::general_purpose::STANDARD;
    let with =
        |secrets: Vec<SecretSpec>| CreateSandboxRequest { source: "busybox".into(), secrets, ..Default::default() };
    let spec = |name: &str, value: &[u8]| SecretSpec {
        name: name.into(),
        value_b64: Some(b64.encode(value)),
        ..Default::default()
    };
    let cases: Vec<(Vec<SecretSpec>, &str)> = vec![
        (vec![spec("bad-name", b"value")], "invalid secret name"),
        (vec![spec("../x", b"value")], "invalid secret name"),
        (vec![spec("A", b"")], "empty"),
        (vec![spec("A", &vec![b'x'; 64 * 1024 + 1])], "at most 65536"),
        (vec![spec("A", b"v1v1"), spec("A", b"v2v2")], "twice"),
        ((0..65).map(|i| spec(&format!("S{i}"), b"value")).collect(), "too many secrets"),
        (
            vec![SecretSpec { name: "F".into(), host_file: Some("/nonexistent/secret".into()), ..Default::default() }],
            "cannot read host_file",
        ),
        (vec![SecretSpec { name: "F".into(), ..Default::default() }], "exactly one"),
    ];
    for (secrets, want) in cases {
        let (status, body) = err_of(rt().block_on(d.client().create_sandbox(&with(secrets))));
        assert_eq!((status, body.code), (400, ErrorCode::BadRequest), "{}", body.message);
        assert!(body.message.contains(want), "{want:?} not in {:?}", body.message);
    }
    // The CLI reads files and variables itself and refuses literal values.
    for (args, want) in [
        (vec!["--secret", "A=@/nonexistent/secret"], "reading /nonexistent/secret"),
        (vec!["--secret", "A=literal"], "literal values"),
        (vec!["--secret", "A=env:STRATA_TEST_UNSET_VAR"], "is not set"),
        (vec!["--secret-env", "B"], "no --secret named B"),
    ] {
        let mut all = vec!["create", "busybox"];
        all.extend(args);
        let out = d.cli(&all);
        assert!(!out.status.success() && common::stderr(&out).contains(want), "{all:?}: {}", common::stderr(&out));
    }
    // A 64 KiB value is accepted (the limit is inclusive) and arrives whole.
    let big: Vec<u8> = (0..64 * 1024).map(|i| b'a' + (i % 26) as u8).collect();
    let created = rt().block_on(d.client().create_sandbox(&with(vec![spec("BIG", &big)]))).unwrap();
    assert_eq!(
        d.cli_ok(&["exec", &created.id, "--", "wc", "-c", "/run/secrets/BIG"]).split_whitespace().next(),
        Some("65536")
    );
    let listing: Vec<serde_json::Value> = serde_json::from_str(&d.cli_ok(&["ps", "--json"])).unwrap();
    assert_eq!(listing.len(), 1, "only the valid request created a sandbox");
    let stored: Vec<_> = std::fs::read_dir(d.state("secrets")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(stored, vec![std::ffi::OsString::from(format!("{}.json", created.id))]);
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(d.state("secrets")).unwrap().permissions()) & 0o777;
    assert_eq!(mode, 0o700);
}

#[test]
fn one_shot_runs_take_secrets_too() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let secret = random_secret();
    let file = common::write_file(d.dir.path(), "token", secret.as_bytes());
    let arg = format!("R=@{}", file.display());
    assert_eq!(
        d.cli_ok(&[
            "run",
            "--rm",
            "--secret",
            &arg,
            "busybox",
            "--",
            "sh",
            "-c",
            "cat /run/secrets/R; echo; rev /run/secrets/R"
        ]),
        format!("***\n{}", rev(&secret))
    );
    assert!(d.cli_ok(&["ps", "--json"]).trim() == "[]", "the ephemeral sandbox is gone");
    assert!(std::fs::read_dir(d.state("secrets")).map(|r| r.count()).unwrap_or(0) == 0, "and so are its secrets");
}

#[test]
fn a_microvm_s_secrets_are_files_in_its_guest_s_ram_and_in_no_artifact() {
    require_microvm!();
    let d = TestDaemon::start();
    d.import_busybox();
    let secret = random_secret();
    let file = common::write_file(d.dir.path(), "token", secret.as_bytes());
    let spec = format!("API_TOKEN=@{}", file.display());
    let id = d.create(&["--isolation", "microvm", "--network", "none", "--secret", &spec]);
    std::fs::remove_file(&file).unwrap();

    // Inside the guest: the same read-only files as on the other tiers, redacted on the way out.
    assert_the_file_inside(&d, &id, &secret);
    // They are in the guest's RAM, not on its disk: not in its writable layer, a checkpoint or the disk image.
    exec_out(&d, &id, "echo kept > /root/kept; sync");
    let diff = d.cli_ok(&["diff", &id]);
    assert!(diff.contains("/root/kept") && !diff.contains("secrets"), "{diff}");
    d.cli_ok(&["checkpoint", &id, "--name", "c1"]);
    assert_nowhere(&d, &secret, "after a checkpoint of a microVM");

    // A snapshot of the VM's memory would hold them: standby keeps only the filesystem.
    let out = d.cli(&["standby", &id]);
    let said = common::stderr(&out);
    assert!(!out.status.success() && said.contains("guest's RAM") && said.contains("--fs-only"), "{said}");
    d.cli_ok(&["standby", &id, "--fs-only"]);
    assert_nowhere(&d, &secret, "a microVM in standby");
    // The next boot mounts them again.
    assert_eq!(exec_out(&d, &id, "rev /run/secrets/API_TOKEN; cat /root/kept"), format!("{}kept\n", rev(&secret)));

    // A fork starts without them.
    let child = d.cli_ok(&["fork", "c1", "-n", "1"]).trim().to_string();
    assert_eq!(exec_out(&d, &child, "cat /root/kept; ls /run/secrets 2>/dev/null; echo end"), "kept\nend\n");
    d.cli_ok(&["rm", "-f", &child, &id]);
    assert_nowhere(&d, &secret, "at the end");
}
