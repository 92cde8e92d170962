//! The writable layer of a sandbox whose tier keeps it inside a guest (the
//! microvm tier: [`strata_runtime::Runtime::layer_in_guest`]).
//!
//! A guest kernel writes that disk's blocks, so the host never mounts it (a
//! crafted file system would meet the host's ext4 driver). Checkpoints,
//! diffs, exports, scans and checks read the layer through the guest's pid 1
//! instead: first its manifest of entries (the guest kernel's inode numbers
//! and change times; a checkpoint keeps it, so the next change set is what
//! changed since), then an OCI layer tar of the entries asked for, which the
//! hardened unpacker that takes untrusted images stages on the host. The
//! engine's own code then works on that staged copy as on any other tier's
//! upper directory. A stopped microVM is booted for the read (no process of
//! its own runs in it) and powered off again; a paused one is refused.
//! Flush paths are wiped by the guest itself ([`flush`]).

use std::path::PathBuf;
use std::time::Duration;

use strata_api::SandboxState;
use strata_image::changes::{EntryKind, EntryMeta, TreeManifest};
use strata_init::layer::{Entry, Item, Kind};
use strata_runtime::Runtime;
use strata_store::db::SandboxRecord;
use tracing::{debug, warn};

use crate::error::{EngineError, EngineResult};
use crate::state::Shared;

/// The most entries a guest's manifest may name.
const MAX_ENTRIES: usize = 20_000_000;

/// The longest path a guest's manifest may name.
const MAX_PATH: usize = 4096;

/// Which entries of the layer to copy to the host.
pub(crate) enum Pick {
    /// None: the manifest is enough (a diff).
    Nothing,
    /// What changed since `base` over `lowers` (a checkpoint, an export):
    /// [`strata_image::changes::layer_items`].
    Changes {
        /// The manifest at the last checkpoint.
        base: TreeManifest,
        /// The layer chain below, top first.
        lowers: Vec<PathBuf>,
    },
    /// All of them (a scan, a comparison with another checkpoint).
    Everything,
}

/// The layer as its guest told it.
#[derive(Debug)]
pub(crate) struct GuestView {
    /// Its entries, with the guest's inode numbers and change times.
    pub now: TreeManifest,
    /// The entries copied to the host (with their parent directories),
    /// discarded when the view is dropped.
    staged: Option<strata_image::UnpackedLayer>,
    /// How long the guest's disk stayed frozen for the read.
    pub frozen_ms: u64,
}

impl GuestView {
    /// Where the copied entries are (`None`: none were asked for).
    pub fn dir(&self) -> Option<PathBuf> {
        self.staged.as_ref().map(|s| s.fs_dir())
    }
}

/// Whether `rec`'s writable layer is read through its guest.
pub(crate) fn in_guest(st: &Shared, rec: &SandboxRecord) -> bool {
    st.runtime_of(&rec.sandbox).layer_in_guest()
}

/// Checks a path a guest named: relative, clean, no NUL.
pub(crate) fn check_path(p: &str) -> Result<(), String> {
    let clean = !p.is_empty()
        && p.len() <= MAX_PATH
        && !p.contains('\0')
        && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..");
    if clean {
        Ok(())
    } else {
        Err(format!(
            "the guest named a path that is not a clean relative path: {:?}",
            p.chars().take(200).collect::<String>()
        ))
    }
}

/// The guest's entries as a manifest (paths checked, the identity paths
/// left out as [`strata_image::changes::scan`] leaves them out).
pub(crate) fn manifest_of(entries: Vec<Entry>) -> Result<TreeManifest, String> {
    if entries.len() > MAX_ENTRIES {
        return Err(format!("the guest's manifest names {} entries (at most {MAX_ENTRIES})", entries.len()));
    }
    let exclude = &strata_runtime::spec::IDENTITY_PATHS;
    let mut m = TreeManifest::default();
    for e in entries {
        check_path(&e.path)?;
        if exclude
            .iter()
            .any(|x| e.path == *x || (e.path.starts_with(x) && e.path.as_bytes().get(x.len()) == Some(&b'/')))
        {
            continue;
        }
        let kind = match e.kind {
            Kind::File => EntryKind::File,
            Kind::Dir => EntryKind::Dir,
            Kind::Symlink => EntryKind::Symlink,
            Kind::Whiteout => EntryKind::Whiteout,
            Kind::Other => EntryKind::Other,
        };
        let meta = EntryMeta {
            kind,
            ino: e.ino,
            ctime_ns: e.ctime_ns,
            size: if kind == EntryKind::File { e.size } else { 0 },
            opaque: e.opaque && kind == EntryKind::Dir,
        };
        m.entries.insert(e.path, meta);
    }
    Ok(m)
}

/// The items `pick` asks the guest for, given its manifest `now`.
fn items_for(pick: &Pick, now: &TreeManifest) -> Vec<Item> {
    match pick {
        Pick::Nothing => Vec::new(),
        Pick::Changes { base, lowers } => strata_image::changes::layer_items(base, now, lowers)
            .into_iter()
            .map(|(path, deleted)| Item { path, deleted })
            .collect(),
        Pick::Everything => now.entries.keys().map(|p| Item { path: p.clone(), deleted: false }).collect(),
    }
}

/// Reads the layer of the running guest of `sandbox_id` (blocking): its
/// manifest, and the entries `pick` asks for staged in `store`.
pub(crate) fn read_running(
    rt: &dyn Runtime,
    sandbox_id: &str,
    pick: &Pick,
    store: &strata_store::LayerStore,
    limit: u64,
    while_frozen: &mut dyn FnMut(),
) -> EngineResult<GuestView> {
    let mut now: Option<Result<TreeManifest, String>> = None;
    let mut choose = |entries: Vec<Entry>| -> Vec<Item> {
        match manifest_of(entries) {
            Ok(m) => {
                let items = items_for(pick, &m);
                now = Some(Ok(m));
                items
            }
            Err(e) => {
                now = Some(Err(e));
                Vec::new()
            }
        }
    };
    let (frozen, staged) = if matches!(pick, Pick::Nothing) {
        (rt.read_guest_layer(sandbox_id, &mut choose, None, while_frozen), None)
    } else {
        let (reader, mut writer) = strata_image::chunk_pipe::chunk_pipe();
        std::thread::scope(|s| {
            let unpacker = s.spawn(move || {
                // Untrusted bytes: the unpacker's checks all apply; modes are kept
                // (setuid files are what a scan looks for; no_new_privs keeps them inert).
                let opts = strata_image::ImportOptions { trusted: true, max_unpacked_bytes: limit };
                let mut warnings = Vec::new();
                let staged = strata_image::stage_layer(reader, store, &opts, None, &mut warnings, &mut |_| {});
                if !warnings.is_empty() {
                    debug!(sandbox = sandbox_id, ?warnings, "the guest's layer, as unpacked");
                }
                staged
            });
            let frozen = rt.read_guest_layer(sandbox_id, &mut choose, Some(&mut writer), while_frozen);
            drop(writer);
            let staged = unpacker
                .join()
                .map_err(|_| EngineError::new(strata_api::ErrorCode::Internal, "the layer's unpacker panicked"));
            (frozen, Some(staged))
        })
    };
    let now = match now {
        Some(Ok(m)) => m,
        Some(Err(why)) => return Err(EngineError::new(strata_api::ErrorCode::Internal, why)),
        None => {
            let e = frozen.err().map(|e| crate::error::chain(&e)).unwrap_or_else(|| "no manifest".into());
            return Err(EngineError::new(strata_api::ErrorCode::Internal, format!("reading the guest's layer: {e}")));
        }
    };
    let staged = match staged {
        None => None,
        // The unpacker gave up first (its reason is the cause), or the guest did.
        Some(staged) => match (staged?, &frozen) {
            (Err(u), _) => return Err(u.into()),
            (Ok(s), Ok(_)) => Some(s),
            (Ok(_), Err(_)) => None,
        },
    };
    let frozen = frozen.map_err(|e| EngineError::internal("reading the guest's layer", &e))?;
    Ok(GuestView { now, staged, frozen_ms: frozen.as_millis() as u64 })
}

/// Reads the layer of `rec` through its guest: a running microVM's own, or,
/// for a stopped one, a guest booted on its disk for the read (no process of
/// the sandbox runs; it is powered off after). `locked`: the caller holds
/// the sandbox's operation lock (otherwise it is taken for a boot).
pub(crate) async fn read(st: &Shared, rec: &SandboxRecord, pick: Pick, locked: bool) -> EngineResult<GuestView> {
    read_with(st, rec, pick, locked, Box::new(|| {})).await
}

/// [`read`], with `while_frozen` run in a running guest after its layer is
/// read and before its disk thaws (a warm checkpoint's copy of the VM).
pub(crate) async fn read_with(
    st: &Shared,
    rec: &SandboxRecord,
    pick: Pick,
    locked: bool,
    mut while_frozen: Box<dyn FnMut() + Send>,
) -> EngineResult<GuestView> {
    let disk = st.sandbox_dir(&rec.sandbox.id).join(strata_runtime::disk::IMAGE);
    let limit = tar_limit(st, &rec.sandbox.id);
    let (rt, store, id) = (st.runtime_of(&rec.sandbox), st.layers.clone(), rec.sandbox.id.clone());
    match rec.sandbox.state {
        SandboxState::Running => {
            tokio::task::spawn_blocking(move || read_running(&*rt, &id, &pick, &store, limit, &mut *while_frozen))
                .await
                .map_err(|e| EngineError::internal("guest layer task", &e))?
        }
        SandboxState::Stopped | SandboxState::Error | SandboxState::Lost => {
            let lock = st.lock_for(&id);
            let _g = if locked { None } else { Some(lock.lock().await) };
            let rec = crate::record::load(st, &id)?;
            if rec.sandbox.state == SandboxState::Running {
                return Box::pin(read(st, &rec, pick, true)).await;
            }
            if !disk.exists() {
                // Never booted: nothing was written.
                return Ok(GuestView { now: TreeManifest::default(), staged: None, frozen_ms: 0 });
            }
            let spec = reader_spec(st, &rec).await?;
            tokio::task::spawn_blocking(move || {
                in_booted_guest(&*rt, &id, &spec, |rt| read_running(rt, &id, &pick, &store, limit, &mut || {}))
            })
            .await
            .map_err(|e| EngineError::internal("guest layer task", &e))?
        }
        state => Err(EngineError::invalid_state(
            state,
            format!(
                "the writable layer of microVM {} is read through its guest, which cannot answer while it is {state}{}",
                rec.sandbox.id,
                if state == SandboxState::Paused { " (unpause it first)" } else { "" }
            ),
        )),
    }
}

/// The spec of a guest booted on a stopped microVM's disk for the engine's
/// own work (reading its layer, applying a rebase): none of the sandbox's
/// processes run in it, so it gets no secret.
pub(crate) async fn reader_spec(st: &Shared, rec: &SandboxRecord) -> EngineResult<strata_runtime::SandboxSpec> {
    let mut spec = crate::root_spec::mount_spec(st, rec).await?;
    spec.secrets.clear();
    Ok(spec)
}

/// Boots a guest on stopped microVM `id`'s disk from `spec` (the caller
/// holds the sandbox's operation lock, so no start races it), runs `f`
/// while that guest answers, and powers it off again (blocking).
pub(crate) fn in_booted_guest<T>(
    rt: &dyn Runtime,
    id: &str,
    spec: &strata_runtime::SandboxSpec,
    f: impl FnOnce(&dyn Runtime) -> EngineResult<T>,
) -> EngineResult<T> {
    let t = std::time::Instant::now();
    let handle = rt.start(spec).map_err(|e| EngineError::internal("booting the guest on the sandbox's disk", &e))?;
    let done = f(rt);
    if let Err(e) = rt.stop(id, &handle, Duration::from_secs(10)) {
        warn!(sandbox = %id, error = %crate::error::chain(&e), "stopping the guest booted on the sandbox's disk");
    }
    reap(handle.init_pid);
    if let Err(e) = rt.cleanup(id) {
        warn!(sandbox = %id, error = %crate::error::chain(&e), "cleaning up after the guest booted on the sandbox's disk");
    }
    debug!(sandbox = %id, ms = t.elapsed().as_millis() as u64, "worked on a stopped microVM's disk through a boot");
    done
}

/// The most bytes a tar of `id`'s guest layer may take: its disk's bytes
/// and the headers of its files.
pub(crate) fn tar_limit(st: &Shared, id: &str) -> u64 {
    let disk = st.sandbox_dir(id).join(strata_runtime::disk::IMAGE);
    std::fs::metadata(&disk).map(|m| m.len()).unwrap_or(0).saturating_mul(2) + (64 << 20)
}

/// Collects the exit of a keeper the engine started without watching it.
fn reap(pid: i32) {
    use nix::sys::wait::{waitpid, WaitPidFlag};
    for _ in 0..100 {
        match waitpid(nix::unistd::Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
            Ok(nix::sys::wait::WaitStatus::StillAlive) => std::thread::sleep(Duration::from_millis(20)),
            _ => return,
        }
    }
}

/// Wipes flush `paths` in a running microVM (its guest does it in its own
/// root); the report's lines.
pub(crate) async fn flush(
    st: &Shared,
    rec: &SandboxRecord,
    paths: Vec<String>,
    user: Option<String>,
) -> EngineResult<Vec<String>> {
    let (rt, id) = (st.runtime_of(&rec.sandbox), rec.sandbox.id.clone());
    tokio::task::spawn_blocking(move || rt.guest_flush(&id, &paths, user.as_deref()))
        .await
        .map_err(|e| EngineError::internal("flush task", &e))?
        .map_err(|e| EngineError::internal("flush", &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, kind: Kind) -> Entry {
        Entry { path: path.into(), kind, ino: 7, ctime_ns: 1, size: 3, opaque: true }
    }

    #[test]
    fn a_guest_s_manifest_is_checked_before_it_is_used() {
        for bad in ["", "/etc/passwd", "../x", "a/../../b", "a//b", ".", "a/./b", "a\0b"] {
            assert!(manifest_of(vec![entry(bad, Kind::File)]).is_err(), "{bad:?} accepted");
        }
        let long = "a/".repeat(MAX_PATH);
        assert!(manifest_of(vec![entry(&long, Kind::File)]).is_err());
        let m = manifest_of(vec![
            entry("etc/hostname", Kind::File),
            entry("srv", Kind::Dir),
            entry("srv/x", Kind::Symlink),
            entry("gone", Kind::Whiteout),
        ])
        .unwrap();
        // Identity paths are left out, as the host's own walk leaves them out.
        assert!(!m.entries.contains_key("etc/hostname"));
        assert!(m.entries["srv"].opaque, "a directory keeps its opaque mark");
        assert!(!m.entries["srv/x"].opaque && m.entries["srv/x"].size == 0, "only files have sizes, directories marks");
        assert_eq!(m.entries["gone"].kind, EntryKind::Whiteout);
    }

    #[test]
    fn the_items_asked_for_follow_the_pick() {
        let now = manifest_of(vec![entry("a", Kind::File), entry("b", Kind::Dir), entry("b/c", Kind::File)]).unwrap();
        assert!(items_for(&Pick::Nothing, &now).is_empty());
        let all: Vec<String> = items_for(&Pick::Everything, &now).into_iter().map(|i| i.path).collect();
        assert_eq!(all, ["a", "b", "b/c"]);
        // Against a base that had `a` as it is now and a `d` since deleted.
        let mut base = now.clone();
        base.entries.remove("b/c");
        base.entries.insert("d".into(), base.entries["a"].clone());
        let changes = items_for(&Pick::Changes { base, lowers: vec![] }, &now);
        let got: Vec<(String, bool)> = changes.into_iter().map(|i| (i.path, i.deleted)).collect();
        assert_eq!(got, [("b/c".to_string(), false), ("d".to_string(), true)]);
    }
}
