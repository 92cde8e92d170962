//! Patching: what sits on an image version that is no longer its name's
//! newest ([`outdated`]), and moving a stopped or standby sandbox onto a newer
//! base while keeping its writable layer ([`rebase`]).
//!
//! A sandbox's chain is its image's layers, then the layers of the
//! checkpoint it was made from (if any), then its writable layer. A rebase
//! swaps the bottom part for the new image's layers; the rest is stacked on
//! top unchanged, so the sandbox's changes apply to the new base the way
//! overlayfs applies any layer. Paths the sandbox changed *and* the two bases
//! differ in are conflicts: refused unless `prefer` says which side wins.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use strata_api::{ErrorCode, Image, OutdatedEntry, Prefer, RebaseConflict, RebaseReport, RebaseRequest, SandboxState};
use strata_image::changes::{self, ChangeKind, EntryKind, PathChange};
use strata_image::rebase::below;
use strata_store::db::SandboxRecord;
use tracing::info;

use crate::clock::parse_time;
use crate::error::{EngineError, EngineResult};
use crate::record::lock_and_load;
use crate::state::Shared;

/// What a rebase does not keep, said in every report.
pub const REBASE_NOTE: &str =
    "a rebase keeps the filesystem (the writable layer and the layers above the image); processes start again on the new base: the sandbox is stopped";

/// The image version `image_id` names whose layers are the bottom of
/// `chain` (the newest such version; `None` when none is registered any more).
pub(crate) fn base_image(st: &Shared, image_id: &str, chain: &[String]) -> EngineResult<Option<Image>> {
    let mut found = st.db.images_with_id(image_id)?;
    found.retain(|i| i.layers.len() <= chain.len() && i.layers.iter().zip(chain).all(|(l, c)| &l.digest == c));
    Ok(found.into_iter().max_by_key(|i| (i.newest, i.version)))
}

/// The version an image id is and its name's newest, when the newest is another.
pub(crate) fn behind(st: &Shared, image_id: &str) -> EngineResult<Option<(Image, Image)>> {
    // An id under several names: the name whose newest it is not is what matters; any works.
    for v in st.db.images_with_id(image_id)? {
        if v.newest {
            return Ok(None);
        }
        if let Some(n) = st.db.get_image(&v.name)?.filter(|n| n.name == v.name) {
            return Ok(Some((v, n)));
        }
    }
    Ok(None)
}

/// Whole days between two image imports.
pub(crate) fn days_between(older: &Image, newer: &Image) -> u64 {
    match (parse_time(&older.created_at), parse_time(&newer.created_at)) {
        (Some(a), Some(b)) => b.duration_since(a).unwrap_or(Duration::ZERO).as_secs() / 86_400,
        _ => 0,
    }
}

/// Sandboxes, checkpoints and templates (the caller's) on an image version
/// that is not its name's newest, with how to move each.
pub fn outdated(st: &Shared) -> EngineResult<Vec<OutdatedEntry>> {
    let mut memo: HashMap<String, Option<(Image, Image)>> = HashMap::new();
    let mut lookup = |id: &str| -> EngineResult<Option<(Image, Image)>> {
        if let Some(v) = memo.get(id) {
            return Ok(v.clone());
        }
        let v = behind(st, id)?;
        memo.insert(id.to_string(), v.clone());
        Ok(v)
    };
    let entry = |kind: &str, id: &str, name: &str, (v, n): (Image, Image), how: String| OutdatedEntry {
        kind: kind.into(),
        id: id.into(),
        name: name.into(),
        image: v.name.clone(),
        version: v.version,
        image_id: v.id.clone(),
        newest_version: n.version,
        newest_id: n.id.clone(),
        days_behind: days_between(&v, &n),
        how,
    };
    let mut out = Vec::new();
    for rec in st.db.list_sandboxes()? {
        let s = &rec.sandbox;
        if !crate::caller::visible(&s.tenant) || s.state == SandboxState::Destroyed {
            continue;
        }
        if let Some(pair) = lookup(&s.image_id)? {
            let how = format!("strata rebase {} --onto {}", s.name, pair.1.name);
            out.push(entry("sandbox", &s.id, &s.name, pair, how));
        }
    }
    let templates = st.db.list_templates()?;
    for c in st.db.list_checkpoints(None)? {
        if !crate::caller::visible(&c.tenant) {
            continue;
        }
        if let Some(pair) = lookup(&c.image_id)? {
            let how = "a checkpoint is immutable: create a sandbox from it, rebase that, checkpoint it".to_string();
            out.push(entry("checkpoint", &c.id, &c.name, pair.clone(), how));
            for (t, _, _) in templates.iter().filter(|(_, ck, _)| *ck == c.id) {
                let how = template_how(st, t, &pair.1.name)?;
                out.push(entry("template", t, t, pair.clone(), how));
            }
        }
    }
    Ok(out)
}

/// Every path in the given layer directories (the paths two stacks can
/// differ in), and which of them are opaque directories.
fn paths_of(dirs: &[PathBuf]) -> EngineResult<(BTreeSet<String>, Vec<String>)> {
    let exclude = &strata_runtime::spec::IDENTITY_PATHS;
    let (mut touched, mut opaque) = (BTreeSet::new(), Vec::new());
    for d in dirs {
        for (path, meta) in changes::scan(d, exclude)?.entries {
            if meta.opaque {
                opaque.push(path.clone());
            }
            touched.insert(path);
        }
    }
    Ok((touched, opaque))
}

/// How to move template `name` onto the newest version of image `image`:
/// a rebuild for a built template, a rebase and promotion otherwise.
pub(crate) fn template_how(st: &Shared, name: &str, image: &str) -> EngineResult<String> {
    Ok(match st.db.template_build(name)? {
        Some(_) => format!("strata template rebuild {name} --base {image}"),
        None => format!("strata create --name {name}-next {name}; strata stop {name}-next; strata rebase {name}-next --onto {image}; strata template create {name} --from {name}-next --replace"),
    })
}

fn kind_word(c: ChangeKind) -> String {
    match c {
        ChangeKind::Added => "added",
        ChangeKind::Modified => "modified",
        ChangeKind::Deleted => "deleted",
    }
    .to_string()
}

/// The version label of an image: `name@version (id prefix)`.
fn label(i: &Image) -> String {
    format!("{}@{} ({})", i.name, i.version, &i.id[..i.id.len().min(19)])
}

/// Refuses a base of another operating system, machine or distribution family (400).
fn check_platforms(st: &Shared, from: &Image, onto: &Image) -> EngineResult<()> {
    let (a, b) = (crate::images::platform_of(st, from)?, crate::images::platform_of(st, onto)?);
    if (a.os.as_str(), a.architecture.as_str()) != (b.os.as_str(), b.architecture.as_str()) {
        return Err(EngineError::bad_request(format!(
            "image {} is for {}/{}, the sandbox's base {} is for {}/{}: its binaries would not run there",
            label(onto),
            b.os,
            b.architecture,
            label(from),
            a.os,
            a.architecture
        )));
    }
    if a.family != b.family {
        return Err(EngineError::bad_request(format!(
            "image {} is another OS family ({}) than the sandbox's base {} ({}): what the sandbox installed is for {}",
            label(onto),
            b.family,
            label(from),
            a.family,
            a.family
        )));
    }
    Ok(())
}

/// What the two sides changed: the base (old image to new) and, of what the
/// sandbox changed against the old image (its layers above the image and its
/// writable layer), the part that can meet the base's changes.
struct Sides {
    base: Vec<PathChange>,
    sandbox: Vec<PathChange>,
    /// Entries the sandbox's own layers hold.
    sandbox_paths: u64,
}

/// Compares the sandbox's side (its writable layer at `upper`, and its own
/// layers) with the base's changes from `from` to `onto`; the new base's
/// layer directories, top first.
fn compare(
    st: &Shared,
    rec: &SandboxRecord,
    upper: PathBuf,
    from: &Image,
    onto: &Image,
) -> EngineResult<(Sides, Vec<PathBuf>)> {
    let old: Vec<String> = from.layers.iter().map(|l| l.digest.clone()).collect();
    let new: Vec<String> = onto.layers.iter().map(|l| l.digest.clone()).collect();
    let shared = old.iter().zip(&new).take_while(|(a, b)| a == b).count();
    let (old_dirs, new_dirs) = (st.layer_dirs(&old)?, st.layer_dirs(&new)?);
    let mut base_touched_dirs = st.layer_dirs(&old[shared..])?;
    base_touched_dirs.extend(st.layer_dirs(&new[shared..])?);
    let strip = |v: Vec<changes::StackChange>| -> Vec<PathChange> { v.into_iter().map(|(c, _)| c).collect() };
    let base = strip(changes::diff_stacks(&new_dirs, &old_dirs, &paths_of(&base_touched_dirs)?.0)?);
    let mut mine = vec![upper];
    mine.extend(st.layer_dirs(&rec.layers[old.len()..])?);
    let (mine_paths, mine_opaque) = paths_of(&mine)?;
    // Only what can meet a base change needs the sandbox's side of the diff (a
    // setup layer holds tens of thousands of paths, a patch touches a few): the
    // paths the base changed, those below a directory the base deleted, the
    // sandbox's directories above a base change (deleted or made opaque there),
    // and base changes below a directory the sandbox made opaque.
    let base_paths: BTreeSet<&str> = base.iter().map(|c| c.path.trim_start_matches('/')).collect();
    let base_deleted_dirs: Vec<&str> = base
        .iter()
        .filter(|c| c.change == ChangeKind::Deleted && c.kind == changes::EntryKind::Dir)
        .map(|c| c.path.trim_start_matches('/'))
        .collect();
    let above_a_base_change = |p: &str| {
        let prefix = format!("{p}/");
        base_paths.range(prefix.as_str()..).next().is_some_and(|b| b.starts_with(&prefix))
    };
    let mut relevant: BTreeSet<String> = mine_paths
        .iter()
        .filter(|p| {
            base_paths.contains(p.as_str()) || base_deleted_dirs.iter().any(|d| below(p, d)) || above_a_base_change(p)
        })
        .cloned()
        .collect();
    relevant.extend(base_paths.iter().filter(|b| mine_opaque.iter().any(|o| below(b, o))).map(|b| b.to_string()));
    let mut now = mine.clone();
    now.extend(old_dirs.iter().cloned());
    let sandbox = strip(changes::diff_stacks(&now, &old_dirs, &relevant)?);
    Ok((Sides { base, sandbox, sandbox_paths: mine_paths.len() as u64 }, new_dirs))
}

/// The conflicts as the API shows them.
fn wire_conflicts(conflicts: &[strata_image::rebase::Conflict]) -> Vec<RebaseConflict> {
    conflicts
        .iter()
        .map(|c| RebaseConflict { path: c.path.clone(), sandbox: kind_word(c.sandbox), base: kind_word(c.base) })
        .collect()
}

/// Why a rebase with these conflicts cannot go ahead (a 409 listing them),
/// or `None`: conflicts need `prefer`, and `prefer base` cannot write a
/// directory of the new base over a sandbox's entry.
fn refusal(
    rec: &SandboxRecord,
    from: &Image,
    onto: &Image,
    conflicts: &[strata_image::rebase::Conflict],
    prefer: Option<Prefer>,
) -> Option<EngineError> {
    if !conflicts.is_empty() && prefer.is_none() {
        let shown: Vec<&str> = conflicts.iter().take(5).map(|c| c.path.as_str()).collect();
        return Some(EngineError::new(
            ErrorCode::RebaseConflicts,
            format!(
                "{} path(s) changed both in sandbox {} and between {} and {} ({}{}): pass prefer sandbox or base",
                conflicts.len(),
                rec.sandbox.id,
                label(from),
                label(onto),
                shown.join(", "),
                if conflicts.len() > shown.len() { ", ..." } else { "" }
            ),
        ));
    }
    if prefer == Some(Prefer::Base) {
        let dirs: Vec<&str> =
            conflicts.iter().filter(|c| c.base_kind == Some(EntryKind::Dir)).map(|c| c.path.as_str()).collect();
        if !dirs.is_empty() {
            return Some(EngineError::new(
                ErrorCode::RebaseConflicts,
                format!(
                    "the new base has a directory where sandbox {} has its own entry ({}): prefer base cannot merge a directory; move the sandbox's entry away or prefer sandbox",
                    rec.sandbox.id,
                    dirs.join(", ")
                ),
            ));
        }
    }
    None
}

/// A stopped microVM's side of a rebase, in one guest booted on its disk
/// (the host never mounts it): the guest writes out its whole writable layer,
/// the comparison runs on that copy, and with `prefer base` the guest applies
/// the new base's versions of the conflicting paths through its root
/// ([`strata_init::guestfs::FsOp::ApplyLayer`]) and writes the layer out
/// again for the scan. Nothing changes when the rebase is refused.
async fn rebase_in_guest(
    st: &Shared,
    rec: &SandboxRecord,
    from: &Image,
    onto: &Image,
    prefer: Option<Prefer>,
) -> EngineResult<(Sides, Vec<strata_image::rebase::Conflict>, crate::guest_layer::GuestView)> {
    use crate::guest_layer::{in_booted_guest, read_running, Pick};
    let spec = crate::guest_layer::reader_spec(st, rec).await?;
    let (st2, rec2, from2, onto2) = (st.clone(), rec.clone(), from.clone(), onto.clone());
    let (rt, id) = (st.runtime_of(&rec.sandbox), rec.sandbox.id.clone());
    let limit = crate::guest_layer::tar_limit(st, &id);
    tokio::task::spawn_blocking(move || {
        in_booted_guest(&*rt, &id, &spec, |rt| {
            let view = read_running(rt, &id, &Pick::Everything, &st2.layers, limit, &mut || {})?;
            let upper = view
                .dir()
                .ok_or_else(|| EngineError::new(ErrorCode::Internal, "the guest wrote out no copy of its layer"))?;
            let (sides, new_dirs) = compare(&st2, &rec2, upper, &from2, &onto2)?;
            let conflicts = strata_image::rebase::conflicts(&sides.sandbox, &sides.base);
            let apply = prefer == Some(Prefer::Base)
                && !conflicts.is_empty()
                && refusal(&rec2, &from2, &onto2, &conflicts, prefer).is_none();
            if !apply {
                return Ok((sides, conflicts, view));
            }
            drop(view);
            let paths: Vec<String> = conflicts.iter().map(|c| c.path.clone()).collect();
            let (mut reader, writer) = std::io::pipe().map_err(|e| EngineError::internal("a pipe", &e))?;
            let (written, applied) = std::thread::scope(|s| {
                let tar = s.spawn(|| strata_image::rebase::base_versions_tar(&new_dirs, &paths, writer));
                let op = strata_init::guestfs::FsOp::ApplyLayer;
                let applied = rt.guest_fs(&id, &op, Some(&mut reader), &mut std::io::sink(), 0);
                // A refusal leaves the rest unread: the writer ends on the closed pipe.
                drop(reader);
                (tar.join(), applied)
            });
            let taken = |why: String| {
                EngineError::new(
                    ErrorCode::RebaseConflicts,
                    format!("cannot give the conflicting paths the new base's versions: {why}"),
                )
            };
            applied.map_err(|f| taken(f.message))?;
            match written {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(taken(crate::error::chain(&e))),
                Err(_) => {
                    return Err(EngineError::new(ErrorCode::Internal, "the new base's versions' writer panicked"))
                }
            }
            let after = read_running(rt, &id, &Pick::Everything, &st2.layers, limit, &mut || {})?;
            Ok((sides, conflicts, after))
        })
    })
    .await
    .map_err(|e| EngineError::internal("rebase task", &e))?
}

/// Moves a stopped or standby sandbox onto `req.onto` (see the module docs).
pub async fn rebase(st: &Shared, id: &str, req: RebaseRequest) -> EngineResult<RebaseReport> {
    let started = Instant::now();
    let (_g, rec) = lock_and_load(st, id).await?;
    let state = rec.sandbox.state;
    if !matches!(state, SandboxState::Stopped | SandboxState::Standby) {
        return Err(EngineError::invalid_state(
            state,
            format!(
                "sandbox {} is {state}: a rebase moves a stopped or standby sandbox (its processes start again on the new base); stop it first",
                rec.sandbox.id
            ),
        ));
    }
    let in_guest = crate::guest_layer::in_guest(st, &rec);
    if in_guest && state == SandboxState::Standby {
        return Err(EngineError::invalid_state(
            state,
            format!(
                "microVM {} is in standby: its writable layer is read by a guest booted on its disk, which would change the disk its saved VM needs; stop it first (a rebase starts its processes again anyway)",
                rec.sandbox.id
            ),
        ));
    }
    let onto = crate::images::get(st, &req.onto)?;
    let from = base_image(st, &rec.sandbox.image_id, &rec.layers)?.ok_or_else(|| {
        EngineError::new(
            ErrorCode::InvalidState,
            format!(
                "the image version sandbox {} was made from ({}) is no longer registered: the changes between it and {} cannot be known",
                rec.sandbox.id,
                rec.sandbox.image_id,
                label(&onto)
            ),
        )
    })?;
    if from.id == onto.id {
        return Err(EngineError::bad_request(format!("sandbox {} is already on {}", rec.sandbox.id, label(&onto))));
    }
    check_platforms(st, &from, &onto)?;
    let compare_started = Instant::now();
    let mut guest_view = None;
    let (sides, conflicts) = if in_guest {
        let (sides, conflicts, view) = rebase_in_guest(st, &rec, &from, &onto, req.prefer).await?;
        guest_view = Some(view);
        (sides, conflicts)
    } else {
        let (st2, rec2, from2, onto2) = (st.clone(), rec.clone(), from.clone(), onto.clone());
        let (sides, new_dirs) = tokio::task::spawn_blocking(move || {
            let upper = st2.upper_dir(&rec2.sandbox.id);
            compare(&st2, &rec2, upper, &from2, &onto2)
        })
        .await
        .map_err(|e| EngineError::internal("rebase task", &e))??;
        let conflicts = strata_image::rebase::conflicts(&sides.sandbox, &sides.base);
        if refusal(&rec, &from, &onto, &conflicts, req.prefer).is_none() {
            // Standby: the process image is of processes on the old base; they start again.
            if state == SandboxState::Standby {
                crate::lifecycle::stop::stop_locked(st, &rec, "rebase", Duration::ZERO).await?;
            }
            if req.prefer == Some(Prefer::Base) && !conflicts.is_empty() {
                let upper = st.upper_dir(&rec.sandbox.id);
                let paths: Vec<String> = conflicts.iter().map(|c| c.path.clone()).collect();
                tokio::task::spawn_blocking(move || -> EngineResult<()> {
                    for p in &paths {
                        strata_image::rebase::take_base_version(&upper, &new_dirs, p).map_err(|e| {
                            EngineError::new(
                                ErrorCode::RebaseConflicts,
                                format!("cannot give {p} the new base's version: {}", crate::error::chain(&e)),
                            )
                        })?;
                    }
                    Ok(())
                })
                .await
                .map_err(|e| EngineError::internal("rebase task", &e))??;
            }
        }
        (sides, conflicts)
    };
    let compare_ms = compare_started.elapsed().as_millis() as u64;
    let wire = wire_conflicts(&conflicts);
    if let Some(mut e) = refusal(&rec, &from, &onto, &conflicts, req.prefer) {
        e.body.conflicts = wire;
        return Err(e);
    }
    let mut chain: Vec<String> = onto.layers.iter().map(|l| l.digest.clone()).collect();
    chain.extend(rec.layers[from.layers.len()..].iter().cloned());
    // The image's process defaults follow the image, unless the sandbox's were its own (a build's ENV, WORKDIR).
    let config = if rec.image_config == from.config { onto.config.clone() } else { rec.image_config.clone() };
    {
        // Layer GC must not run between reading the chain and recording it.
        let _gc = st.image_lock.lock().await;
        st.db.set_base(&rec.sandbox.id, &chain, &onto.id, &config)?;
    }
    let detail = format!(
        "from {} onto {}: {} base change(s), {} path(s) in the sandbox's layers, {} conflict(s){}",
        label(&from),
        label(&onto),
        sides.base.len(),
        sides.sandbox_paths,
        conflicts.len(),
        match (req.prefer, conflicts.is_empty()) {
            (Some(Prefer::Sandbox), false) => ", the sandbox's versions kept",
            (Some(Prefer::Base), false) => ", the base's versions taken",
            _ => "",
        }
    );
    if let Ok(ev) =
        st.db.record_event(&rec.sandbox.id, SandboxState::Stopped, "rebase", Some(&detail), &crate::clock::now())
    {
        st.notify_events(ev.seq);
    }
    let scan_started = Instant::now();
    let scan = match guest_view {
        // The layer as the guest wrote it out under this rebase's lock (a new read would wait for the lock).
        Some(view) => crate::scan::scan_guest_view(st, &crate::record::load(st, &rec.sandbox.id)?, view).await?,
        None => crate::scan::scan(st, &rec.sandbox.id).await?,
    };
    let scan_ms = scan_started.elapsed().as_millis() as u64;
    info!(sandbox = %rec.sandbox.id, from = %from.id, onto = %onto.id, conflicts = conflicts.len(), "rebased");
    st.metrics.observe("rebase", started.elapsed());
    Ok(RebaseReport {
        sandbox_id: rec.sandbox.id.clone(),
        from_image: label(&from),
        onto_image: label(&onto),
        state_before: state,
        base_changes: sides.base.len() as u64,
        sandbox_paths: sides.sandbox_paths,
        conflicts: wire,
        prefer: req.prefer,
        scan,
        note: REBASE_NOTE.into(),
        duration_ms: started.elapsed().as_millis() as u64,
        compare_ms,
        scan_ms,
    })
}
