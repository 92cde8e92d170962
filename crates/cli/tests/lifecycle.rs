//! Lifecycle policy: idle detection (processes, leases), automatic stop and
//! destroy on idle, max lifetime, retention, policy updates, leases across a
//! daemon restart, failed actions, and bad input.
//!
//! Short timeouts ("2s") with generous deadlines: the tests check what
//! happens, never how precisely on time.

mod common;

use std::time::Duration;

use common::TestDaemon;
use strata_api::{ErrorCode, ExecRequest, OnIdle, PolicyPatch, UpdateSandboxRequest};
use strata_client::{Body, ClientError, Method};

fn inspect(d: &TestDaemon, id: &str) -> serde_json::Value {
    serde_json::from_str(&d.cli_ok(&["inspect", id, "--json"])).unwrap()
}

fn state(d: &TestDaemon, id: &str) -> String {
    inspect(d, id)["state"].as_str().unwrap().to_string()
}

fn exists(d: &TestDaemon, id: &str) -> bool {
    let list: Vec<serde_json::Value> = serde_json::from_str(&d.cli_ok(&["ps", "--json"])).unwrap();
    list.iter().any(|s| s["id"] == id)
}

fn events(d: &TestDaemon, id: &str) -> Vec<serde_json::Value> {
    d.cli_ok(&["events", id, "--json"]).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The event with this reason, if any.
fn event_with(d: &TestDaemon, id: &str, reason: &str) -> Option<serde_json::Value> {
    events(d, id).into_iter().find(|e| e["reason"] == reason)
}

fn wait_state(d: &TestDaemon, id: &str, want: &str, secs: u64) {
    assert!(
        common::wait_until(secs, || state(d, id) == want),
        "sandbox {id} did not become {want} (it is {}); log:\n{}",
        state(d, id),
        d.log()
    );
}

fn api_error(e: ClientError) -> (u16, ErrorCode) {
    match e {
        ClientError::Api { status, body } => (status, body.code),
        other => panic!("expected an API error, got {other}"),
    }
}

#[test]
fn an_idle_sandbox_is_stopped_and_a_running_process_keeps_it_awake() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let idle = d.create(&["--on-idle", "stop", "--idle-timeout", "2s"]);
    let busy = d.create(&["--on-idle", "stop", "--idle-timeout", "2s"]);
    let c = d.client();
    let p = common::rt()
        .block_on(c.start_process(&busy, &ExecRequest { cmd: vec!["sleep".into(), "15".into()], ..Default::default() }))
        .unwrap();

    // Polling with inspect is not activity: the idle one stops.
    wait_state(&d, &idle, "stopped", 30);
    let info = inspect(&d, &idle);
    assert_eq!(info["state_reason"], "idle_timeout");
    assert!(info["inactive_since"].is_string(), "{info}");
    let ev = event_with(&d, &idle, "idle_timeout").expect("an idle_timeout event");
    assert_eq!((ev["from"].as_str(), ev["to"].as_str()), (Some("running"), Some("stopped")));
    assert!(ev["duration_ms"].is_u64() && ev["time"].is_string());

    // The busy one has been quiet for longer than its timeout but runs a process.
    assert_eq!(state(&d, &busy), "running", "a running process keeps the sandbox awake");
    let ps = common::rt().block_on(c.list_processes(&busy)).unwrap();
    assert!(
        ps.iter().any(|x| x.id == p.id && x.status == strata_api::ProcessStatus::Running),
        "the test needs the process still running: {ps:?}"
    );
    // Once it ends, the sandbox goes idle and is stopped.
    wait_state(&d, &busy, "stopped", 60);
    assert_eq!(inspect(&d, &busy)["state_reason"], "idle_timeout");
}

#[test]
fn a_lease_keeps_a_sandbox_awake_across_a_daemon_restart_until_released() {
    require_host!();
    let mut d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&["--name", "held", "--on-idle", "stop", "--idle-timeout", "2s"]);
    let out = d.cli_ok(&["lease", "held", "--for", "10m"]);
    let mut fields = out.split_whitespace();
    let lease = fields.next().unwrap().to_string();
    assert_eq!(lease.len(), 16, "lease prints the id first: {out:?}");
    assert!(fields.next().is_some_and(|t| t.ends_with('Z')), "then the expiry: {out:?}");

    // Leases are durable: they survive a daemon restart.
    d.kill9_and_restart();
    let leases: Vec<serde_json::Value> = serde_json::from_str(&d.cli_ok(&["lease", "ls", &id, "--json"])).unwrap();
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0]["id"], lease.as_str());
    assert_eq!(leases[0]["sandbox_id"], id.as_str());
    // Renewing moves the expiry.
    let renewed: serde_json::Value =
        serde_json::from_str(&d.cli_ok(&["lease", "renew", &id, &lease, "--for", "20m", "--json"])).unwrap();
    assert!(
        renewed["expires_at"].as_str().unwrap() > leases[0]["expires_at"].as_str().unwrap(),
        "{renewed} vs {}",
        leases[0]
    );

    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(state(&d, &id), "running", "a held lease keeps the sandbox awake past its idle timeout");

    assert_eq!(d.cli_ok(&["lease", "release", &id, &lease]).trim(), lease);
    assert!(d.cli_ok(&["lease", "ls", &id]).lines().count() == 1, "only the header is left");
    wait_state(&d, &id, "stopped", 30);
    assert_eq!(inspect(&d, &id)["state_reason"], "idle_timeout");

    // A lease that lapses stops holding the sandbox too.
    d.cli_ok(&["start", &id]);
    d.cli_ok(&["lease", &id, "--for", "3s"]);
    wait_state(&d, &id, "stopped", 40);
    assert!(common::rt().block_on(d.client().list_leases(&id)).unwrap().is_empty(), "the lapsed lease is gone");
}

#[test]
fn after_a_restart_idle_time_counts_from_the_daemon_start() {
    require_host!();
    let mut d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&["--on-idle", "keep", "--idle-timeout", "6s"]);
    // Quiet for longer than the timeout, but "keep" does nothing.
    std::thread::sleep(Duration::from_secs(7));
    assert_eq!(state(&d, &id), "running");
    d.kill9_and_restart();
    // The new daemon knows no activity: it counts the sandbox active at its start,
    // so switching to "stop" right away does not stop it at once.
    let s = common::rt()
        .block_on(d.client().update_sandbox(
            &id,
            &UpdateSandboxRequest {
                policy: Some(PolicyPatch { on_idle: Some(OnIdle::Stop), ..Default::default() }),
                ..Default::default()
            },
        ))
        .unwrap();
    assert_eq!(s.policy.on_idle, OnIdle::Stop);
    assert_eq!(state(&d, &id), "running", "not stopped right after a restart");
    wait_state(&d, &id, "stopped", 40);
}

#[test]
fn update_changes_the_policy_of_a_live_sandbox_and_defaults_are_shown() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    // Defaults: persistent sandboxes go to standby, ephemeral ones are destroyed, after 15m.
    let per = d.create(&[]);
    let eph = d.create(&["--lifecycle", "ephemeral"]);
    let p = inspect(&d, &per)["policy"].clone();
    assert_eq!((p["on_idle"].as_str(), p["idle_timeout"].as_str()), (Some("standby"), Some("15m")), "{p}");
    assert!(p.get("max_lifetime").is_none() && p.get("delete_after").is_none(), "{p}");
    assert_eq!(inspect(&d, &eph)["policy"]["on_idle"], "destroy");

    let id = d.create(&["--on-idle", "keep", "--idle-timeout", "2s", "--max-lifetime", "1h", "--delete-after", "7d"]);
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(state(&d, &id), "running", "keep never acts on idleness");
    // `update` changes only what it is given, and clears a limit with "none".
    let s: serde_json::Value =
        serde_json::from_str(&d.cli_ok(&["update", &id, "--on-idle", "stop", "--max-lifetime", "none", "--json"]))
            .unwrap();
    assert_eq!(s["policy"]["on_idle"], "stop");
    assert_eq!(s["policy"]["idle_timeout"], "2s");
    assert_eq!(s["policy"]["delete_after"], "7d");
    assert!(s["policy"].get("max_lifetime").is_none(), "{s}");
    wait_state(&d, &id, "stopped", 30);
    assert_eq!(inspect(&d, &id)["state_reason"], "idle_timeout");
    // The human view shows the policy.
    assert!(d.cli_ok(&["inspect", &id]).contains("on_idle=stop after 2s"));
}

#[test]
fn an_idle_ephemeral_sandbox_is_destroyed() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&["--lifecycle", "ephemeral", "--idle-timeout", "2s"]);
    assert!(common::wait_until(30, || !exists(&d, &id)), "the idle ephemeral sandbox is destroyed");
    let ev = event_with(&d, &id, "idle_timeout").expect("an idle_timeout event");
    assert_eq!((ev["from"].as_str(), ev["to"].as_str()), (Some("running"), Some("destroyed")));
}

#[test]
fn max_lifetime_ends_a_run_even_while_busy() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let per = d.create(&["--on-idle", "keep", "--max-lifetime", "3s"]);
    let eph = d.create(&["--lifecycle", "ephemeral", "--max-lifetime", "3s"]);
    // --on-max-lifetime chooses the action: an ephemeral sandbox kept in standby.
    let parked = d.create(&["--lifecycle", "ephemeral", "--max-lifetime", "3s", "--on-max-lifetime", "standby"]);
    assert_eq!(inspect(&d, &parked)["policy"]["on_max_lifetime"], "standby");
    let refused = d.cli(&["create", "busybox", "--max-lifetime", "3s", "--on-max-lifetime", "keep"]);
    assert!(
        !refused.status.success() && common::stderr(&refused).contains("on_max_lifetime"),
        "{}",
        common::stderr(&refused)
    );
    let c = d.client();
    for id in [&per, &eph, &parked] {
        common::rt()
            .block_on(
                c.start_process(id, &ExecRequest { cmd: vec!["sleep".into(), "60".into()], ..Default::default() }),
            )
            .unwrap();
    }
    wait_state(&d, &per, "stopped", 40);
    assert_eq!(inspect(&d, &per)["state_reason"], "max_lifetime");
    assert!(common::wait_until(30, || !exists(&d, &eph)));
    assert_eq!(event_with(&d, &eph, "max_lifetime").expect("a max_lifetime event")["to"], "destroyed");
    wait_state(&d, &parked, "standby", 40);
    assert_eq!(inspect(&d, &parked)["state_reason"], "max_lifetime");
    // Started by hand after the deadline: the new run is left alone.
    d.cli_ok(&["start", &per]);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(state(&d, &per), "running");
}

#[test]
fn delete_after_destroys_a_sandbox_stopped_long_enough() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&["--on-idle", "keep", "--delete-after", "2s"]);
    std::thread::sleep(Duration::from_secs(3));
    assert!(exists(&d, &id), "delete_after does not apply while running");
    d.cli_ok(&["stop", &id]);
    assert!(common::wait_until(30, || !exists(&d, &id)), "destroyed after 2s stopped");
    let ev = event_with(&d, &id, "delete_after").expect("a delete_after event");
    assert_eq!((ev["from"].as_str(), ev["to"].as_str()), (Some("stopped"), Some("destroyed")));
    // Its leases went with it.
    let kept = d.create(&["--on-idle", "keep", "--delete-after", "2s"]);
    d.cli_ok(&["stop", &kept]);
    d.cli_ok(&["lease", &kept, "--for", "10m"]);
    std::thread::sleep(Duration::from_secs(4));
    assert!(exists(&d, &kept), "a lease holds retention off");
}

#[test]
fn a_failed_automatic_action_is_recorded_and_not_retried_in_a_loop() {
    require_host!();
    let d = TestDaemon::start_with_env(&[("STRATA_FAILPOINTS", "policy_action")]);
    d.import_busybox();
    let id = d.create(&["--on-idle", "stop", "--idle-timeout", "2s"]);
    assert!(
        common::wait_until(30, || event_with(&d, &id, "idle_action_failed").is_some()),
        "the failure is an event; log:\n{}",
        d.log()
    );
    let ev = event_with(&d, &id, "idle_action_failed").unwrap();
    assert_eq!((ev["from"].as_str(), ev["to"].as_str()), (Some("running"), Some("running")));
    assert!(ev["detail"].as_str().unwrap().contains("idle_timeout: stop failed"), "{ev}");
    // Retried at most once a minute: a few seconds later there is still one failure.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(events(&d, &id).iter().filter(|e| e["reason"] == "idle_action_failed").count(), 1);
    assert_eq!(state(&d, &id), "running");
    assert!(d.log().contains("automatic lifecycle action failed"));
}

#[test]
fn bad_policy_and_lease_requests_are_rejected_with_codes() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[]);
    let c = d.client();
    let rt = common::rt();
    let patch = |p: PolicyPatch| UpdateSandboxRequest { policy: Some(p), ..Default::default() };
    rt.block_on(async {
        // Unknown sandbox.
        let e = c
            .update_sandbox("nope", &patch(PolicyPatch { on_idle: Some(OnIdle::Stop), ..Default::default() }))
            .await
            .unwrap_err();
        assert_eq!(api_error(e), (404, ErrorCode::SandboxNotFound));
        assert_eq!(api_error(c.create_lease("nope", "1m").await.unwrap_err()), (404, ErrorCode::SandboxNotFound));
        assert_eq!(api_error(c.list_leases("nope").await.unwrap_err()), (404, ErrorCode::SandboxNotFound));
        // Bad durations.
        for p in [
            PolicyPatch { idle_timeout: Some("soon".into()), ..Default::default() },
            PolicyPatch { idle_timeout: Some("none".into()), ..Default::default() },
            PolicyPatch { max_lifetime: Some("0s".into()), ..Default::default() },
            PolicyPatch { delete_after: Some("-1h".into()), ..Default::default() },
        ] {
            assert_eq!(
                api_error(c.update_sandbox(&id, &patch(p.clone())).await.unwrap_err()),
                (400, ErrorCode::BadRequest),
                "{p:?}"
            );
        }
        assert_eq!(api_error(c.create_lease(&id, "forever").await.unwrap_err()), (400, ErrorCode::BadRequest));
        // Unknown on_idle value, on update and on create.
        let e = c
            .send(
                Method::PATCH,
                &format!("/v1/sandboxes/{id}"),
                Body::from_static(br#"{"policy":{"on_idle":"hibernate"}}"#),
                "application/json",
            )
            .await
            .unwrap_err();
        assert_eq!(api_error(e), (400, ErrorCode::BadRequest));
        let e = c
            .send(
                Method::POST,
                "/v1/sandboxes",
                Body::from_static(br#"{"source":"busybox","policy":{"on_idle":"hibernate"}}"#),
                "application/json",
            )
            .await
            .unwrap_err();
        assert_eq!(api_error(e), (400, ErrorCode::BadRequest));
        // Unknown lease.
        assert_eq!(
            api_error(c.renew_lease(&id, "0123456789abcdef", "1m").await.unwrap_err()),
            (404, ErrorCode::LeaseNotFound)
        );
        assert_eq!(
            api_error(c.release_lease(&id, "0123456789abcdef").await.unwrap_err()),
            (404, ErrorCode::LeaseNotFound)
        );
        // A lease is scoped to its sandbox.
        let other = c
            .create_sandbox(&strata_api::CreateSandboxRequest { source: "busybox".into(), ..Default::default() })
            .await
            .unwrap();
        let l = c.create_lease(&other.id, "1m").await.unwrap();
        assert_eq!(api_error(c.release_lease(&id, &l.id).await.unwrap_err()), (404, ErrorCode::LeaseNotFound));
        // An empty update changes nothing and returns the sandbox.
        let s = c.update_sandbox(&id, &UpdateSandboxRequest::default()).await.unwrap();
        assert_eq!(s.policy.on_idle, OnIdle::Standby);
    });
    // Nothing was changed by the rejected updates.
    assert_eq!(inspect(&d, &id)["policy"]["idle_timeout"], "15m");
    // The CLI: bad duration at create, nothing to update, unknown lease.
    let out = d.cli(&["create", "busybox", "--idle-timeout", "soon"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(common::stderr(&out).contains("bad_request"), "{}", common::stderr(&out));
    let out = d.cli(&["update", &id]);
    assert_eq!(out.status.code(), Some(1));
    assert!(common::stderr(&out).contains("nothing to update"));
    let out = d.cli(&["update", "nope", "--on-idle", "stop"]);
    assert!(common::stderr(&out).contains("sandbox_not_found"), "{}", common::stderr(&out));
    let out = d.cli(&["lease", "release", &id, "nope"]);
    assert!(common::stderr(&out).contains("lease_not_found"), "{}", common::stderr(&out));
}
