//! A daemon whose metadata is in PostgreSQL (`strata daemon --database
//! postgres://...`), against a real server on loopback (the store's test
//! server: Debian's postgresql, a private cluster per test process).

mod common;

use common::{rt, TestDaemon};
use strata_store::testing::PgServer;

/// The shared test server, or `None` (skipped, saying why; failed in CI).
fn postgres_or_skip() -> Option<&'static PgServer> {
    match strata_store::testing::shared() {
        Ok(s) => Some(s),
        Err(why) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("CI must be able to run this test, but: {why}")
        }
        Err(why) => {
            println!("skipped: {why}");
            None
        }
    }
}

fn count(url: &str, sql: &str) -> i64 {
    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
    c.query_one(sql, &[]).unwrap().get(0)
}

#[test]
fn a_daemon_on_postgres_runs_the_lifecycle_and_keeps_it_across_a_restart() {
    require_criu!();
    let Some(pg) = postgres_or_skip() else { return };
    let url = pg.fresh_database();
    let mut d = TestDaemon::start_with_env(&[("STRATA_DATABASE", &url)]);
    assert!(d.log().contains("postgres 127.0.0.1:"), "the daemon names its database: {}", d.log());
    d.import_busybox();
    let id = d.create(&["--name", "dev"]);
    d.cli_ok(&["exec", "dev", "--", "sh", "-c", "echo v1 > /root/a"]);
    d.cli_ok(&["checkpoint", "dev", "--name", "c1"]);
    let forks: Vec<String> = d.cli_ok(&["fork", "c1", "--count", "2"]).lines().map(str::to_string).collect();
    assert_eq!(forks.len(), 2);
    for f in &forks {
        assert_eq!(d.cli_ok(&["exec", f, "--", "cat", "/root/a"]), "v1\n");
    }
    d.cli_ok(&["standby", "dev"]);
    // A call resumes it (the transition recorded in PostgreSQL).
    assert_eq!(d.cli_ok(&["exec", "dev", "--", "cat", "/root/a"]), "v1\n");
    d.cli_ok(&["stop", &forks[1]]);
    d.cli_ok(&["rm", "-f", &forks[1]]);

    // Everything is in the database, nothing in a SQLite file.
    assert!(!d.state("metadata.db").exists());
    assert_eq!(count(&url, "SELECT count(*) FROM sandboxes"), 2);
    assert_eq!(count(&url, "SELECT count(*) FROM checkpoints WHERE name = 'c1'"), 1);
    let reasons =
        count(&url, &format!("SELECT count(*) FROM events WHERE sandbox_id = '{id}' AND to_state = 'standby'"));
    assert_eq!(reasons, 1, "the standby event");
    let verify: serde_json::Value = serde_json::from_str(&d.cli_ok(&["audit", "verify", "--json"])).unwrap();
    assert_eq!(verify["ok"], true, "{verify}");

    // A daemon killed and started again finds its sandboxes in the database.
    d.kill9_and_restart();
    let listed: serde_json::Value = serde_json::from_str(&d.cli_ok(&["ps", "--json"])).unwrap();
    let names: Vec<&str> = listed.as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 2, "{listed}");
    assert!(names.contains(&"dev"), "{listed}");
    assert_eq!(d.cli_ok(&["exec", "dev", "--", "cat", "/root/a"]), "v1\n");
    let seqs: Vec<i64> = d
        .cli_ok(&["events", "dev", "--json"])
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"].as_i64().unwrap())
        .collect();
    assert!(seqs.len() >= 4, "created, standby, resumed ... : {seqs:?}");
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "events in order: {seqs:?}");
}

#[test]
fn a_daemon_refuses_to_start_without_its_database_or_beside_another_on_it() {
    require_host!();
    let Some(pg) = postgres_or_skip() else { return };
    let dir = tempfile::Builder::new().prefix("strata-it-").tempdir_in("/var/tmp").unwrap();
    let start = |name: &str, url: &str| {
        std::process::Command::new(common::strata_bin())
            .args(["daemon", "--state-dir"])
            .arg(dir.path().join(name))
            .arg("--socket")
            .arg(dir.path().join(format!("{name}.sock")))
            .args(["--database", url, "--network-pool", "10.159.0.0/24"])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let out = start("a", "postgres://strata:s3cret@127.0.0.1:1/meta");
    let err = common::stderr(&out);
    assert!(!out.status.success());
    assert!(err.contains("the metadata database at 127.0.0.1:1/meta is unavailable"), "{err}");
    assert!(!err.contains("s3cret"), "{err}");

    let url = pg.fresh_database();
    let d = TestDaemon::start_with_env(&[("STRATA_DATABASE", &url)]);
    let out = start("b", &url);
    let err = common::stderr(&out);
    assert!(!out.status.success());
    assert!(err.contains("another strata daemon uses this database"), "{err}");
    // The first one is untouched.
    d.cli_ok(&["ps"]);
}

#[test]
fn a_lost_database_answers_503_writes_nothing_and_the_daemon_carries_on_when_it_is_back() {
    require_host!();
    if postgres_or_skip().is_none() {
        return;
    }
    let mut pg = PgServer::start().unwrap();
    let url = pg.fresh_database();
    let d = TestDaemon::start_with_env(&[("STRATA_DATABASE", &url)]);
    d.import_busybox();
    let id = d.create(&["--name", "kept"]);
    pg.stop();
    let c = d.client();
    let e = rt().block_on(c.get_sandbox(&id)).unwrap_err().to_string();
    assert!(e.contains("metadata_unavailable") || e.contains("is unavailable"), "{e}");
    let out = d.cli(&["create", "busybox", "--name", "lost"]);
    let err = common::stderr(&out);
    assert!(!out.status.success());
    assert!(err.contains("unavailable"), "{err}");
    // The API says 503 with the code and the reason.
    let body = {
        use std::io::{Read, Write};
        let mut sock = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
        write!(sock, "GET /v1/sandboxes/{id} HTTP/1.1\r\nHost: strata\r\nConnection: close\r\n\r\n").unwrap();
        let mut body = String::new();
        sock.read_to_string(&mut body).unwrap();
        body
    };
    assert!(body.starts_with("HTTP/1.1 503"), "{body}");
    assert!(body.contains("\"code\":\"metadata_unavailable\"") && body.contains("127.0.0.1:"), "{body}");

    pg.restart().unwrap();
    assert!(common::wait_until(30, || d.cli(&["inspect", "kept"]).status.success()), "{}", d.log());
    let listed: serde_json::Value = serde_json::from_str(&d.cli_ok(&["ps", "--json"])).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "the create during the outage left nothing: {listed}");
    assert_eq!(d.cli_ok(&["exec", "kept", "--", "echo", "back"]), "back\n");
    d.create(&["--name", "after"]);
}
