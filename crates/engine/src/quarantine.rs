//! Quarantine's rules: a sandbox or checkpoint that must not spread can still
//! be inspected, diffed, exported and destroyed, but not forked, promoted to a
//! template, restored into a new sandbox (or into one that is not
//! quarantined) or given egress; the operations that would do so ask here
//! first. A checkpoint of a quarantined sandbox is born quarantined (`by:
//! inherited`), so checkpointing is no way around it. Placing and lifting a
//! quarantine (and the checks that place one) are [`crate::checks`]'. A leaf:
//! errors and the clock only.

use strata_api::{Checkpoint, ErrorCode, Quarantine, Sandbox};

use crate::clock::now;
use crate::error::EngineError;

/// 409 `quarantined`: `what` is refused on `kind` `name` while `q` holds.
fn refused(kind: &str, name: &str, q: &Quarantine, what: &str) -> EngineError {
    EngineError::new(
        ErrorCode::Quarantined,
        format!(
            "{kind} {name} is quarantined (since {}, by {}: {}); it cannot {what} until an operator lifts it (`strata quarantine lift`)",
            q.since, q.by, q.reason
        ),
    )
}

/// Refuses `what` on a quarantined sandbox.
pub fn refuse_sandbox(sb: &Sandbox, what: &str) -> Result<(), EngineError> {
    match &sb.quarantine {
        Some(q) => Err(refused("sandbox", &sb.name, q, what)),
        None => Ok(()),
    }
}

/// Refuses `what` on a quarantined checkpoint.
pub fn refuse_checkpoint(c: &Checkpoint, what: &str) -> Result<(), EngineError> {
    match &c.quarantine {
        Some(q) => Err(refused("checkpoint", &c.name, q, what)),
        None => Ok(()),
    }
}

/// The quarantine a new checkpoint of `sb` is born with.
pub fn inherited(sb: &Sandbox) -> Option<Quarantine> {
    sb.quarantine.as_ref().map(|q| inherited_from(&sb.name, q))
}

fn inherited_from(sandbox: &str, q: &Quarantine) -> Quarantine {
    Quarantine {
        reason: format!("taken from quarantined sandbox {sandbox}: {}", q.reason),
        since: now(),
        by: "inherited".into(),
        network_before: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q() -> Quarantine {
        Quarantine { reason: "leaked key".into(), since: "t0".into(), by: "check".into(), network_before: None }
    }

    #[test]
    fn refusals_name_the_object_the_reason_and_the_way_out() {
        let e = refused("sandbox", "agent", &q(), "be forked");
        assert_eq!(e.code(), ErrorCode::Quarantined);
        for part in ["sandbox agent", "leaked key", "by check", "be forked", "strata quarantine lift"] {
            assert!(e.body.message.contains(part), "{part:?} in {}", e.body.message);
        }
        let born = inherited_from("agent", &q());
        assert_eq!(born.by, "inherited");
        assert!(born.reason.contains("agent") && born.reason.contains("leaked key"), "{}", born.reason);
    }
}
