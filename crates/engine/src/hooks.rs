//! Lifecycle hooks: commands a sandbox's policy asks to run inside it before
//! standby or stop and after resume (e.g. to flush a dev server's state).
//!
//! A hook runs like `exec` (the image's user and environment), bounded by its
//! timeout; its outcome is recorded as an event (`hook_ok` / `hook_failed`
//! with the exit status and the start of its output). A failing hook never
//! blocks the transition: the transition is what the caller asked for.

use std::time::Duration;

use strata_api::{ExecRequest, LifecycleHooks};
use strata_core::units;
use strata_store::db::SandboxRecord;
use tracing::{info, warn};

use crate::error::{EngineError, EngineResult};
use crate::record::now;
use crate::state::Shared;

/// Default time a hook may run.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// When a hook runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Before the processes are dumped (or stopped, for fs_only).
    BeforeStandby,
    /// Before the processes are stopped.
    BeforeStop,
    /// After the sandbox runs again.
    AfterResume,
}

impl Stage {
    fn name(self) -> &'static str {
        match self {
            Stage::BeforeStandby => "before_standby",
            Stage::BeforeStop => "before_stop",
            Stage::AfterResume => "after_resume",
        }
    }

    fn command(self, h: &LifecycleHooks) -> Option<&Vec<String>> {
        match self {
            Stage::BeforeStandby => h.before_standby.as_ref(),
            Stage::BeforeStop => h.before_stop.as_ref(),
            Stage::AfterResume => h.after_resume.as_ref(),
        }
    }
}

/// Checks hook definitions: non-empty argv without NUL bytes, a valid timeout.
pub fn validate(h: &LifecycleHooks) -> EngineResult<()> {
    for stage in [Stage::BeforeStandby, Stage::BeforeStop, Stage::AfterResume] {
        if let Some(cmd) = stage.command(h) {
            if cmd.first().is_none_or(|c| c.is_empty()) || cmd.iter().any(|a| a.contains('\0')) {
                return Err(EngineError::bad_request(format!(
                    "hook {}: the command must name a program and contain no NUL bytes",
                    stage.name()
                )));
            }
        }
    }
    if let Some(t) = &h.timeout {
        units::parse_duration(t).map_err(|e| EngineError::bad_request(format!("hooks.timeout: {e}")))?;
    }
    Ok(())
}

/// Runs the hook for `stage`, if the sandbox has one, and records its outcome.
/// The sandbox must be running; the caller holds its operation lock.
pub async fn run(st: &Shared, rec: &SandboxRecord, stage: Stage) {
    let hooks = &rec.sandbox.policy.hooks;
    let Some(cmd) = stage.command(hooks) else { return };
    let timeout = hooks.timeout.as_deref().and_then(|t| units::parse_duration(t).ok()).unwrap_or(DEFAULT_TIMEOUT);
    let req =
        ExecRequest { cmd: cmd.clone(), timeout: Some(format!("{}ms", timeout.as_millis())), ..Default::default() };
    let (reason, detail) = match crate::processes::spawn_unchecked(st, rec, req).await {
        Ok(p) => {
            let info = p.wait(Some(timeout + Duration::from_secs(5))).await;
            let (out, err, _) = p.captured_output();
            let tail = |b: &[u8]| String::from_utf8_lossy(&b[b.len().saturating_sub(512)..]).trim().to_string();
            let status = match (info.exit_code, info.signal, info.timed_out) {
                (_, _, true) => format!("timed out after {}", humantime::format_duration(timeout)),
                (Some(c), _, _) => format!("exit code {c}"),
                (_, Some(s), _) => format!("killed by signal {s}"),
                _ => info.spawn_error.clone().unwrap_or_else(|| "did not finish".into()),
            };
            let ok = info.exit_code == Some(0) && !info.timed_out;
            (
                if ok { "hook_ok" } else { "hook_failed" },
                format!(
                    "{} `{}`: {status}; stdout: {:?}; stderr: {:?}",
                    stage.name(),
                    cmd.join(" "),
                    tail(&out),
                    tail(&err)
                ),
            )
        }
        Err(e) => ("hook_failed", format!("{} `{}`: {}", stage.name(), cmd.join(" "), e.body.message)),
    };
    let detail = st.secrets.get_or_empty(&rec.sandbox.id).redact_str(&detail);
    if reason == "hook_ok" {
        info!(sandbox = %rec.sandbox.id, hook = stage.name(), "hook ran");
    } else {
        warn!(sandbox = %rec.sandbox.id, hook = stage.name(), detail, "hook failed");
    }
    if let Ok(ev) = st.db.record_event(&rec.sandbox.id, rec.sandbox.state, reason, Some(&detail), &now()) {
        st.notify_events(ev.seq);
    }
}
