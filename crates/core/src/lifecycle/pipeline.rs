//! The pipeline run state machine.
//!
//! ```text
//! running -> succeeded | failed | paused | interrupted (daemon restart)
//! paused | failed | interrupted -> (resume) -> running
//! succeeded is terminal
//! ```

use strata_api::PipelineState;
use strata_api::PipelineState::*;

/// Something that moves a pipeline run between states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunAction {
    /// Continue from the first unfinished stage.
    Resume,
    /// Stop before the next stage (asked by `strata pipeline pause`).
    Pause,
    /// Every stage succeeded.
    Succeed,
    /// A stage failed.
    Fail,
    /// The daemon stopped while the run was driven.
    Interrupt,
}

impl RunAction {
    /// Every action, for exhaustive tests.
    pub const ALL: [RunAction; 5] =
        [RunAction::Resume, RunAction::Pause, RunAction::Succeed, RunAction::Fail, RunAction::Interrupt];

    /// Lower-case name used in errors.
    pub fn as_str(self) -> &'static str {
        match self {
            RunAction::Resume => "resume",
            RunAction::Pause => "pause",
            RunAction::Succeed => "succeed",
            RunAction::Fail => "fail",
            RunAction::Interrupt => "interrupt",
        }
    }
}

/// An action that is not legal in the run's current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cannot {} a pipeline run that {}", action.as_str(), describe(*current))]
pub struct InvalidRunTransition {
    /// The state the run is in.
    pub current: PipelineState,
    /// The refused action.
    pub action: RunAction,
}

fn describe(s: PipelineState) -> &'static str {
    match s {
        Running => "is running",
        Succeeded => "already succeeded",
        Failed => "failed",
        Interrupted => "was interrupted",
        Paused => "is paused",
    }
}

/// Where `action` leads from `current`, or why not. Every pair is spelled out.
pub fn next_run_state(current: PipelineState, action: RunAction) -> Result<PipelineState, InvalidRunTransition> {
    use RunAction as A;
    let next = match current {
        Running => match action {
            // A run recorded as running that no driver holds (the daemon
            // checks) is continued like an interrupted one.
            A::Resume => Some(Running),
            A::Pause => Some(Paused),
            A::Succeed => Some(Succeeded),
            A::Fail => Some(Failed),
            A::Interrupt => Some(Interrupted),
        },
        Paused | Failed | Interrupted => match action {
            A::Resume => Some(Running),
            A::Pause | A::Succeed | A::Fail | A::Interrupt => None,
        },
        Succeeded => match action {
            A::Resume | A::Pause | A::Succeed | A::Fail | A::Interrupt => None,
        },
    };
    next.ok_or(InvalidRunTransition { current, action })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATES: [PipelineState; 5] = [Running, Succeeded, Failed, Interrupted, Paused];

    #[test]
    fn every_pair_is_decided_and_succeeded_is_terminal() {
        let legal: Vec<_> = STATES
            .iter()
            .flat_map(|s| RunAction::ALL.iter().map(move |a| (*s, *a)))
            .filter(|(s, a)| next_run_state(*s, *a).is_ok())
            .collect();
        assert_eq!(legal.len(), 8, "{legal:?}");
        for a in RunAction::ALL {
            let e = next_run_state(Succeeded, a).unwrap_err();
            assert_eq!(e.current, Succeeded);
        }
        assert_eq!(
            next_run_state(Succeeded, RunAction::Resume).unwrap_err().to_string(),
            "cannot resume a pipeline run that already succeeded"
        );
    }

    #[test]
    fn stopped_runs_resume_and_only_a_running_one_ends() {
        for s in [Paused, Failed, Interrupted] {
            assert_eq!(next_run_state(s, RunAction::Resume), Ok(Running));
            for a in [RunAction::Succeed, RunAction::Fail, RunAction::Pause, RunAction::Interrupt] {
                assert!(next_run_state(s, a).is_err(), "{s:?} {a:?}");
            }
        }
        assert_eq!(next_run_state(Running, RunAction::Succeed), Ok(Succeeded));
        assert_eq!(next_run_state(Running, RunAction::Fail), Ok(Failed));
        assert_eq!(next_run_state(Running, RunAction::Pause), Ok(Paused));
        assert_eq!(next_run_state(Running, RunAction::Interrupt), Ok(Interrupted));
    }
}
