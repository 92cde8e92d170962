//! The MCP server, driven by a real MCP client: the official Python SDK (`mcp`,
//! pinned and installed into a venv by scripts/setup-host.sh) runs
//! crates/cli/tests/mcp/client.py against `strata mcp` over stdio and against
//! the daemon's `/mcp` endpoint over streamable HTTP (TCP, bearer token). The
//! script lists the tools and calls every one of them (create, exec with output
//! and exit codes, files, checkpoint, diff, fork, restore, standby/resume,
//! destroy, bad input).

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::TestDaemon;

/// The venv holding the pinned `mcp` package (see scripts/setup-host.sh).
fn venv_python() -> Option<PathBuf> {
    let venv = std::env::var("STRATA_MCP_VENV").unwrap_or_else(|_| "/var/cache/strata/venv-mcp".into());
    let py = PathBuf::from(venv).join("bin/python");
    let ok = Command::new(&py).args(["-c", "import mcp, httpx2"]).output().is_ok_and(|o| o.status.success());
    ok.then_some(py)
}

macro_rules! require_mcp_client {
    () => {{
        match venv_python() {
            Some(py) => py,
            None => {
                let reason = "the MCP Python SDK venv is missing (run scripts/setup-host.sh)";
                if std::env::var("CI").is_ok_and(|v| v == "true") {
                    panic!("CI must be able to run this test, but: {reason}");
                }
                println!("skipped: {reason}");
                return;
            }
        }
    }};
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/client.py")
}

/// Whether standby with processes can be tested here (in CI it must be).
fn criu_flag() -> Option<&'static str> {
    match strata_runtime::namespace::criu::unsupported() {
        None => Some("--criu"),
        Some(reason) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("CI must be able to run standby through MCP, but: {reason}");
            }
            println!("skipped (standby/resume part only): {reason}");
            None
        }
    }
}

/// Makes the template `mcp-tpl` (a busybox with /opt/template-marker) for the
/// client's create-from-template check.
fn make_template(d: &TestDaemon) {
    let id = d.create(&[]);
    d.cli_ok(&["exec", &id, "--", "sh", "-c", "mkdir -p /opt && echo 'from the template' > /opt/template-marker"]);
    d.cli_ok(&["template", "create", "mcp-tpl", "--from", &id]);
    d.cli_ok(&["rm", "-f", &id]);
}

/// Runs the client script; returns its summary JSON.
fn run_client(d: &TestDaemon, py: &PathBuf, args: &[&str]) -> serde_json::Value {
    let out = Command::new(py)
        .arg(script())
        .args(args)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("MCP_TEST_TEMPLATE", "mcp-tpl")
        .output()
        .expect("run the MCP client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "MCP client failed ({:?}):\nstdout: {stdout}\nstderr: {stderr}\ndaemon log:\n{}",
        out.status,
        d.log()
    );
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("MCP-OK "))
        .unwrap_or_else(|| panic!("no MCP-OK line in:\n{stdout}\n{stderr}"));
    println!("{line}");
    serde_json::from_str(line).unwrap()
}

#[test]
fn stdio_server_lists_and_calls_every_tool() {
    require_host!();
    let py = require_mcp_client!();
    let d = TestDaemon::start();
    d.import_busybox();
    make_template(&d);
    let bin = common::strata_bin();
    let mut args = vec!["stdio", bin.to_str().unwrap(), d.socket.to_str().unwrap()];
    args.extend(criu_flag());
    let summary = run_client(&d, &py, &args);
    assert!(summary["tools"].as_u64().unwrap() >= 14, "{summary}");
    assert_eq!(summary["template"], "mcp-tpl", "{summary}");
    if args.contains(&"--criu") {
        assert!(summary["standby"]["resume_ms"].is_u64(), "{summary}");
    }
    // Every tool call went through the API: the audit log names the calls.
    let audit: Vec<serde_json::Value> =
        serde_json::from_str(&d.cli_ok(&["audit", "--json", "--limit", "1000"])).unwrap();
    for route in [
        "/v1/sandboxes",
        "/v1/sandboxes/{id}/exec",
        "/v1/sandboxes/{id}/checkpoints",
        "/v1/fork",
        "/v1/sandboxes/{id}/restore",
        "/v1/sandboxes/{id}/files",
    ] {
        assert!(audit.iter().any(|e| e["route"] == route), "{route} not audited: {audit:?}");
    }
}

#[test]
fn http_endpoint_lists_and_calls_every_tool_with_the_bearer_token() {
    require_host!();
    let py = require_mcp_client!();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let d = TestDaemon::start_with(Some(&format!("127.0.0.1:{port}")));
    d.import_busybox();
    make_template(&d);
    let token = std::fs::read_to_string(d.state("api-token")).unwrap().trim().to_string();
    let url = format!("http://127.0.0.1:{port}/mcp");
    run_client(&d, &py, &["http-unauthorized", &url, "-"]);
    let mut args = vec!["http", url.as_str(), token.as_str()];
    args.extend(criu_flag());
    let summary = run_client(&d, &py, &args);
    assert!(summary["tools"].as_u64().unwrap() >= 14, "{summary}");
    // The tools ran in-process as the caller of the /mcp request: the audit
    // log records each mutating tool call as `mcp:<tool>` under the token's
    // fingerprint (not as a local caller), and no native API request.
    let audit: Vec<serde_json::Value> =
        serde_json::from_str(&d.cli_ok(&["audit", "--json", "--limit", "1000"])).unwrap();
    let sid = summary["sandbox"].as_str().unwrap();
    let create = audit
        .iter()
        .find(|e| e["route"] == "mcp:create_sandbox" && e["target"] == sid && e["status"] == 200)
        .unwrap_or_else(|| panic!("create of {sid} not audited: {audit:?}"));
    assert!(create["actor"].as_str().unwrap().starts_with("token:"), "{create}");
    for route in ["mcp:exec", "mcp:write_file", "mcp:checkpoint", "mcp:fork", "mcp:restore", "mcp:destroy"] {
        assert!(
            audit.iter().any(|e| e["route"] == route && e["actor"] == create["actor"]),
            "{route} not audited: {audit:?}"
        );
    }
    assert!(!audit.iter().any(|e| e["route"] == "mcp:read_file"), "read-only tools are not audited");
    assert!(
        !audit
            .iter()
            .any(|e| e["route"].as_str().is_some_and(|r| r.starts_with("/v1/")) && e["actor"] == create["actor"]),
        "the tools made no native API request: {audit:?}"
    );
    assert!(
        audit.iter().any(|e| e["route"] == "/mcp" && e["actor"] == create["actor"]),
        "the /mcp requests are audited too"
    );
    // X-Strata-Tenant on the MCP request goes with the tools' calls.
    let acme = run_client(&d, &py, &["http-tenant", url.as_str(), token.as_str()]);
    let sb = common::rt().block_on(d.client().get_sandbox(acme["sandbox"].as_str().unwrap())).unwrap();
    assert_eq!(sb.tenant, "acme");
}
