//! What every call on a sandbox does before it runs, whichever front end made
//! it: the sandbox is resolved once among the caller's own ([`crate::tenancy`]),
//! the call counts as activity while it runs ([`crate::activity`]) and, when it
//! needs the sandbox's processes or files, a parked sandbox is brought back
//! first (resume on access, [`crate::lifecycle::ensure_running()`]).
//!
//! Each method of the surface ([`crate::Engine`]) says what its operation
//! needs with a [`Use`] and gets an [`Entered`] sandbox, whichever front end
//! called it. Who may call at all (tenancy of the route, operator-only
//! operations) is decided before this; what is recorded in the audit log after it.

use strata_api::{ResumeResult, SandboxState};
use strata_store::db::SandboxRecord;

use crate::activity::ActivityGuard;
use crate::error::{EngineError, EngineResult};
use crate::state::Shared;

/// What a call needs from the sandbox it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Only its record (inspect, leases, previews, network, pause, stop, ...):
    /// not activity, never resumes it.
    Record,
    /// Its contents, running or not (process logs and lists, checkpoints,
    /// restore, diff, export): counts as activity while it runs.
    Contents,
    /// Its processes or files (exec, starting a process, signals, stdin, file
    /// operations): counts as activity, and a sandbox in standby, paused,
    /// stopped or archived is brought back to running first.
    Running,
}

impl Use {
    /// Whether the call counts as activity on the sandbox (idle detection).
    pub fn is_activity(self) -> bool {
        match self {
            Use::Record => false,
            Use::Contents | Use::Running => true,
        }
    }

    /// Whether the call brings a parked sandbox back first.
    pub fn resumes(self) -> bool {
        match self {
            Use::Record | Use::Contents => false,
            Use::Running => true,
        }
    }
}

/// A sandbox a call has entered: resolved for its caller, held awake (for
/// calls that are activity) until this is dropped, and running when the call
/// asked for it.
#[derive(Debug)]
pub struct Entered {
    /// The sandbox as it is now (after a resume, if one was made).
    pub sandbox: SandboxRecord,
    /// The resume made for this call, if the sandbox was parked.
    pub resumed: Option<ResumeResult>,
    activity: Option<ActivityGuard>,
}

impl Entered {
    /// The sandbox's full id.
    pub fn id(&self) -> &str {
        &self.sandbox.sandbox.id
    }

    /// The activity hold, to keep for as long as the call's answer streams
    /// (its drop counts as activity).
    pub fn into_hold(self) -> Option<ActivityGuard> {
        self.activity
    }

    /// The sandbox's record and the activity hold, taken apart.
    pub fn into_parts(self) -> (SandboxRecord, Option<ActivityGuard>) {
        (self.sandbox, self.activity)
    }
}

/// Whether a sandbox in `state` is parked: brought back by a [`Use::Running`] call.
fn parked(state: SandboxState) -> bool {
    match state {
        SandboxState::Standby | SandboxState::Paused | SandboxState::Stopped | SandboxState::Archived => true,
        SandboxState::Creating
        | SandboxState::Running
        | SandboxState::Error
        | SandboxState::Lost
        | SandboxState::Destroyed => false,
    }
}

/// Enters the sandbox `key` names for the current caller (exact id, name or
/// unique prefix among its own sandboxes; another tenant's is unknown): 404
/// when there is none. A [`Use::Running`] call resumes a parked sandbox (the
/// transition's reason is `resume_on_access`); a resume that fails is the
/// call's error. The sandbox is loaded once for all of it (twice when it is
/// resumed: the record after the resume is the one returned).
pub async fn enter(st: &Shared, key: &str, using: Use) -> EngineResult<Entered> {
    let rec = crate::tenancy::find_sandbox(st, key)?.ok_or_else(|| EngineError::sandbox_not_found(key))?;
    let id = rec.sandbox.id.clone();
    let activity = using.is_activity().then(|| st.activity.hold(&id));
    let (sandbox, resumed) = if using.resumes() && parked(rec.sandbox.state) {
        let resumed = crate::lifecycle::ensure_running(st, &id).await?;
        (crate::record::load(st, &id)?, resumed)
    } else {
        (rec, None)
    };
    Ok(Entered { sandbox, resumed, activity })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_calls_that_use_a_sandbox_count_and_only_those_that_need_it_running_resume_it() {
        assert!(!Use::Record.is_activity() && !Use::Record.resumes());
        assert!(Use::Contents.is_activity() && !Use::Contents.resumes());
        assert!(Use::Running.is_activity() && Use::Running.resumes());
    }
}
