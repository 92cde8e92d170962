//! The seven figures of the benchmark, and what they share.

pub mod checkpoint;
pub mod create;
pub mod exec;
pub mod idle;
pub mod import;
pub mod pipeline;
pub mod standby;

use anyhow::{bail, Result};
use base64::Engine;
use strata_api::{CreateSandboxRequest, ExecRequest, ExecResult};

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
