//! The audit log: mutations recorded with who/what/target/status, and a hash
//! chain that detects edited, removed and reordered entries.

mod common;

use common::TestDaemon;

fn entries(d: &TestDaemon) -> Vec<serde_json::Value> {
    serde_json::from_str(&d.cli_ok(&["audit", "--json", "--limit", "1000"])).unwrap()
}

fn verify(d: &TestDaemon) -> serde_json::Value {
    let out = d.cli(&["audit", "verify", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.success(), v["ok"] == true, "exit status follows the result: {v}");
    v
}

type Row = (i64, String, String, String, String, Option<String>, i64, String, String);

fn row(c: &rusqlite::Connection, seq: i64) -> Row {
    c.query_row(
        "SELECT seq, time, actor, method, route, target, status, prev_hash, hash FROM audit WHERE seq = ?1",
        [seq],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?, r.get(8)?)),
    )
    .unwrap()
}

fn insert(c: &rusqlite::Connection, r: &Row) {
    c.execute(
        "INSERT INTO audit (seq, time, actor, method, route, target, status, prev_hash, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        rusqlite::params![r.0, r.1, r.2, r.3, r.4, r.5, r.6, r.7, r.8],
    )
    .unwrap();
}

#[test]
fn mutations_are_logged_and_verify_detects_tampering() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&["--name", "a1"]);
    d.cli_ok(&["exec", "a1", "--", "true"]);
    d.cli_ok(&["inspect", "a1"]);
    assert!(!d.cli(&["exec", "missing", "--", "true"]).status.success());
    assert!(!d.cli(&["create", "no-such-image"]).status.success());
    d.cli_ok(&["rm", "--force", "a1"]);

    let log = entries(&d);
    let find = |method: &str, route: &str, target: Option<&str>| {
        log.iter()
            .find(|e| e["method"] == method && e["route"] == route && target.is_none_or(|t| e["target"] == t))
            .unwrap_or_else(|| panic!("no {method} {route} {target:?} in {log:#?}"))
            .clone()
    };
    let created = find("POST", "/v1/sandboxes", None);
    assert_eq!(created["status"], 201);
    let first_create_target = created["target"].as_str().unwrap();
    assert_eq!(first_create_target, id, "the created id is the target");
    assert_eq!(find("POST", "/v1/sandboxes/{id}/exec", Some("a1"))["status"], 200);
    assert_eq!(find("POST", "/v1/sandboxes/{id}/exec", Some("missing"))["status"], 404, "failed requests are logged");
    assert!(log.iter().any(|e| e["route"] == "/v1/sandboxes" && e["status"] == 404), "{log:#?}");
    assert_eq!(find("DELETE", "/v1/sandboxes/{id}", Some("a1"))["status"], 200);
    assert!(log.iter().all(|e| e["method"] != "GET"), "reads are not logged");
    assert!(log.iter().all(|e| e["actor"] == "uid:0"), "{log:#?}");
    for (i, e) in log.iter().enumerate() {
        assert_eq!(e["seq"], i as i64 + 1);
        assert!(e["time"].as_str().unwrap().starts_with("20"));
        if i > 0 {
            assert_eq!(e["prev_hash"], log[i - 1]["hash"]);
        }
    }
    assert_eq!(log[0]["prev_hash"], "0".repeat(64));
    let text = d.cli_ok(&["audit", "--limit", "2"]);
    assert_eq!(text.lines().count(), 3, "header + 2 entries: {text}");
    let v = verify(&d);
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["entries"], log.len());

    let c = rusqlite::Connection::open(d.state("metadata.db")).unwrap();
    c.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    let failed_seq = find("POST", "/v1/sandboxes/{id}/exec", Some("missing"))["seq"].as_i64().unwrap();

    // Edited: a failure rewritten as a success.
    c.execute("UPDATE audit SET status = 200 WHERE seq = ?1", [failed_seq]).unwrap();
    let v = verify(&d);
    assert_eq!((v["ok"].clone(), v["first_bad"].clone()), (false.into(), failed_seq.into()), "{v}");
    assert!(v["reason"].as_str().unwrap().contains("edited"), "{v}");
    assert!(common::stdout(&d.cli(&["audit", "verify"])).contains(&format!("BROKEN at entry {failed_seq}")));
    c.execute("UPDATE audit SET status = 404 WHERE seq = ?1", [failed_seq]).unwrap();
    assert_eq!(verify(&d)["ok"], true);

    // Edited including a recomputed own hash: the next entry's link breaks.
    let orig = row(&c, 2);
    let mut forged: strata_api::AuditEntry = serde_json::from_value(log[1].clone()).unwrap();
    forged.actor = "uid:1000".into();
    forged.hash = strata_store_hash(&forged);
    c.execute("UPDATE audit SET actor = ?1, hash = ?2 WHERE seq = 2", rusqlite::params![forged.actor, forged.hash])
        .unwrap();
    let v = verify(&d);
    assert_eq!(v["first_bad"], 3, "{v}");
    c.execute("UPDATE audit SET actor = ?1, hash = ?2 WHERE seq = 2", rusqlite::params![orig.2, orig.8]).unwrap();
    assert_eq!(verify(&d)["ok"], true);

    // Removed.
    let r3 = row(&c, 3);
    c.execute("DELETE FROM audit WHERE seq = 3", []).unwrap();
    let v = verify(&d);
    assert_eq!((v["ok"].clone(), v["first_bad"].clone()), (false.into(), 4.into()), "{v}");
    insert(&c, &r3);
    assert_eq!(verify(&d)["ok"], true);

    // Reordered: entries 2 and 3 swap places.
    let (r2, r3) = (row(&c, 2), row(&c, 3));
    c.execute("DELETE FROM audit WHERE seq IN (2, 3)", []).unwrap();
    insert(
        &c,
        &(2, r3.1.clone(), r3.2.clone(), r3.3.clone(), r3.4.clone(), r3.5.clone(), r3.6, r3.7.clone(), r3.8.clone()),
    );
    insert(
        &c,
        &(3, r2.1.clone(), r2.2.clone(), r2.3.clone(), r2.4.clone(), r2.5.clone(), r2.6, r2.7.clone(), r2.8.clone()),
    );
    let v = verify(&d);
    assert_eq!((v["ok"].clone(), v["first_bad"].clone()), (false.into(), 2.into()), "{v}");
    c.execute("DELETE FROM audit WHERE seq IN (2, 3)", []).unwrap();
    insert(&c, &r2);
    insert(&c, &r3);
    assert_eq!(verify(&d)["ok"], true);

    // New entries keep chaining after the repairs.
    d.create(&["--name", "a2"]);
    assert_eq!(verify(&d)["ok"], true);
}

/// The chain's hash of an entry, computed independently of the daemon: sha256
/// over the JSON array of every field but the hash.
fn strata_store_hash(e: &strata_api::AuditEntry) -> String {
    let canonical = serde_json::to_vec(&serde_json::json!([
        e.seq,
        e.time,
        e.actor,
        e.method,
        e.route,
        e.target,
        e.status,
        e.prev_hash
    ]))
    .unwrap();
    let out = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(&canonical)?;
            c.wait_with_output()
        });
    String::from_utf8(out.unwrap().stdout).unwrap().split_whitespace().next().unwrap().to_string()
}

#[test]
fn tcp_callers_are_recorded_by_token_fingerprint() {
    require_host!();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let d = TestDaemon::start_with(Some(&addr));
    let token = std::fs::read_to_string(d.state("api-token")).unwrap().trim().to_string();
    let tcp = strata_client::Client::new(strata_client::Endpoint::Tcp { addr, token: Some(token.clone()) });
    let rt = common::rt();
    let e = rt.block_on(tcp.remove_sandbox("nothing-here", true)).unwrap_err();
    assert_eq!(e.code(), Some(strata_api::ErrorCode::SandboxNotFound));
    let log = entries(&d);
    let last = log.last().expect("an entry");
    assert_eq!(
        (last["method"].as_str(), last["route"].as_str(), last["target"].as_str(), last["status"].as_u64()),
        (Some("DELETE"), Some("/v1/sandboxes/{id}"), Some("nothing-here"), Some(404))
    );
    let actor = last["actor"].as_str().unwrap();
    assert!(actor.starts_with("token:") && actor.len() == "token:".len() + 12, "{actor}");
    assert!(!actor.contains(&token[..12]), "a fingerprint, not the token");
}
