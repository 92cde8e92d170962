//! Warm checkpoints: a checkpoint that keeps the running processes, and the
//! sandboxes started from it (fork children, a create, a template's sandbox, a
//! rollback in place) coming up with those processes running, each with its
//! own identity.
//!
//! The workload is a counter loop whose count lives only in the shell's memory
//! and is appended to /root/log every 50 ms, plus busybox httpd serving a page:
//! a copy whose log continues without a gap from the checkpoint's content
//! proves memory and filesystem were taken at one instant.

mod common;

use std::time::Duration;

use common::{rt, TestDaemon};
use strata_api::ExecRequest;

const COUNTER: &str = "i=0; while true; do i=$((i+1)); echo $i >> /root/log; echo tick$i; sleep 0.05; done";

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

fn sh(d: &TestDaemon, id: &str, script: &str) -> String {
    d.cli_ok(&["exec", id, "--", "sh", "-c", script])
}

/// The counter's log inside `id`: every value, in order (none yet before the
/// counter, a background process, has written its first line).
fn counts(d: &TestDaemon, id: &str) -> Vec<u64> {
    sh(d, id, "cat /root/log 2>/dev/null || true")
        .lines()
        .map(|l| l.trim().parse().unwrap_or_else(|_| panic!("bad log line {l:?}")))
        .collect()
}

/// The log grows by one each time, from 1, without a gap or a repeat.
fn assert_contiguous(nums: &[u64], what: &str) {
    assert_eq!(nums.first(), Some(&1), "{what}: the log starts at 1");
    for w in nums.windows(2) {
        assert_eq!(w[1], w[0] + 1, "{what}: the counter skipped or repeated around {}", w[0]);
    }
}

fn wait_longer(d: &TestDaemon, id: &str, than: usize) -> Vec<u64> {
    let mut last = Vec::new();
    assert!(
        common::wait_until(10, || {
            last = counts(d, id);
            last.len() > than + 3
        }),
        "the counter runs on in {id} (log has {} lines)",
        last.len()
    );
    last
}

/// Starts the workload in `id`; returns the counter's process id (API).
fn start_workload(d: &TestDaemon, id: &str) -> u64 {
    sh(d, id, "mkdir -p /www && echo 'hello from the source' > /www/index.html");
    let c = d.client();
    let httpd = ExecRequest {
        cmd: ["httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www"].map(String::from).to_vec(),
        ..Default::default()
    };
    rt().block_on(c.start_process(id, &httpd)).unwrap();
    let p = rt()
        .block_on(c.start_process(
            id,
            &ExecRequest { cmd: vec!["sh".into(), "-c".into(), COUNTER.into()], ..Default::default() },
        ))
        .unwrap();
    wait_longer(d, id, 0);
    assert!(
        common::wait_until(10, || d
            .cli(&["exec", id, "--", "wget", "-qO-", "http://127.0.0.1:8080/index.html"])
            .status
            .success()),
        "httpd serves"
    );
    p.id
}

/// Checks that `child` runs the workload copied from the checkpoint, as itself.
/// `source`: the machine id and boot id of the sandbox the checkpoint was taken of.
fn assert_warm_copy(d: &TestDaemon, child: &str, counter_id: u64, source: &(String, String)) {
    let info = json(&d.cli_ok(&["inspect", child, "--json"]));
    assert_eq!(info["state"], "running", "{info}");
    let procs = json(&d.cli_ok(&["proc", "ls", child, "--json"]));
    let counter = procs
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == counter_id)
        .unwrap_or_else(|| panic!("process {counter_id} in {child}: {procs}"));
    assert_eq!(counter["status"], "running", "{counter}");
    // Memory and files from one instant: the log continues without a gap.
    let before = counts(d, child);
    let after = wait_longer(d, child, before.len());
    assert_contiguous(&after, child);
    // The server is there, serving the checkpoint's files.
    assert_eq!(
        d.cli_ok(&["exec", child, "--", "wget", "-qO-", "http://127.0.0.1:8080/index.html"]),
        "hello from the source\n"
    );
    // Its own identity.
    let name = info["name"].as_str().unwrap();
    assert_eq!(d.cli_ok(&["exec", child, "--", "hostname"]).trim(), info["hostname"].as_str().unwrap(), "UTS hostname");
    assert_eq!(sh(d, child, "cat /etc/hostname").trim(), info["hostname"].as_str().unwrap(), "/etc/hostname of {name}");
    assert!(sh(d, child, "cat /etc/hosts").contains(info["hostname"].as_str().unwrap()));
    assert_eq!(sh(d, child, "cat /run/strata/sandbox-id").trim(), child);
    assert_eq!(sh(d, child, "cat /run/strata/generation").trim(), info["fork_generation"].to_string());
    assert_ne!(sh(d, child, "cat /etc/machine-id").trim(), source.0, "a fresh machine id");
    assert_ne!(sh(d, child, "cat /proc/sys/kernel/random/boot_id").trim(), source.1, "a boot id of its own");
    // Its processes are in its own cgroups (its limits, its accounting, its
    // freezer), not in those of the sandbox they were copied from.
    let init = info["init_pid"].as_i64().expect("init pid");
    for pid in std::iter::once(init.to_string()).chain(
        std::fs::read_to_string(format!("/proc/{init}/task/{init}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string),
    ) {
        let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        for line in cg.lines().filter(|l| !l.ends_with(":/")) {
            assert!(line.ends_with(child), "process {pid} of {child} in another sandbox's cgroup: {line}\n{cg}");
        }
    }
    // The API process is the child's: what it printed since the restore streams
    // on new pipes, continuing the count (not a process started afresh).
    let out = common::stdout(&d.cli(&["proc", "logs", child, &counter_id.to_string()]));
    let ticks: Vec<u64> = out.lines().filter_map(|l| l.strip_prefix("tick")?.parse().ok()).collect();
    assert!(!ticks.is_empty(), "output after the restore: {out}");
    assert!(ticks[0] > 1, "the count continues from the checkpoint: {ticks:?}");
    for w in ticks.windows(2) {
        assert_eq!(w[1], w[0] + 1, "output of the copied process: {ticks:?}");
    }
}

#[test]
fn warm_checkpoints_start_sandboxes_with_their_processes_running() {
    require_criu!();
    let d = TestDaemon::start();
    d.import_busybox();
    let src = d.create(&["--name", "src"]);
    let counter = start_workload(&d, &src);
    let src_machine_id = (
        sh(&d, &src, "cat /etc/machine-id").trim().to_string(),
        sh(&d, &src, "cat /proc/sys/kernel/random/boot_id").trim().to_string(),
    );

    let ck = json(&d.cli_ok(&["checkpoint", &src, "--processes", "--name", "warm", "--json"]));
    let image = &ck["processes"];
    assert_eq!(image["api_processes"], 2, "{ck}");
    assert!(image["bytes"].as_u64().unwrap() > 0, "{ck}");
    assert!(d.state(&format!("checkpoints/{}/processes/manifest.json", ck["id"].as_str().unwrap())).is_file());
    // The source runs on, untouched.
    let n = counts(&d, &src).len();
    wait_longer(&d, &src, n);
    assert_eq!(d.cli_ok(&["exec", &src, "--", "hostname"]).trim(), "src");

    // Fork: every child has the processes, with its own identity.
    let fork = json(&d.cli_ok(&["fork", "warm", "--count", "2", "--json"]));
    let children: Vec<String> =
        fork["sandboxes"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
    for child in &children {
        assert_warm_copy(&d, child, counter, &src_machine_id);
    }
    // A copy is an ordinary sandbox from then on: standby and resume keep its processes.
    d.cli_ok(&["standby", &children[0]]);
    d.cli_ok(&["resume", &children[0]]);
    let n = counts(&d, &children[0]).len();
    assert_contiguous(&wait_longer(&d, &children[0], n), "a copy after standby");
    // A fork from the live sandbox with --processes checkpoints it warm first.
    let live = json(&d.cli_ok(&["fork", "src", "--count", "1", "--processes", "--json"]));
    assert_warm_copy(&d, live["sandboxes"][0].as_str().unwrap(), counter, &src_machine_id);

    // create: warm by default, cold when asked.
    let created = d.cli_ok(&["create", "warm", "--name", "made"]).trim().to_string();
    assert_warm_copy(&d, &created, counter, &src_machine_id);
    let cold = d.cli_ok(&["create", "warm", "--name", "cold", "--no-processes"]).trim().to_string();
    assert!(
        json(&d.cli_ok(&["proc", "ls", &cold, "--json"])).as_array().unwrap().is_empty(),
        "a cold start has no API processes"
    );
    let frozen = counts(&d, &cold);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(counts(&d, &cold), frozen, "nothing runs the counter in a cold start");
    assert!(
        !d.cli(&["exec", &cold, "--", "wget", "-qO-", "http://127.0.0.1:8080/index.html"]).status.success(),
        "no server in a cold start"
    );

    // A template made from it keeps the processes.
    d.cli_ok(&["template", "create", "warmtpl", "--from", "warm"]);
    let from_tpl = d.cli_ok(&["create", "warmtpl", "--name", "tpl-made"]).trim().to_string();
    assert_warm_copy(&d, &from_tpl, counter, &src_machine_id);

    // Restore in place: the source goes back to the checkpoint, processes included.
    let ahead = counts(&d, &src).len();
    d.cli_ok(&["restore", &src, "--to", "warm"]);
    let back = counts(&d, &src);
    assert!(back.len() < ahead, "the log went back ({} lines, {ahead} before)", back.len());
    assert_eq!(back[..frozen.len()], frozen[..], "the restored log starts with the checkpoint's");
    assert_contiguous(&wait_longer(&d, &src, back.len()), "restored source");
    assert_eq!(d.cli_ok(&["exec", &src, "--", "hostname"]).trim(), "src", "the source keeps its own hostname");

    // A copy outlives its source: removing the sandbox the checkpoint was taken
    // of (through a fork of it, whose processes it froze to dump them) leaves the copies running.
    let gone = json(&d.cli_ok(&["fork", &from_tpl, "--count", "1", "--processes", "--json"]));
    let orphan = gone["sandboxes"][0].as_str().unwrap().to_string();
    d.cli_ok(&["rm", "-f", &from_tpl]);
    let n = counts(&d, &orphan).len();
    assert_contiguous(&wait_longer(&d, &orphan, n), "a copy whose source was removed");
    d.cli_ok(&["rm", "-f", &orphan]);
    d.cli_ok(&["checkpoint", "rm", gone["checkpoint"].as_str().unwrap()]);

    // Deleting the checkpoint (once nothing needs it) deletes its process image.
    let ckpt_id = ck["id"].as_str().unwrap().to_string();
    for id in children.iter().chain([&created, &cold]) {
        d.cli_ok(&["rm", "-f", id]);
    }
    d.cli_ok(&["rm", "-f", live["sandboxes"][0].as_str().unwrap()]);
    d.cli_ok(&["rm", "-f", &src]);
    d.cli_ok(&["template", "rm", "warmtpl"]);
    // The live fork's checkpoint was taken after (and on top of) this one.
    let later = live["checkpoint"].as_str().unwrap();
    d.cli_ok(&["checkpoint", "rm", later]);
    assert!(!d.state(&format!("checkpoints/{later}")).exists());
    d.cli_ok(&["checkpoint", "rm", "warm"]);
    assert!(!d.state(&format!("checkpoints/{ckpt_id}")).exists(), "the process image is deleted with its checkpoint");
}

#[test]
fn warm_checkpoints_refuse_what_they_cannot_keep() {
    require_criu!();
    let d = TestDaemon::start();
    d.import_busybox();
    // Secrets would be in process memory: no warm checkpoint of such a sandbox.
    let key = d.dir.path().join("token");
    std::fs::write(&key, b"a-secret-value-long-enough").unwrap();
    let with_secret = d.create(&["--secret", &format!("TOKEN=@{}", key.display())]);
    let out = d.cli(&["checkpoint", &with_secret, "--processes"]);
    assert!(!out.status.success() && common::stderr(&out).contains("secrets"), "{}", common::stderr(&out));
    // A stopped sandbox has no processes to keep.
    let plain = d.create(&["--name", "plain"]);
    d.cli_ok(&["stop", &plain]);
    let out = d.cli(&["checkpoint", &plain, "--processes"]);
    assert!(!out.status.success() && common::stderr(&out).contains("stopped"), "{}", common::stderr(&out));
    // --processes from a checkpoint that kept none.
    d.cli_ok(&["checkpoint", &plain, "--name", "coldck"]);
    let out = d.cli(&["create", "coldck", "--processes"]);
    assert!(!out.status.success() && common::stderr(&out).contains("kept no processes"), "{}", common::stderr(&out));
    // A sandbox with secrets of its own cannot start from a warm checkpoint.
    d.cli_ok(&["start", &plain]);
    d.cli_ok(&["checkpoint", &plain, "--processes", "--name", "warmck"]);
    let out = d.cli(&["create", "warmck", "--secret", &format!("TOKEN=@{}", key.display())]);
    assert!(!out.status.success() && common::stderr(&out).contains("secrets"), "{}", common::stderr(&out));
    // Processes come back only with the /tmp layout they were saved with (here: on disk).
    let out = d.cli(&["create", "warmck", "--tmp", "tmpfs"]);
    assert!(!out.status.success() && common::stderr(&out).contains("/tmp was disk"), "{}", common::stderr(&out));
    let cold = d.cli_ok(&["create", "warmck", "--no-processes", "--secret", &format!("TOKEN=@{}", key.display())]);
    // (Exec output redacts the value: compare its length.)
    assert_eq!(sh(&d, cold.trim(), "wc -c < /run/secrets/TOKEN").trim(), "26");
    // None of these left a sandbox or a process image behind.
    let listed = json(&d.cli_ok(&["ps", "--json"]));
    assert_eq!(listed.as_array().unwrap().len(), 3, "{listed}");
    let images: Vec<_> = std::fs::read_dir(d.state("checkpoints")).unwrap().flatten().collect();
    assert_eq!(images.len(), 1, "only warmck has a process image");
}
