//! `strata scan`: the state-hygiene scan of a sandbox or checkpoint, the
//! template gate built on it, and flush rules.
//!
//! A scan compares against the parent layers: for a sandbox, everything its
//! chain and writable layer add on top of its image; for a checkpoint, its
//! layers above its image. The changed paths come from
//! [`changes::diff_stacks`] (overlay semantics, whiteouts, opaque
//! directories); each path's mode and, for regular files of at most
//! [`hygiene::MAX_READ`] bytes, its contents are read from the layer directory
//! that provides it on the host with `O_NOFOLLOW` walks, so a symlink planted in
//! a layer is never followed. The rules are in [`crate::hygiene`].
//!
//! Credential patterns in files that an installed Python package shipped —
//! verified byte for byte against the SHA-256 in its `.dist-info/RECORD`, which
//! must itself be among the changes — are reported apart (`packaged`) and do not
//! block a template: a venv with a few hundred packages carries test keys and
//! documentation examples that are not state left behind by the workload.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use strata_api::{ErrorCode, Finding, FindingsAcceptance, SandboxState, ScanReport};
use strata_image::changes;
use strata_store::db::SandboxRecord;

use crate::error::{EngineError, EngineResult};
use crate::hygiene::{self, Change, Entry};
use crate::sandboxfs::FsError;
use crate::state::Shared;
use sha2::{Digest, Sha256};

/// Largest `RECORD` read (botocore's is about 300 KiB).
const MAX_RECORD: u64 = 8 << 20;
/// Most bytes of `RECORD`s one scan reads in all: the sandbox decides how many
/// there are. Past it, further packages' files are not excused (their
/// findings stay findings), so the bound can only make a scan stricter.
const MAX_RECORDS_TOTAL: u64 = 64 << 20;

/// What is scanned: the view now (top first), the image's layers (top first),
/// and the layers whose paths are looked at.
pub(crate) struct Target {
    report: ScanReport,
    now: Vec<PathBuf>,
    image: Vec<PathBuf>,
    touched: Vec<PathBuf>,
    /// A microVM's layer as its guest told it (staged at `touched[0]`).
    guest: Option<crate::guest_layer::GuestView>,
}

/// How many layers at the bottom of `chain` are the image's.
fn image_depth(st: &Shared, image_id: &str, chain: &[String], from_checkpoint: bool) -> EngineResult<usize> {
    if let Some(img) = st.db.get_image(image_id)? {
        let n = img.layers.len();
        if n <= chain.len() && img.layers.iter().zip(chain).all(|(l, c)| &l.digest == c) {
            return Ok(n);
        }
    }
    // The image is gone: a sandbox created from it still has exactly its layers; otherwise scan everything.
    Ok(if from_checkpoint { 0 } else { chain.len() })
}

pub(crate) async fn target(st: &Shared, id: &str) -> EngineResult<Target> {
    let found = crate::tenancy::find_sandbox_or_checkpoint(st, id, crate::tenancy::NamesFirst::Sandbox)?;
    if let Some(crate::tenancy::SandboxOrCheckpoint::Sandbox(rec)) = &found {
        let mut t = sandbox_target(st, rec)?;
        if crate::guest_layer::in_guest(st, rec) {
            let view = crate::guest_layer::read(st, rec, crate::guest_layer::Pick::Everything, false).await?;
            t.take_guest_view(view);
        }
        return Ok(t);
    }
    if let Some(crate::tenancy::SandboxOrCheckpoint::Checkpoint(found)) = found {
        let c = found.0;
        let depth = image_depth(st, &c.image_id, &c.layers, true)?;
        let now = st.layer_dirs(&c.layers)?;
        let image = st.layer_dirs(&c.layers[..depth])?;
        let touched = st.layer_dirs(&c.layers[depth..])?;
        let report = ScanReport {
            kind: "checkpoint".into(),
            id: c.id,
            name: c.name,
            image: c.image,
            changed_paths: 0,
            findings: vec![],
            clean: true,
            packaged: vec![],
        };
        return Ok(Target { report, now, image, touched, guest: None });
    }
    Err(EngineError::new(ErrorCode::SandboxNotFound, format!("no sandbox or checkpoint named {id:?}")))
}

impl Target {
    /// A microVM's whole layer, as its guest wrote it out, stands for the upper directory.
    fn take_guest_view(&mut self, view: crate::guest_layer::GuestView) {
        if let Some(dir) = view.dir() {
            self.now[0] = dir.clone();
            self.touched[0] = dir;
        }
        self.guest = Some(view);
    }
}

/// Scans microVM `rec`, whose whole layer its guest already wrote out as
/// `view` (a rebase read it under the sandbox's operation lock).
pub(crate) async fn scan_guest_view(
    st: &Shared,
    rec: &SandboxRecord,
    view: crate::guest_layer::GuestView,
) -> EngineResult<ScanReport> {
    let mut t = sandbox_target(st, rec)?;
    t.take_guest_view(view);
    tokio::task::spawn_blocking(move || run(t)).await.map_err(|e| EngineError::internal("scan task", &e))?
}

fn sandbox_target(st: &Shared, rec: &SandboxRecord) -> EngineResult<Target> {
    let s = &rec.sandbox;
    if !matches!(
        s.state,
        SandboxState::Running
            | SandboxState::Stopped
            | SandboxState::Paused
            | SandboxState::Standby
            | SandboxState::Error
            | SandboxState::Lost
    ) {
        // Standby keeps the writable layer where it was (its disk stays mounted):
        // it is read as a stopped sandbox's, without resuming the sandbox.
        return Err(EngineError::invalid_state(s.state, "the writable layer is not on local disk"));
    }
    let depth = image_depth(st, &s.image_id, &rec.layers, s.base_checkpoint.is_some())?;
    let upper = st.upper_dir(&s.id);
    let mut now = vec![upper.clone()];
    now.extend(st.layer_dirs(&rec.layers)?);
    let image = st.layer_dirs(&rec.layers[..depth])?;
    let mut touched = vec![upper];
    touched.extend(st.layer_dirs(&rec.layers[depth..])?);
    let image_name = match s.base_checkpoint.as_deref().and_then(|c| st.db.checkpoint_by_id(c).ok().flatten()) {
        Some((c, _)) => c.image,
        None => s.source.clone(),
    };
    let report = ScanReport {
        kind: "sandbox".into(),
        id: s.id.clone(),
        name: s.name.clone(),
        image: image_name,
        changed_paths: 0,
        findings: vec![],
        clean: true,
        packaged: vec![],
    };
    Ok(Target { report, now, image, touched, guest: None })
}

pub(crate) fn run(t: Target) -> EngineResult<ScanReport> {
    run_walked(t).map(|(report, _)| report)
}

/// [`run`], also handing back its walk of a sandbox's writable layer (the
/// first layer it looks at; `None` for a checkpoint, or when the layer is
/// missing), so that a check measures the layer without walking it again.
pub(crate) fn run_walked(t: Target) -> EngineResult<(ScanReport, Option<changes::TreeManifest>)> {
    let exclude = &strata_runtime::spec::IDENTITY_PATHS;
    let mut paths = BTreeSet::new();
    let mut writable = None;
    for (i, l) in t.touched.iter().enumerate() {
        if l.exists() {
            let walked = changes::scan(l, exclude)?;
            if i == 0 && t.report.kind == "sandbox" {
                paths.extend(walked.entries.keys().cloned());
                writable = Some(walked);
            } else {
                paths.extend(walked.entries.into_keys());
            }
        }
    }
    if let Some(g) = &t.guest {
        // The guest's own walk (its inode numbers are what the checkpoints' manifests hold).
        writable = Some(g.now.clone());
    }
    let list = changes::diff_stacks(&t.now, &t.image, &paths)?;
    let mut report = t.report;
    report.changed_paths = list.len() as u64;
    // Files of installed Python packages, by path: (distribution, SHA-256 of the file as shipped).
    let mut shipped: HashMap<String, (String, [u8; 32])> = HashMap::new();
    let mut record_bytes = 0u64;
    let mut now = changes::StackLookup::new(&t.now);
    for (c, provider) in &list {
        if let (Some(i), changes::ChangeKind::Added | changes::ChangeKind::Modified) = (provider, c.change) {
            if hygiene::is_dist_record(&c.path) && record_bytes < MAX_RECORDS_TOTAL {
                if let Some((_, _, Some(text))) =
                    now.read(*i, c.path.trim_start_matches('/'), MAX_RECORD.min(MAX_RECORDS_TOTAL - record_bytes))?
                {
                    record_bytes += text.len() as u64;
                    let dist = hygiene::dist_name(&c.path).to_string();
                    shipped.extend(
                        hygiene::parse_record(&c.path, &text).into_iter().map(|e| (e.path, (dist.clone(), e.sha256))),
                    );
                }
            }
        }
    }
    for (c, provider) in &list {
        strata_image::pace::tick();
        let rel = c.path.trim_start_matches('/');
        let change = match c.change {
            changes::ChangeKind::Added => Change::Added,
            changes::ChangeKind::Modified => Change::Modified,
            changes::ChangeKind::Deleted => Change::Deleted,
        };
        let (mode, content) = match provider {
            Some(i) => match now.read(*i, rel, hygiene::MAX_READ)? {
                Some((mode, _, content)) => (mode, content),
                None => continue, // vanished since the walk (a running sandbox)
            },
            None => (0, None),
        };
        if is_resolv_mount_point(&c.path, change, mode, content.as_deref()) {
            continue;
        }
        let found = hygiene::check(&Entry { path: &c.path, change, mode, content: content.as_deref() });
        // A credential pattern in a file that is byte for byte what its package shipped
        // (a test fixture, an example in the docs) is listed apart, not left-behind state.
        let verified = match (shipped.get(&c.path), content.as_deref()) {
            (Some((dist, want)), Some(bytes)) if Sha256::digest(bytes).as_slice() == want => Some(dist),
            _ => None,
        };
        for mut f in found {
            match verified {
                Some(dist) if hygiene::excusable_in_package(&f.rule) => {
                    f.reason = format!("{}; shipped by the Python package {dist} (matches its RECORD)", f.reason);
                    report.packaged.push(f);
                }
                _ => report.findings.push(f),
            }
        }
    }
    hygiene::sort(&mut report.findings);
    hygiene::sort(&mut report.packaged);
    report.clean = report.findings.is_empty();
    Ok((report, writable))
}

/// Whether a change is the empty `/etc/resolv.conf` strata adds as the mount
/// point of its own resolver file (a sandbox with egress, from an image that
/// has none): its content is never in the layer. Anything written into it
/// while it was not mounted has bytes, and is checked like any other file.
fn is_resolv_mount_point(path: &str, change: Change, mode: u32, content: Option<&[u8]>) -> bool {
    path == "/etc/resolv.conf" && change == Change::Added && mode & 0o170000 == 0o100000 && content == Some(&[][..])
}

/// Scans a sandbox or checkpoint (id or name).
pub async fn scan(st: &Shared, id: &str) -> EngineResult<ScanReport> {
    let t = target(st, id).await?;
    tokio::task::spawn_blocking(move || run(t)).await.map_err(|e| EngineError::internal("scan task", &e))?
}

/// The template gate: `Ok(None)` when `checkpoint` scans clean (ignoring
/// `ignore_rules`), `Ok(Some(acceptance))` when it has findings and
/// `accept` is set, a 409 `scan_findings` listing them otherwise.
pub async fn gate(
    st: &Shared,
    checkpoint: &str,
    accept: bool,
    actor: &str,
    ignore_rules: &[&str],
) -> EngineResult<Option<FindingsAcceptance>> {
    let mut report = scan(st, checkpoint).await?;
    report.findings.retain(|f| !ignore_rules.contains(&f.rule.as_str()));
    if report.findings.is_empty() {
        return Ok(None);
    }
    if !accept {
        let mut e = EngineError::new(
            ErrorCode::ScanFindings,
            format!("checkpoint {} has {} state-hygiene finding(s); clean them up, or pass accept_findings (--accept-findings) to promote it anyway (recorded)", report.id, report.findings.len()),
        );
        e.body.dependents = report.findings.iter().map(|f| format!("{} {} ({})", f.rule, f.path, f.reason)).collect();
        e.body.findings = report.findings;
        return Err(e);
    }
    let mut rules = std::collections::BTreeMap::new();
    for f in &report.findings {
        *rules.entry(f.rule.clone()).or_insert(0) += 1;
    }
    let count = report.findings.len();
    let findings: Vec<Finding> = report.findings.into_iter().take(50).collect();
    Ok(Some(FindingsAcceptance {
        count,
        rules,
        findings,
        accepted_by: actor.to_string(),
        accepted_at: crate::record::now(),
    }))
}

// ---- flush rules ----

/// Checks flush paths: absolute or `~/...`, no `..`, not a root-level system directory.
pub fn validate_flush(paths: &[String]) -> EngineResult<()> {
    for p in paths {
        let rest = p
            .strip_prefix("~/")
            .or_else(|| p.strip_prefix('/'))
            .ok_or_else(|| EngineError::bad_request(format!("flush path {p:?} must be absolute or start with ~/")))?;
        let comps: Vec<&str> = rest.split('/').filter(|c| !c.is_empty()).collect();
        if comps.is_empty() || comps.iter().any(|c| *c == ".." || *c == ".") {
            return Err(EngineError::bad_request(format!(
                "flush path {p:?} must name a directory below / (no . or .. components)"
            )));
        }
        if p.starts_with('/')
            && comps.len() == 1
            && ["bin", "boot", "dev", "etc", "lib", "lib64", "proc", "run", "sbin", "sys", "usr", "var"]
                .contains(&comps[0])
        {
            return Err(EngineError::bad_request(format!("flush path {p:?} would wipe a system directory")));
        }
    }
    Ok(())
}

/// Home directory of `user` (name or uid) from the sandbox's /etc/passwd.
fn home_of(fs: &crate::sandboxfs::SandboxFs, user: Option<&str>) -> String {
    // The sandbox controls the file: a regular file of at most 1 MiB is read
    // (a FIFO or device planted there is refused, never opened for reading).
    let passwd =
        fs.read_small("/etc/passwd", 1 << 20).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    strata_init::user::flush_home(&passwd, user)
}

/// Wipes the contents of one flush path (the directory itself is kept). A
/// symlink at the path is not followed (and left alone); entries below it are
/// removed without following symlinks. Returns a line for the event.
fn wipe(fs: &crate::sandboxfs::SandboxFs, path: &str) -> Result<String, FsError> {
    let st = match fs.stat(path) {
        Ok(s) => s,
        Err(FsError::NotFound(_)) => return Ok(format!("{path}: absent")),
        Err(FsError::Io { source, .. }) if source.raw_os_error() == Some(libc::ENOENT) => {
            return Ok(format!("{path}: absent"))
        }
        Err(e) => return Err(e),
    };
    match st.kind {
        strata_api::FileKind::Symlink => return Ok(format!("{path}: skipped, a symlink (not followed)")),
        strata_api::FileKind::Dir => {}
        _ => {
            fs.remove(path, false)?;
            return Ok(format!("{path}: removed (a file)"));
        }
    }
    // Entries are removed as the directory is read (in batches, never listed whole), without following them.
    let removed = fs.clear_dir(path)?;
    Ok(format!("{path}: {removed} entries removed"))
}

/// Applies a sandbox's flush rules (before a checkpoint). A sandbox that is
/// not running has nothing reachable through the confined file access: the
/// flush is skipped and the event says so.
pub async fn flush(st: &Shared, rec: &SandboxRecord) -> EngineResult<()> {
    let rules = rec.sandbox.policy.flush.clone();
    if rules.is_empty() {
        return Ok(());
    }
    let running =
        matches!(rec.sandbox.state, SandboxState::Running | SandboxState::Paused) && rec.sandbox.init_pid.is_some();
    let detail = if running && crate::guest_layer::in_guest(st, rec) && rec.sandbox.state == SandboxState::Paused {
        "skipped: a paused microVM's guest is frozen (flush needs it running)".to_string()
    } else if running && crate::guest_layer::in_guest(st, rec) {
        // A microVM's guest wipes the paths in its own root.
        let user = rec.image_config.user.clone().filter(|u| !u.is_empty());
        crate::guest_layer::flush(st, rec, rules, user).await?.join("; ")
    } else if running {
        let user = rec.image_config.user.clone();
        crate::files::with_fs(st, &rec.sandbox.id, move |fs| {
            let home = home_of(&fs, user.as_deref());
            let mut lines = Vec::new();
            for p in &rules {
                let abs = match p.strip_prefix("~/") {
                    Some(rest) => format!("{}/{rest}", home.trim_end_matches('/')),
                    None => p.clone(),
                };
                lines.push(match wipe(&fs, &abs) {
                    Ok(l) => l,
                    Err(FsError::Escape(_)) => format!("{abs}: skipped, leaves the sandbox"),
                    Err(e) => return Err(e),
                });
            }
            Ok(lines.join("; "))
        })
        .await?
    } else {
        format!("skipped: sandbox is {} (flush needs it running)", rec.sandbox.state)
    };
    if let Ok(ev) =
        st.db.record_event(&rec.sandbox.id, rec.sandbox.state, "flush", Some(&detail), &crate::record::now())
    {
        st.notify_events(ev.seq);
    }
    tracing::info!(sandbox = %rec.sandbox.id, %detail, "flush");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_empty_resolv_conf_strata_adds_is_passed_over() {
        let file = libc::S_IFREG | 0o644;
        assert!(is_resolv_mount_point("/etc/resolv.conf", Change::Added, file, Some(b"")));
        assert!(!is_resolv_mount_point("/etc/resolv.conf", Change::Added, file, Some(b"nameserver 6.6.6.6\n")));
        assert!(!is_resolv_mount_point("/etc/resolv.conf", Change::Modified, file, Some(b"")));
        assert!(!is_resolv_mount_point("/etc/resolv.conf", Change::Added, libc::S_IFLNK | 0o777, None));
        assert!(!is_resolv_mount_point("/etc/hosts.allow", Change::Added, file, Some(b"")));
    }
}
