//! Image import and pull (with progress events), and the layer sweep; the
//! listing and removal routes are the server's.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use strata_api::{ErrorCode, Image, ImportEvent, ImportImageRequest, ImportReport, LayerInfo, PullImageRequest};
use strata_core::ids;
use tracing::info;

use crate::error::{EngineError, EngineResult};
use crate::record::now;
use crate::state::Shared;

impl From<strata_image::ImageError> for EngineError {
    fn from(e: strata_image::ImageError) -> Self {
        if e.is_invalid_input() {
            EngineError::new(ErrorCode::InvalidArchive, crate::error::chain(&e))
        } else {
            EngineError::internal("image import", &e)
        }
    }
}

impl From<strata_image::registry::PullError> for EngineError {
    fn from(e: strata_image::registry::PullError) -> Self {
        use strata_image::registry::PullError as P;
        let msg = crate::error::chain(&e);
        match e {
            P::BadReference { .. } => EngineError::bad_request(msg),
            P::NotFound { .. } => EngineError::new(ErrorCode::ImageNotFound, msg),
            // Credentials are not supported: the host cannot do this pull.
            P::AuthRequired { .. } => EngineError::new(ErrorCode::Unsupported, msg),
            P::Unreachable { timed_out: true, .. } => EngineError::new(ErrorCode::Timeout, msg),
            P::Unreachable { .. } | P::Registry { .. } => EngineError::new(ErrorCode::RegistryError, msg),
            P::Image(e) => e.into(),
        }
    }
}

/// Content id of an image: sha256 over its layer digests and config.
fn image_id(layers: &[LayerInfo], config: &strata_api::ImageConfig) -> String {
    let mut h = Sha256::new();
    for l in layers {
        h.update(l.digest.as_bytes());
        h.update(b"\n");
    }
    h.update(serde_json::to_vec(config).expect("config serializes"));
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// Progress events go to `progress` at most every 100 ms (phase changes always).
struct Reporter {
    tx: Option<tokio::sync::mpsc::Sender<ImportEvent>>,
    last: Instant,
    phase: String,
}

impl Reporter {
    fn new(tx: Option<tokio::sync::mpsc::Sender<ImportEvent>>) -> Self {
        Reporter { tx, last: Instant::now() - Duration::from_secs(1), phase: String::from("reading source") }
    }

    /// Reports from a blocking thread.
    fn blocking(&mut self, phase: Option<String>, done: u64, total: Option<u64>) {
        if let Some(ev) = self.event(phase, done, total) {
            let _ = self.tx.as_ref().expect("event implies a sender").blocking_send(ev);
        }
    }

    /// Reports from async code (an event is dropped when the client lags).
    fn nonblocking(&mut self, phase: Option<String>, done: u64, total: Option<u64>) {
        if let Some(ev) = self.event(phase, done, total) {
            let _ = self.tx.as_ref().expect("event implies a sender").try_send(ev);
        }
    }

    fn event(&mut self, phase: Option<String>, done: u64, total: Option<u64>) -> Option<ImportEvent> {
        self.tx.as_ref()?;
        let changed = phase.as_ref().is_some_and(|p| *p != self.phase);
        if let Some(p) = phase {
            self.phase = p;
        }
        if !changed && self.last.elapsed() < Duration::from_millis(100) {
            return None;
        }
        self.last = Instant::now();
        Some(ImportEvent::Progress { phase: self.phase.clone(), done, total })
    }
}

/// What [`register`] imports and under which name.
struct Registration {
    src: PathBuf,
    name: String,
    source_kind: Option<&'static str>,
    source: String,
    replace: bool,
    opts: strata_image::ImportOptions,
    /// Prefix of the per-layer progress phase (`layer`, `unpack layer`).
    phase: &'static str,
    warnings: Vec<String>,
    started: Instant,
}

/// Imports `r.src` into the layer store and registers the image. The caller
/// holds the image lock and has checked the name.
async fn register(st: &Shared, r: Registration, progress: Reporter) -> EngineResult<ImportReport> {
    let layers = st.layers.clone();
    let (src, opts, prefix) = (r.src.clone(), r.opts.clone(), r.phase);
    let imported = tokio::task::spawn_blocking(move || {
        let mut progress = progress;
        let mut cb = |p: strata_image::Progress<'_>| match p {
            strata_image::Progress::Layer { index, count, digest } => {
                progress.blocking(Some(format!("{prefix} {}/{count} {digest}", index + 1)), 0, None)
            }
            strata_image::Progress::Bytes { done, total } => progress.blocking(None, done, total),
        };
        let imported = strata_image::import(&src, &layers, &opts, &mut cb)?;
        // What the files say the image is: read once, here, while its layers are warm in the page cache.
        let dirs: Vec<PathBuf> = imported.layers.iter().rev().filter_map(|l| layers.fs_dir(&l.key).ok()).collect();
        let platform = strata_image::platform::detect(&dirs)?;
        Ok::<_, strata_image::ImageError>((imported, platform))
    })
    .await
    .map_err(|e| EngineError::internal("import task", &e))??;
    let (imported, platform) = imported;
    let layer_infos: Vec<LayerInfo> =
        imported.layers.iter().map(|l| LayerInfo { digest: l.key.clone(), size: l.size }).collect();
    let image = Image {
        id: image_id(&layer_infos, &imported.config),
        name: r.name.clone(),
        source_kind: r.source_kind.unwrap_or(imported.kind.as_str()).to_string(),
        source: r.source,
        size: layer_infos.iter().map(|l| l.size).sum(),
        layers: layer_infos,
        config: imported.config.clone(),
        created_at: now(),
        version: 0,
        previous: None,
        newest: true,
        platform: Some(platform),
    };
    // A new version of a name keeps the older ones (and their layers) for what was made from them.
    let image = st.db.put_image(&image, r.replace)?;
    // A pool of this name moves onto the new version now.
    st.pools.wake.notify_one();
    let layers_new = imported.layers.iter().filter(|l| l.new).count();
    info!(image = %image.name, id = %image.id, version = image.version, previous = ?image.previous, kind = %image.source_kind, layers_new, "imported image");
    let mut warnings = r.warnings;
    warnings.extend(imported.warnings);
    Ok(ImportReport {
        layers_new,
        layers_reused: imported.layers.len() - layers_new,
        bytes_stored: imported.bytes_stored,
        warnings,
        duration_ms: r.started.elapsed().as_millis() as u64,
        image,
    })
}

/// Imports an image; `progress` receives events as it goes.
pub async fn import(
    st: &Shared,
    req: ImportImageRequest,
    progress: Option<tokio::sync::mpsc::Sender<ImportEvent>>,
) -> EngineResult<ImportReport> {
    ids::validate_new_name(&req.name, true)?;
    let src = PathBuf::from(&req.source);
    if !src.is_absolute() {
        return Err(EngineError::bad_request(format!(
            "source {:?} must be an absolute path on the daemon's host",
            req.source
        )));
    }
    if !src.exists() {
        return Err(EngineError::bad_request(format!("source {:?} does not exist", req.source)));
    }
    let _g = st.image_lock.lock().await;
    if !req.replace && st.db.get_image(&req.name)?.is_some_and(|i| i.name == req.name) {
        return Err(EngineError::new(
            ErrorCode::NameConflict,
            format!(
                "an image named {:?} exists (use replace to import a new version of it; the old one is kept)",
                req.name
            ),
        ));
    }
    let r = Registration {
        src,
        name: req.name,
        source_kind: None,
        source: req.source,
        replace: req.replace,
        opts: strata_image::ImportOptions { trusted: req.trusted, ..Default::default() },
        phase: "layer",
        warnings: Vec::new(),
        started: Instant::now(),
    };
    register(st, r, Reporter::new(progress)).await
}

/// Whether a pull may register `name`: `Ok(true)` for a new version of an
/// image pulled from a registry before (a re-pull), `Ok(false)` when the name
/// is free, 409 when a locally imported image has it.
fn pull_replaces(st: &Shared, name: &str) -> EngineResult<bool> {
    match st.db.get_image(name)?.filter(|i| i.name == name) {
        None => Ok(false),
        Some(i) if i.source_kind == "registry" => Ok(true),
        Some(i) => Err(EngineError::new(
            ErrorCode::NameConflict,
            format!(
                "an image named {name:?} exists (imported from {}: {}); remove it or pull under another name",
                i.source_kind, i.source
            ),
        )),
    }
}

/// Pulls an image from a registry; `progress` receives events as it goes.
///
/// The download happens outside the image lock (into the layer store's
/// staging area); the import of the downloaded OCI layout, with every check
/// of a local import, and the registration happen under it. Pulling again
/// under the same name registers a new version when the content changed (the
/// older one stays for what was made from it; layers already stored are reused).
pub async fn pull(
    st: &Shared,
    req: PullImageRequest,
    progress: Option<tokio::sync::mpsc::Sender<ImportEvent>>,
) -> EngineResult<ImportReport> {
    let started = Instant::now();
    let reference = strata_image::registry::parse_reference(&req.reference)?;
    let name = req.name.clone().unwrap_or_else(|| req.reference.clone());
    if let Err(e) = ids::validate_new_name(&name, true) {
        return Err(match req.name {
            Some(_) => e.into(),
            None => EngineError::bad_request(format!("{e}: the reference is not a valid image name, pass a name")),
        });
    }
    pull_replaces(st, &name)?;
    let mut reporter = Reporter::new(progress);
    reporter.nonblocking(Some(format!("resolving {}", reference.whole())), 0, None);
    let opts = strata_image::registry::PullOptions { insecure: req.insecure, ..Default::default() };
    let mut cb = |p: strata_image::registry::DownloadProgress<'_>| {
        reporter.nonblocking(
            Some(format!("download layer {}/{} {}", p.index + 1, p.count, p.digest)),
            p.done,
            Some(p.total),
        )
    };
    let fetched = strata_image::registry::fetch(&req.reference, &st.layers, &opts, &mut cb).await?;
    let _g = st.image_lock.lock().await;
    let replace = pull_replaces(st, &name)?;
    let r = Registration {
        src: fetched.layout().to_path_buf(),
        name,
        source_kind: Some("registry"),
        source: fetched.reference.clone(),
        replace,
        opts: strata_image::ImportOptions::default(),
        phase: "unpack layer",
        warnings: fetched.warnings.clone(),
        started,
    };
    let report = register(st, r, reporter).await;
    drop(fetched);
    report
}

/// Removes layers that no image, sandbox or checkpoint references.
pub fn gc_layers(st: &Shared) -> EngineResult<usize> {
    Ok(gc_layers_counted(st)?.0)
}

/// [`gc_layers`], also returning the bytes the removed layers held.
pub fn gc_layers_counted(st: &Shared) -> EngineResult<(usize, u64)> {
    let mut used = std::collections::HashSet::new();
    for img in st.db.list_image_versions(None)? {
        used.extend(img.layers.into_iter().map(|l| l.digest));
    }
    for sb in st.db.list_sandboxes()? {
        used.extend(sb.layers);
    }
    for c in st.db.list_checkpoints(None)? {
        used.extend(c.layers);
    }
    let (mut removed, mut bytes) = (0, 0);
    for d in st.layers.list().map_err(|e| EngineError::internal("layer store", &e))? {
        if !used.contains(&d) {
            bytes += st.layers.meta(&d).map(|m| m.size).unwrap_or(0);
            st.layers.remove(&d).map_err(|e| EngineError::internal("layer store", &e))?;
            removed += 1;
        }
    }
    // Flattened chains no sandbox mounts any more.
    let squashed_root = st.layers.root().join("squashed");
    if let Ok(entries) = std::fs::read_dir(&squashed_root) {
        let mut needed = std::collections::HashSet::new();
        for sb in st.db.list_sandboxes()? {
            if sb.layers.len() > crate::lifecycle::SQUASH_AT {
                let dirs: Vec<_> = sb.layers.iter().filter_map(|d| st.layers.fs_dir(d).ok()).collect();
                needed.insert(crate::lifecycle::squashed_dir(&st.layers, &dirs));
            }
        }
        for e in entries.flatten() {
            if !needed.contains(&e.path()) {
                let _ = strata_store::fsutil::remove_dir_all_if_exists(&e.path());
            }
        }
    }
    Ok((removed, bytes))
}

/// Every image (images are shared: every caller sees them all).
pub fn list(st: &Shared) -> EngineResult<Vec<Image>> {
    Ok(st.db.list_images()?)
}

/// The image `name` names (404 `image_not_found` otherwise).
pub fn get(st: &Shared, name: &str) -> EngineResult<Image> {
    st.db.get_image(name)?.ok_or_else(|| EngineError::new(ErrorCode::ImageNotFound, format!("no image named {name:?}")))
}

/// Every version of an image name, newest first (404 when there is none).
pub fn versions(st: &Shared, name: &str) -> EngineResult<Vec<Image>> {
    let img = get(st, name)?;
    Ok(st.db.list_image_versions(Some(&img.name))?)
}

/// What an image's files say it is, read now for an image imported before
/// strata read it at import (and recorded).
pub fn platform_of(st: &Shared, img: &Image) -> EngineResult<strata_api::Platform> {
    if let Some(p) = &img.platform {
        return Ok(p.clone());
    }
    let chain: Vec<String> = img.layers.iter().map(|l| l.digest.clone()).collect();
    let p = strata_image::platform::detect(&st.layer_dirs(&chain)?)?;
    st.db.set_image_platform(&img.id, &p)?;
    Ok(p)
}

/// Removes an image and the layers nothing else uses: by name, every version
/// of it; by id, that one version (the one before it becomes the name's
/// newest). 409 (`in_use`, naming them) while sandboxes of any tenant were made from it.
pub async fn remove(st: &Shared, name: &str) -> EngineResult<()> {
    let _g = st.image_lock.lock().await;
    let img = get(st, name)?;
    let whole_name = name == img.name;
    // Warm-pool sandboxes of it are the daemon's own: they go, and the pool follows what is left.
    crate::pool::drain_users(st, |r| match whole_name {
        true => r.sandbox.source == img.name || r.sandbox.image_id == img.id,
        false => r.sandbox.image_id == img.id,
    })
    .await;
    let users: Vec<String> = st
        .db
        .list_sandboxes()?
        .into_iter()
        .filter(|s| match whole_name {
            true => s.sandbox.source == img.name,
            false => s.sandbox.image_id == img.id,
        })
        .map(|s| format!("sandbox {}", s.sandbox.id))
        .collect();
    let what = match whole_name {
        true => format!("image {:?}", img.name),
        false => format!("image {:?} version {} ({})", img.name, img.version, img.id),
    };
    if !users.is_empty() {
        let mut e = EngineError::new(ErrorCode::InUse, format!("{what} is used by {} sandbox(es)", users.len()));
        e.body.dependents = users;
        return Err(e);
    }
    match whole_name {
        true => st.db.delete_image(&img.name)?,
        false => st.db.delete_image_version(&img.name, img.version)?,
    };
    let removed = gc_layers(st)?;
    info!(image = %img.name, whole_name, version = img.version, layers_removed = removed, "removed image");
    Ok(())
}
