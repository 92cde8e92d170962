//! The web console (`/ui`) in a real browser: headless Chromium driven by
//! Selenium (`tests/console/browser.py`; both installed by
//! scripts/setup-host.sh): login (a wrong token refused), the fleet page
//! showing a sandbox and following a change made through the API live, an
//! action from the page, a 409 shown with the current state, a forged change
//! without the CSRF token refused with nothing done, a sandbox's page (events,
//! a command and its output, processes, files, an upload, a terminal), its
//! lineage (a fork drawn under its checkpoint, a fork and a refused delete
//! from the graph), the approval queue
//! (a refused create approved by a click, then going through), a pipeline
//! run's stages, the cost against its counterfactuals, the audit log and its
//! verified chain, logout, a
//! tenant seeing only its own sandboxes (another's id a 404, its page too),
//! and a revoked token sending the page back to the login. Screenshots go to
//! `target/console-shots/`.

mod common;

use common::TestDaemon;

#[test]
fn the_console_logs_in_shows_the_fleet_live_and_acts_as_the_api_does() {
    require_host!();
    let venv = std::env::var("STRATA_SELENIUM_VENV").unwrap_or_else(|_| "/var/cache/strata/venv-selenium".into());
    let python = std::path::Path::new(&venv).join("bin/python");
    for (what, path) in [
        ("Chromium", "/usr/bin/chromium"),
        ("ChromeDriver", "/usr/bin/chromedriver"),
        ("Selenium", python.to_str().unwrap()),
    ] {
        if !std::path::Path::new(path).exists() {
            let why = format!("{what} is missing ({path}; scripts/setup-host.sh installs it)");
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("CI must be able to run this test, but: {why}");
            }
            println!("skipped: {why}");
            return;
        }
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let d = TestDaemon::start_with(Some(&addr));
    d.import_busybox();
    let operator = std::fs::read_to_string(d.state("api-token")).unwrap().trim().to_string();
    let sandbox = d.create(&["--name", "console-op"]);
    let tenant: serde_json::Value =
        serde_json::from_str(&d.cli_ok(&["token", "create", "--name", "console", "--tenant", "acme", "--json"]))
            .unwrap();
    let tenant_client = strata_client::Client::new(strata_client::Endpoint::Tcp {
        addr: addr.clone(),
        token: Some(tenant["secret"].as_str().unwrap().to_string()),
    });
    let req = strata_api::CreateSandboxRequest {
        source: "busybox".into(),
        name: Some("acme-app".into()),
        ..Default::default()
    };
    let tenant_sandbox = common::rt().block_on(tenant_client.create_sandbox(&req)).unwrap().id;

    let shots = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/console-shots");
    let _ = std::fs::remove_dir_all(&shots);
    std::fs::create_dir_all(&shots).unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/console/browser.py");
    let out = std::process::Command::new(&python)
        .arg(&script)
        .env("STRATA_URL", format!("http://{addr}"))
        .env("OPERATOR_TOKEN", &operator)
        .env("TENANT_TOKEN", tenant["secret"].as_str().unwrap())
        .env("TENANT_TOKEN_ID", tenant["id"].as_str().unwrap())
        .env("SANDBOX", &sandbox)
        .env("TENANT_SANDBOX", &tenant_sandbox)
        .env("SHOTS", &shots)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}\n{}\ndaemon log:\n{}", common::stdout(&out), common::stderr(&out), d.log());
    assert!(common::stdout(&out).contains("console: done"), "{}", common::stdout(&out));
    for shot in [
        "login.png",
        "fleet.png",
        "sandbox.png",
        "lineage.png",
        "approvals.png",
        "pipelines.png",
        "cost.png",
        "audit.png",
    ] {
        assert!(shots.join(shot).exists(), "no screenshot {shot}");
    }
    // The approval was decided in the console, as the operator's session.
    let approvals: serde_json::Value = serde_json::from_str(&d.cli_ok(&["approvals", "ls", "--json"])).unwrap();
    let used = approvals.as_array().unwrap().iter().find(|a| a["action"] == "create sandbox");
    let used = used.unwrap_or_else(|| panic!("no approval: {approvals}"));
    assert_eq!((used["state"].as_str(), used["reason"].as_str()), (Some("used"), Some("checked by the console test")));
    // The console's actions are audited as the session's caller, like any API call.
    let audit: serde_json::Value = serde_json::from_str(&d.cli_ok(&["audit", "--json", "--limit", "1000"])).unwrap();
    let started =
        audit.as_array().unwrap().iter().find(|e| {
            e["route"] == "/v1/sandboxes/{id}/start" && e["target"] == sandbox.as_str() && e["status"] == 200
        });
    let started = started.unwrap_or_else(|| panic!("the console's start is not in the audit log: {audit}"));
    assert!(started["actor"].as_str().unwrap().starts_with("token:"), "audited as the session's token: {started}");
    let forged = audit.as_array().unwrap().iter().filter(|e| e["route"] == "/v1/sandboxes/{id}/stop").count();
    assert_eq!(forged, 2, "the API's stop and the tenant's refused one; the forged one never reached the API: {audit}");
}
