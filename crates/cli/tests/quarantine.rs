//! State over time: checks at set times (`check_every`, `on_findings`, `strata
//! check`) and quarantine (what it refuses, inheritance, egress cut and given
//! back, the operator's lift).

mod common;

use common::TestDaemon;
use strata_api::ErrorCode;

fn json(d: &TestDaemon, args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&d.cli_ok(args)).unwrap()
}

const KEY: &str = "mkdir -p /root/.ssh && printf -- '-----BEGIN OPENSSH PRIVATE KEY-----\\nb3BlbnNzaC1rZXktdjEAAAAA\\n-----END OPENSSH PRIVATE KEY-----\\n' > /root/.ssh/id_ed25519";

fn events(d: &TestDaemon, id: &str) -> Vec<serde_json::Value> {
    d.cli_ok(&["events", id, "--json"]).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn has_event(d: &TestDaemon, id: &str, reason: &str, detail_part: &str) -> bool {
    events(d, id).iter().any(|e| e["reason"] == reason && e["detail"].as_str().unwrap_or("").contains(detail_part))
}

fn api_code(err: strata_client::ClientError) -> (u16, ErrorCode) {
    match err {
        strata_client::ClientError::Api { status, body } => (status, body.code),
        e => panic!("{e}"),
    }
}

#[test]
fn checks_find_state_and_quarantine_holds_it_until_lifted() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let rt = common::rt();
    let c = d.client();

    // A check interval below the minimum is a 400, on create and on update.
    let out = d.cli(&["create", "busybox", "--check-every", "30s"]);
    assert!(!out.status.success() && common::stderr(&out).contains("minimum"), "{}", common::stderr(&out));
    // Scheduled: checked within a minute (and the loop's tick) of its creation, clean.
    let sched = d.create(&["--name", "sched", "--check-every", "1m"]);
    let out = d.cli(&["update", &sched, "--check-every", "10s"]);
    assert!(!out.status.success() && common::stderr(&out).contains("bad_request"), "{}", common::stderr(&out));
    assert_eq!(json(&d, &["inspect", &sched, "--json"])["policy"]["check_every"], "1m");
    // A template checked at set times too (from its creation).
    d.cli_ok(&["template", "create", "sched-tpl", "--from", &sched]);
    let out = d.cli(&["template", "update", "sched-tpl", "--check-every", "30s"]);
    assert!(!out.status.success() && common::stderr(&out).contains("minimum"), "{}", common::stderr(&out));
    let t = json(&d, &["template", "update", "sched-tpl", "--check-every", "1m", "--json"]);
    assert_eq!((t["check_every"].as_str(), t["on_findings"].as_str()), (Some("1m"), Some("record")), "{t}");

    // A requested check with `on_findings: quarantine`, egress on.
    let id = d.create(&[
        "--name",
        "dirty",
        "--check-every",
        "6h",
        "--on-findings",
        "quarantine",
        "--network",
        "egress",
        "--allow-cidr",
        "192.0.2.1/32:80",
    ]);
    let out = d.cli(&["check", &id, "--json"]);
    assert_eq!(out.status.code(), Some(0), "clean: {}", common::stdout(&out));
    d.cli_ok(&["exec", &id, "--", "sh", "-c", KEY]);
    let out = d.cli(&["check", &id, "--json"]);
    assert_eq!(out.status.code(), Some(2), "findings give exit status 2: {}", common::stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["trigger"], "requested");
    assert!(r["findings"].as_array().unwrap().iter().any(|f| f["path"] == "/root/.ssh/id_ed25519"), "{r}");
    assert_eq!(r["action"], "on_findings quarantine: quarantined", "{r}");
    let sb = json(&d, &["inspect", &id, "--json"]);
    assert_eq!(sb["quarantine"]["by"], "check", "{sb}");
    assert!(sb["quarantine"]["reason"].as_str().unwrap().contains("/root/.ssh/id_ed25519"), "{sb}");
    assert_eq!(sb["network"]["mode"], "none", "egress is cut: {sb}");
    assert_eq!(sb["state"], "running", "a quarantined sandbox keeps running");
    assert!(has_event(&d, &id, "checked", "credential.ssh_key /root/.ssh/id_ed25519"), "{:?}", events(&d, &id));
    assert!(has_event(&d, &id, "quarantined", "by check"));

    // What it refuses, each a 409 `quarantined` naming why.
    let fork = strata_api::ForkRequest {
        source: id.clone(),
        count: 1,
        name_prefix: None,
        lifecycle: strata_api::Lifecycle::Ephemeral,
        ttl: None,
        limits: None,
        network: None,
        processes: None,
        isolation: None,
    };
    assert_eq!(api_code(rt.block_on(c.fork(&fork)).unwrap_err()), (409, ErrorCode::Quarantined));
    let out = d.cli(&["template", "create", "t-q", "--from", &id]);
    assert!(common::stderr(&out).contains("quarantined"), "{}", common::stderr(&out));
    let out = d.cli(&["network", "set", &id, "--network", "egress"]);
    assert!(common::stderr(&out).contains("quarantined") && common::stderr(&out).contains("be given egress"));
    // Still inspected, scanned, diffed, exec'd, checkpointed: the checkpoint is born quarantined.
    assert_eq!(d.cli(&["scan", &id]).status.code(), Some(2));
    d.cli_ok(&["diff", &id]);
    d.cli_ok(&["checkpoint", &id, "--name", "dirty-ck"]);
    let ck = json(&d, &["checkpoint", "inspect", "dirty-ck", "--json"]);
    assert_eq!(ck["quarantine"]["by"], "inherited", "{ck}");
    let out = d.cli(&["create", "dirty-ck"]);
    assert!(common::stderr(&out).contains("be restored into a new sandbox"), "{}", common::stderr(&out));
    let fork_ck = strata_api::ForkRequest { source: "dirty-ck".into(), ..fork.clone() };
    assert_eq!(api_code(rt.block_on(c.fork(&fork_ck)).unwrap_err()), (409, ErrorCode::Quarantined));
    let list = json(&d, &["quarantine", "ls", "--json"]);
    assert_eq!(list.as_array().unwrap().len(), 2, "{list}");

    // Lifting needs a reason; then the checkpoint forks again.
    assert_eq!(api_code(rt.block_on(c.lift_quarantine("dirty-ck", " ")).unwrap_err()), (400, ErrorCode::BadRequest));
    d.cli_ok(&["quarantine", "lift", "dirty-ck", "--reason", "reviewed: test key"]);
    let forked = rt.block_on(c.fork(&fork_ck)).unwrap();
    assert_eq!(forked.sandboxes.len(), 1);
    // Lifting what is not quarantined is a 409.
    assert_eq!(api_code(rt.block_on(c.lift_quarantine("dirty-ck", "again")).unwrap_err()).1, ErrorCode::InvalidState);
    // The sandbox's lift gives its egress back, recorded with the reason.
    d.cli_ok(&["quarantine", "lift", &id, "--reason", "key rotated"]);
    let sb = json(&d, &["inspect", &id, "--json"]);
    assert!(sb.get("quarantine").is_none(), "{sb}");
    assert_eq!(sb["network"]["mode"], "egress", "{sb}");
    assert!(has_event(&d, &id, "quarantine_lifted", "key rotated; egress restored"));
    // Placed by hand (any caller who sees it), with a reason.
    let e = rt.block_on(c.quarantine(&id, "manual review")).unwrap();
    assert_eq!((e.kind.as_str(), e.quarantine.reason.as_str()), ("sandbox", "manual review"));
    assert_eq!(api_code(rt.block_on(c.quarantine("no-such", "x")).unwrap_err()), (404, ErrorCode::SandboxNotFound));

    // A sandbox in standby is checked without being resumed; `on_findings: stop` stops a running one.
    let parked = d.create(&["--name", "parked"]);
    d.cli_ok(&["exec", &parked, "--", "sh", "-c", KEY]);
    d.cli_ok(&["standby", &parked]);
    let out = d.cli(&["check", &parked, "--json"]);
    let r: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", common::stderr(&out)));
    assert_eq!((r["state"].as_str(), r["action"].as_str()), (Some("standby"), Some("on_findings record: recorded")));
    assert_eq!(json(&d, &["inspect", &parked, "--json"])["state"], "standby", "not resumed");
    let stopper = d.create(&["--name", "stopper", "--on-findings", "stop"]);
    d.cli_ok(&["exec", &stopper, "--", "sh", "-c", KEY]);
    let r: serde_json::Value = serde_json::from_slice(&d.cli(&["check", &stopper, "--json"]).stdout).unwrap();
    assert_eq!(r["action"], "on_findings stop: stopped", "{r}");
    assert_eq!(json(&d, &["inspect", &stopper, "--json"])["state"], "stopped");

    // Accumulation: the writable layer since the last checkpoint, the
    // checkpoints kept, the base's age; past max_writable it is a finding.
    let out = d.cli(&["create", "busybox", "--max-writable", "lots"]);
    assert!(common::stderr(&out).contains("max_writable"), "{}", common::stderr(&out));
    let grower = d.create(&["--name", "grower", "--max-writable", "512K"]);
    d.cli_ok(&["exec", &grower, "--", "sh", "-c", "mkdir -p /data && head -c 1048576 /dev/zero > /data/blob"]);
    let a = rt.block_on(c.accumulation(&grower)).unwrap();
    assert!(a.writable_bytes >= 1 << 20 && a.writable_files >= 2, "{a:?}");
    // No checkpoint yet: everything is new (the layer also holds the directories overlayfs copied up).
    assert_eq!(a.since_checkpoint_bytes, a.writable_bytes, "{a:?}");
    assert!((2..=a.writable_files).contains(&a.since_checkpoint_paths), "{a:?}");
    assert_eq!((a.checkpoints, a.base.as_str(), a.base_age_days, a.age_days), (0, "image busybox", 0, 0), "{a:?}");
    assert!(a.growth_per_day_bytes >= 1 << 20, "less than a day old: its bytes so far: {a:?}");
    assert_eq!(a.over.len(), 1, "{a:?}");
    let out = d.cli(&["check", &grower, "--json"]);
    assert_eq!(out.status.code(), Some(2), "{}", common::stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(r["findings"].as_array().unwrap().iter().any(|f| f["rule"] == "accumulation.writable"), "{r}");
    assert_eq!(r["accumulation"]["writable_bytes"].as_u64(), Some(a.writable_bytes), "{r}");
    d.cli_ok(&["checkpoint", &grower, "--name", "grown"]);
    d.cli_ok(&["exec", &grower, "--", "sh", "-c", "echo more > /data/note"]);
    let b = rt.block_on(c.accumulation(&grower)).unwrap();
    assert_eq!(b.writable_bytes, a.writable_bytes + 5, "the writable layer keeps it all: {b:?}");
    assert_eq!((b.since_checkpoint_bytes, b.since_checkpoint_paths), (5, 1), "only the note is new: {b:?}");
    assert_eq!(b.checkpoints, 1, "{b:?}");
    assert!(b.checkpoint_bytes >= 1 << 20, "{b:?}");
    assert_ne!(b.checkpoint_since, a.checkpoint_since, "counted from the checkpoint");
    // A sandbox that is not quarantined cannot be rolled onto a quarantined checkpoint.
    d.cli_ok(&["quarantine", "add", "grown", "--reason", "under review"]);
    let req = strata_api::RestoreRequest { checkpoint: "grown".into(), keep_current: false, processes: None };
    assert_eq!(api_code(rt.block_on(c.restore(&grower, &req)).unwrap_err()), (409, ErrorCode::Quarantined));
    d.cli_ok(&["quarantine", "lift", "grown", "--reason", "reviewed"]);
    let wide = d.cli_ok(&["ps", "--wide"]);
    assert!(wide.contains("WRITABLE") && wide.contains("grower") && wide.contains("BASE AGE"), "{wide}");
    assert_eq!(json(&d, &["inspect", &grower, "--json"])["accumulation"]["checkpoints"], 1);
    assert!(d.cli_ok(&["inspect", &grower]).contains("checkpoints"));

    // The scheduled checks came (created before all of the above).
    assert!(
        common::wait_until(120, || has_event(&d, &sched, "checked", "scheduled: clean")),
        "no scheduled check: {:?}",
        events(&d, &sched)
    );
    let tpl_checked = || {
        let list = json(&d, &["template", "ls", "--json"]);
        let t = list.as_array().unwrap().iter().find(|t| t["name"] == "sched-tpl").cloned().unwrap();
        (t["last_check"]["trigger"] == "scheduled").then_some(t)
    };
    assert!(common::wait_until(60, || tpl_checked().is_some()), "no scheduled template check");
    let t = tpl_checked().unwrap();
    assert_eq!(t["last_check"]["action"], "none", "a clean template: {t}");
    assert_eq!(t["last_check"]["image"], "busybox@1", "{t}");
}
