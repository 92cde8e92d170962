//! Fan-out and select: `strata fork SOURCE --run ...` / `POST /v1/fanout`.

mod common;

use common::TestDaemon;
use strata_api::{ErrorCode, FanoutPlan, FanoutRequest};

fn json(d: &TestDaemon, args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&d.cli_ok(args)).unwrap()
}

fn ps_ids(d: &TestDaemon) -> Vec<String> {
    let v: Vec<serde_json::Value> = serde_json::from_str(&d.cli_ok(&["ps", "--json"])).unwrap();
    v.iter().map(|s| s["id"].as_str().unwrap().to_string()).collect()
}

/// A running sandbox `base` with /root/base, checkpointed as `c0`.
fn base(d: &TestDaemon) {
    d.import_busybox();
    d.create(&["--name", "base"]);
    d.cli_ok(&["exec", "base", "--", "sh", "-c", "echo from-base > /root/base"]);
    d.cli_ok(&["checkpoint", "base", "--name", "c0"]);
}

#[test]
fn first_success_picks_the_passing_attempt_and_destroys_the_losers() {
    require_host!();
    let d = TestDaemon::start();
    base(&d);
    let r =
        json(&d, &["fork", "c0", "--run", "echo attempt-{i} > /root/result; test {i} = 2", "--count", "4", "--json"]);
    assert_eq!(r["winner"], 2, "{r}");
    let attempts = r["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 4);
    let outcomes: Vec<&str> = attempts.iter().map(|a| a["outcome"].as_str().unwrap()).collect();
    // Attempts 1, 3 and 4 either failed or were cancelled once 2 had won; none passed.
    assert_eq!(outcomes[1], "passed");
    for (i, o) in outcomes.iter().enumerate().filter(|(i, _)| *i != 1) {
        assert!(*o == "failed" || *o == "cancelled", "attempt {}: {o}", i + 1);
    }
    let winner = r["winner_sandbox"].as_str().unwrap().to_string();
    assert_eq!(attempts[1]["sandbox_id"], winner.as_str());
    // The losers are gone; the winner (and the source) are still there.
    let ids = ps_ids(&d);
    for (i, a) in attempts.iter().enumerate() {
        let id = a["sandbox_id"].as_str().unwrap().to_string();
        assert_eq!(ids.contains(&id), i == 1, "attempt {} in ps: {}", i + 1, ids.contains(&id));
        assert_eq!(a["kept"], i == 1);
    }
    // The winner carries its change on top of the source's state.
    assert_eq!(d.cli_ok(&["exec", &winner, "--", "cat", "/root/base", "/root/result"]), "from-base\nattempt-2\n");
    // Every child has events for its attempt.
    let events = d.cli_ok(&["events", &winner, "--json"]);
    assert!(events.contains("\"reason\":\"fanout_winner\""), "{events}");
    // The human output is a table with the winner marked.
    let out = d.cli(&["fork", "c0", "--run", "test {i} = 1", "--count", "2"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let text = common::stdout(&out);
    assert!(text.contains("OUTCOME") && text.contains("winner: attempt 1"), "{text}");
}

#[test]
fn best_score_picks_the_highest_keeps_losers_and_promotes_the_winner() {
    require_host!();
    let d = TestDaemon::start();
    base(&d);
    let r = json(
        &d,
        &[
            "fork",
            "c0",
            "--run",
            "echo {arg} > /root/score",
            "--arg",
            "3",
            "--arg",
            "9.5",
            "--arg",
            "not-a-number",
            "--arg",
            "5",
            "--select",
            "score",
            "--score-cmd",
            "echo scoring; cat /root/score",
            "--keep-losers",
            "--promote",
            "best",
            "--json",
        ],
    );
    assert_eq!(r["winner"], 2, "{r}");
    let attempts = r["attempts"].as_array().unwrap();
    let scores: Vec<Option<f64>> = attempts.iter().map(|a| a["score"].as_f64()).collect();
    assert_eq!(scores, [Some(3.0), Some(9.5), None, Some(5.0)]);
    assert!(attempts[2]["score_error"].as_str().unwrap().contains("not a number"), "{}", attempts[2]);
    // Kept losers are still listed.
    let ids = ps_ids(&d);
    for a in attempts {
        assert!(ids.contains(&a["sandbox_id"].as_str().unwrap().to_string()));
        assert_eq!(a["kept"], true);
    }
    // The promoted checkpoint is a source like any other.
    assert_eq!(r["promoted"]["name"], "best");
    let from_best = d.cli_ok(&["create", "best"]).trim().to_string();
    assert_eq!(d.cli_ok(&["exec", &from_best, "--", "cat", "/root/score"]), "9.5\n");
}

#[test]
fn all_success_with_a_failure_has_no_winner_and_says_why() {
    require_host!();
    let d = TestDaemon::start();
    base(&d);
    let before = ps_ids(&d);
    let out =
        d.cli(&["fork", "base", "--run", "echo out-{i}; test {i} != 3", "--count", "3", "--select", "all", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", common::stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(r["winner"].is_null());
    let reason = r["reason"].as_str().unwrap();
    assert!(reason.contains("1 of 3") && reason.contains("attempt 3 exited 1"), "{reason}");
    assert_eq!(r["attempts"][2]["stdout_tail"], "out-3\n");
    // No winner, losers destroyed: only what was there before is left (plus nothing).
    assert_eq!(ps_ids(&d), before);
    // A per-attempt timeout kills a slow attempt and says so.
    let out = d.cli(&[
        "fork",
        "c0",
        "--run",
        "if [ {i} = 1 ]; then sleep 60; fi",
        "--count",
        "2",
        "--select",
        "all",
        "--timeout",
        "1s",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", common::stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(r["winner"].is_null());
    assert!(r["reason"].as_str().unwrap().contains("attempt 1 timed out"), "{r}");
    assert_eq!(r["attempts"][0]["outcome"], "timed_out");
    assert_eq!(r["attempts"][1]["outcome"], "passed");
}

#[test]
fn bad_fanout_requests_are_refused() {
    require_host!();
    let d = TestDaemon::start();
    base(&d);
    let c = d.client();
    let rt = common::rt();
    let req = |source: &str, plan: FanoutPlan| FanoutRequest { source: source.into(), plan, ..Default::default() };
    let run = |count: u32| FanoutPlan { run: Some("true".into()), count: Some(count), ..Default::default() };
    for (r, want) in [
        (req("c0", run(0)), "between 1 and 64"),
        (req("c0", run(65)), "between 1 and 64"),
        (req("c0", FanoutPlan { run: Some(" ".into()), count: Some(2), ..Default::default() }), "empty command"),
        (
            req(
                "c0",
                FanoutPlan {
                    run: Some("true".into()),
                    count: Some(2),
                    select: strata_api::SelectRule::BestScore,
                    ..Default::default()
                },
            ),
            "score",
        ),
    ] {
        match rt.block_on(c.fanout(&r)).unwrap_err() {
            strata_client::ClientError::Api { status, body } => {
                assert_eq!((status, body.code), (400, ErrorCode::BadRequest));
                assert!(body.message.contains(want), "{}", body.message);
            }
            other => panic!("{other}"),
        }
    }
    assert_eq!(rt.block_on(c.fanout(&req("nope", run(2)))).unwrap_err().code(), Some(ErrorCode::SandboxNotFound));
    // The CLI refuses an empty --run the same way; nothing was forked by any of these.
    let out = d.cli(&["fork", "c0", "--run", "", "--count", "2"]);
    assert!(!out.status.success() && common::stderr(&out).contains("empty command"), "{}", common::stderr(&out));
    assert_eq!(ps_ids(&d).len(), 1);
    // A promotion name that is taken is refused before anything is forked.
    let e = rt.block_on(c.fanout(&FanoutRequest { promote_as: Some("c0".into()), ..req("c0", run(2)) })).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NameConflict));
    assert_eq!(ps_ids(&d).len(), 1);
}
