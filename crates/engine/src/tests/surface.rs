//! The engine's surface ([`crate::Engine`]): a front end's call runs as the
//! caller the engine was made for (no task-local needed), enters the sandbox
//! with what the operation needs, reports the resume it made, and refuses a
//! tenant the operator's operations itself.

use std::sync::Arc;

use strata_api::{ErrorCode, SandboxState, StandbyRequest, TokenQuery};

use super::harness::{tenant, TestEngine};
use crate::caller::Caller;
use crate::surface::ResumeReport;
use crate::Engine;

/// An engine with the image `base` and nothing else.
async fn with_base_image() -> TestEngine {
    crate::tenancy::as_daemon(async {
        let e = TestEngine::new();
        e.image("base").await;
        e
    })
    .await
}

/// An engine with one sandbox, `dev`, in standby (the default tenant's).
async fn standby_sandbox() -> (TestEngine, String) {
    crate::tenancy::as_daemon(async {
        let e = TestEngine::new();
        e.image("base").await;
        let id = e.sandbox("base", "dev").await;
        crate::lifecycle::standby(&e.st, &id, "user").await.expect("standby");
        (e, id)
    })
    .await
}

#[tokio::test]
async fn a_call_on_the_processes_resumes_and_reports_it_and_a_call_on_the_contents_does_not() {
    let (e, id) = standby_sandbox().await;
    let report = ResumeReport::default();
    let engine = Engine::new(e.st.clone(), Caller::operator("test")).reporting_resumes(Arc::clone(&report));

    // Contents: listed without waking the sandbox.
    assert!(engine.list_processes("dev").await.expect("list").is_empty());
    assert!(report.lock().unwrap().is_none());
    assert_eq!(crate::tenancy::as_daemon(async { e.state(&id) }).await, SandboxState::Standby);

    // Processes: brought back first (the signal itself finds no such process).
    let err = engine.signal("dev", 999_999, "TERM").await.unwrap_err();
    assert_eq!(err.body.code, ErrorCode::ProcessNotFound, "{err:?}");
    let resumed = report.lock().unwrap().take().expect("the resume is reported");
    assert_eq!(resumed.from, SandboxState::Standby);
    assert_eq!(crate::tenancy::as_daemon(async { e.state(&id) }).await, SandboxState::Running);
    assert_eq!(
        crate::tenancy::as_daemon(async { e.event_reasons(&id) }).await.last().map(String::as_str),
        Some("resume_on_access")
    );

    // A transition asked for by name, as the caller.
    engine.standby_sandbox("dev", &StandbyRequest::default()).await.expect("standby again");
    assert_eq!(crate::tenancy::as_daemon(async { e.state(&id) }).await, SandboxState::Standby);
}

#[tokio::test]
async fn a_tenants_engine_neither_sees_nor_wakes_another_tenants_sandbox() {
    let (e, id) = standby_sandbox().await;
    let report = ResumeReport::default();
    let engine = Engine::new(e.st.clone(), tenant("globex")).reporting_resumes(Arc::clone(&report));
    assert!(engine.list_sandboxes().await.expect("list").is_empty());
    for key in [id.as_str(), "dev", &id[..6]] {
        assert_eq!(engine.get_sandbox(key).await.unwrap_err().body.code, ErrorCode::SandboxNotFound, "{key}");
        let err = engine.signal(key, 1, "TERM").await.unwrap_err();
        assert_eq!(err.body.code, ErrorCode::SandboxNotFound, "{key}");
        let err = engine.resume_sandbox(key).await.unwrap_err();
        assert_eq!(err.body.code, ErrorCode::SandboxNotFound, "{key}");
    }
    assert!(report.lock().unwrap().is_none());
    assert_eq!(crate::tenancy::as_daemon(async { e.state(&id) }).await, SandboxState::Standby, "not resumed");
}

#[tokio::test]
async fn the_operators_operations_refuse_a_tenant_in_the_engine_itself() {
    let e = crate::tenancy::as_daemon(async { TestEngine::new() }).await;
    let t = Engine::new(e.st.clone(), tenant("acme"));
    let forbidden = |r: Result<(), crate::error::EngineError>, what: &str| {
        assert_eq!(r.unwrap_err().body.code, ErrorCode::Forbidden, "{what}");
    };
    forbidden(t.gc().await.map(drop), "gc");
    forbidden(t.list_tokens(&TokenQuery::default()).await.map(drop), "list tokens");
    forbidden(t.revoke_token("x", &TokenQuery::default()).await.map(drop), "revoke token");
    forbidden(t.quota("acme").await.map(drop), "quota");
    forbidden(t.remove_quota("acme").await.map(drop), "remove quota");
    forbidden(t.remove_image("base").await.map(drop), "remove image");
    forbidden(t.verify_audit().await.map(drop), "verify audit");
    forbidden(t.metrics().await.map(drop), "metrics");
    forbidden(t.decide_approval("apr-0", true, None).await.map(drop), "approve");
    // What is open to a tenant stays open, and scoped to it.
    assert!(t.usage("acme").await.is_ok());
    assert_eq!(t.usage("other").await.unwrap_err().body.code, ErrorCode::Forbidden);
    // The operator passes the same checks.
    let op = Engine::new(e.st.clone(), Caller::operator("test"));
    assert!(op.list_tokens(&TokenQuery::default()).await.expect("tokens").is_empty());
    assert_eq!(op.quota("acme").await.expect("quota").tenant, "acme");
}

#[tokio::test]
async fn a_tier_this_daemon_cannot_run_is_refused_with_why_and_nothing_is_made() {
    let e = with_base_image().await;
    let engine = Engine::new(e.st.clone(), Caller::operator("test"));
    for tier in [strata_api::Isolation::Gvisor, strata_api::Isolation::Microvm] {
        let req =
            strata_api::CreateSandboxRequest { source: "base".into(), isolation: Some(tier), ..Default::default() };
        let err = engine.create_sandbox(&req).await.unwrap_err();
        assert_eq!(err.body.code, ErrorCode::Unsupported, "{tier}");
        assert!(err.body.message.starts_with(&format!("isolation {tier}: ")), "{}", err.body.message);
    }
    assert!(engine.list_sandboxes().await.expect("list").is_empty(), "nothing was recorded");
    let req = strata_api::CreateSandboxRequest {
        source: "base".into(),
        isolation: Some(strata_api::Isolation::Namespace),
        ..Default::default()
    };
    engine.create_sandbox(&req).await.expect("the namespace tier runs");
}

#[tokio::test]
async fn a_pipeline_whose_stage_needs_a_tier_this_daemon_cannot_run_never_starts() {
    let e = with_base_image().await;
    let engine = Engine::new(e.st.clone(), Caller::operator("test"));
    let toml = "name = \"p\"\n[[stage]]\nname = \"eval\"\nsource = \"image:base\"\nlifecycle = \"ephemeral\"\n\
                commands = [\"true\"]\nisolation = \"gvisor\"\n";
    let req = strata_api::RunPipelineRequest { toml: Some(toml.into()), spec: None };
    let err = engine.start_pipeline(req).await.err().expect("refused");
    assert_eq!(err.body.code, ErrorCode::Unsupported);
    assert!(err.body.message.starts_with("stage \"eval\": isolation gvisor: "), "{}", err.body.message);
    assert!(engine.list_pipelines().await.expect("runs").is_empty(), "no run was recorded");
}
