//! The archive store: a stopped or standby sandbox's own state (its writable
//! layer, and its standby process image) packed into an object store
//! (`pack`), fetched and checked back (`unpack`), the local pointer to it
//! and [`reconcile`] after a restart. The transitions themselves are
//! [`crate::lifecycle::archive`](mod@crate::lifecycle::archive) and
//! [`crate::lifecycle::unarchive`](mod@crate::lifecycle::unarchive); `resume` /
//! `start` (or any call that resumes on access) brings an archived sandbox back.
//!
//! The store is an [`object_store`] (a local directory by default,
//! `<state>/archive`; an S3-compatible bucket with `--archive-url s3://...`
//! when built with the `s3` feature). Objects live under
//! `sandboxes/<id>/<archive id>/`: `upper.tar` (GNU tar with xattrs, so
//! overlay whiteouts and opaque directories survive; a microVM's disk image
//! instead, `disk.tar`, sparse), `standby.tar` when the
//! sandbox was in standby, and `manifest.json` last. The manifest (every
//! object's size and sha256) is also kept locally in `<sandbox>/archived.json`
//! and is the trust anchor: objects that do not match it are refused with the
//! reason, the sandbox becomes `error`, and nothing is unpacked half-way.
//! The image layers below the writable layer are shared, content-addressed
//! and stay in the local layer store.
//!
//! Order (crash safety): upload objects, then the remote manifest, then the
//! local `archived.json` (atomic), then the `archived` transition, then the
//! local files are removed. Restoring unpacks into a staging directory and
//! renames it into place before the transition; the local pointer goes last.

use std::path::{Path, PathBuf};

use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::ObjectStore;
use serde::{Deserialize, Serialize};
use sha2::Digest;
use strata_api::SandboxState;
use strata_store::db::SandboxRecord;
use tokio::io::AsyncWriteExt;
use tracing::warn;

use crate::record::now;
use crate::state::Shared;

pub use crate::state::archive::*;

/// The local pointer to a sandbox's archive (a copy of its manifest).
const POINTER: &str = "archived.json";
/// Staging directories.
pub(crate) const PACK_DIR: &str = "archive.tmp";
pub(crate) const UNPACK_DIR: &str = "unarchive.tmp";

/// An archive's description (remote `manifest.json`, local `archived.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArchiveManifest {
    /// Format version.
    pub version: u32,
    /// The sandbox.
    pub sandbox_id: String,
    /// Key prefix of its objects in the store.
    pub prefix: String,
    /// The store it went to.
    pub store: String,
    /// The state it was archived from (`stopped` or `standby`).
    pub from: SandboxState,
    /// RFC 3339 time.
    pub created_at: String,
    /// Layer chain below the writable layer (kept in the local layer store).
    pub layers: Vec<String>,
    /// Every object with its size and sha256.
    pub objects: Vec<ObjectSum>,
}

/// One archived object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObjectSum {
    /// File name under the prefix.
    pub name: String,
    /// Bytes.
    pub size: u64,
    /// Hex sha256.
    pub sha256: String,
}

pub(crate) fn pointer_path(st: &Shared, id: &str) -> PathBuf {
    st.sandbox_dir(id).join(POINTER)
}

/// The local archive pointer of a sandbox, if it has one.
pub fn pointer(st: &Shared, id: &str) -> Option<ArchiveManifest> {
    std::fs::read(pointer_path(st, id)).ok().and_then(|b| serde_json::from_slice(&b).ok())
}

/// Runs GNU tar (xattrs included: overlay whiteouts are device nodes, opaque
/// directories an xattr; owners numeric).
async fn tar(args: &[&std::ffi::OsStr]) -> Result<(), String> {
    let out = tokio::process::Command::new("tar")
        .args(["--xattrs", "--xattrs-include=*", "--numeric-owner", "--acls"])
        .args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .output()
        .await
        .map_err(|e| format!("running tar: {e}"))?;
    if !out.status.success() {
        return Err(format!("tar {:?} failed ({}): {}", args, out.status, String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(())
}

async fn sha256_file(path: &Path) -> std::io::Result<(u64, String)> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut h = sha2::Sha256::new();
        let n = strata_store::fsutil::for_each_chunk(&path, |c| h.update(c))?;
        Ok((n, hex::encode(h.finalize())))
    })
    .await
    .map_err(std::io::Error::other)?
}

async fn upload(store: &dyn ObjectStore, key: &ObjectPath, file: &Path) -> Result<(), String> {
    use tokio::io::AsyncReadExt;
    let upload = store.put_multipart(key).await.map_err(|e| format!("upload {key}: {e}"))?;
    let mut w = object_store::WriteMultipart::new(upload);
    let mut f = tokio::fs::File::open(file).await.map_err(|e| format!("{}: {e}", file.display()))?;
    let mut buf = vec![0u8; 8 << 20];
    loop {
        let n = f.read(&mut buf).await.map_err(|e| format!("{}: {e}", file.display()))?;
        if n == 0 {
            break;
        }
        w.wait_for_capacity(4).await.map_err(|e| format!("upload {key}: {e}"))?;
        w.write(&buf[..n]);
    }
    w.finish().await.map_err(|e| format!("upload {key}: {e}"))?;
    Ok(())
}

/// Downloads `key` into `dest`, checking it against `want`.
async fn download(store: &dyn ObjectStore, key: &ObjectPath, dest: &Path, want: &ObjectSum) -> Result<(), String> {
    let got = store.get(key).await.map_err(|e| format!("archive object {}: {e}", want.name))?;
    let mut stream = got.into_stream();
    let mut f = tokio::fs::File::create(dest).await.map_err(|e| format!("{}: {e}", dest.display()))?;
    let mut h = sha2::Sha256::new();
    let mut n = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| format!("archive object {}: {e}", want.name))?;
        h.update(&chunk);
        n += chunk.len() as u64;
        f.write_all(&chunk).await.map_err(|e| format!("{}: {e}", dest.display()))?;
    }
    f.sync_all().await.map_err(|e| format!("{}: {e}", dest.display()))?;
    let sum = hex::encode(h.finalize());
    if n != want.size || sum != want.sha256 {
        return Err(format!(
            "archive object {} does not match its manifest ({n} bytes, sha256 {sum}; expected {} bytes, sha256 {})",
            want.name, want.size, want.sha256
        ));
    }
    Ok(())
}

// ---- packing ----

/// Packs and uploads; on success the local pointer is written.
pub(crate) async fn pack(st: &Shared, rec: &SandboxRecord, staging: &Path) -> Result<ArchiveManifest, String> {
    let id = &rec.sandbox.id;
    let dir = st.sandbox_dir(id);
    tokio::fs::create_dir_all(staging).await.map_err(|e| format!("{}: {e}", staging.display()))?;
    // (object, directory, what of it): a guest's writable layer is on its disk,
    // which the host never mounts, so the disk image goes as it is (holes kept).
    // A microVM restored to a checkpoint and not booted since has no disk yet (its next boot makes one).
    let mut parts: Vec<(&str, PathBuf, &str)> = match crate::guest_layer::in_guest(st, rec) {
        true if dir.join(strata_runtime::disk::IMAGE).exists() => {
            vec![(DISK_TAR, dir.clone(), strata_runtime::disk::IMAGE)]
        }
        true => Vec::new(),
        false => vec![("upper.tar", strata_runtime::disk::upper_dir(&dir), ".")],
    };
    if rec.sandbox.state == SandboxState::Standby {
        parts.push(("standby.tar", dir.join("standby"), "."));
        // A gVisor sandbox's /tmp is a host directory its saved sentry refers to.
        let tmp = tmp_dir(&dir);
        if tmp.is_dir() {
            parts.push((TMP_TAR, tmp, "."));
        }
    }
    let mut objects = Vec::new();
    for (name, src, member) in &parts {
        let file = staging.join(name);
        tar(&[
            "--create".as_ref(),
            "--sparse".as_ref(),
            "--file".as_ref(),
            file.as_os_str(),
            "-C".as_ref(),
            src.as_os_str(),
            member.as_ref(),
        ])
        .await?;
        let (size, sha256) = sha256_file(&file).await.map_err(|e| format!("{}: {e}", file.display()))?;
        objects.push(ObjectSum { name: name.to_string(), size, sha256 });
    }
    let prefix = format!("sandboxes/{id}/{}", strata_core::ids::new_id());
    let manifest = ArchiveManifest {
        version: 1,
        sandbox_id: id.clone(),
        prefix: prefix.clone(),
        store: st.archive.url.clone(),
        from: rec.sandbox.state,
        created_at: now(),
        layers: rec.layers.clone(),
        objects: objects.clone(),
    };
    crate::failpoint("archive-upload").map_err(|e| format!("uploading: {e}"))?;
    for o in &objects {
        upload(st.archive.store.as_ref(), &ObjectPath::from(format!("{prefix}/{}", o.name)), &staging.join(&o.name))
            .await?;
    }
    let json = serde_json::to_vec_pretty(&manifest).expect("manifest serializes");
    st.archive
        .store
        .put(&ObjectPath::from(format!("{prefix}/manifest.json")), json.clone().into())
        .await
        .map_err(|e| format!("upload manifest: {e}"))?;
    strata_store::fsutil::write_atomic(&pointer_path(st, id), &json, 0o600)
        .map_err(|e| format!("writing {POINTER}: {e}"))?;
    Ok(manifest)
}

// ---- unpacking ----

/// The archive object holding a gVisor sandbox's `/tmp` (with its standby image).
pub(crate) const TMP_TAR: &str = "tmp.tar";

/// The archive object holding a microVM's disk image (its writable layer is
/// on it; the host does not mount a disk a guest has written).
pub(crate) const DISK_TAR: &str = "disk.tar";

/// Where the sandbox in `dir` keeps a gVisor `/tmp` (beside its writable layer).
pub(crate) fn tmp_dir(dir: &Path) -> PathBuf {
    strata_runtime::gvisor::bundle::tmp_dir_beside(&strata_runtime::disk::upper_dir(dir))
}

/// Downloads and checks every object of `m`, then unpacks each into
/// `staging/<name>` or, for `upper.tar` and [`TMP_TAR`], straight into
/// `upper_target` and `tmp_target` when given (onto the sandbox's disk).
pub(crate) async fn unpack(
    st: &Shared,
    m: &ArchiveManifest,
    staging: &Path,
    upper_target: Option<&Path>,
    tmp_target: Option<&Path>,
) -> Result<(), String> {
    tokio::fs::create_dir_all(staging).await.map_err(|e| format!("{}: {e}", staging.display()))?;
    crate::failpoint("archive-download").map_err(|e| format!("downloading: {e}"))?;
    // Every object is fetched and checked before anything is unpacked.
    for o in &m.objects {
        download(
            st.archive.store.as_ref(),
            &ObjectPath::from(format!("{}/{}", m.prefix, o.name)),
            &staging.join(&o.name),
            o,
        )
        .await?;
    }
    for o in &m.objects {
        let target = match (upper_target, tmp_target) {
            (Some(t), _) if o.name == "upper.tar" => t.to_path_buf(),
            (_, Some(t)) if o.name == TMP_TAR => t.to_path_buf(),
            _ => staging.join(o.name.trim_end_matches(".tar")),
        };
        tokio::fs::create_dir_all(&target).await.map_err(|e| format!("{}: {e}", target.display()))?;
        let file = staging.join(&o.name);
        tar(&[
            "--extract".as_ref(),
            "--same-permissions".as_ref(),
            "--same-owner".as_ref(),
            "--file".as_ref(),
            file.as_os_str(),
            "-C".as_ref(),
            target.as_os_str(),
        ])
        .await?;
        let _ = tokio::fs::remove_file(&file).await;
    }
    Ok(())
}

/// Deletes an archive's objects (best effort: a leftover object is only storage).
pub async fn delete_remote(st: &Shared, m: &ArchiveManifest) {
    for name in m.objects.iter().map(|o| o.name.as_str()).chain(["manifest.json"]) {
        if let Err(e) = st.archive.store.delete(&ObjectPath::from(format!("{}/{name}", m.prefix))).await {
            warn!(prefix = %m.prefix, object = name, error = %e, "deleting an archive object");
        }
    }
}

/// After a daemon (re)start: an archive pointer on a sandbox that is not
/// archived belongs to an archive that never got recorded (crash): forget it.
/// An archived sandbox whose local files outlived the crash loses them now.
pub async fn reconcile(st: &Shared, rec: &SandboxRecord) {
    let id = &rec.sandbox.id;
    let dir = st.sandbox_dir(id);
    let _ = strata_store::fsutil::remove_dir_all_if_exists(&dir.join(PACK_DIR));
    let _ = strata_store::fsutil::remove_dir_all_if_exists(&dir.join(UNPACK_DIR));
    match (rec.sandbox.state, pointer(st, id)) {
        (SandboxState::Archived, Some(_)) => {
            st.disks.release(&dir);
            for d in ["upper", "work", "standby"] {
                let _ = strata_store::fsutil::remove_dir_all_if_exists(&dir.join(d));
            }
        }
        (SandboxState::Archived, None) | (_, None) => {}
        (_, Some(m)) => {
            delete_remote(st, &m).await;
            let _ = std::fs::remove_file(pointer_path(st, id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn objects_that_do_not_match_the_manifest_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let store = ArchiveStore::local(&d.path().join("store")).unwrap();
        let src = d.path().join("obj");
        std::fs::write(&src, vec![5u8; 3 << 20]).unwrap();
        let key = ObjectPath::from("sandboxes/x/1/upper.tar");
        upload(store.store.as_ref(), &key, &src).await.unwrap();
        let (size, sha256) = sha256_file(&src).await.unwrap();
        let want = ObjectSum { name: "upper.tar".into(), size, sha256 };
        download(store.store.as_ref(), &key, &d.path().join("back"), &want).await.unwrap();
        assert_eq!(std::fs::read(d.path().join("back")).unwrap(), std::fs::read(&src).unwrap());
        // Tampered in the store: refused with the reason.
        std::fs::write(d.path().join("store/sandboxes/x/1/upper.tar"), vec![6u8; 3 << 20]).unwrap();
        let err = download(store.store.as_ref(), &key, &d.path().join("back2"), &want).await.unwrap_err();
        assert!(err.contains("does not match its manifest"), "{err}");
        assert!(ArchiveStore::from_url("ftp://x").is_err());
    }
}
