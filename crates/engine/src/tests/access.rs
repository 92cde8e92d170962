//! Entering a sandbox for a call ([`crate::access::enter`]): one resolution for
//! the caller, activity while the call runs, resume on access.

use std::time::Instant;

use strata_api::{ErrorCode, SandboxState};

use super::harness::{tenant, TestEngine};
use crate::access::{enter, Use};

#[tokio::test]
async fn a_call_that_needs_the_processes_resumes_a_sandbox_in_standby_once() {
    crate::tenancy::as_daemon(async {
        let e = TestEngine::new();
        e.image("base").await;
        let id = e.sandbox("base", "dev").await;
        crate::lifecycle::standby(&e.st, &id, "user").await.expect("standby");

        let entered = enter(&e.st, "dev", Use::Running).await.expect("enter by name");
        assert_eq!(entered.id(), id);
        let resumed = entered.resumed.as_ref().expect("resumed for the call");
        assert_eq!(resumed.from, SandboxState::Standby);
        assert_eq!(
            entered.sandbox.sandbox.state,
            SandboxState::Running,
            "the record returned is the one after the resume"
        );
        assert_eq!(e.event_reasons(&id).last().map(String::as_str), Some("resume_on_access"));
        assert_eq!(e.st.activity.view(&id, Instant::now()).open, 1, "held while the call runs");
        drop(entered);
        assert_eq!(e.st.activity.view(&id, Instant::now()).open, 0, "released when the call ends");

        let again = enter(&e.st, &id, Use::Running).await.expect("enter a running sandbox");
        assert!(again.resumed.is_none(), "a running sandbox is not resumed again");
    })
    .await;
}

#[tokio::test]
async fn reading_contents_counts_as_activity_without_waking_the_sandbox() {
    crate::tenancy::as_daemon(async {
        let e = TestEngine::new();
        e.image("base").await;
        let id = e.sandbox("base", "dev").await;
        crate::lifecycle::stop(&e.st, &id, "user", std::time::Duration::ZERO).await.expect("stop");

        let entered = enter(&e.st, &id[..8], Use::Contents).await.expect("enter by prefix");
        assert!(entered.resumed.is_none());
        assert_eq!(e.state(&id), SandboxState::Stopped);
        let hold = entered.into_hold();
        assert!(hold.is_some(), "contents are activity");

        let record = enter(&e.st, &id, Use::Record).await.expect("enter for the record");
        assert!(record.into_hold().is_none(), "reading the record is not activity");
        assert_eq!(e.st.activity.view(&id, Instant::now()).open, 1, "only the contents call holds it");
    })
    .await;
}

#[tokio::test]
async fn another_tenants_sandbox_is_unknown_and_stays_parked() {
    let e = crate::tenancy::as_daemon(async {
        let e = TestEngine::new();
        e.image("base").await;
        let id = e.sandbox("base", "dev").await;
        crate::lifecycle::standby(&e.st, &id, "user").await.expect("standby");
        (e, id)
    })
    .await;
    let (e, id) = e;
    for key in [id.as_str(), "dev", &id[..6]] {
        let err = crate::tenancy::run_as(tenant("globex"), enter(&e.st, key, Use::Running)).await.unwrap_err();
        assert_eq!(err.body.code, ErrorCode::SandboxNotFound, "{key}");
    }
    assert_eq!(crate::tenancy::as_daemon(async { e.state(&id) }).await, SandboxState::Standby, "not resumed");
    assert_eq!(e.st.activity.view(&id, Instant::now()).open, 0, "not held");
}
