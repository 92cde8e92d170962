//! The Rule-of-Two approval state machine.
//!
//! ```text
//! pending -> approved (operator) | denied (operator, or timeout)
//! approved -> used (the request it approved came back; single use)
//! denied and used are terminal
//! ```

use strata_api::ApprovalState;
use strata_api::ApprovalState::*;

/// Something that moves an approval between states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ApprovalAction {
    /// The operator approves.
    Approve,
    /// The operator denies.
    Deny,
    /// No decision came before the timeout (a denial by `timeout`).
    Expire,
    /// The approved request is made (single use).
    Use,
}

impl ApprovalAction {
    /// Every action, for exhaustive tests.
    pub const ALL: [ApprovalAction; 4] =
        [ApprovalAction::Approve, ApprovalAction::Deny, ApprovalAction::Expire, ApprovalAction::Use];

    /// Lower-case name used in errors.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalAction::Approve => "approve",
            ApprovalAction::Deny => "deny",
            ApprovalAction::Expire => "expire",
            ApprovalAction::Use => "use",
        }
    }
}

/// An action that is not legal in the approval's current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cannot {} an approval that is {}", action.as_str(), current.as_str())]
pub struct InvalidApprovalTransition {
    /// The state the approval is in.
    pub current: ApprovalState,
    /// The refused action.
    pub action: ApprovalAction,
}

/// Where `action` leads from `current`, or why not. Every pair is spelled out.
pub fn next_approval_state(
    current: ApprovalState,
    action: ApprovalAction,
) -> Result<ApprovalState, InvalidApprovalTransition> {
    use ApprovalAction as A;
    let next = match current {
        Pending => match action {
            A::Approve => Some(Approved),
            A::Deny | A::Expire => Some(Denied),
            // Only an approved request may be made.
            A::Use => None,
        },
        // A decision is final; an approval that expires unused stays approved
        // (and is refused on use by its expiry).
        Approved => match action {
            A::Use => Some(Used),
            A::Approve | A::Deny | A::Expire => None,
        },
        Denied | Used => match action {
            A::Approve | A::Deny | A::Expire | A::Use => None,
        },
    };
    next.ok_or(InvalidApprovalTransition { current, action })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pair_is_decided() {
        let legal: Vec<_> = [Pending, Approved, Denied, Used]
            .iter()
            .flat_map(|s| ApprovalAction::ALL.iter().map(move |a| (*s, *a)))
            .filter(|(s, a)| next_approval_state(*s, *a).is_ok())
            .collect();
        assert_eq!(legal.len(), 4, "{legal:?}");
    }

    #[test]
    fn decisions_are_final_and_use_is_single() {
        assert_eq!(next_approval_state(Pending, ApprovalAction::Approve), Ok(Approved));
        assert_eq!(next_approval_state(Pending, ApprovalAction::Deny), Ok(Denied));
        assert_eq!(next_approval_state(Pending, ApprovalAction::Expire), Ok(Denied));
        assert!(next_approval_state(Pending, ApprovalAction::Use).is_err(), "pending is not usable");
        assert_eq!(next_approval_state(Approved, ApprovalAction::Use), Ok(Used));
        let e = next_approval_state(Denied, ApprovalAction::Approve).unwrap_err();
        assert_eq!(e.current, Denied);
        assert_eq!(e.to_string(), "cannot approve an approval that is denied");
        assert!(next_approval_state(Used, ApprovalAction::Use).is_err(), "single use");
        assert!(next_approval_state(Approved, ApprovalAction::Deny).is_err());
    }
}
