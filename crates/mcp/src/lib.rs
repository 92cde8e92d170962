//! MCP (Model Context Protocol) tool server for strata, built on the official
//! Rust SDK (`rmcp`).
//!
//! [`StrataMcp`] exposes sandbox tools to agents (create, exec, files,
//! checkpoint, fork, diff, standby/resume, destroy, list). Every tool is one or
//! two calls of a [`Backend`], made for the caller of the tool call:
//!
//! * in the daemon (`/mcp`), the engine itself, in-process (`strata-server`'s
//!   `mcp` module), as the caller the request authenticated as: validation,
//!   policy, tenancy, the Rule of Two and activity tracking apply to agents
//!   exactly as to any other caller, and mutating tool calls are audited
//!   ([`Backend::record`]);
//! * in `strata mcp`, a process of its own, the daemon's native API over HTTP
//!   ([`ClientBackend`], through [`strata_client::Client`], the path the CLI
//!   takes), audited by the daemon as the API requests they are.
//!
//! Two transports: [`serve_stdio`] (`strata mcp`, for clients that launch the
//! server as a subprocess) and [`http_service`] (the daemon's `/mcp` route,
//! streamable HTTP). Backend errors become tool errors (`isError: true` results
//! carrying the API's error code), never protocol errors or panics.

mod backend;
mod tools;

pub use backend::{Backend, BackendError, BackendResult, ClientBackend, Download, Extensions, ToolCall};
pub use tools::StrataMcp;

use std::sync::Arc;

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServiceExt;

/// Errors of the MCP transports.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The MCP session could not be set up (e.g. the client sent no valid `initialize`).
    #[error("MCP session setup failed: {0}")]
    Init(String),
    /// The session's task failed.
    #[error("MCP session ended abnormally: {0}")]
    Session(String),
}

/// Serves the tools over stdin/stdout until the client closes the stream.
pub async fn serve_stdio(server: StrataMcp) -> Result<(), McpError> {
    let running = server.serve(rmcp::transport::stdio()).await.map_err(|e| McpError::Init(e.to_string()))?;
    running.waiting().await.map_err(|e| McpError::Session(e.to_string()))?;
    Ok(())
}

/// Largest MCP request body over HTTP (a `write_file` of 8 MiB, base64-encoded, fits).
pub const MAX_HTTP_BODY: usize = 16 << 20;

/// The streamable-HTTP MCP endpoint as a tower service (mount it at `/mcp`).
///
/// Host and Origin checks are off: the daemon serves it on its Unix socket
/// (guarded by the socket's permissions) and on its TCP listener (guarded by
/// the bearer token, which a browser never attaches on its own, so DNS
/// rebinding gains an attacker nothing).
pub fn http_service(server: StrataMcp) -> StreamableHttpService<StrataMcp, LocalSessionManager> {
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .disable_allowed_origins()
        .with_max_request_body_bytes(MAX_HTTP_BODY);
    StreamableHttpService::new(move || Ok(server.clone()), Arc::new(LocalSessionManager::default()), config)
}
