//! Kept state: checkpoints and forks, reconciliation after a restart, tenancy.

use strata_api::{CheckpointRequest, ErrorCode, ForkRequest, Lifecycle, SandboxState};
use strata_runtime::fake::Op;

use super::harness::{tenant, TestEngine};
use crate::tenancy;

fn fork_of(source: &str, count: u32) -> ForkRequest {
    ForkRequest {
        source: source.to_string(),
        count,
        name_prefix: None,
        lifecycle: Lifecycle::Persistent,
        ttl: None,
        limits: None,
        network: None,
        processes: None,
        isolation: None,
    }
}

#[tokio::test]
async fn forks_of_a_checkpoint_are_new_running_sandboxes_that_keep_it_alive() {
    crate::tenancy::as_daemon(async {
        let e = TestEngine::new();
        e.image("base").await;
        let id = e.sandbox("base", "setup").await;
        let req = CheckpointRequest { name: Some("warmed".into()), ..Default::default() };
        let ck = crate::checkpoints::checkpoint(&e.st, &id, req).await.expect("checkpoint");
        assert_eq!(e.state(&id), SandboxState::Running, "a checkpoint leaves its sandbox running");
        assert!(e.rt.sandbox(&id).is_some_and(|s| !s.frozen), "and thawed");

        let r = crate::checkpoints::fork(&e.st, fork_of("warmed", 3)).await.expect("fork");
        assert_eq!(r.checkpoint, ck.id);
        assert_eq!(r.sandboxes.len(), 3);
        let mut seen = std::collections::HashSet::new();
        for child in &r.sandboxes {
            assert!(seen.insert(child.clone()), "each child has its own id");
            assert_ne!(child, &id);
            assert_eq!(e.state(child), SandboxState::Running);
            assert!(e.rt.actions(child).contains(&Op::Start), "each child booted on the runtime");
        }
        // The children (and the source, now on top of it) keep the checkpoint alive.
        let deps = crate::checkpoints::dependents_of(&e.st, &ck.id).expect("dependents");
        assert!(
            r.sandboxes.iter().all(|c| deps.contains(&format!("sandbox {c}"))),
            "children depend on the checkpoint: {deps:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_fork_of_an_unknown_checkpoint_is_a_404_and_makes_nothing() {
    crate::tenancy::as_daemon(async {
        let e = TestEngine::new();
        e.image("base").await;
        let before = e.st.db.list_sandboxes().unwrap().len();
        let err = crate::checkpoints::fork(&e.st, fork_of("no-such-checkpoint", 2)).await.unwrap_err();
        assert!(matches!(err.body.code, ErrorCode::CheckpointNotFound | ErrorCode::SandboxNotFound), "{:?}", err.body);
        assert_eq!(e.st.db.list_sandboxes().unwrap().len(), before);
    })
    .await;
}

#[tokio::test]
async fn a_restart_readopts_live_inits_and_records_lost_ones() {
    crate::tenancy::as_daemon(async {
        let e = TestEngine::new();
        e.image("base").await;
        let alive = e.sandbox("base", "alive").await;
        let gone = e.sandbox("base", "gone").await;
        let e = e.restart(&[&alive]);
        crate::lifecycle::reconcile(&e.st).await.expect("reconcile");
        assert_eq!(e.state(&alive), SandboxState::Running, "a surviving init is adopted");
        assert_eq!(e.state(&gone), SandboxState::Lost, "an init that did not survive is lost, with a reason");
        assert!(e.event_reasons(&gone).iter().any(|r| r == "init_gone"), "{:?}", e.event_reasons(&gone));
    })
    .await;
}

#[tokio::test]
async fn a_restart_keeps_a_sandbox_in_standby_resumable() {
    crate::tenancy::as_daemon(async {
        let e = TestEngine::new();
        e.image("base").await;
        let id = e.sandbox("base", "idle").await;
        crate::lifecycle::standby(&e.st, &id, "idle").await.expect("standby");
        let e = e.restart(&[]);
        crate::lifecycle::reconcile(&e.st).await.expect("reconcile");
        assert_eq!(e.state(&id), SandboxState::Standby);
        let r = crate::lifecycle::resume(&e.st, &id, "user").await.expect("resume after restart");
        assert!(r.processes_restored);
    })
    .await;
}

#[tokio::test]
async fn a_tenant_sees_its_own_sandboxes_and_no_one_else_s() {
    crate::tenancy::as_daemon(async {
        let e = TestEngine::new();
        e.image("base").await;
        let a = tenancy::run_as(tenant("acme"), e.sandbox("base", "web")).await;
        let b = tenancy::run_as(tenant("globex"), e.sandbox("base", "api")).await;
        let seen_by_acme = tenancy::run_as(tenant("acme"), async { crate::record::load(&e.st, "web") }).await;
        assert_eq!(seen_by_acme.expect("acme's web").sandbox.id, a);
        let by_name = tenancy::run_as(tenant("acme"), async { crate::record::load(&e.st, "api") }).await.unwrap_err();
        assert_eq!(by_name.body.code, ErrorCode::SandboxNotFound, "another tenant's name does not resolve");
        let other = tenancy::run_as(tenant("acme"), async { crate::record::load(&e.st, &b) }).await.unwrap_err();
        assert_eq!(other.body.code, ErrorCode::SandboxNotFound, "another tenant's id is a 404 like an unknown one");
        let stop = tenancy::run_as(tenant("acme"), async {
            crate::lifecycle::stop(&e.st, &b, "user", std::time::Duration::ZERO).await
        })
        .await
        .unwrap_err();
        assert_eq!(stop.body.code, ErrorCode::SandboxNotFound);
        assert_eq!(e.state(&b), SandboxState::Running, "and it is left alone");
    })
    .await;
}

#[tokio::test]
async fn a_task_with_no_caller_sees_nothing() {
    let e = TestEngine::new();
    let id = crate::tenancy::as_daemon(async {
        e.image("base").await;
        e.sandbox("base", "web").await
    })
    .await;
    // No caller: the lookup fails closed (a 404 like an unknown id), and no transition happens.
    let err = crate::record::load(&e.st, &id).unwrap_err();
    assert_eq!(err.body.code, ErrorCode::SandboxNotFound);
    let stop = crate::lifecycle::stop(&e.st, &id, "user", std::time::Duration::ZERO).await.unwrap_err();
    assert_eq!(stop.body.code, ErrorCode::SandboxNotFound);
    assert_eq!(crate::tenancy::as_daemon(async { e.state(&id) }).await, SandboxState::Running);
}
