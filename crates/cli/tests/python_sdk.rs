//! Runs the Python SDK's test suite (sdk/python/tests, stdlib unittest) against a
//! private daemon, over its Unix socket and over TCP with the bearer token.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::TestDaemon;

#[test]
fn python_sdk_suite_passes_against_a_live_daemon() {
    require_host!();
    if Command::new("python3").arg("--version").output().is_err() {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("CI must be able to run this test, but python3 is missing");
        }
        println!("skipped: python3 not found");
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let d = TestDaemon::start_with(Some(&format!("127.0.0.1:{port}")));
    d.import_busybox();
    let token = std::fs::read_to_string(d.state("api-token")).unwrap().trim().to_string();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let sdk = root.join("sdk/python");
    let out = Command::new("python3")
        .args(["-m", "unittest", "discover", "-s"])
        .arg(sdk.join("tests"))
        .arg("-v")
        .current_dir(&root)
        .env("PYTHONPATH", sdk.join("src"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("STRATA_SOCKET", &d.socket)
        .env("STRATA_URL", format!("http://127.0.0.1:{port}"))
        .env("STRATA_TOKEN", &token)
        .env("STRATA_TEST_IMAGES", common::images_dir())
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}\n{stderr}");
    assert!(out.status.success(), "python SDK tests failed ({:?}); daemon log:\n{}", out.status, d.log());
    assert!(stderr.contains("OK"), "unittest did not report OK:\n{stderr}");
    // The live suite ran (not only the offline tests).
    assert!(
        !stderr.contains("STRATA_SOCKET is not set") && stderr.contains("test_fork_two_see_the_file"),
        "the live tests did not run:\n{stderr}"
    );
}
