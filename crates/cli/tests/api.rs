//! The HTTP API's contract: JSON errors with codes, 404/409 semantics, the
//! served OpenAPI document, and bearer-token auth on TCP.

mod common;

use common::TestDaemon;

use strata_api::{ErrorCode, ExecRequest, SandboxState};

#[test]
fn unknown_ids_are_404_with_a_json_code() {
    require_host!();
    let d = TestDaemon::start();
    let c = d.client();
    common::rt().block_on(async {
        let e = c.get_sandbox("doesnotexist").await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::SandboxNotFound), "{e}");
        let e =
            c.exec("doesnotexist", &ExecRequest { cmd: vec!["true".into()], ..Default::default() }).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::SandboxNotFound));
        let e = c.get_image("nope").await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::ImageNotFound));
        let e = c.remove_sandbox("nope", true).await.unwrap_err();
        assert!(matches!(e, strata_client::ClientError::Api { status: 404, .. }), "{e}");
    });
    // Unknown routes and malformed bodies also answer with JSON error bodies.
    common::rt().block_on(async {
        let e = c.send(strata_client::Method::GET, "/v1/nothing", strata_client::Body::new(), "application/json").await.unwrap_err();
        assert!(matches!(&e, strata_client::ClientError::Api { status: 404, body } if body.code == ErrorCode::RouteNotFound), "{e}");
        let e = c.send(strata_client::Method::POST, "/v1/sandboxes", strata_client::Body::from_static(b"{not json"), "application/json").await.unwrap_err();
        assert!(matches!(&e, strata_client::ClientError::Api { status: 400, body } if body.code == ErrorCode::BadRequest), "{e}");
        let e = c.send(strata_client::Method::POST, "/v1/sandboxes", strata_client::Body::from_static(b"{}"), "application/json").await.unwrap_err();
        assert!(matches!(&e, strata_client::ClientError::Api { status: 400 | 422, .. }), "{e}");
    });
    let out = d.cli(&["inspect", "doesnotexist"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(common::stderr(&out).contains("sandbox_not_found"), "{}", common::stderr(&out));
}

#[test]
fn illegal_transitions_are_409_with_the_current_state() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[]);
    d.cli_ok(&["stop", &id]);
    let c = d.client();
    common::rt().block_on(async {
        let e = c.pause_sandbox(&id).await.unwrap_err();
        match e {
            strata_client::ClientError::Api { status, body } => {
                assert_eq!(status, 409);
                assert_eq!(body.code, ErrorCode::InvalidState);
                assert_eq!(body.current_state, Some(SandboxState::Stopped));
            }
            other => panic!("expected 409, got {other}"),
        }
        let e = c.stop_sandbox(&id).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidState));
        c.start_sandbox(&id).await.unwrap();
        let e = c.start_sandbox(&id).await.unwrap_err();
        match e {
            strata_client::ClientError::Api { body, .. } => assert_eq!(body.current_state, Some(SandboxState::Running)),
            other => panic!("{other}"),
        }
        // Removing a running sandbox needs force.
        let e = c.remove_sandbox(&id, false).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidState));
    });
    let out = d.cli(&["exec", "nope", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn served_openapi_matches_the_committed_document() {
    require_host!();
    let d = TestDaemon::start();
    let served = common::rt().block_on(d.client().openapi()).unwrap();
    let committed: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        served, committed,
        "docs/openapi.json drifted from the code; regenerate with `strata openapi > docs/openapi.json`"
    );
    assert!(served["paths"]["/v1/sandboxes/{id}/exec"].is_object());
}

#[test]
fn tcp_listener_requires_the_bearer_token() {
    require_host!();
    // A port the kernel just handed out (and we released) is free for the daemon.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let d = TestDaemon::start_with(Some(&addr));
    let token = std::fs::read_to_string(d.state("api-token")).unwrap();
    let meta = std::fs::metadata(d.state("api-token")).unwrap();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777, 0o600);
    let rt = common::rt();
    let anon = strata_client::Client::new(strata_client::Endpoint::Tcp { addr: addr.clone(), token: None });
    let e = rt.block_on(anon.list_sandboxes()).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unauthorized), "{e}");
    let wrong =
        strata_client::Client::new(strata_client::Endpoint::Tcp { addr: addr.clone(), token: Some("x".repeat(64)) });
    assert_eq!(rt.block_on(wrong.list_sandboxes()).unwrap_err().code(), Some(ErrorCode::Unauthorized));
    let ok = strata_client::Client::new(strata_client::Endpoint::Tcp { addr, token: Some(token.trim().to_string()) });
    assert!(rt.block_on(ok.list_sandboxes()).unwrap().is_empty());
}

#[test]
fn request_bodies_with_unknown_fields_are_refused() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    // Raw HTTP/1.1 over the socket: the typed client cannot send unknown fields.
    let post = |path: &str, body: &str| {
        use std::io::{Read, Write};
        let mut s = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
        write!(s, "POST {path} HTTP/1.1\r\nHost: strata\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        let status: u16 = resp.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let json = resp.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        (status, serde_json::from_str::<strata_api::ApiErrorBody>(json).ok())
    };
    // A misspelt or unsupported option must not be silently dropped (here: a tier that does not exist as a field).
    let (status, body) = post("/v1/sandboxes", r#"{"source":"busybox","runtime":"microvm"}"#);
    let body = body.expect("a JSON error body");
    assert_eq!((status, body.code), (400, ErrorCode::BadRequest));
    assert!(body.message.contains("unknown field `runtime`"), "{}", body.message);
    // An unknown tier is a 400 naming the tiers; a tier this host cannot run a 501 saying why.
    let (status, body) = post("/v1/sandboxes", r#"{"source":"busybox","isolation":"firecracker"}"#);
    let body = body.expect("a JSON error body");
    assert_eq!((status, body.code), (400, ErrorCode::BadRequest));
    assert!(body.message.contains("firecracker") && body.message.contains("gvisor"), "{}", body.message);
    let unavailable = ["gvisor", "microvm"].into_iter().filter(|t| match *t {
        "gvisor" => strata_runtime::gvisor::probe().unavailable().is_some(),
        _ => strata_runtime::microvm::probe().unavailable().is_some(),
    });
    for tier in unavailable {
        let (status, body) = post("/v1/sandboxes", &format!(r#"{{"source":"busybox","isolation":"{tier}"}}"#));
        let body = body.expect("a JSON error body");
        assert_eq!((status, body.code), (501, ErrorCode::Unsupported), "{tier}");
        assert!(body.message.starts_with(&format!("isolation {tier}: ")), "{}", body.message);
    }
    let (status, _) = post("/v1/sandboxes", r#"{"source":"busybox","isolation":"namespace","name":"ns"}"#);
    assert_eq!(status, 201);
    let ns = common::rt().block_on(d.client().get_sandbox("ns")).unwrap();
    assert_eq!(ns.runtime, "namespace");
    common::rt().block_on(d.client().remove_sandbox("ns", true)).unwrap();
    assert!(common::rt().block_on(d.client().list_sandboxes()).unwrap().is_empty(), "nothing else was created");
    let id = d.create(&[]);
    for (path, body) in [
        (format!("/v1/sandboxes/{id}/exec"), r#"{"cmd":["true"],"usr":"root"}"#),
        (format!("/v1/sandboxes/{id}/checkpoints"), r#"{"nmae":"x"}"#),
        (format!("/v1/sandboxes/{id}/standby"), r#"{"fsonly":true}"#),
    ] {
        let (status, body) = post(&path, body);
        assert_eq!(status, 400, "{path}: {body:?}");
        assert!(body.is_some_and(|b| b.message.contains("unknown field")), "{path}");
    }
}
