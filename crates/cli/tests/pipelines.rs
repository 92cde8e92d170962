//! Pipelines: `strata pipeline run|status|ls|resume`, `strata cost --pipeline`.

mod common;

use common::TestDaemon;
use strata_api::{ErrorCode, RunPipelineRequest};

fn json(d: &TestDaemon, args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&d.cli_ok(args)).unwrap()
}

fn ps_ids(d: &TestDaemon) -> Vec<String> {
    let v: Vec<serde_json::Value> = serde_json::from_str(&d.cli_ok(&["ps", "--json"])).unwrap();
    v.iter().map(|s| s["id"].as_str().unwrap().to_string()).collect()
}

fn spec_file(d: &TestDaemon, name: &str, text: &str) -> String {
    common::write_file(d.dir.path(), name, text.as_bytes()).to_str().unwrap().to_string()
}

/// Runs a spec that must be refused before anything runs: 400 `bad_request`; its message.
fn refused(d: &TestDaemon, toml: String) -> String {
    match common::rt()
        .block_on(d.client().run_pipeline(&RunPipelineRequest { toml: Some(toml), spec: None }))
        .unwrap_err()
    {
        strata_client::ClientError::Api { status, body } => {
            assert_eq!((status, body.code), (400, ErrorCode::BadRequest));
            body.message
        }
        other => panic!("{other}"),
    }
}

/// The last line of a `--json` follow: the `finished` event's run.
fn finished(out: &str) -> serde_json::Value {
    let last: serde_json::Value = serde_json::from_str(out.lines().last().expect("events")).unwrap();
    assert_eq!(last["type"], "finished", "{out}");
    last["run"].clone()
}

const THREE_STAGES: &str = r#"
name = "it"

[[stage]]
name = "setup"
source = "image:busybox"
lifecycle = "persistent"
commands = ["mkdir -p /work /root/.cache && echo setup-done > /work/setup && echo junk > /root/.cache/x"]
flush = ["/root/.cache"]

[[stage]]
name = "fix"
source = "stage:setup"
lifecycle = "fork"
[stage.fanout]
run = "echo fix-{i} > /work/fix; test {i} = 2"
count = 3

[[stage]]
name = "eval"
source = "stage:fix"
lifecycle = "ephemeral"
commands = ["grep -qx setup-done /work/setup", "grep -qx fix-2 /work/fix", "test ! -e /root/.cache/x"]
"#;

#[test]
fn setup_fanout_and_ephemeral_eval_run_stage_by_stage() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let file = spec_file(&d, "p.toml", THREE_STAGES);
    let out = d.cli_ok(&["pipeline", "run", &file, "--json"]);
    let run = finished(&out);
    assert_eq!(run["state"], "succeeded", "{run}");
    // Progress was streamed per stage (running, then succeeded) before the end.
    for stage in ["setup", "fix", "eval"] {
        assert!(
            out.lines().any(|l| l.contains("\"type\":\"stage\"")
                && l.contains(&format!("\"name\":\"{stage}\""))
                && l.contains("\"state\":\"running\"")),
            "{out}"
        );
    }
    let stages = run["stages"].as_array().unwrap();
    let setup = &stages[0];
    assert_eq!((setup["lifecycle"].as_str(), setup["state"].as_str()), (Some("persistent"), Some("succeeded")));
    assert!(setup["state_kept_bytes"].as_u64().unwrap() > 0);
    assert_eq!(setup["exit_codes"], serde_json::json!([0]));
    // The setup checkpoint is a source like any other, and its flushed path is empty.
    let setup_ckpt = setup["checkpoint"].as_str().unwrap();
    let probe = d.cli_ok(&["create", setup_ckpt]).trim().to_string();
    assert_eq!(d.cli_ok(&["exec", &probe, "--", "sh", "-c", "cat /work/setup; ls -A /root/.cache"]), "setup-done\n");
    d.cli_ok(&["rm", "-f", &probe]);
    // Fan-out: attempt 2 won, its checkpoint is the stage output, losers are gone.
    let fix = &stages[1];
    assert_eq!(fix["fanout"]["winner"], 2, "{fix}");
    assert!(fix["checkpoint"].is_string());
    let ids = ps_ids(&d);
    let fix_sandboxes: Vec<String> =
        fix["sandboxes"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect();
    assert_eq!(fix_sandboxes.len(), 3);
    for (i, sb) in fix_sandboxes.iter().enumerate() {
        assert_eq!(ids.contains(sb), i == 1, "fork child {} listed: {}", i + 1, ids.contains(sb));
    }
    // The winner is kept, stopped (its output is the checkpoint).
    assert_eq!(json(&d, &["inspect", &fix_sandboxes[1], "--json"])["state"], "stopped");
    // Eval saw the winner's file and the setup state, and left nothing behind.
    let eval = &stages[2];
    assert_eq!(eval["exit_codes"], serde_json::json!([0, 0, 0]));
    assert!(eval["checkpoint"].is_null() && eval["output_sandbox"].is_null());
    assert!(!ids.contains(&eval["sandboxes"][0].as_str().unwrap().to_string()));
    // status, ls, cost.
    let id = run["id"].as_str().unwrap();
    let status = d.cli_ok(&["pipeline", "status", &id[..8]]);
    assert!(
        status.contains("STATE KEPT")
            && status.contains("eval")
            && status.contains("nothing")
            && status.contains("succeeded"),
        "{status}"
    );
    let ls = json(&d, &["pipeline", "ls", "--json"]);
    assert_eq!(ls[0]["id"], id);
    let cost = json(&d, &["cost", "--pipeline", id, "--json"]);
    assert_eq!(cost["stages"].as_array().unwrap().len(), 3);
    assert!(cost["total"].as_f64().unwrap() >= 0.0);
    assert_eq!(cost["stages"][1]["sandboxes"].as_array().unwrap().len(), 3);
}

#[test]
fn bad_specs_and_unknown_runs_are_refused_and_a_failing_command_stops_the_run() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let bad = |text: String| refused(&d, text);
    let m = bad(THREE_STAGES.replace("stage:setup", "stage:eval"));
    assert!(m.contains("\"fix\"") && m.contains("source") && m.contains("forward reference"), "{m}");
    let m = bad(THREE_STAGES.replace("count = 3", "count = 65"));
    assert!(m.contains("\"fix\"") && m.contains("fanout") && m.contains("between 1 and 64"), "{m}");
    let m = bad(THREE_STAGES.replace("\"ephemeral\"", "\"sometimes\""));
    assert!(m.contains("sometimes") && m.contains("line"), "{m}");
    let m = bad(THREE_STAGES.replace("image:busybox", "image:nope"));
    assert!(m.contains("\"setup\"") && m.contains("no image named \"nope\""), "{m}");
    let m = bad(THREE_STAGES.replace("stage:fix", "stage:nope"));
    assert!(m.contains("\"eval\"") && m.contains("no stage named"), "{m}");
    let m = bad(THREE_STAGES.replace("lifecycle = \"ephemeral\"", "lifecycle = \"ephemeral\"\ntemplate = \"t\""));
    assert!(m.contains("\"eval\"") && m.contains("template") && m.contains("no output checkpoint"), "{m}");
    let m = bad(THREE_STAGES.replace("flush = [", "accept_findings = true\nflush = ["));
    assert!(m.contains("\"setup\"") && m.contains("accept_findings"), "{m}");
    let m = bad(THREE_STAGES.replace("flush = [", "templat = \"x\"\nflush = ["));
    assert!(m.contains("templat") && m.contains("line"), "unknown field names its line: {m}");
    // Nothing ran for any of them.
    assert!(ps_ids(&d).is_empty());
    assert_eq!(json(&d, &["pipeline", "ls", "--json"]), serde_json::json!([]));
    // The CLI prints the reason.
    let file = spec_file(&d, "bad.toml", &THREE_STAGES.replace("stage:fix", "stage:fix2"));
    let out = d.cli(&["pipeline", "run", &file]);
    assert!(
        !out.status.success() && common::stderr(&out).contains("no stage named \"fix2\""),
        "{}",
        common::stderr(&out)
    );
    // Unknown run ids are 404s.
    let (c, rt) = (d.client(), common::rt());
    assert_eq!(rt.block_on(c.pipeline("0123456789abcdef")).unwrap_err().code(), Some(ErrorCode::PipelineNotFound));
    assert_eq!(
        rt.block_on(c.resume_pipeline("0123456789abcdef")).unwrap_err().code(),
        Some(ErrorCode::PipelineNotFound)
    );
    // A failing command fails the run, naming the stage and the command, with its output.
    let file = spec_file(&d, "fail.toml", "[[stage]]\nname = \"only\"\nsource = \"image:busybox\"\nlifecycle = \"persistent\"\ncommands = [\"true\", \"echo broken >&2; exit 3\"]\n");
    let out = d.cli(&["pipeline", "run", &file]);
    assert_eq!(out.status.code(), Some(1));
    let text = common::stdout(&out);
    assert!(text.contains("stage \\\"only\\\" failed") || text.contains("stage \"only\" failed"), "{text}");
    assert!(text.contains("command 2") && text.contains("exited 3") && text.contains("broken"), "{text}");
    // Progress was printed as it happened, a line per stage event.
    assert!(
        text.contains("stage only: command 1 exited 0\nstage only: command 2 exited 3\nstage only: FAILED"),
        "{text}"
    );
    // The failed persistent stage's sandbox is kept for debugging.
    let runs = json(&d, &["pipeline", "ls", "--json"]);
    let stage = &runs[0]["stages"][0];
    assert_eq!(stage["exit_codes"], serde_json::json!([0, 3]));
    assert!(ps_ids(&d).contains(&stage["sandboxes"][0].as_str().unwrap().to_string()));
}

#[test]
fn a_run_interrupted_by_a_daemon_restart_resumes_from_the_unfinished_stage() {
    require_host!();
    let mut d = TestDaemon::start();
    d.import_busybox();
    // Stage two blocks on its first attempt only ($STRATA_PIPELINE_ATTEMPT counts the attempts).
    let file = spec_file(
        &d,
        "r.toml",
        r#"
name = "rs"
[[stage]]
name = "one"
source = "image:busybox"
lifecycle = "persistent"
commands = ["echo 1 > /root/one"]

[[stage]]
name = "two"
source = "stage:one"
lifecycle = "persistent-with-checkpoints"
commands = ['[ "$STRATA_PIPELINE_ATTEMPT" -gt 1 ] || sleep 600', "cat /root/one > /root/two"]

[[stage]]
name = "three"
source = "stage:two"
lifecycle = "ephemeral"
commands = ["grep -qx 1 /root/two"]
"#,
    );
    let id = d.cli_ok(&["pipeline", "run", &file, "--detach"]).trim().to_string();
    let status = |d: &TestDaemon| json(d, &["pipeline", "status", &id, "--json"]);
    assert!(
        common::wait_until(60, || status(&d)["stages"][1]["sandboxes"].as_array().is_some_and(|s| !s.is_empty())),
        "{}",
        status(&d)
    );
    let before = status(&d);
    assert_eq!(before["state"], "running");
    let one_ckpt = before["stages"][0]["checkpoint"].clone();
    let stuck = before["stages"][1]["sandboxes"][0].as_str().unwrap().to_string();

    d.kill9_and_restart();
    let after = status(&d);
    assert_eq!(after["state"], "interrupted", "{after}");
    assert!(after["reason"].as_str().unwrap().contains("resume"));
    assert_eq!(after["stages"][0]["state"], "succeeded");

    let out = d.cli_ok(&["pipeline", "resume", &id, "--json"]);
    let run = finished(&out);
    assert_eq!(run["state"], "succeeded", "{run}");
    let stages = run["stages"].as_array().unwrap();
    // Stage one was not run again: same attempt count, same output.
    assert_eq!(stages[0]["attempts"], 1);
    assert_eq!(stages[0]["checkpoint"], one_ckpt);
    assert_eq!(stages[1]["attempts"], 2);
    assert_eq!(stages[1]["exit_codes"], serde_json::json!([0, 0]));
    assert_eq!(stages[2]["state"], "succeeded");
    // The interrupted attempt's sandbox was cleaned up.
    assert!(!ps_ids(&d).contains(&stuck));
    // A finished run cannot be resumed again.
    let out = d.cli(&["pipeline", "resume", &id]);
    assert!(!out.status.success() && common::stderr(&out).contains("already succeeded"), "{}", common::stderr(&out));
}

#[test]
fn a_standby_stage_is_resumed_by_the_next_stage_with_its_processes() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let file = spec_file(
        &d,
        "s.toml",
        r#"
name = "sb"
[[stage]]
name = "serve"
source = "image:busybox"
lifecycle = "standby-between-turns"
commands = ["echo turn1 > /root/state", "(exec sleep 1000) >/dev/null 2>&1 &"]

[[stage]]
name = "turn2"
source = "stage:serve"
lifecycle = "persistent"
commands = ["grep -qx turn1 /root/state", "cat /proc/[0-9]*/comm | grep -x sleep > /root/sleepers || true"]
"#,
    );
    let run = finished(&d.cli_ok(&["pipeline", "run", &file, "--json"]));
    assert_eq!(run["state"], "succeeded", "{run}");
    let (serve, turn2) = (&run["stages"][0], &run["stages"][1]);
    // The standby sandbox is the stage's output and the next stage's sandbox.
    let sb = serve["output_sandbox"].as_str().unwrap();
    assert_eq!(turn2["sandboxes"], serde_json::json!([sb]));
    assert!(serve["checkpoint"].is_null());
    let degraded =
        serve["notes"].as_array().is_some_and(|n| n.iter().any(|x| x.as_str().unwrap().contains("filesystem-only")));
    let events = d.cli_ok(&["events", sb, "--json"]);
    assert!(events.contains("\"to\":\"standby\"") || events.contains("\"state\":\"standby\""), "{events}");
    // With process state kept, the background process was still running in turn 2.
    let probe = d.cli_ok(&["create", turn2["checkpoint"].as_str().unwrap()]).trim().to_string();
    let sleepers = d.cli_ok(&["exec", &probe, "--", "cat", "/root/sleepers"]);
    if degraded {
        println!("standby degraded to filesystem-only here: {}", serve["notes"]);
    } else {
        assert!(serve["state_kept_bytes"].as_u64().unwrap() > 0);
        assert_eq!(sleepers, "sleep\n", "the background process did not survive standby: {run}");
    }
}

#[test]
fn a_paused_run_stops_at_the_next_stage_boundary_and_resumes() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let file = spec_file(
        &d,
        "w.toml",
        r#"
[[stage]]
name = "wait"
source = "image:busybox"
lifecycle = "persistent"
commands = ["while [ ! -e /root/go ]; do sleep 0.1; done"]

[[stage]]
name = "after"
source = "stage:wait"
lifecycle = "ephemeral"
commands = ["test -e /root/go"]
"#,
    );
    let id = d.cli_ok(&["pipeline", "run", &file, "--detach"]).trim().to_string();
    let status = |d: &TestDaemon| json(d, &["pipeline", "status", &id, "--json"]);
    assert!(
        common::wait_until(60, || status(&d)["stages"][0]["sandboxes"].as_array().is_some_and(|s| !s.is_empty())),
        "{}",
        status(&d)
    );
    d.cli_ok(&["pipeline", "pause", &id]);
    // The current stage finishes (it waits for /root/go), then the run pauses.
    let sb = status(&d)["stages"][0]["sandboxes"][0].as_str().unwrap().to_string();
    d.cli_ok(&["exec", &sb, "--", "touch", "/root/go"]);
    assert!(common::wait_until(60, || status(&d)["state"] == "paused"), "{}", status(&d));
    let paused = status(&d);
    assert_eq!(paused["stages"][0]["state"], "succeeded");
    assert_eq!(paused["stages"][1]["state"], "pending");
    assert!(paused["reason"].as_str().unwrap().contains("\"after\""), "{paused}");
    // Only a running run can be paused.
    let out = d.cli(&["pipeline", "pause", &id]);
    assert!(!out.status.success() && common::stderr(&out).contains("not running"), "{}", common::stderr(&out));
    let run = finished(&d.cli_ok(&["pipeline", "resume", &id, "--json"]));
    assert_eq!(run["state"], "succeeded", "{run}");
    assert_eq!(run["stages"][0]["attempts"], 1);
    assert_eq!(run["stages"][1]["exit_codes"], serde_json::json!([0]));
}

#[test]
fn a_stage_output_is_promoted_to_a_template_through_the_scan_gate_and_overhead_is_measured() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let spec = r#"
[[stage]]
name = "setup"
source = "image:busybox"
lifecycle = "persistent"
commands = ["mkdir -p /work && echo prepared > /work/env", "sleep 0.3"]
template = "prepared-env"

[[stage]]
name = "use"
source = "template:prepared-env"
lifecycle = "ephemeral"
commands = ["grep -qx prepared /work/env"]
"#;
    let run = finished(&d.cli_ok(&["pipeline", "run", &spec_file(&d, "t.toml", spec), "--json"]));
    assert_eq!(run["state"], "succeeded", "{run}");
    let setup = &run["stages"][0];
    assert_eq!(setup["template"], "prepared-env");
    let templates = d.cli_ok(&["template", "ls"]);
    assert!(templates.contains("prepared-env"), "{templates}");
    // The commands' own time is recorded apart from the stage's: the rest is strata's overhead.
    let (total, commands) = (setup["duration_ms"].as_u64().unwrap(), setup["commands_ms"].as_u64().unwrap());
    assert!(commands >= 300 && commands <= total, "commands {commands} ms of {total} ms");
    let table = d.cli_ok(&["pipeline", "status", run["id"].as_str().unwrap()]);
    assert!(table.contains("OVERHEAD") && table.contains("(template prepared-env)"), "{table}");

    // A second run re-points the template; a stage whose output has findings is refused
    // (the run fails, naming the finding), unless accept_findings is set.
    let dirty = spec.replace(
        "echo prepared > /work/env",
        "echo prepared > /work/env && mkdir -p /root/.ssh && echo k > /root/.ssh/id_rsa",
    );
    let out = d.cli(&["pipeline", "run", &spec_file(&d, "dirty.toml", &dirty), "--json"]);
    let failed = finished(&common::stdout(&out));
    assert_eq!(failed["state"], "failed");
    let err = failed["stages"][0]["error"].as_str().unwrap();
    assert!(
        err.contains("prepared-env") && err.contains("credential.ssh_key") && err.contains("accept_findings"),
        "{err}"
    );
    let accepted = dirty.replace("template = \"prepared-env\"", "template = \"prepared-env\"\naccept_findings = true");
    let run = finished(&d.cli_ok(&["pipeline", "run", &spec_file(&d, "ok.toml", &accepted), "--json"]));
    assert_eq!(run["state"], "succeeded", "{run}");
    let t: serde_json::Value = json(&d, &["template", "ls", "--json"]);
    let t = t.as_array().unwrap().iter().find(|t| t["name"] == "prepared-env").unwrap().clone();
    assert_eq!(t["checkpoint"], run["stages"][0]["checkpoint"], "re-pointed to the new output: {t}");
    assert!(t.to_string().contains("credential.ssh_key"), "the acceptance is recorded: {t}");
}

#[test]
fn stage_secrets_reach_only_their_stage_and_never_the_recorded_run() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let value = "pipeline-secret-7f3a9c";
    let secret = common::write_file(d.dir.path(), "token", value.as_bytes());
    let spec = format!(
        r#"
[[stage]]
name = "setup"
source = "image:busybox"
lifecycle = "persistent"
secrets = [{{ name = "TOKEN", host_file = "{}", env = true }}]
user = "0"
workdir = "/etc"
commands = ['test "$(cat /run/secrets/TOKEN)" = "$TOKEN" && test "$(pwd)" = /etc && mkdir -p /work && echo kept > /work/out']

[[stage]]
name = "after"
source = "stage:setup"
lifecycle = "ephemeral"
commands = ["grep -qx kept /work/out && test ! -e /run/secrets/TOKEN && test -z \"$TOKEN\""]
"#,
        secret.display()
    );
    let out = d.cli_ok(&["pipeline", "run", &spec_file(&d, "s.toml", &spec), "--json"]);
    let run = finished(&out);
    assert_eq!(run["state"], "succeeded", "{run}");
    assert!(!out.contains(value), "the value is not in the run's events");
    let shown = d.cli_ok(&["pipeline", "status", run["id"].as_str().unwrap(), "--json"]);
    assert!(!shown.contains(value) && shown.contains("\"TOKEN\""), "the recorded spec names the secret only: {shown}");
    // The run succeeded: no stage will run again, its values are gone from the store.
    let store: Vec<String> = std::fs::read_dir(d.state_dir.join("secrets"))
        .map(|r| r.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(store.iter().all(|f| !f.starts_with("pipeline-")), "{store:?}");

    // A failing command's output, quoted in the stage error, is redacted.
    let failing = spec.replace("echo kept > /work/out'", "echo kept > /work/out && echo leaked=$TOKEN && exit 4'");
    let out = d.cli(&["pipeline", "run", &spec_file(&d, "f.toml", &failing), "--json"]);
    let run = finished(&common::stdout(&out));
    let err = run["stages"][0]["error"].as_str().unwrap();
    assert!(err.contains("exited 4") && err.contains("leaked=") && !err.contains(value), "{err}");
    // A failed run may be resumed: its values stay in the store until it succeeds.
    let store: Vec<String> = std::fs::read_dir(d.state_dir.join("secrets"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(store.iter().any(|f| f.starts_with(&format!("pipeline-{}", run["id"].as_str().unwrap()))), "{store:?}");

    // Bad secrets are refused before anything runs, naming the stage.
    let bad = |text: String| refused(&d, text);
    let m = bad(spec.replace(&secret.display().to_string(), "/nonexistent/token"));
    assert!(m.contains("\"setup\"") && m.contains("secrets") && m.contains("/nonexistent/token"), "{m}");
    let m = bad(THREE_STAGES.replace(
        "[stage.fanout]",
        &format!("secrets = [{{ name = \"T\", host_file = \"{}\" }}]\n[stage.fanout]", secret.display()),
    ));
    assert!(m.contains("\"fix\"") && m.contains("secrets"), "{m}");
}

#[test]
fn a_stage_network_applies_to_its_sandbox_and_bad_rules_are_refused_up_front() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let spec = r#"
[[stage]]
name = "fetch"
source = "image:busybox"
lifecycle = "persistent"
network = { mode = "egress", allow = ["198.51.100.7/32:80"] }
commands = ["ip route | grep -q default && grep -q nameserver /etc/resolv.conf"]

[[stage]]
name = "offline"
source = "stage:fetch"
lifecycle = "ephemeral"
commands = ["! ip route | grep -q default"]
"#;
    let run = finished(&d.cli_ok(&["pipeline", "run", &spec_file(&d, "n.toml", spec), "--json"]));
    assert_eq!(run["state"], "succeeded", "{run}");
    let sb = run["stages"][0]["sandboxes"][0].as_str().unwrap();
    let net = json(&d, &["inspect", sb, "--json"])["network"].clone();
    assert_eq!(net["mode"], "egress", "{net}");
    assert!(net.to_string().contains("198.51.100.7"), "{net}");

    let bad = |text: String| refused(&d, text);
    let m = bad(spec.replace("198.51.100.7/32:80", "300.1.2.3/8:99999"));
    assert!(m.contains("\"fetch\"") && m.contains("network") && m.contains("300.1.2.3"), "{m}");
    let m = bad(THREE_STAGES.replace("[stage.fanout]", "network = { mode = \"none\" }\n[stage.fanout]"));
    assert!(m.contains("\"fix\"") && m.contains("network"), "{m}");
}
