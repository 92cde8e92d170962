//! The daemon's MCP endpoint (`/mcp`) on the engine, in-process: [`InProcess`]
//! is the [`Backend`] of its tools. Each tool call acts as the [`Caller`] of
//! the HTTP request it came in ([`crate::native::tenancy::authenticate`] made
//! it, folding in `X-Strata-Tenant` and `X-Strata-Approval`; rmcp hands the
//! tools that request's [`Parts`]), through [`Engine`]: tenancy, the Rule of
//! Two, quotas, activity and resume on access apply as for a native call. A
//! call without a caller is refused (`unauthorized`). Mutating tool calls are
//! audited here ([`Backend::record`]), as the E2B layer audits its requests
//! (`crate::e2b::audit`): no native request is made that would be recorded
//! instead.

use axum::http::request::Parts;
use bytes::Bytes;
use futures_util::StreamExt;
use strata_api::{
    Checkpoint, CheckpointRequest, CreateSandboxRequest, CreatedSandbox, ErrorCode, ExecRequest, ExecResult,
    FileChange, FileStat, ForkRequest, ForkResult, RestoreRequest, RestoreResult, ResumeResult, Sandbox, SandboxEvent,
};
use strata_engine::error::EngineError;
use strata_engine::state::Shared;
use strata_engine::tenancy::Caller;
use strata_engine::Engine;
use strata_mcp::{Backend, BackendError, BackendResult, Download, Extensions, ToolCall};

/// The tools' backend in the daemon: the engine of `st`, as each call's caller.
#[derive(Clone)]
pub struct InProcess {
    st: Shared,
}

impl InProcess {
    /// The backend over the engine `st`.
    pub fn new(st: Shared) -> Self {
        InProcess { st }
    }

    /// The engine as the caller of the tool call `cx`, or `unauthorized`.
    fn engine(&self, cx: &Extensions) -> BackendResult<Engine> {
        match caller_of(cx) {
            Some(caller) => Ok(Engine::new(self.st.clone(), caller)),
            None => {
                Err(err(EngineError::new(ErrorCode::Unauthorized, "the MCP call came without an authenticated caller")))
            }
        }
    }
}

/// The caller the HTTP request of a tool call authenticated as.
fn caller_of(cx: &Extensions) -> Option<Caller> {
    cx.get::<Parts>()?.extensions.get::<Caller>().cloned()
}

/// An engine error in the backends' common form (the native API's status).
fn err(e: EngineError) -> BackendError {
    BackendError::api(e.body)
}

#[async_trait::async_trait]
impl Backend for InProcess {
    async fn list_sandboxes(&self, cx: &Extensions) -> BackendResult<Vec<Sandbox>> {
        self.engine(cx)?.list_sandboxes().await.map_err(err)
    }

    async fn create_sandbox(&self, cx: &Extensions, req: &CreateSandboxRequest) -> BackendResult<CreatedSandbox> {
        self.engine(cx)?.create_sandbox(req).await.map_err(err)
    }

    async fn get_sandbox(&self, cx: &Extensions, sandbox: &str) -> BackendResult<Sandbox> {
        self.engine(cx)?.get_sandbox(sandbox).await.map_err(err)
    }

    async fn remove_sandbox(&self, cx: &Extensions, sandbox: &str) -> BackendResult<SandboxEvent> {
        self.engine(cx)?.remove_sandbox(sandbox, true).await.map_err(err)
    }

    async fn standby_sandbox(&self, cx: &Extensions, sandbox: &str, fs_only: bool) -> BackendResult<SandboxEvent> {
        self.engine(cx)?.standby_sandbox(sandbox, &strata_api::StandbyRequest { fs_only }).await.map_err(err)
    }

    async fn resume_sandbox(&self, cx: &Extensions, sandbox: &str) -> BackendResult<ResumeResult> {
        self.engine(cx)?.resume_sandbox(sandbox).await.map_err(err)
    }

    async fn exec(&self, cx: &Extensions, sandbox: &str, req: &ExecRequest) -> BackendResult<ExecResult> {
        self.engine(cx)?.exec(sandbox, req).await.map_err(err)
    }

    async fn stat(&self, cx: &Extensions, sandbox: &str, path: &str) -> BackendResult<FileStat> {
        self.engine(cx)?.stat(sandbox, path).await.map_err(err)
    }

    async fn list_dir(&self, cx: &Extensions, sandbox: &str, path: &str) -> BackendResult<Vec<FileStat>> {
        self.engine(cx)?.list_dir(sandbox, path).await.map_err(err)
    }

    async fn mkdir(&self, cx: &Extensions, sandbox: &str, path: &str) -> BackendResult<()> {
        self.engine(cx)?.mkdir(sandbox, path, true).await.map_err(err)
    }

    async fn download(&self, cx: &Extensions, sandbox: &str, path: &str) -> BackendResult<Download> {
        let q = strata_api::DownloadQuery { path: path.to_string(), tar: false };
        // The stream holds the sandbox awake until the reader drops it.
        let d = self.engine(cx)?.download(sandbox, q).await.map_err(err)?;
        let chunks =
            d.stream.map(move |r| r.map_err(|e| BackendError::Failed(format!("reading the file failed: {e}"))));
        Ok(Download { len: d.len, chunks: Box::pin(chunks) })
    }

    async fn upload(&self, cx: &Extensions, sandbox: &str, path: &str, data: Bytes, mode: u32) -> BackendResult<()> {
        let chunks = futures_util::stream::iter([Ok::<_, std::io::Error>(data)]);
        let q = strata_api::UploadQuery { path: path.to_string(), mode: Some(mode), tar: false };
        self.engine(cx)?.upload(sandbox, q, None, chunks).await.map_err(err)
    }

    async fn checkpoint(&self, cx: &Extensions, sandbox: &str, req: &CheckpointRequest) -> BackendResult<Checkpoint> {
        self.engine(cx)?.checkpoint(sandbox, req).await.map_err(err)
    }

    async fn list_checkpoints(&self, cx: &Extensions, sandbox: Option<&str>) -> BackendResult<Vec<Checkpoint>> {
        self.engine(cx)?.list_checkpoints(sandbox).await.map_err(err)
    }

    async fn restore(&self, cx: &Extensions, sandbox: &str, req: &RestoreRequest) -> BackendResult<RestoreResult> {
        self.engine(cx)?.restore(sandbox, req).await.map_err(err)
    }

    async fn fork(&self, cx: &Extensions, req: &ForkRequest) -> BackendResult<ForkResult> {
        self.engine(cx)?.fork(req).await.map_err(err)
    }

    async fn diff(&self, cx: &Extensions, sandbox: &str, against: Option<&str>) -> BackendResult<Vec<FileChange>> {
        self.engine(cx)?.diff(sandbox, against).await.map_err(err)
    }

    /// Appends the call to the audit log as `POST mcp:<tool>` (it came in a
    /// `POST /mcp`), under its caller and tenant. A call without a caller
    /// was refused before it did anything: nothing to record.
    fn record(&self, cx: &Extensions, call: &ToolCall<'_>) {
        let Some(caller) = caller_of(cx) else { return };
        strata_engine::audit_log::append(
            &self.st,
            &caller.actor(),
            caller.scope(),
            "POST",
            &format!("mcp:{}", call.tool),
            call.target,
            call.status,
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use strata_api::{CreateSandboxRequest, ImportImageRequest};
    use strata_engine::admission::{Admission, AdmissionConfig, DefaultLimit, HostBounds};
    use strata_engine::state::AppState;
    use strata_engine::tenancy::Principal;
    use strata_runtime::fake::FakeRuntime;

    use super::*;

    /// An engine on `dir` with the in-memory runtime (no root needed), holding
    /// the image `base`.
    async fn engine(dir: &std::path::Path) -> Shared {
        std::fs::create_dir_all(dir.join("sandboxes")).unwrap();
        let host =
            HostBounds { mem_total: 64 << 30, cpus: 16.0, pid_max: 1 << 22, fs_bytes: 1 << 40, state_dir: dir.into() };
        let admission = AdmissionConfig { default_disk: DefaultLimit::NoLimit, ..AdmissionConfig::default() };
        let st: Shared = Arc::new(AppState::new(
            strata_store::Db::open(&dir.join("metadata.db")).unwrap(),
            strata_store::LayerStore::open(dir.join("layers")).unwrap(),
            Arc::new(FakeRuntime::new(dir.join("run"))),
            dir.into(),
            strata_engine::archive::ArchiveStore::local(&dir.join("archive")).unwrap(),
            Arc::new(Admission::new(&admission, host).unwrap()),
        ));
        let src = dir.join("rootfs");
        std::fs::create_dir_all(src.join("bin")).unwrap();
        let image = ImportImageRequest {
            source: src.to_string_lossy().into_owned(),
            name: "base".into(),
            trusted: false,
            replace: false,
        };
        strata_engine::images::import(&st, image, None).await.unwrap();
        st
    }

    /// A tenant token's caller.
    fn tenant(name: &str) -> Caller {
        let principal =
            Principal::Tenant { tenant: name.into(), token_id: format!("tok-{name}"), token_name: name.into() };
        Caller { principal, acting_as: None, approval: None }
    }

    /// The extensions of a tool call that came in an HTTP request authenticated as `caller`.
    fn call_as(caller: Option<Caller>) -> Extensions {
        let (mut parts, ()) = axum::http::Request::new(()).into_parts();
        if let Some(c) = caller {
            parts.extensions.insert(c);
        }
        let mut cx = Extensions::new();
        cx.insert(parts);
        cx
    }

    fn code(e: BackendError) -> (u16, ErrorCode) {
        match e {
            BackendError::Api { status, body } => (status, body.code),
            other => panic!("not an API error: {other}"),
        }
    }

    #[tokio::test]
    async fn a_call_without_a_caller_is_refused_and_not_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let mcp = InProcess::new(engine(dir.path()).await);
        for cx in [Extensions::new(), call_as(None)] {
            let e = mcp.list_sandboxes(&cx).await.unwrap_err();
            assert_eq!(code(e), (401, ErrorCode::Unauthorized));
            let req = CreateSandboxRequest { source: "base".into(), ..Default::default() };
            assert_eq!(code(mcp.create_sandbox(&cx, &req).await.unwrap_err()), (401, ErrorCode::Unauthorized));
            mcp.record(&cx, &ToolCall { tool: "create_sandbox", target: None, status: 401 });
        }
        assert!(mcp.st.db.audit_entries(None).unwrap().is_empty());
        assert!(mcp.st.db.list_sandboxes().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_tenant_sees_and_touches_only_its_own_sandboxes() {
        let dir = tempfile::tempdir().unwrap();
        let mcp = InProcess::new(engine(dir.path()).await);
        let (acme, globex) = (call_as(Some(tenant("acme"))), call_as(Some(tenant("globex"))));
        let req = CreateSandboxRequest { source: "base".into(), name: Some("web".into()), ..Default::default() };
        let id = mcp.create_sandbox(&acme, &req).await.unwrap().id;
        assert_eq!(mcp.get_sandbox(&acme, "web").await.unwrap().tenant, "acme");
        assert_eq!(mcp.list_sandboxes(&acme).await.unwrap().len(), 1);

        assert!(mcp.list_sandboxes(&globex).await.unwrap().is_empty());
        for key in [id.as_str(), "web"] {
            assert_eq!(code(mcp.get_sandbox(&globex, key).await.unwrap_err()), (404, ErrorCode::SandboxNotFound));
            assert_eq!(code(mcp.stat(&globex, key, "/").await.unwrap_err()), (404, ErrorCode::SandboxNotFound));
            assert_eq!(code(mcp.remove_sandbox(&globex, key).await.unwrap_err()), (404, ErrorCode::SandboxNotFound));
        }
        assert!(mcp.list_checkpoints(&globex, None).await.unwrap().is_empty());
        assert_eq!(mcp.get_sandbox(&acme, &id).await.unwrap().state, strata_api::SandboxState::Running);

        // Mutating calls are recorded under their caller and tenant.
        mcp.record(&globex, &ToolCall { tool: "destroy", target: Some("web"), status: 404 });
        let audit = mcp.st.db.audit_entries(None).unwrap();
        let e = audit.last().unwrap();
        assert_eq!(
            (e.method.as_str(), e.route.as_str(), e.target.as_deref(), e.status),
            ("POST", "mcp:destroy", Some("web"), 404)
        );
        assert_eq!((e.actor.as_str(), e.tenant.as_deref()), ("token:tok-globex:globex", Some("globex")));
    }

    /// One JSON-RPC message to `/mcp` as the holder of `token` (acting in
    /// `tenant`): the HTTP status, the session id and the JSON-RPC answer.
    async fn post(
        app: &axum::Router,
        token: &str,
        tenant: &str,
        session: Option<&str>,
        msg: serde_json::Value,
    ) -> (u16, Option<String>, Option<serde_json::Value>) {
        use tower::ServiceExt;
        let mut req = axum::http::Request::post("/mcp")
            .header("host", "127.0.0.1")
            .header("authorization", format!("Bearer {token}"))
            .header(strata_api::TENANT_HEADER, tenant)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(s) = session {
            req = req.header("mcp-session-id", s);
        }
        let resp = app.clone().oneshot(req.body(axum::body::Body::from(msg.to_string())).unwrap()).await.unwrap();
        let status = resp.status().as_u16();
        let session = resp.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_string);
        let read = axum::body::to_bytes(resp.into_body(), 1 << 20);
        let body = tokio::time::timeout(std::time::Duration::from_secs(20), read).await.unwrap().unwrap();
        let text = String::from_utf8_lossy(&body);
        let answer = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .chain([text.as_ref()])
            .filter_map(|d| serde_json::from_str::<serde_json::Value>(d.trim()).ok())
            .find(|v| v.get("id").is_some());
        (status, session, answer)
    }

    /// A tool call over `/mcp` as the caller its request authenticated as.
    async fn call_tool(
        app: &axum::Router,
        token: &str,
        tenant: &str,
        tool: &str,
        args: serde_json::Value,
    ) -> serde_json::Value {
        use serde_json::json;
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}});
        let (status, session, _) = post(app, token, tenant, None, init).await;
        assert_eq!(status, 200);
        let session = session.expect("a session id");
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        post(app, token, tenant, Some(&session), initialized).await;
        let call =
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": tool, "arguments": args}});
        let (status, _, answer) = post(app, token, tenant, Some(&session), call).await;
        assert_eq!(status, 200);
        answer.expect("an answer")["result"]["structuredContent"].clone()
    }

    #[tokio::test]
    async fn tools_over_http_run_as_the_requests_caller() {
        use serde_json::json;
        let dir = tempfile::tempdir().unwrap();
        let st = engine(dir.path()).await;
        let mcp = strata_mcp::StrataMcp::new(InProcess::new(st.clone()));
        let listener = crate::native::tenancy::Listener::Tcp { legacy: Arc::new("op-secret".into()) };
        let app = crate::app_with_mcp(st.clone(), listener, Some(mcp), Arc::default());

        let (status, _, _) =
            post(&app, "wrong", "acme", None, json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})).await;
        assert_eq!(status, 401);
        let created =
            call_tool(&app, "op-secret", "acme", "create_sandbox", json!({"source": "base", "name": "web"})).await;
        let id = created["id"].as_str().unwrap_or_else(|| panic!("{created}")).to_string();
        let listed = call_tool(&app, "op-secret", "acme", "list_sandboxes", json!({})).await;
        assert_eq!(listed["count"], 1, "{listed}");
        // Another tenant neither sees it nor reaches it.
        let listed = call_tool(&app, "op-secret", "globex", "list_sandboxes", json!({})).await;
        assert_eq!(listed["count"], 0, "{listed}");
        let refused = call_tool(&app, "op-secret", "globex", "destroy", json!({"sandbox": id})).await;
        assert_eq!(refused["error"]["code"], "sandbox_not_found", "{refused}");

        let audit = st.db.audit_entries(None).unwrap();
        let create = audit.iter().find(|e| e.route == "mcp:create_sandbox").expect("create audited");
        assert_eq!(
            (create.target.as_deref(), create.status, create.tenant.as_deref()),
            (Some(id.as_str()), 200, Some("acme"))
        );
        assert!(create.actor.starts_with("token:"), "{}", create.actor);
        let destroy = audit.iter().find(|e| e.route == "mcp:destroy").expect("refused destroy audited");
        assert_eq!((destroy.status, destroy.tenant.as_deref()), (404, Some("globex")));
        assert!(!audit.iter().any(|e| e.route == "mcp:list_sandboxes"), "reads are not audited");
        assert!(!audit.iter().any(|e| e.route.starts_with("/v1/")), "no native request was made");
        assert!(audit.iter().any(|e| e.route == "/mcp"), "the /mcp requests themselves are audited");
    }
}
