//! Sandbox lifecycle bookkeeping: states, events, standby images, refusals.

use strata_api::{ErrorCode, SandboxState};
use strata_runtime::fake::Op;
use strata_runtime::RuntimeError;

use super::harness::TestEngine;

#[tokio::test]
async fn create_stop_start_destroy_records_each_transition() {
    crate::tenancy::as_daemon(async {
        let e = TestEngine::new();
        e.image("base").await;
        let id = e.sandbox("base", "web").await;
        assert!(e.rt.sandbox(&id).is_some_and(|s| s.alive), "the runtime started its init");

        crate::lifecycle::stop(&e.st, &id, "user", std::time::Duration::ZERO).await.expect("stop");
        assert_eq!(e.state(&id), SandboxState::Stopped);
        assert!(!e.rt.sandbox(&id).is_some_and(|s| s.alive), "stop ended the init");

        // Stopping again is illegal in `stopped`: a 409 naming the state, not a no-op.
        let again = crate::lifecycle::stop(&e.st, &id, "user", std::time::Duration::ZERO).await.unwrap_err();
        assert_eq!(again.body.code, ErrorCode::InvalidState);
        assert_eq!(again.body.current_state, Some(SandboxState::Stopped));

        crate::lifecycle::start(&e.st, &id).await.expect("start");
        assert_eq!(e.state(&id), SandboxState::Running);

        crate::lifecycle::destroy(&e.st, &id, true, "user").await.expect("destroy");
        let gone = crate::record::load(&e.st, &id).unwrap_err();
        assert_eq!(gone.body.code, ErrorCode::SandboxNotFound);
        let reasons = e.event_reasons(&id);
        assert!(reasons.len() >= 4, "create, stop, start, destroy are events: {reasons:?}");
    })
    .await;
}

#[tokio::test]
async fn standby_seals_an_image_and_resume_brings_the_processes_back() {
    crate::tenancy::as_daemon(async {
        let e = TestEngine::new();
        e.image("base").await;
        let id = e.sandbox("base", "dev").await;

        crate::lifecycle::standby(&e.st, &id, "user").await.expect("standby");
        assert_eq!(e.state(&id), SandboxState::Standby);
        let dir = crate::process_image::image_dir(&e.st, &id);
        assert!(crate::process_image::verify(&dir).is_ok(), "the sealed image verifies");
        let ops = e.rt.actions(&id);
        let dump = ops.iter().position(|o| *o == Op::DumpProcesses).expect("dumped");
        let cleanup = ops.iter().rposition(|o| *o == Op::Cleanup).expect("cleaned up");
        assert!(dump < cleanup, "processes dumped before the cgroup goes: {ops:?}");

        let r = crate::lifecycle::resume(&e.st, &id, "user").await.expect("resume");
        assert!(r.processes_restored);
        assert_eq!(r.from, SandboxState::Standby);
        assert_eq!(e.state(&id), SandboxState::Running);
        assert!(e.rt.actions(&id).contains(&Op::RestoreProcesses));
        assert!(!dir.exists(), "a spent image is retired");
    })
    .await;
}

#[tokio::test]
async fn a_failed_dump_leaves_the_sandbox_running_and_says_so() {
    crate::tenancy::as_daemon(async {
        let e = TestEngine::new();
        e.image("base").await;
        let id = e.sandbox("base", "dev").await;
        e.rt.fail_next_for(&id, Op::DumpProcesses, RuntimeError::Setup("criu said no".into()));
        let err = crate::lifecycle::standby(&e.st, &id, "user").await.unwrap_err();
        assert_eq!(err.body.code, ErrorCode::Internal);
        assert!(
            err.body.message.contains("keeps running") && err.body.message.contains("criu said no"),
            "{}",
            err.body.message
        );
        assert_eq!(e.state(&id), SandboxState::Running);
        assert!(!crate::process_image::image_dir(&e.st, &id).exists(), "no half image is left");
    })
    .await;
}

#[tokio::test]
async fn standby_without_process_dumps_is_a_501_naming_why() {
    crate::tenancy::as_daemon(async {
        let e = TestEngine::new();
        e.image("base").await;
        let id = e.sandbox("base", "dev").await;
        e.rt.set_process_dump_unsupported(Some("no CRIU here".into()));
        let err = crate::lifecycle::standby(&e.st, &id, "user").await.unwrap_err();
        assert_eq!(err.body.code, ErrorCode::Unsupported);
        assert!(
            err.body.message.contains("no CRIU here") && err.body.message.contains("--fs-only"),
            "{}",
            err.body.message
        );
        assert_eq!(e.state(&id), SandboxState::Running);
    })
    .await;
}

#[tokio::test]
async fn a_failed_restore_marks_the_sandbox_error_and_keeps_its_image() {
    crate::tenancy::as_daemon(async {
        let e = TestEngine::new();
        e.image("base").await;
        let id = e.sandbox("base", "dev").await;
        crate::lifecycle::standby(&e.st, &id, "user").await.expect("standby");
        e.rt.fail_next_for(&id, Op::RestoreProcesses, RuntimeError::Setup("restore broke".into()));
        let err = crate::lifecycle::resume(&e.st, &id, "user").await.unwrap_err();
        assert!(err.body.message.contains("restore broke"), "{}", err.body.message);
        assert_eq!(e.state(&id), SandboxState::Error);
        assert!(crate::process_image::image_dir(&e.st, &id).exists(), "the image is kept for diagnosis");
    })
    .await;
}

/// Polls the engine (yielding to its tasks) until `f` holds, at most 5 s.
async fn eventually(mut f: impl FnMut() -> bool) -> bool {
    for _ in 0..500 {
        if f() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    f()
}

/// An engine whose fake restores lazily, with a sandbox put into standby and
/// resumed: its fill is open until the test settles it.
async fn lazily_resumed() -> (TestEngine, String) {
    let e = TestEngine::new();
    e.rt.set_lazy_restore(true);
    e.image("base").await;
    let id = e.sandbox("base", "dev").await;
    crate::lifecycle::standby(&e.st, &id, "user").await.expect("standby");
    crate::lifecycle::resume(&e.st, &id, "user").await.expect("resume");
    (e, id)
}

#[tokio::test]
async fn a_lazy_resume_keeps_its_image_until_every_page_is_in() {
    crate::tenancy::as_daemon(async {
        let (e, id) = lazily_resumed().await;
        let dir = crate::process_image::image_dir(&e.st, &id);
        assert_eq!(e.state(&id), SandboxState::Running);
        let last = e.st.db.events(Some(&id), 0, 1000).unwrap().pop().unwrap();
        assert!(last.detail.as_deref().unwrap().contains("memory restored lazily"), "{last:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(dir.exists(), "pages still come from the image");
        e.rt.settle_fill(&id, Ok(std::time::Duration::from_millis(42)));
        assert!(eventually(|| !dir.exists()).await, "retired once every page is in");
        let ev = e.st.db.events(Some(&id), 0, 1000).unwrap().pop().unwrap();
        assert_eq!((ev.reason.as_str(), ev.to), ("memory_resident", SandboxState::Running));
        assert!(ev.detail.unwrap().contains("42 ms"));
        // And a standby after that dumps as usual.
        crate::lifecycle::standby(&e.st, &id, "user").await.expect("standby again");
    })
    .await;
}

#[tokio::test]
async fn a_failed_fill_kills_the_processes_and_keeps_the_image_for_another_resume() {
    crate::tenancy::as_daemon(async {
        let (e, id) = lazily_resumed().await;
        e.rt.settle_fill(&id, Err("criu lazy-pages ended (signal: 9)".into()));
        assert!(eventually(|| e.state(&id) == SandboxState::Error).await);
        let ev = e.st.db.events(Some(&id), 0, 1000).unwrap().pop().unwrap();
        assert_eq!(ev.reason, "lazy_restore_failed");
        assert!(ev.detail.unwrap().contains("signal: 9"));
        assert!(!e.rt.sandbox(&id).unwrap().alive, "the processes with missing pages are gone");
        assert!(crate::process_image::image_dir(&e.st, &id).exists(), "the image is kept");
        // The explicit retry restores from it (eagerly this time).
        e.rt.set_lazy_restore(false);
        let r = crate::lifecycle::resume_parked(&e.st, &id, &Default::default(), "user").await.expect("retry");
        assert!(r.processes_restored && r.from == SandboxState::Error);
        assert!(!crate::process_image::image_dir(&e.st, &id).exists(), "an eager resume retires it at once");
    })
    .await;
}

#[tokio::test]
async fn a_sandbox_stopped_before_its_fill_ends_loses_the_spent_image() {
    crate::tenancy::as_daemon(async {
        let (e, id) = lazily_resumed().await;
        assert!(strata_runtime::Runtime::memory_fill(&*e.rt, &id).is_some(), "a fill runs");
        crate::lifecycle::stop(&e.st, &id, "user", std::time::Duration::ZERO).await.expect("stop");
        // The processes are gone: the fill daemon's verdict says so.
        e.rt.settle_fill(&id, Err("Restorer unexpectedly closed the connection".into()));
        assert!(eventually(|| !crate::process_image::image_dir(&e.st, &id).exists()).await);
        assert_eq!(e.state(&id), SandboxState::Stopped);
    })
    .await;
}

#[tokio::test]
async fn an_image_from_another_host_is_a_409_and_stays_in_standby() {
    crate::tenancy::as_daemon(async {
        let e = TestEngine::new();
        e.image("base").await;
        let id = e.sandbox("base", "dev").await;
        crate::lifecycle::standby(&e.st, &id, "user").await.expect("standby");
        e.rt.fail_next_for(
            &id,
            Op::RestoreProcesses,
            RuntimeError::Incompatible("made by runsc X, this host has Y".into()),
        );
        let err = crate::lifecycle::resume(&e.st, &id, "user").await.unwrap_err();
        assert_eq!(err.body.code.http_status(), 409, "{:?}", err.body);
        assert!(
            err.body.message.contains("made by runsc X") && err.body.message.contains("kept"),
            "{}",
            err.body.message
        );
        assert_eq!(err.body.current_state, Some(SandboxState::Standby));
        assert_eq!(e.state(&id), SandboxState::Standby, "nothing changed");
        assert!(crate::process_image::image_dir(&e.st, &id).exists(), "the image is kept");
        // Asked for, it starts afresh from its filesystem instead, and the image goes.
        let req = strata_api::ResumeRequest { fs_only: true };
        let r = crate::lifecycle::resume_with(&e.st, &id, &req, "user").await.expect("resume --fs-only");
        assert!(!r.processes_restored);
        assert_eq!(e.state(&id), SandboxState::Running);
        assert!(!crate::process_image::image_dir(&e.st, &id).exists(), "the image is dropped");
    })
    .await;
}

#[tokio::test]
async fn a_corrupted_standby_image_is_refused_by_name() {
    crate::tenancy::as_daemon(async {
        let e = TestEngine::new();
        e.image("base").await;
        let id = e.sandbox("base", "dev").await;
        crate::lifecycle::standby(&e.st, &id, "user").await.expect("standby");
        let dir = crate::process_image::image_dir(&e.st, &id);
        let victim = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(Result::ok)
            .map(|d| d.path())
            .find(|p| p.file_name().is_some_and(|n| n != "manifest.json"))
            .expect("an image file");
        std::fs::write(&victim, b"not what was dumped").unwrap();
        let err = crate::lifecycle::resume(&e.st, &id, "user").await.unwrap_err();
        let name = victim.file_name().unwrap().to_string_lossy().into_owned();
        assert!(err.body.message.contains(&name), "the corrupted file is named: {}", err.body.message);
        assert_eq!(e.state(&id), SandboxState::Error);
        assert!(!e.rt.actions(&id).contains(&Op::RestoreProcesses), "nothing is restored from a bad image");
    })
    .await;
}

#[tokio::test]
async fn pause_and_unpause_freeze_through_the_runtime() {
    crate::tenancy::as_daemon(async {
        let e = TestEngine::new();
        e.image("base").await;
        let id = e.sandbox("base", "dev").await;
        crate::lifecycle::pause(&e.st, &id).await.expect("pause");
        assert_eq!(e.state(&id), SandboxState::Paused);
        assert!(e.rt.sandbox(&id).is_some_and(|s| s.frozen));
        let again = crate::lifecycle::pause(&e.st, &id).await.unwrap_err();
        assert_eq!(again.body.current_state, Some(SandboxState::Paused));
        crate::lifecycle::unpause(&e.st, &id, "user").await.expect("unpause");
        assert!(e.rt.sandbox(&id).is_some_and(|s| !s.frozen));
        assert_eq!(e.state(&id), SandboxState::Running);
    })
    .await;
}
