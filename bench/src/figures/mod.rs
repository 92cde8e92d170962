//! The figures of the benchmark, and what they share.

pub mod checkpoint;
pub mod create;
pub mod e2b;
pub mod exec;
pub mod gvisor;
pub mod idle;
pub mod import;
pub mod microvm;
pub mod network;
pub mod pipeline;
pub mod pool;
pub mod preview;
pub mod standby;
pub mod state;
pub mod warm;

use anyhow::{bail, Context, Result};
use base64::Engine;
use strata_api::{CreateSandboxRequest, ExecRequest, ExecResult};
use strata_client::Client;

/// The sandbox every figure creates: the busybox image, defaults otherwise.
pub fn create_req(image: &str) -> CreateSandboxRequest {
    CreateSandboxRequest { source: image.to_string(), ..Default::default() }
}

/// `echo hi`.
pub fn echo_req() -> ExecRequest {
    ExecRequest { cmd: vec!["echo".into(), "hi".into()], ..Default::default() }
}

/// Fails unless the exec exited 0 and printed exactly "hi\n".
pub fn check_echo(r: &ExecResult) -> Result<()> {
    let out = base64::engine::general_purpose::STANDARD.decode(&r.stdout_b64).unwrap_or_default();
    if r.process.exit_status() != 0 || out != b"hi\n" {
        let err = base64::engine::general_purpose::STANDARD.decode(&r.stderr_b64).unwrap_or_default();
        bail!(
            "exec `echo hi` exited {} with stdout {:?}, stderr {:?}, spawn error {:?}",
            r.process.exit_status(),
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&err),
            r.process.spawn_error
        );
    }
    Ok(())
}

/// An exec's base64 output as text (lossy).
pub fn decode_output(b64: &str) -> String {
    String::from_utf8_lossy(&base64::engine::general_purpose::STANDARD.decode(b64).unwrap_or_default()).into_owned()
}

/// Runs `req` in sandbox `id`; fails unless it exits 0 (naming the command, its
/// output and any spawn error); returns its stdout.
pub async fn exec_ok(c: &Client, id: &str, req: ExecRequest) -> Result<String> {
    let r = c.exec(id, &req).await.with_context(|| format!("exec {:?} in {id}", req.cmd))?;
    if r.process.exit_status() != 0 {
        bail!(
            "`{}` in sandbox {id} exited {}: stdout {:?}, stderr {:?}, spawn error {:?}",
            req.cmd.join(" "),
            r.process.exit_status(),
            decode_output(&r.stdout_b64),
            decode_output(&r.stderr_b64),
            r.process.spawn_error
        );
    }
    Ok(decode_output(&r.stdout_b64))
}
