//! An engine on a temporary state directory with a [`FakeRuntime`].

use std::sync::Arc;

use strata_api::{CreateSandboxRequest, ImportImageRequest, Lifecycle, SandboxState};
use strata_runtime::fake::FakeRuntime;

use crate::admission::{Admission, AdmissionConfig, DefaultLimit, HostBounds};
use crate::state::{AppState, Shared};

/// The engine's state, its fake runtime and the directory they live in.
pub struct TestEngine {
    pub st: Shared,
    pub rt: Arc<FakeRuntime>,
    pub dir: tempfile::TempDir,
}

impl TestEngine {
    /// A fresh engine: empty metadata, no images, no disk limits (no loop devices).
    pub fn new() -> TestEngine {
        Self::open(tempfile::tempdir().expect("temp dir"), &[])
    }

    /// The same state directory opened again with a new runtime, as after a
    /// daemon restart: `adopt` are the sandboxes whose inits survived it.
    /// Reconciliation is the caller's to run.
    pub fn restart(self, adopt: &[&str]) -> TestEngine {
        let handles: Vec<(String, strata_runtime::SandboxHandle)> = adopt
            .iter()
            .map(|id| (id.to_string(), self.rt.sandbox(id).expect("known to the old runtime").handle))
            .collect();
        let TestEngine { st, rt: _, dir } = self;
        drop(st);
        Self::open(dir, &handles)
    }

    /// Opens the engine's state in `dir` on a new fake runtime that knows the
    /// inits in `adopt` as running.
    fn open(dir: tempfile::TempDir, adopt: &[(String, strata_runtime::SandboxHandle)]) -> TestEngine {
        let root = dir.path().to_path_buf();
        std::fs::create_dir_all(root.join("sandboxes")).expect("sandboxes dir");
        let rt = Arc::new(FakeRuntime::new(root.join("run")));
        for (id, h) in adopt {
            rt.adopt(id, h.clone());
        }
        let host = HostBounds {
            mem_total: 64 << 30,
            cpus: 16.0,
            pid_max: 4_194_304,
            fs_bytes: 1 << 40,
            state_dir: root.clone(),
        };
        let cfg = AdmissionConfig { default_disk: DefaultLimit::NoLimit, ..AdmissionConfig::default() };
        let mut st = AppState::new(
            strata_store::Db::open(&root.join("metadata.db")).expect("db"),
            strata_store::LayerStore::open(root.join("layers")).expect("layers"),
            rt.clone(),
            root.clone(),
            crate::archive::ArchiveStore::local(&root.join("archive")).expect("archive"),
            Arc::new(Admission::new(&cfg, host).expect("admission")),
        );
        // As the daemon's default; the fake restores lazily only once told to.
        st.lazy_restore = true;
        TestEngine { st: Arc::new(st), rt, dir }
    }

    /// Imports a tiny rootfs directory as image `name`.
    pub async fn image(&self, name: &str) {
        let src = self.dir.path().join(format!("src-{name}"));
        for d in ["bin", "etc", "tmp"] {
            std::fs::create_dir_all(src.join(d)).expect("mkdir");
        }
        std::fs::write(src.join("etc/os-release"), format!("NAME={name}\n")).expect("write");
        let req = ImportImageRequest {
            source: src.to_string_lossy().into_owned(),
            name: name.to_string(),
            trusted: false,
            replace: false,
        };
        crate::images::import(&self.st, req, None).await.expect("import");
    }

    /// Creates (and starts, on the fake runtime) a persistent sandbox from `image`.
    pub async fn sandbox(&self, image: &str, name: &str) -> String {
        let req = CreateSandboxRequest {
            source: image.to_string(),
            name: Some(name.to_string()),
            lifecycle: Lifecycle::Persistent,
            ..Default::default()
        };
        let sb = crate::lifecycle::create(&self.st, req).await.expect("create");
        assert_eq!(sb.state, SandboxState::Running);
        sb.id
    }

    /// The state the store records for `id`.
    pub fn state(&self, id: &str) -> SandboxState {
        crate::record::load(&self.st, id).expect("load").sandbox.state
    }

    /// The reasons of `id`'s events, oldest first.
    pub fn event_reasons(&self, id: &str) -> Vec<String> {
        self.st.db.events(Some(id), 0, 10_000).expect("events").into_iter().map(|e| e.reason).collect()
    }
}

/// A caller holding a token of tenant `name`.
pub fn tenant(name: &str) -> crate::caller::Caller {
    crate::caller::Caller {
        principal: crate::caller::Principal::Tenant {
            tenant: name.into(),
            token_id: format!("tok-{name}"),
            token_name: name.into(),
        },
        acting_as: None,
        approval: None,
    }
}
