//! E2B compatibility: the official `e2b` Python SDK (pinned to 2.63.0 and
//! installed into a venv by scripts/setup-host.sh) runs
//! crates/cli/tests/e2b/suite.py against a private daemon's TCP listener with
//! `E2B_API_URL`/`E2B_SANDBOX_URL` pointing at it and a tenant token as
//! `E2B_API_KEY`: sandboxes (create, info, list with filters and pages,
//! connect, kill, timeouts), commands (foreground, background, stdin,
//! timeouts, kill, list, reconnect, stream input), PTY (create, input, resize,
//! exit code), files (text and binary, multipart and
//! octet-stream, list, exists, rename, remove, make_dir, get_info, watch),
//! pause -> resume with a running process, fork, snapshots, metrics, logs,
//! network rules, and the
//! errors of bad keys, unknown ids, another tenant's key, unsupported calls and malformed frames.
//! The E2B template `base` is the Debian test image imported as `e2b-base`.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::TestDaemon;

/// The venv holding the pinned `e2b` package (see scripts/setup-host.sh).
fn venv_python() -> Option<PathBuf> {
    let venv = std::env::var("STRATA_E2B_VENV").unwrap_or_else(|_| "/var/cache/strata/venv-e2b".into());
    let py = PathBuf::from(venv).join("bin/python");
    let ok = Command::new(&py).args(["-c", "import e2b"]).output().is_ok_and(|o| o.status.success());
    ok.then_some(py)
}

/// Skips (outside CI) or fails (in CI) for a missing prerequisite.
fn missing(reason: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI must be able to run this test, but: {reason}");
    }
    println!("skipped: {reason}");
}

#[test]
fn e2b_sdk_suite_passes_against_a_live_daemon() {
    require_host!();
    let Some(py) = venv_python() else {
        return missing("the e2b SDK venv is missing (run scripts/setup-host.sh)");
    };
    let base = common::images_dir().join("debian-python.tar.gz");
    if !base.exists() {
        return missing(&format!("{} is missing (run scripts/build-test-images.sh --debian)", base.display()));
    }
    if let Some(reason) = strata_runtime::namespace::criu::unsupported() {
        return missing(&format!("pause/resume with processes needs CRIU: {reason}"));
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let d = TestDaemon::start_with(Some(&format!("127.0.0.1:{port}")));
    d.cli_ok(&["image", "import", base.to_str().unwrap(), "--name", "e2b-base", "--trusted"]);
    // A tenant's key, as `strata token create` prints it for E2B_API_KEY.
    let key = d.cli_ok(&["token", "create", "--name", "e2b-suite", "--tenant", "e2b"]);
    let key = key.lines().find(|l| l.starts_with("strata_")).unwrap_or(key.trim()).trim().to_string();
    let other = d.cli_ok(&["token", "create", "--name", "e2b-other", "--tenant", "other"]);
    let other = other.trim().to_string();
    let url = format!("http://127.0.0.1:{port}");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2b/suite.py");
    let out = Command::new(&py)
        .arg(&script)
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_API_KEY", &key)
        .env("E2B_OTHER_KEY", &other)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run the e2b suite");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}\n{stderr}");
    assert!(out.status.success(), "e2b suite failed ({:?}); daemon log:\n{}", out.status, d.log());
    assert!(stderr.contains("\nOK"), "unittest did not report OK:\n{stderr}");
    assert!(!stderr.contains("skipped"), "a test of the suite was skipped:\n{stderr}");
    // Everything the tenant made is gone or still its own: nothing leaked to the operator's view.
    let ls = d.cli_ok(&["ps", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&ls).unwrap();
    for s in v.as_array().unwrap() {
        assert_eq!(s["tenant"], "e2b", "sandbox outside the key's tenant: {s}");
    }
}
