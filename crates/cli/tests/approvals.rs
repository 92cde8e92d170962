//! The Rule of Two: a sandbox may hold two of {untrusted_input,
//! sensitive_access, external_comms}; a create or change that would give it all
//! three waits in the approval queue for an operator, and goes through once
//! when approved. Denials, timeouts, forks, exports, capability declarations
//! and pipeline stages, and the audit trail of each decision.

mod common;

use common::{rt, stderr, wait_until, write_file, TestDaemon};
use strata_api::{
    ApprovalState, Capability, CheckpointRequest, ErrorCode, ForkRequest, NetworkMode, NetworkSpec, RunPipelineRequest,
    UpdateSandboxRequest,
};
use strata_client::{Client, ClientError, Endpoint};

/// The approval id (`apr-` + 16 hex) a refused CLI call printed.
fn approval_in(text: &str) -> String {
    let i = text.find("apr-").unwrap_or_else(|| panic!("no approval id in {text:?}"));
    let id = &text[i..i + 20];
    assert!(id[4..].bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    id.to_string()
}

fn api_err<T: std::fmt::Debug>(r: Result<T, ClientError>) -> (u16, strata_api::ApiErrorBody) {
    match r.unwrap_err() {
        ClientError::Api { status, body } => (status, body),
        e => panic!("expected an API error, got {e}"),
    }
}

fn capabilities(d: &TestDaemon, id: &str) -> Vec<(String, String)> {
    let v: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", id, "--json"])).unwrap();
    v["capabilities"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|g| (g["capability"].as_str().unwrap().to_string(), g["because"].as_str().unwrap().to_string()))
        .collect()
}

fn approval(d: &TestDaemon, id: &str) -> serde_json::Value {
    serde_json::from_str(&d.cli_ok(&["approvals", "show", id, "--json"])).unwrap()
}

#[test]
fn a_third_capability_waits_for_an_operator_and_goes_through_once() {
    require_host!();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let d = TestDaemon::start_with(Some(&addr));
    d.import_busybox();
    let key = write_file(d.dir.path(), "db-password", b"hunter2-but-longer");
    let secret = format!("DB=@{}", key.display());

    // Two capabilities: no approval needed, and inspect says which and why.
    let two = d.create(&["--name", "two", "--secret", &secret, "--capability", "untrusted_input"]);
    let caps = capabilities(&d, &two);
    assert!(caps.contains(&("untrusted_input".into(), "declared".into())), "{caps:?}");
    assert!(caps.contains(&("sensitive_access".into(), "secrets: DB".into())), "{caps:?}");
    assert!(d.cli_ok(&["inspect", &two]).contains("rule of 2"));

    // The third (egress) is held: exit code 3, the approval id, and no sandbox.
    let three = |name: &str| -> Vec<String> {
        [
            "create",
            "busybox",
            "--name",
            name,
            "--secret",
            &secret,
            "--capability",
            "untrusted_input",
            "--allow-cidr",
            "10.0.0.0/8:443",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let args = three("three");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = d.cli(&args);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("approval required") || stderr(&out).contains("all three Rule-of-Two capabilities"),
        "{}",
        stderr(&out)
    );
    let id = approval_in(&stderr(&out));
    assert!(!d.cli(&["inspect", "three"]).status.success(), "nothing is created while the approval is pending");
    // Asking again does not queue a second approval.
    assert_eq!(approval_in(&stderr(&d.cli(&args))), id);
    let pending: Vec<serde_json::Value> =
        serde_json::from_str(&d.cli_ok(&["approvals", "ls", "--state", "pending", "--json"])).unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0]["action"], "create sandbox");
    let reasons: Vec<&str> =
        pending[0]["capabilities"].as_array().unwrap().iter().map(|g| g["because"].as_str().unwrap()).collect();
    assert!(
        reasons.contains(&"network egress: allow 10.0.0.0/8:443") && reasons.contains(&"secrets: DB"),
        "{reasons:?}"
    );

    // An agent's tenant token reads its own approval but cannot decide it; another tenant sees nothing.
    let token = |name: &str, tenant: &str| -> String {
        let v: serde_json::Value =
            serde_json::from_str(&d.cli_ok(&["token", "create", "--name", name, "--tenant", tenant, "--json"]))
                .unwrap();
        v["secret"].as_str().unwrap().to_string()
    };
    let agent = Client::new(Endpoint::Tcp { addr: addr.clone(), token: Some(token("agent", "default")) });
    let other = Client::new(Endpoint::Tcp { addr: addr.clone(), token: Some(token("other", "globex")) });
    assert_eq!(rt().block_on(agent.get_approval(&id)).unwrap().state, ApprovalState::Pending);
    let (status, body) = api_err(rt().block_on(agent.decide_approval(&id, true, None)));
    assert_eq!((status, body.code), (403, ErrorCode::Forbidden), "{}", body.message);
    let (status, body) = api_err(rt().block_on(other.get_approval(&id)));
    assert_eq!((status, body.code), (404, ErrorCode::ApprovalNotFound));
    assert!(rt().block_on(other.list_approvals(None)).unwrap().is_empty());
    let (status, body) = api_err(rt().block_on(d.client().get_approval("apr-0000000000000000")));
    assert_eq!((status, body.code), (404, ErrorCode::ApprovalNotFound));

    // The operator approves; the same request goes through, once.
    assert!(d.cli_ok(&["approvals", "approve", &id, "--reason", "reviewed the egress rule"]).contains("approved"));
    let sb = d.cli_ok(&args).trim().to_string();
    let caps: Vec<String> = capabilities(&d, &sb).into_iter().map(|(c, _)| c).collect();
    for c in ["untrusted_input", "sensitive_access", "external_comms"] {
        assert!(caps.iter().any(|x| x == c), "{c} missing from {caps:?}");
    }
    let a = approval(&d, &id);
    assert_eq!(a["state"], "used");
    assert_eq!(a["reason"], "reviewed the egress rule");
    assert!(a["used_at"].is_string());
    let (status, body) = api_err(rt().block_on(d.client().decide_approval(&id, false, None)));
    assert_eq!((status, body.code), (409, ErrorCode::InvalidState), "deciding twice: {}", body.message);
    assert_eq!(body.approval.map(|a| a.state), Some(ApprovalState::Used));

    // A new request needs its own approval; a denied one stays refused, with the reason.
    let args4 = three("four");
    let args4: Vec<&str> = args4.iter().map(String::as_str).collect();
    let id4 = approval_in(&stderr(&d.cli(&args4)));
    assert_ne!(id4, id);
    d.cli_ok(&["approvals", "deny", &id4, "--reason", "no egress for untrusted work"]);
    let mut cited = vec!["--approval", id4.as_str()];
    cited.extend_from_slice(&args4);
    let out = d.cli(&cited);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("denied") && stderr(&out).contains("no egress for untrusted work"),
        "{}",
        stderr(&out)
    );
    assert!(!d.cli(&["inspect", "four"]).status.success());

    // The audit log holds the request, the decisions and the use, and its chain verifies.
    let audit = rt().block_on(d.client().audit(Some(1000))).unwrap();
    let has = |method: &str, route: &str, target: &str| {
        audit.iter().any(|e| e.method == method && e.route == route && e.target.as_deref() == Some(target))
    };
    assert!(has("APPROVAL", "requested", &id), "no request entry");
    assert!(has("POST", "/v1/approvals/{id}/approve", &id), "no approval entry");
    assert!(has("APPROVAL", "used", &id), "no use entry");
    assert!(has("POST", "/v1/approvals/{id}/deny", &id4), "no denial entry");
    assert!(
        audit
            .iter()
            .any(|e| e.route == "/v1/approvals/{id}/approve" && e.status == 403 && e.actor.starts_with("token:")),
        "the agent's refused attempt is audited"
    );
    assert!(rt().block_on(d.client().audit_verify()).unwrap().ok);
}

#[test]
fn declarations_and_exports_are_gated_and_an_undecided_approval_times_out_denied() {
    require_host!();
    let d = TestDaemon::start_with_env(&[("STRATA_APPROVAL_TIMEOUT", "2s")]);
    d.import_busybox();
    let key = write_file(d.dir.path(), "token", b"ghp_notarealtokenbutlongenough");
    let secret = format!("GH=@{}", key.display());
    let c = d.client();

    // Secrets + egress; declaring untrusted input would make three.
    let sb = d.create(&["--secret", &secret, "--allow-cidr", "10.0.0.0/8:443"]);
    let out = d.cli(&["update", &sb, "--capability", "untrusted_input"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let id = approval_in(&stderr(&out));
    assert_eq!(approval(&d, &id)["action"], "declare capabilities of");
    // Nobody decides: the timeout denies it (and the audit log says so).
    assert!(
        wait_until(20, || approval(&d, &id)["state"] == "denied"),
        "the approval never timed out: {}",
        approval(&d, &id)
    );
    assert_eq!(approval(&d, &id)["decided_by"], "timeout");
    assert!(rt().block_on(c.audit(Some(1000))).unwrap().iter().any(|e| e.method == "APPROVAL"
        && e.route == "timed out (denied)"
        && e.target.as_deref() == Some(id.as_str())));
    assert!(!capabilities(&d, &sb).iter().any(|(c, _)| c == "untrusted_input"), "the declaration did not happen");

    // Declared capabilities only grow.
    let tainted = d.create(&["--capability", "untrusted_input", "--secret", &secret]);
    let (status, body) = api_err(rt().block_on(
        c.update_sandbox(&tainted, &UpdateSandboxRequest { capabilities: Some(vec![]), ..Default::default() }),
    ));
    assert_eq!((status, body.code), (400, ErrorCode::BadRequest), "{}", body.message);
    assert!(body.message.contains("cannot be dropped"), "{}", body.message);

    // Exporting the files of a sandbox with untrusted input and secrets is the third capability.
    d.cli_ok(&["exec", &tainted, "--", "sh", "-c", "echo result > /result.txt"]);
    let (status, body) = api_err(rt().block_on(c.export(&tainted, None)));
    assert_eq!((status, body.code), (403, ErrorCode::ApprovalRequired), "{}", body.message);
    let a = body.approval.expect("the pending approval comes with the refusal");
    assert_eq!(a.action, "export files of");
    assert!(a
        .capabilities
        .iter()
        .any(|g| g.capability == Capability::ExternalComms && g.because == "export of its files"));
    d.cli_ok(&["approvals", "approve", &a.id]);
    let tar = rt().block_on(c.export(&tainted, None)).expect("approved export");
    assert!(tar.windows(10).any(|w| w == b"result.txt"), "the export holds the file");
    // Used up: the next export asks again.
    let (_, body) = api_err(rt().block_on(c.export(&tainted, None)));
    assert_eq!(body.code, ErrorCode::ApprovalRequired);
    // A preview URL is external communication too; once approved, the sandbox shows it.
    let out = d.cli(&["preview", "create", &tainted, "8000"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let id = approval_in(&stderr(&out));
    assert_eq!(approval(&d, &id)["action"], "create preview of");
    d.cli_ok(&["approvals", "approve", &id]);
    d.cli_ok(&["preview", "create", &tainted, "8000"]);
    assert!(
        capabilities(&d, &tainted).contains(&("external_comms".into(), "preview of port 8000".into())),
        "{:?}",
        capabilities(&d, &tainted)
    );
}

#[test]
fn forks_inherit_declared_capabilities_and_a_pipeline_stage_waits_for_its_approval() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let c = d.client();

    // A checkpoint remembers what its sandbox declared; forks and sandboxes from it inherit it.
    let src = d.create(&["--name", "reader", "--capability", "untrusted_input"]);
    let ck = rt()
        .block_on(c.checkpoint(&src, &CheckpointRequest { name: Some("read-1".into()), ..Default::default() }))
        .unwrap();
    assert_eq!(ck.capabilities, vec![Capability::UntrustedInput]);
    let egress = NetworkSpec { mode: NetworkMode::Egress, allow: vec!["10.0.0.0/8:443".into()], deny: vec![] };
    let forks = rt()
        .block_on(c.fork(&ForkRequest {
            source: "read-1".into(),
            count: 2,
            name_prefix: None,
            lifecycle: strata_api::Lifecycle::Persistent,
            ttl: None,
            limits: None,
            network: Some(egress),
            processes: None,
            isolation: None,
        }))
        .unwrap();
    for child in &forks.sandboxes {
        let caps: Vec<String> = capabilities(&d, child).into_iter().map(|(c, _)| c).collect();
        assert_eq!(caps, vec!["untrusted_input".to_string(), "external_comms".to_string()], "{child}");
    }
    // A child holding two cannot take secrets' capability by declaration without an approval.
    let out = d.cli(&["update", &forks.sandboxes[0], "--capability", "sensitive_access"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    d.cli_ok(&["approvals", "deny", &approval_in(&stderr(&out))]);

    // A pipeline stage that would hold all three waits for the operator, then runs.
    let spec = r#"
name = "triage"
[[stage]]
name = "read-issue"
source = "image:busybox"
lifecycle = "ephemeral"
capabilities = ["untrusted_input"]
secrets = [{ name = "GH", value_b64 = "Z2hwX3NlY3JldHZhbHVl" }]
network = { mode = "egress", allow = ["10.0.0.0/8:443"] }
commands = ["test -s /run/secrets/GH"]
"#;
    let run =
        rt().block_on(c.run_pipeline(&RunPipelineRequest { toml: Some(spec.into()), ..Default::default() })).unwrap();
    let waiting = || rt().block_on(c.list_approvals(Some("pending"))).unwrap();
    assert!(wait_until(60, || !waiting().is_empty()), "the stage never asked for an approval");
    let a = waiting().remove(0);
    assert_eq!(a.action, "create sandbox");
    let r = rt().block_on(c.pipeline(&run.id)).unwrap();
    assert!(
        r.stages[0].notes.iter().any(|n| n.contains(&a.id)),
        "the stage notes the approval it waits for: {:?}",
        r.stages[0].notes
    );
    d.cli_ok(&["approvals", "approve", &a.id]);
    assert!(wait_until(120, || rt().block_on(c.pipeline(&run.id)).unwrap().state != strata_api::PipelineState::Running));
    let r = rt().block_on(c.pipeline(&run.id)).unwrap();
    assert_eq!(r.state, strata_api::PipelineState::Succeeded, "{:?}", r.stages[0]);

    // Denied: the stage fails with the decider's reason.
    let run =
        rt().block_on(c.run_pipeline(&RunPipelineRequest {
            toml: Some(spec.replace("triage", "triage-2")),
            ..Default::default()
        }))
        .unwrap();
    assert!(wait_until(60, || !waiting().is_empty()));
    let a = waiting().remove(0);
    d.cli_ok(&["approvals", "deny", &a.id, "--reason", "not today"]);
    assert!(wait_until(60, || rt().block_on(c.pipeline(&run.id)).unwrap().state != strata_api::PipelineState::Running));
    let r = rt().block_on(c.pipeline(&run.id)).unwrap();
    assert_eq!(r.state, strata_api::PipelineState::Failed);
    let err = r.stages[0].error.clone().unwrap_or_default();
    assert!(err.contains("denied") && err.contains("not today"), "{err}");
}
