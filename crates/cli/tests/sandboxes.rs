//! Sandbox lifecycle, exec and background processes, ephemeral runs, TTLs
//! and daemon restarts, through the CLI and the API.

mod common;

use std::time::Duration;

use base64::Engine;
use common::TestDaemon;
use strata_api::{ExecRequest, ProcessEvent, ProcessStatus, StdinRequest};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

fn ps(d: &TestDaemon) -> Vec<serde_json::Value> {
    serde_json::from_str(&d.cli_ok(&["ps", "--json"])).unwrap()
}

#[test]
fn create_inspect_stop_start_rm_keeps_the_filesystem_across_stop() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[
        "--name",
        "web",
        "--memory",
        "64m",
        "--cpus",
        "0.5",
        "--pids",
        "64",
        "--env",
        "A=1",
        "--label",
        "stage=setup",
    ]);
    assert_eq!(id.len(), 16, "create prints only the id: {id:?}");
    let list = ps(&d);
    assert_eq!(list.len(), 1);
    for k in ["id", "name", "state", "source", "created_at"] {
        assert!(list[0].get(k).is_some(), "ps --json has {k}");
    }
    assert_eq!(list[0]["state"], "running");
    let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", "web", "--json"])).unwrap();
    assert_eq!(info["limits"]["memory_bytes"], 64 << 20);
    assert_eq!(info["limits"]["cpus"], 0.5);
    assert_eq!(info["limits"]["pids"], 64);
    assert_eq!(info["state_reason"], "created");
    assert_eq!(info["hostname"], "web");
    assert_eq!(info["labels"]["stage"], "setup");
    assert_eq!(
        d.cli_ok(&["exec", "web", "--", "sh", "-c", "echo $A; hostname; echo kept > /root/state; echo t > /tmp/t"]),
        "1\nweb\n"
    );
    assert_eq!(info["tmp"], "disk", "/tmp is part of the filesystem by default");

    d.cli_ok(&["stop", "web"]);
    let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", "web", "--json"])).unwrap();
    assert_eq!(info["state"], "stopped");
    assert_eq!(info["state_reason"], "user");
    assert!(info.get("init_pid").is_none());
    d.cli_ok(&["start", "web"]);
    assert_eq!(d.cli_ok(&["exec", "web", "--", "cat", "/root/state"]), "kept\n");
    assert_eq!(d.cli_ok(&["exec", "web", "--", "cat", "/tmp/t"]), "t\n", "/tmp is kept as the rest of the filesystem");

    let events: Vec<serde_json::Value> =
        d.cli_ok(&["events", &id, "--json"]).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let path: Vec<String> = events.iter().map(|e| e["to"].as_str().unwrap().to_string()).collect();
    assert_eq!(path, ["creating", "running", "stopped", "running"]);
    d.cli_ok(&["rm", "-f", "web"]);
    assert!(ps(&d).is_empty());
    // The writable layer and the cgroup are released right after the destroy is recorded.
    assert!(common::wait_until(10, || !d.state(&format!("sandboxes/{id}")).exists()), "writable layer removed");
    assert!(
        common::wait_until(10, || !std::path::Path::new(&format!("/sys/fs/cgroup/memory/strata/{id}")).exists()
            && !std::path::Path::new(&format!("/sys/fs/cgroup/strata/{id}")).exists()),
        "cgroup removed"
    );
}

#[test]
fn exec_passes_stdio_exit_codes_env_cwd_user_and_timeouts() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[]);
    let out = d.cli(&["exec", &id, "--", "sh", "-c", "echo out; echo err >&2; exit 7"]);
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(common::stdout(&out), "out\n");
    assert_eq!(common::stderr(&out), "err\n");
    assert_eq!(d.cli_ok(&["exec", "-e", "X=y", "-w", "/etc", &id, "--", "sh", "-c", "echo $X; pwd"]), "y\n/etc\n");
    assert_eq!(d.cli_ok(&["exec", "--user", "user", &id, "--", "id", "-u"]), "1000\n");
    assert_eq!(d.cli_ok(&["exec", "--user", "1234:1234", &id, "--", "id", "-u"]), "1234\n");
    let out = d.cli(&["exec", "--timeout", "1s", &id, "--", "sleep", "30"]);
    assert_eq!(out.status.code(), Some(137));
    assert!(common::stderr(&out).contains("timed out"));
    let out = d.cli(&["exec", &id, "--", "no-such-program"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(common::stderr(&out).contains("not found"), "{}", common::stderr(&out));
    let out = d.cli_stdin(&["exec", "-i", &id, "--", "sh", "-c", "tr a-z A-Z; exit 3"], b"piped input\n");
    assert_eq!(common::stdout(&out), "PIPED INPUT\n");
    assert_eq!(out.status.code(), Some(3));
    // Binary output survives the trip.
    let out = d.cli(&["exec", &id, "--", "sh", "-c", "printf '\\000\\377\\001'"]);
    assert_eq!(out.stdout, vec![0u8, 255, 1]); // SIGPIPE is at its default in sandbox processes, as on any Linux box:
                                               // a writer whose reader has gone ends (busybox `yes` ignores write errors).
    assert_eq!(d.cli_ok(&["exec", "--timeout", "30s", &id, "--", "sh", "-c", "yes | head -n 2"]), "y\ny\n");
    let status = d.cli_ok(&["exec", &id, "--", "cat", "/proc/self/status"]);
    let ignored = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    assert_eq!(ignored & (1 << (libc::SIGPIPE - 1)), 0, "SIGPIPE ignored: SigIgn {ignored:x}");
}

#[test]
fn api_streams_output_while_the_command_runs_and_background_processes_are_reattachable() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[]);
    let c = d.client();
    common::rt().block_on(async {
        // Streaming: the first line arrives long before the command ends.
        let started = std::time::Instant::now();
        let req = ExecRequest {
            cmd: vec!["sh".into(), "-c".into(), "echo first; sleep 2; echo second".into()],
            ..Default::default()
        };
        let mut s = c.exec_stream(&id, &req).await.unwrap();
        let mut first_at = None;
        let mut out = Vec::new();
        while let Some(ev) = s.next().await.unwrap() {
            match ev {
                ProcessEvent::Output { data_b64, .. } => {
                    first_at.get_or_insert(started.elapsed());
                    out.extend(B64.decode(data_b64).unwrap());
                }
                ProcessEvent::Exited { process } => assert_eq!(process.exit_code, Some(0)),
                _ => {}
            }
        }
        assert_eq!(out, b"first\nsecond\n");
        assert!(first_at.unwrap() < Duration::from_millis(1500), "output streamed while running: {first_at:?}");

        // Run to completion.
        let r =
            c.exec(&id, &ExecRequest { cmd: vec!["echo".into(), "done".into()], ..Default::default() }).await.unwrap();
        assert_eq!(B64.decode(r.stdout_b64).unwrap(), b"done\n");

        // Background process: start, list, read logs, reattach from an offset, stdin, signal, wait.
        let p = c
            .start_process(
                &id,
                &ExecRequest {
                    cmd: vec![
                        "sh".into(),
                        "-c".into(),
                        "echo ready; while read l; do echo got:$l; done; sleep 100".into(),
                    ],
                    keep_stdin_open: true,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(p.status, ProcessStatus::Running);
        c.write_stdin(&id, p.id, &StdinRequest { data_b64: B64.encode("one\n"), close: true }).await.unwrap();
        let mut got = String::new();
        for _ in 0..100 {
            let mut logs = c.logs(&id, p.id, 0, false).await.unwrap();
            got.clear();
            while let Some(ev) = logs.next().await.unwrap() {
                if let ProcessEvent::Output { data_b64, .. } = ev {
                    got.push_str(&String::from_utf8(B64.decode(data_b64).unwrap()).unwrap());
                }
            }
            if got.contains("got:one") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(got, "ready\ngot:one\n");
        // Reattach from an offset: only the later output.
        let mut logs = c.logs(&id, p.id, 6, false).await.unwrap();
        match logs.next().await.unwrap().unwrap() {
            ProcessEvent::Output { offset, data_b64, .. } => {
                assert_eq!(offset, 6);
                assert_eq!(B64.decode(data_b64).unwrap(), b"got:one\n");
            }
            other => panic!("{other:?}"),
        }
        let list = c.list_processes(&id).await.unwrap();
        assert!(list.iter().any(|x| x.id == p.id && x.status == ProcessStatus::Running));
        let w = c.wait(&id, p.id, Some("200ms")).await.unwrap();
        assert_eq!(w.status, ProcessStatus::Running, "wait with timeout returns the running record");
        c.signal(&id, p.id, "TERM").await.unwrap();
        let w = c.wait(&id, p.id, Some("10s")).await.unwrap();
        assert_eq!(w.status, ProcessStatus::Exited);
        assert_eq!(w.signal, Some(15));
        assert_eq!(w.exit_status(), 143);
        let e = c.get_process(&id, 999).await.unwrap_err();
        assert_eq!(e.code(), Some(strata_api::ErrorCode::ProcessNotFound));
        // A signal right after the start reaches the process (its pid may not be reported yet).
        for _ in 0..5 {
            let p = c
                .start_process(
                    &id,
                    &ExecRequest {
                        cmd: vec!["sleep".into(), "600".into()],
                        keep_stdin_open: true,
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            c.signal(&id, p.id, "KILL").await.unwrap();
            let w = c.wait(&id, p.id, Some("10s")).await.unwrap();
            assert_eq!(w.signal, Some(9), "{w:?}");
        }
    });
    // The CLI's detach + logs + wait.
    let pid = d.cli_ok(&["exec", "-d", &id, "--", "sh", "-c", "echo bg; exit 4"]).trim().to_string();
    let out = d.cli(&["proc", "wait", &id, &pid]);
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(d.cli_ok(&["proc", "logs", &id, &pid]), "bg\n");
}

#[test]
fn ephemeral_runs_leave_nothing_and_ttls_expire() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let out =
        d.cli(&["run", "--rm", "busybox", "--", "sh", "-c", "echo eval > /root/result; cat /root/result; exit 5"]);
    assert_eq!(common::stdout(&out), "eval\n");
    assert_eq!(out.status.code(), Some(5));
    assert!(ps(&d).is_empty(), "run --rm leaves no sandbox");
    assert!(
        common::wait_until(10, || std::fs::read_dir(d.state("sandboxes")).unwrap().count() == 0),
        "and no writable layer"
    );
    // TTL: ephemeral -> destroyed, persistent -> stopped.
    let eph = d.create(&["--lifecycle", "ephemeral", "--ttl", "1s"]);
    let per = d.create(&["--ttl", "1s"]);
    assert!(common::wait_until(15, || {
        let l = ps(&d);
        !l.iter().any(|s| s["id"] == eph.as_str())
            && l.iter().any(|s| s["id"] == per.as_str() && s["state"] == "stopped")
    }));
    let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", &per, "--json"])).unwrap();
    assert_eq!(info["state_reason"], "ttl_expired");
    let evs = d.cli_ok(&["events", &eph, "--json"]);
    assert!(evs.contains("ttl_expired") && evs.contains("destroyed"), "{evs}");
}

#[test]
fn daemon_kill9_readopts_running_sandboxes_and_applies_due_ttls() {
    require_host!();
    let mut d = TestDaemon::start();
    d.import_busybox();
    let keep = d.create(&["--name", "keep"]);
    d.cli_ok(&["exec", &keep, "--", "sh", "-c", "echo before > /root/f"]);
    // A background process that writes all the time outlives the daemon's crash
    // (the output has nowhere to go meanwhile, but the process keeps running).
    d.cli_ok(&[
        "exec",
        "-d",
        &keep,
        "--",
        "sh",
        "-c",
        "while true; do echo tick; date +%s%N > /root/alive; sleep 0.05; done",
    ]);
    let eph = d.create(&["--lifecycle", "ephemeral", "--ttl", "2s"]);
    let init_pid: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", &keep, "--json"])).unwrap();
    let init_pid = init_pid["init_pid"].as_i64().unwrap();
    d.kill9_and_restart();
    // Same init, still running, still usable.
    let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", &keep, "--json"])).unwrap();
    assert_eq!(info["state"], "running");
    assert_eq!(info["init_pid"].as_i64().unwrap(), init_pid);
    assert_eq!(d.cli_ok(&["exec", &keep, "--", "cat", "/root/f"]), "before\n");
    let alive = || d.cli_ok(&["exec", &keep, "--", "cat", "/root/alive"]);
    let t0 = alive();
    assert!(common::wait_until(10, || alive() != t0), "the writer died with the daemon");
    // The ephemeral sandbox's TTL still applies after the restart.
    assert!(common::wait_until(15, || !ps(&d).iter().any(|s| s["id"] == eph.as_str())));
    // A sandbox whose init died while the daemon was down is marked lost, not left "running".
    let victim = d.create(&[]);
    let vpid = serde_json::from_str::<serde_json::Value>(&d.cli_ok(&["inspect", &victim, "--json"])).unwrap()
        ["init_pid"]
        .as_i64()
        .unwrap();
    // SAFETY: killing a sandbox init we created.
    unsafe { libc::kill(vpid as i32, libc::SIGKILL) };
    assert!(common::wait_until(10, || ps(&d).iter().any(|s| s["id"] == victim.as_str() && s["state"] == "lost")));
    d.cli_ok(&["start", &victim]);
    assert_eq!(d.cli_ok(&["exec", &victim, "--", "echo", "back"]), "back\n");
}

/// An image whose tree has a file where strata mounts a directory (`/run`,
/// a scratch `/tmp`) cannot run as a sandbox: that is the caller's input, a
/// 400 that says so, and nothing is left behind (it used to be a 500). A
/// `/tmp` of the filesystem (the default) is the image's, whatever it is.
#[test]
fn an_image_that_cannot_run_is_a_400_and_leaves_nothing() {
    require_host!();
    let d = TestDaemon::start();
    for dir in ["run", "tmp"] {
        let tar = d.dir.path().join(format!("busybox-{dir}-file.tar"));
        std::fs::copy(common::images_dir().join("busybox-rootfs.tar"), &tar).unwrap();
        assert!(std::process::Command::new("tar")
            .arg("--delete")
            .arg("-f")
            .arg(&tar)
            .arg(format!("./{dir}/"))
            .status()
            .unwrap()
            .success());
        let extra = tempfile::tempdir().unwrap();
        std::fs::write(extra.path().join(dir), "a file, not a directory\n").unwrap();
        assert!(std::process::Command::new("tar")
            .arg("-rf")
            .arg(&tar)
            .arg("-C")
            .arg(extra.path())
            .arg(format!("./{dir}"))
            .status()
            .unwrap()
            .success());
        let name = format!("{dir}-file");
        d.cli_ok(&["image", "import", tar.to_str().unwrap(), "--name", &name]);
        let mut req = strata_api::CreateSandboxRequest { source: name.clone(), ..Default::default() };
        if dir == "tmp" {
            let id = d.cli_ok(&["create", &name]).trim().to_string();
            assert_eq!(d.cli_ok(&["exec", &id, "--", "cat", "/tmp"]), "a file, not a directory\n");
            d.cli_ok(&["rm", "-f", &id]);
            req.tmp = Some(strata_api::TmpStorage::Tmpfs);
        }
        let e = common::rt().block_on(d.client().create_sandbox(&req)).unwrap_err();
        assert_eq!(e.code(), Some(strata_api::ErrorCode::BadRequest), "{e}");
        assert!(e.to_string().contains("cannot run as a sandbox") && e.to_string().contains(&format!("/{dir}")), "{e}");
        assert!(ps(&d).is_empty(), "a sandbox was left behind: {:?}", ps(&d));
    }
}
