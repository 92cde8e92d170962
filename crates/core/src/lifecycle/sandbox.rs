//! The sandbox lifecycle state machine.
//!
//! One exhaustive table ([`next_state`]) decides which action is legal in which
//! state and where it leads. Callers never set a state directly: they ask for
//! an [`Action`], and an illegal one yields [`InvalidTransition`] carrying the
//! current state (the daemon maps it to HTTP 409).
//!
//! ```text
//! creating -> running <-> paused -> standby -> running
//! running -> stopped -> running
//! stopped|standby -> archived -> (unarchive) -> stopped|standby
//! any -> destroyed; error and lost carry a reason
//! ```

use strata_api::SandboxState;
use strata_api::SandboxState::*;

/// Something that moves a sandbox between states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Creation finished; init is running.
    Ready,
    /// Freeze processes (cgroup freezer).
    Pause,
    /// Thaw frozen processes.
    Unpause,
    /// Dump processes and memory to disk, release CPU and RAM.
    Standby,
    /// Bring a standby sandbox back with the same processes.
    Resume,
    /// Kill processes, keep the filesystem.
    Stop,
    /// Start init again on the kept filesystem.
    Start,
    /// Pack layers into the object store.
    Archive,
    /// Unpack an archived sandbox back to local disk (it comes back stopped).
    Unarchive,
    /// Unpack an archived sandbox that was in standby (it comes back in standby,
    /// resumable with its processes).
    UnarchiveStandby,
    /// Remove everything.
    Destroy,
    /// A transition failed.
    Fail,
    /// The sandbox's processes vanished outside strata's control.
    Lose,
}

impl Action {
    /// Every action, for exhaustive tests and docs.
    pub const ALL: [Action; 13] = [
        Action::Ready,
        Action::Pause,
        Action::Unpause,
        Action::Standby,
        Action::Resume,
        Action::Stop,
        Action::Start,
        Action::Archive,
        Action::Unarchive,
        Action::UnarchiveStandby,
        Action::Destroy,
        Action::Fail,
        Action::Lose,
    ];

    /// Lower-case name used in errors and events.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Ready => "ready",
            Action::Pause => "pause",
            Action::Unpause => "unpause",
            Action::Standby => "standby",
            Action::Resume => "resume",
            Action::Stop => "stop",
            Action::Start => "start",
            Action::Archive => "archive",
            Action::Unarchive => "unarchive",
            Action::UnarchiveStandby => "unarchive_standby",
            Action::Destroy => "destroy",
            Action::Fail => "fail",
            Action::Lose => "lose",
        }
    }
}

/// An action that is not legal in the sandbox's current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cannot {} a sandbox that is {current}", action.as_str())]
pub struct InvalidTransition {
    /// The state the sandbox is in.
    pub current: SandboxState,
    /// The refused action.
    pub action: Action,
}

/// The transition table: where `action` leads from `current`, or why not.
///
/// Every (state, action) pair is spelled out: one inner match per state that
/// names every action, with no wildcard arm, so adding a state or an action
/// does not compile until this table decides what it does everywhere. The
/// tests enumerate every pair.
pub fn next_state(current: SandboxState, action: Action) -> Result<SandboxState, InvalidTransition> {
    use Action as A;
    let next = match current {
        Creating => match action {
            A::Ready => Some(Running),
            A::Fail => Some(Error),
            A::Destroy => Some(Destroyed),
            A::Pause | A::Unpause | A::Standby | A::Resume | A::Stop | A::Start | A::Archive => None,
            A::Unarchive | A::UnarchiveStandby | A::Lose => None,
        },
        Running => match action {
            A::Pause => Some(Paused),
            A::Standby => Some(Standby),
            A::Stop => Some(Stopped),
            A::Fail => Some(Error),
            A::Lose => Some(Lost),
            A::Destroy => Some(Destroyed),
            A::Ready | A::Unpause | A::Resume | A::Start | A::Archive | A::Unarchive | A::UnarchiveStandby => None,
        },
        Paused => match action {
            A::Unpause => Some(Running),
            A::Standby => Some(Standby),
            A::Stop => Some(Stopped),
            A::Fail => Some(Error),
            A::Lose => Some(Lost),
            A::Destroy => Some(Destroyed),
            A::Ready | A::Pause | A::Resume | A::Start | A::Archive | A::Unarchive | A::UnarchiveStandby => None,
        },
        Standby => match action {
            A::Resume => Some(Running),
            A::Stop => Some(Stopped),
            A::Archive => Some(Archived),
            A::Fail => Some(Error),
            A::Destroy => Some(Destroyed),
            // Nothing runs in standby, so nothing can be lost.
            A::Ready | A::Pause | A::Unpause | A::Standby | A::Start | A::Unarchive | A::UnarchiveStandby => None,
            A::Lose => None,
        },
        Stopped => match action {
            A::Start => Some(Running),
            A::Archive => Some(Archived),
            A::Fail => Some(Error),
            A::Destroy => Some(Destroyed),
            A::Ready | A::Pause | A::Unpause | A::Standby | A::Resume | A::Stop | A::Unarchive => None,
            A::UnarchiveStandby | A::Lose => None,
        },
        Archived => match action {
            A::Unarchive => Some(Stopped),
            A::UnarchiveStandby => Some(Standby),
            A::Fail => Some(Error),
            A::Destroy => Some(Destroyed),
            A::Ready | A::Pause | A::Unpause | A::Standby | A::Resume | A::Stop | A::Start | A::Archive => None,
            A::Lose => None,
        },
        // Terminal.
        Destroyed => match action {
            A::Ready | A::Pause | A::Unpause | A::Standby | A::Resume | A::Stop | A::Start | A::Archive => None,
            A::Unarchive | A::UnarchiveStandby | A::Destroy | A::Fail | A::Lose => None,
        },
        Error => match action {
            // Started again from its kept filesystem.
            A::Start => Some(Running),
            // An archive that failed to restore can be retried once the store is fixed.
            A::Unarchive => Some(Stopped),
            A::UnarchiveStandby => Some(Standby),
            // So can a standby image that failed to restore (it is kept).
            A::Resume => Some(Running),
            A::Stop => Some(Stopped),
            A::Destroy => Some(Destroyed),
            A::Ready | A::Pause | A::Unpause | A::Standby | A::Archive | A::Fail | A::Lose => None,
        },
        Lost => match action {
            // Started again from its kept filesystem.
            A::Start => Some(Running),
            A::Stop => Some(Stopped),
            A::Destroy => Some(Destroyed),
            A::Ready | A::Pause | A::Unpause | A::Standby | A::Resume | A::Archive | A::Unarchive => None,
            A::UnarchiveStandby | A::Fail | A::Lose => None,
        },
    };
    next.ok_or(InvalidTransition { current, action })
}

/// Whether the sandbox has live processes in this state (init exists).
pub fn has_processes(state: SandboxState) -> bool {
    matches!(state, Running | Paused)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documented_paths_are_legal() {
        let path = [
            (Creating, Action::Ready, Running),
            (Running, Action::Pause, Paused),
            (Paused, Action::Unpause, Running),
            (Paused, Action::Standby, Standby),
            (Standby, Action::Resume, Running),
            (Running, Action::Stop, Stopped),
            (Stopped, Action::Start, Running),
            (Stopped, Action::Archive, Archived),
            (Standby, Action::Archive, Archived),
            (Archived, Action::Unarchive, Stopped),
            (Archived, Action::UnarchiveStandby, Standby),
        ];
        for (from, action, to) in path {
            assert_eq!(next_state(from, action), Ok(to), "{from} --{action:?}-->");
        }
    }

    #[test]
    fn destroy_is_legal_from_everything_but_destroyed() {
        for s in SandboxState::ALL {
            let r = next_state(s, Action::Destroy);
            if s == Destroyed {
                assert_eq!(r, Err(InvalidTransition { current: s, action: Action::Destroy }));
            } else {
                assert_eq!(r, Ok(Destroyed));
            }
        }
    }

    #[test]
    fn illegal_requests_carry_the_current_state() {
        let err = next_state(Stopped, Action::Pause).unwrap_err();
        assert_eq!(err.current, Stopped);
        assert_eq!(err.to_string(), "cannot pause a sandbox that is stopped");
        assert!(next_state(Running, Action::Start).is_err());
        assert!(next_state(Archived, Action::Start).is_err());
        assert!(next_state(Destroyed, Action::Start).is_err());
    }

    #[test]
    fn table_is_total_and_destroyed_is_terminal() {
        let mut legal = 0;
        for s in SandboxState::ALL {
            for a in Action::ALL {
                if let Ok(next) = next_state(s, a) {
                    legal += 1;
                    assert_ne!(next, Creating, "nothing goes back to creating");
                }
            }
        }
        // Keep docs/lifecycle.md in step with the table when this changes.
        assert_eq!(legal, 37);
    }
}
