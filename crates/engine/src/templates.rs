//! Templates (named, warm starting points) and template builds.
//!
//! A build file is a Dockerfile subset: `FROM image|template|checkpoint`, `RUN`,
//! `COPY src... dst`, `ENV`, `WORKDIR`, `USER`. Every step has a cache key:
//! sha256 over the previous key, the instruction and (for COPY) the copied
//! bytes. A RUN or COPY step runs in an ephemeral build sandbox and is sealed as
//! a checkpoint, which becomes the cache entry for its key; an unchanged prefix
//! of steps is therefore taken from the cache and only the steps from the first
//! change on run again. A failing step fails the build with its output and
//! leaves the cache of earlier steps intact.

use std::path::{Path as FsPath, PathBuf};
use std::time::Instant;

use base64::Engine;
use sha2::{Digest, Sha256};
use strata_api::{
    BuildEvent, BuildTemplateRequest, CheckpointRequest, CreateSandboxRequest, CreateTemplateRequest, ErrorCode,
    ExecRequest, ImageConfig, Lifecycle, OnFindings, ProcessEvent, Template, TemplatePolicyPatch,
};
use strata_core::ids;
use tokio::sync::mpsc::Sender;

use crate::checkpoints;
use crate::error::{EngineError, EngineResult};
use crate::lifecycle;
use crate::record::now;
use crate::state::Shared;

/// One instruction of a build file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Base image, template or checkpoint.
    From(String),
    /// Shell command (`sh -c`).
    Run(String),
    /// Sources (relative to the build context) and destination.
    Copy(Vec<String>, String),
    /// Environment variables.
    Env(Vec<(String, String)>),
    /// Working directory.
    Workdir(String),
    /// User.
    User(String),
    /// Shell command run as a given user (E2B's `RUN [cmd, user]`).
    RunAs {
        /// The command (`sh -c`).
        cmd: String,
        /// The user it runs as.
        user: String,
    },
    /// Files from an archive the daemon holds (E2B's uploaded `COPY` files: a
    /// tar, gzipped or not, with paths relative to the client's context):
    /// `src` of it to `dest`, like E2B's copy (a directory's contents into
    /// `dest`, a file to `dest` itself, a glob's matches into `dest`), given
    /// to `owner` (`user:group`; the build's user by default) with `mode`.
    CopyArchive {
        /// The archive on the daemon's host (the daemon's own file, never the caller's path).
        archive: PathBuf,
        /// What identifies its content (the cache key takes it).
        digest: String,
        /// The path, or glob, inside the archive.
        src: String,
        /// Where to, inside the sandbox (relative: to the working directory, else the user's home).
        dest: String,
        /// `user[:group]`.
        owner: Option<String>,
        /// Octal mode, e.g. `0755`.
        mode: Option<String>,
    },
}

/// How a build runs, besides its steps.
#[derive(Debug, Clone, Default)]
pub struct BuildOpts {
    /// Ignore the step cache.
    pub no_cache: bool,
    /// Register even if the final scan has findings (recorded).
    pub accept_findings: bool,
    /// A command started (in the background) in a sandbox of the built
    /// filesystem; the template is then a warm checkpoint taken once
    /// `ready_cmd` succeeds: its sandboxes start with the command running.
    pub start_cmd: Option<String>,
    /// Polled every 2 s (up to [`READY_TIMEOUT`]) until it exits 0; without
    /// one, the start command is given 20 s (E2B's default).
    pub ready_cmd: Option<String>,
    /// The build file and context to remember with the template (for a
    /// rebuild); `None` for builds of steps made elsewhere (E2B templates).
    pub recipe: Option<BuildTemplateRequest>,
}

/// The longest a start command may take to be ready.
pub const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// Parses a build file. Comments (`#`), blank lines and `\` continuations are
/// handled; RUN accepts the shell form and the JSON exec form.
pub fn parse(text: &str) -> Result<Vec<(String, Step)>, String> {
    let mut logical = Vec::new();
    let mut cur = String::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim_end();
        if cur.is_empty() && (line.trim().is_empty() || line.trim_start().starts_with('#')) {
            continue;
        }
        if let Some(stripped) = line.strip_suffix('\\') {
            cur.push_str(stripped);
            cur.push(' ');
            continue;
        }
        cur.push_str(line);
        logical.push((n + 1, std::mem::take(&mut cur)));
    }
    if !cur.is_empty() {
        return Err("the file ends inside a line continuation".into());
    }
    let mut steps = Vec::new();
    for (line_no, l) in logical {
        let l = l.trim();
        let (op, rest) = l.split_once(char::is_whitespace).map(|(a, b)| (a, b.trim())).unwrap_or((l, ""));
        let err = |m: &str| format!("line {line_no}: {m}: {l}");
        if rest.is_empty() {
            return Err(err("missing argument"));
        }
        let step = match op.to_ascii_uppercase().as_str() {
            "FROM" => Step::From(rest.split_whitespace().next().unwrap_or(rest).to_string()),
            "RUN" => {
                if rest.starts_with('[') {
                    let argv: Vec<String> =
                        serde_json::from_str(rest).map_err(|e| err(&format!("bad JSON exec form ({e})")))?;
                    Step::Run(argv.iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" "))
                } else {
                    Step::Run(rest.to_string())
                }
            }
            "COPY" | "ADD" => {
                let parts: Vec<String> = rest.split_whitespace().map(str::to_string).collect();
                if parts.len() < 2 || parts.iter().any(|p| p.starts_with("--")) {
                    return Err(err("COPY takes sources and a destination (no flags)"));
                }
                let (dst, srcs) = parts.split_last().expect("two or more parts");
                Step::Copy(srcs.to_vec(), dst.clone())
            }
            "ENV" => {
                let pairs: Vec<(String, String)> = if rest.contains('=') {
                    rest.split_whitespace()
                        .map(|kv| {
                            kv.split_once('=')
                                .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
                                .ok_or_else(|| err("ENV needs K=V"))
                        })
                        .collect::<Result<_, _>>()?
                } else {
                    let (k, v) = rest.split_once(char::is_whitespace).ok_or_else(|| err("ENV needs a value"))?;
                    vec![(k.to_string(), v.trim().to_string())]
                };
                Step::Env(pairs)
            }
            "WORKDIR" => Step::Workdir(rest.to_string()),
            "USER" => Step::User(rest.to_string()),
            other => return Err(err(&format!("unsupported instruction {other}"))),
        };
        steps.push((l.to_string(), step));
    }
    match steps.first() {
        Some((_, Step::From(_))) => {}
        _ => return Err("the first instruction must be FROM".into()),
    }
    if steps.iter().skip(1).any(|(_, s)| matches!(s, Step::From(_))) {
        return Err("only one FROM is supported".into());
    }
    Ok(steps)
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn key(prev: &str, instruction: &str, extra: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(prev.as_bytes());
    h.update(b"\n");
    h.update(instruction.as_bytes());
    h.update(b"\n");
    h.update(extra);
    hex::encode(h.finalize())
}

pub fn template_view(st: &Shared, name: &str, checkpoint: &str, created_at: &str) -> EngineResult<Template> {
    let (c, _) = st.db.checkpoint_by_id(checkpoint)?.ok_or_else(|| {
        EngineError::new(ErrorCode::Internal, format!("template {name} points at a missing checkpoint {checkpoint}"))
    })?;
    let accepted_findings = st.db.template_acceptance(name)?.and_then(|j| serde_json::from_str(&j).ok());
    let built_from = recipe(st, name)?.as_ref().and_then(from_of);
    let Checks { check_every, on_findings, last_check } = checks(st, name)?.unwrap_or_default();
    Ok(Template {
        check_every,
        on_findings,
        last_check: last_check.map(Box::new),
        built_from,
        name: name.into(),
        tenant: c.tenant,
        checkpoint: c.id,
        image: c.image,
        layers: c.layers.len(),
        isolation: c.isolation,
        created_at: created_at.into(),
        accepted_findings,
    })
}

/// A template's checks at set times, as stored.
#[derive(Debug, Default)]
pub(crate) struct Checks {
    pub check_every: Option<String>,
    pub on_findings: OnFindings,
    /// The last check (a report that no longer parses counts as none).
    pub last_check: Option<strata_api::TemplateCheckReport>,
}

/// Reads a template's checks (`None`: no such template).
pub(crate) fn checks(st: &Shared, name: &str) -> EngineResult<Option<Checks>> {
    Ok(st.db.template_checks(name)?.map(|c| Checks {
        check_every: c.check_every,
        on_findings: serde_json::from_value(serde_json::Value::String(c.on_findings)).unwrap_or_default(),
        last_check: c.last_check.and_then(|j| serde_json::from_str(&j).ok()),
    }))
}

/// Sets a template's checks at set times (`PATCH /v1/templates/{name}`):
/// `check_every` (at least the minimum, or `none`) and `on_findings`
/// (`record` or `quarantine`: a template has no processes to stop and no
/// writable layer to flush). Fields left out are kept.
pub fn set_policy(st: &Shared, name: &str, patch: TemplatePolicyPatch) -> EngineResult<Template> {
    let (checkpoint, created_at) = crate::tenancy::find_template(st, name)?.ok_or_else(|| not_found(name))?;
    if let Some(a @ (OnFindings::Flush | OnFindings::Stop)) = patch.on_findings {
        return Err(EngineError::bad_request(format!(
            "on_findings {a} does not apply to a template (no processes to stop, no writable layer to flush): use record or quarantine"
        )));
    }
    let current = checks(st, name)?.ok_or_else(|| not_found(name))?;
    let check_every = match patch.check_every.as_deref().map(str::trim) {
        None => current.check_every,
        Some("none") => None,
        Some(v) => {
            crate::policy_spec::validate_check_every(v)?;
            Some(v.to_string())
        }
    };
    let on_findings = patch.on_findings.unwrap_or(current.on_findings);
    st.db.set_template_checks(name, check_every.as_deref(), on_findings.as_str())?;
    template_view(st, name, &checkpoint, &created_at)
}

/// Template names are daemon-wide: one of another tenant is taken (409) and
/// never re-pointed by `replace`.
fn name_usable(st: &Shared, name: &str) -> EngineResult<()> {
    if st.db.template_tenant(name)?.is_some_and(|t| !crate::tenancy::visible(&t)) {
        return Err(EngineError::new(ErrorCode::NameConflict, format!("the template name {name:?} is in use")));
    }
    Ok(())
}

/// Registers a template, recording accepted scan findings with it.
fn register(
    st: &Shared,
    name: &str,
    checkpoint: &str,
    replace: bool,
    accepted: Option<&strata_api::FindingsAcceptance>,
) -> EngineResult<Template> {
    name_usable(st, name)?;
    let time = now();
    st.db.put_template(name, checkpoint, &time, replace)?;
    if let Some(a) = accepted {
        st.db.set_template_acceptance(name, &serde_json::to_string(a).expect("acceptance serializes"))?;
    }
    // A pool of this name follows it now (a re-pointed template replaces its members).
    st.pools.wake.notify_one();
    template_view(st, name, checkpoint, &time)
}

/// Promotes a checkpoint (or a sandbox, checkpointed first) to a template,
/// only when its state-hygiene scan is clean or `accept_findings` is set
/// (then the findings and `actor` are recorded on the template).
pub async fn create(st: &Shared, req: CreateTemplateRequest, actor: &str) -> EngineResult<Template> {
    ids::validate_new_name(&req.name, true)?;
    name_usable(st, &req.name)?;
    if st.db.get_image(&req.name)?.is_some_and(|i| i.name == req.name) {
        return Err(EngineError::new(
            ErrorCode::NameConflict,
            format!("an image is named {:?}; templates and images share one namespace", req.name),
        ));
    }
    let ckpt = match crate::tenancy::find_sandbox_or_checkpoint(st, &req.from, crate::tenancy::NamesFirst::Checkpoint)?
    {
        Some(crate::tenancy::SandboxOrCheckpoint::Checkpoint(c)) if c.0.retired_at().is_some() => {
            return Err(EngineError::checkpoint_retired(&c.0))
        }
        Some(crate::tenancy::SandboxOrCheckpoint::Checkpoint(c)) => {
            crate::quarantine::refuse_checkpoint(&c.0, "be promoted to a template")?;
            c.0
        }
        Some(crate::tenancy::SandboxOrCheckpoint::Sandbox(rec)) => {
            crate::quarantine::refuse_sandbox(&rec.sandbox, "be promoted to a template")?;
            checkpoints::checkpoint(
                st,
                &rec.sandbox.id,
                CheckpointRequest {
                    labels: [("strata.template".into(), req.name.clone())].into(),
                    ..Default::default()
                },
            )
            .await?
        }
        None => {
            return Err(EngineError::new(
                ErrorCode::CheckpointNotFound,
                format!("no checkpoint or sandbox named {:?}", req.from),
            ))
        }
    };
    if !req.replace && st.db.get_template(&req.name)?.is_some() {
        return Err(EngineError::new(
            ErrorCode::NameConflict,
            format!("a template named {:?} exists (use replace)", req.name),
        ));
    }
    let accepted = crate::scan::gate(st, &ckpt.id, req.accept_findings, actor, &[]).await?;
    register(st, &req.name, &ckpt.id, req.replace, accepted.as_ref())
}

struct Build<'a> {
    st: &'a Shared,
    tx: &'a Sender<BuildEvent>,
    name: String,
    sandbox: Option<String>,
    config: ImageConfig,
}

impl Build<'_> {
    async fn emit(&self, ev: BuildEvent) {
        let _ = self.tx.send(ev).await;
    }

    /// The build sandbox, created from `from` when there is none.
    async fn sandbox(&mut self, from: &str) -> EngineResult<String> {
        if let Some(s) = &self.sandbox {
            return Ok(s.clone());
        }
        let req = CreateSandboxRequest {
            source: from.to_string(),
            name: Some(format!("build-{}", ids::new_id())),
            lifecycle: Lifecycle::Ephemeral,
            ttl: Some("6h".into()),
            // The build removes its sandbox itself; a long COPY or a pause between steps is not idleness.
            policy: Some(strata_api::PolicyPatch { on_idle: Some(strata_api::OnIdle::Keep), ..Default::default() }),
            ..Default::default()
        };
        let sb = lifecycle::create(self.st, req).await?;
        self.st.db.set_image_config(&sb.id, &self.config)?;
        self.sandbox = Some(sb.id.clone());
        Ok(sb.id)
    }

    async fn drop_sandbox(&mut self) {
        if let Some(id) = self.sandbox.take() {
            let _ = lifecycle::destroy(self.st, &id, true, "build_done").await;
        }
    }

    async fn run(&mut self, sandbox: &str, cmd: &str, user: Option<&str>) -> EngineResult<()> {
        let req = ExecRequest {
            cmd: vec!["/bin/sh".into(), "-c".into(), cmd.into()],
            user: user.map(str::to_string),
            ..Default::default()
        };
        let p = crate::processes::spawn(self.st, sandbox, req).await?;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<ProcessEvent>(64);
        let follower = tokio::spawn(crate::processes::follow(p.clone(), tx));
        let mut tail: Vec<u8> = Vec::new();
        while let Some(ev) = rx.recv().await {
            if let ProcessEvent::Output { stream, data_b64, .. } = ev {
                if let Ok(b) = base64::engine::general_purpose::STANDARD.decode(&data_b64) {
                    tail.extend_from_slice(&b);
                    if tail.len() > 4096 {
                        tail.drain(..tail.len() - 4096);
                    }
                }
                self.emit(BuildEvent::Output { stream, data_b64 }).await;
            }
        }
        let _ = follower.await;
        let info = p.wait(None).await;
        if info.exit_status() != 0 {
            let why = info.spawn_error.clone().unwrap_or_else(|| format!("exit status {}", info.exit_status()));
            return Err(EngineError::bad_request(format!(
                "RUN {cmd} failed ({why}); output ends with:\n{}",
                String::from_utf8_lossy(&tail)
            )));
        }
        Ok(())
    }
}

/// What a build step writes into its sandbox.
enum Put {
    /// A file at the path, with these permission bits (its parent made).
    File(u32),
    /// A tar extracted under the path (made if missing).
    Tar,
}

/// Makes directory `path` (and its parents) in build sandbox `sb`.
async fn build_mkdir(st: &Shared, sb: &str, path: String, mode: u32) -> EngineResult<()> {
    let rec = crate::record::load(st, sb)?;
    if crate::guest_layer::in_guest(st, &rec) {
        return crate::files::guest::act(st, &rec, strata_init::guestfs::FsOp::Mkdir { path, parents: true }).await;
    }
    crate::files::with_fs(st, sb, move |fs| fs.mkdir(&path, true, mode)).await
}

/// Writes what `reader` gives into build sandbox `sb` at `path` (see
/// [`Put`]): through the confined file API on the host, or, for a microVM
/// (whose files are its guest's), through its guest's pid 1.
async fn build_put(
    st: &Shared,
    sb: &str,
    path: String,
    put: Put,
    reader: Box<dyn std::io::Read + Send>,
) -> EngineResult<()> {
    // A tar's directory is made by its extraction (on either side); a file's parent is not.
    let parent = match &put {
        Put::File(_) => FsPath::new(&path)
            .parent()
            .and_then(|p| p.to_str())
            .filter(|p| *p != "/" && !p.is_empty())
            .map(str::to_string),
        Put::Tar => None,
    };
    let rec = crate::record::load(st, sb)?;
    if !crate::guest_layer::in_guest(st, &rec) {
        return crate::files::with_fs(st, sb, move |fs| {
            if let Some(parent) = &parent {
                fs.mkdir(parent, true, 0o755)?;
            }
            match put {
                Put::File(mode) => fs.write_from(&path, reader, mode).map(drop),
                Put::Tar => fs.untar_from(&path, reader).map(drop),
            }
        })
        .await;
    }
    if let Some(parent) = parent {
        build_mkdir(st, sb, parent, 0o755).await?;
    }
    let op = match put {
        Put::File(mode) => strata_init::guestfs::FsOp::Write { path, mode },
        Put::Tar => strata_init::guestfs::FsOp::WriteTar { path },
    };
    crate::files::guest::write_from(st, &rec, op, reader).await
}

impl Build<'_> {
    /// [`Step::CopyArchive`]: the archive is unpacked (confined, as any tar
    /// upload) into a staging directory of the build sandbox, and a script
    /// run as root there puts `src` at `dest`, owns and modes it, and removes
    /// the staging directory.
    async fn copy_archive(
        &mut self,
        sandbox: &str,
        archive: &FsPath,
        src: &str,
        dest: &str,
        owner: Option<&str>,
        mode: Option<&str>,
    ) -> EngineResult<()> {
        let user = self.config.user.clone().filter(|u| !u.is_empty()).unwrap_or_else(|| "root".into());
        let dest = match (dest.starts_with('/'), &self.config.working_dir) {
            (true, _) => dest.to_string(),
            (false, Some(w)) if w.starts_with('/') => format!("{}/{dest}", w.trim_end_matches('/')),
            (false, _) if user == "root" => format!("/root/{dest}"),
            (false, _) => format!("/home/{user}/{dest}"),
        };
        let owner = owner.filter(|o| !o.is_empty()).map(str::to_string).unwrap_or_else(|| format!("{user}:{user}"));
        let staging = format!("/tmp/.strata-copy-{}", ids::new_id());
        let mut f = std::fs::File::open(archive)
            .map_err(|e| EngineError::bad_request(format!("COPY {src}: its files are not here ({e})")))?;
        let mut magic = [0u8; 2];
        let gz = std::io::Read::read(&mut f, &mut magic).map(|n| n == 2 && magic == [0x1f, 0x8b]).unwrap_or(false);
        std::io::Seek::rewind(&mut f).map_err(|e| EngineError::internal("COPY archive", &e))?;
        let reader: Box<dyn std::io::Read + Send> =
            if gz { Box::new(flate2::read::MultiGzDecoder::new(f)) } else { Box::new(f) };
        build_mkdir(self.st, sandbox, staging.clone(), 0o700).await?;
        build_put(self.st, sandbox, staging.clone(), Put::Tar, reader).await?;
        let script = copy_script(&staging, src, &dest, &owner, mode.filter(|m| !m.is_empty()));
        self.run(sandbox, &script, Some("root")).await
    }

    /// The warm checkpoint of a template with a start command: a sandbox of
    /// `ckpt` runs `cmd` (as the build's user, in its working directory)
    /// until `ready` exits 0 (polled every 2 s, at most [`READY_TIMEOUT`]),
    /// then its filesystem and processes are checkpointed.
    async fn warm(&mut self, ckpt: &str, cmd: &str, ready: Option<&str>) -> EngineResult<String> {
        let sb = self.sandbox(ckpt).await?;
        self.emit(BuildEvent::Output {
            stream: strata_api::StreamKind::Stdout,
            data_b64: base64::engine::general_purpose::STANDARD.encode(format!("start command: {cmd}\n")),
        })
        .await;
        let req = ExecRequest {
            cmd: vec!["/bin/sh".into(), "-c".into(), cmd.into()],
            user: self.config.user.clone(),
            cwd: self.config.working_dir.clone(),
            ..Default::default()
        };
        let started = crate::processes::spawn(self.st, &sb, req).await?;
        let ready = ready.map(str::to_string).unwrap_or_else(|| "sleep 20".into());
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let now = started.info();
            if now.status == strata_api::ProcessStatus::Exited {
                return Err(EngineError::bad_request(format!(
                    "the start command {cmd:?} exited (status {}) before it was ready",
                    now.exit_status()
                )));
            }
            let probe = ExecRequest {
                cmd: vec!["/bin/sh".into(), "-c".into(), ready.clone()],
                user: self.config.user.clone(),
                cwd: self.config.working_dir.clone(),
                timeout: Some("60s".into()),
                ..Default::default()
            };
            let r = crate::processes::spawn(self.st, &sb, probe).await?.wait(None).await;
            if r.exit_status() == 0 {
                break;
            }
            if Instant::now() >= deadline {
                return Err(EngineError::new(
                    ErrorCode::Timeout,
                    format!(
                        "the ready command {ready:?} did not succeed within {} s of the start command",
                        READY_TIMEOUT.as_secs()
                    ),
                ));
            }
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        }
        let c = checkpoints::checkpoint(
            self.st,
            &sb,
            CheckpointRequest {
                processes: true,
                labels: [("strata.build".into(), self.name.clone()), ("strata.start".into(), cmd.to_string())].into(),
                ..Default::default()
            },
        )
        .await?;
        self.drop_sandbox().await;
        Ok(c.id)
    }
}

/// The script of [`Step::CopyArchive`] (run as root in the build sandbox).
fn copy_script(staging: &str, src: &str, dest: &str, owner: &str, mode: Option<&str>) -> String {
    let q = shell_quote;
    let src = src.trim_end_matches('/');
    let (st, d) = (q(staging), q(dest));
    let globbed = src.contains(['*', '?', '[']);
    let mut s = format!("set -e\ncd {st}\n");
    if globbed {
        // Each match goes into dest (a directory); the glob is expanded by the shell, in the staging directory.
        s.push_str(&format!("mkdir -p {d}\nfor m in {src}; do [ -e \"$m\" ] || {{ echo \"COPY: nothing matches {src}\" >&2; exit 1; }}; cp -a \"$m\" {d}/; done\n"));
    } else {
        s.push_str(&format!(
            "if [ -d {sq} ] && [ ! -L {sq} ]; then mkdir -p {d}; cp -a {sq}/. {d}/\nelif [ -e {sq} ] || [ -L {sq} ]; then\n  case {d} in */) mkdir -p {d}; cp -a {sq} {d} ;; *) mkdir -p \"$(dirname {d})\"; cp -a {sq} {d} ;; esac\nelse echo \"COPY: {src} is not in the uploaded files\" >&2; exit 1\nfi\n",
            sq = q(src)
        ));
    }
    s.push_str(&format!("chown -R {} {d}\n", q(owner)));
    if let Some(m) = mode {
        s.push_str(&format!("chmod {} {d}\n", q(m)));
    }
    s.push_str(&format!("cd / && rm -rf {st}\n"));
    s
}

fn context_file(context: Option<&FsPath>, src: &str) -> EngineResult<PathBuf> {
    let ctx = context.ok_or_else(|| EngineError::bad_request("COPY needs a build context directory"))?;
    let ctx =
        ctx.canonicalize().map_err(|e| EngineError::bad_request(format!("build context {}: {e}", ctx.display())))?;
    let p = ctx.join(src).canonicalize().map_err(|e| EngineError::bad_request(format!("COPY source {src}: {e}")))?;
    if !p.starts_with(&ctx) {
        return Err(EngineError::new(ErrorCode::PathEscape, format!("COPY source {src} is outside the build context")));
    }
    Ok(p)
}

/// Writes the tar of COPY's sources (their names kept) into `out`, as it is made.
fn copy_tar(context: Option<&FsPath>, srcs: &[String], out: impl std::io::Write) -> EngineResult<()> {
    let mut b = tar::Builder::new(out);
    b.follow_symlinks(false);
    b.mode(tar::HeaderMode::Deterministic);
    for src in srcs {
        let p = context_file(context, src)?;
        // Like Docker: a directory's contents are copied, a file keeps its name.
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| ".".into());
        let res = if p.is_dir() { b.append_dir_all(".", &p) } else { b.append_path_with_name(&p, &name) };
        res.map_err(|e| EngineError::bad_request(format!("COPY source {src}: {e}")))?;
    }
    b.finish().map_err(|e| EngineError::bad_request(format!("COPY archive: {e}")))
}

/// A writer that only hashes what goes through it.
struct HashWriter(Sha256);

impl std::io::Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The SHA-256 of COPY's tar, for the cache key (the tar is hashed as it is
/// made, never held in memory).
fn copy_digest(context: Option<&FsPath>, srcs: &[String]) -> EngineResult<Vec<u8>> {
    let mut h = HashWriter(Sha256::new());
    copy_tar(context, srcs, &mut h)?;
    Ok(h.0.finalize().to_vec())
}

/// The build a template was made by (its build file, context and start
/// command), when it was built from a build file.
fn recipe(st: &Shared, name: &str) -> EngineResult<Option<BuildTemplateRequest>> {
    Ok(st.db.template_build(name)?.and_then(|j| serde_json::from_str(&j).ok()))
}

/// The `FROM` of a remembered build.
fn from_of(r: &BuildTemplateRequest) -> Option<String> {
    match parse(&r.file).ok()?.into_iter().next()? {
        (_, Step::From(f)) => Some(f),
        _ => None,
    }
}

/// `file` with its `FROM` instruction (the first one) naming `base`.
fn with_base(file: &str, base: &str) -> Result<String, String> {
    if base.trim().is_empty() || base.contains(char::is_whitespace) {
        return Err(format!("base {base:?} is not an image, template or checkpoint name"));
    }
    let mut out = Vec::new();
    let mut done = false;
    for line in file.lines() {
        let t = line.trim_start();
        if !done && t.len() >= 4 && t[..4].eq_ignore_ascii_case("FROM") && t[4..].starts_with(char::is_whitespace) {
            out.push(format!("FROM {base}"));
            done = true;
        } else {
            out.push(line.to_string());
        }
    }
    if !done {
        return Err("the build file has no FROM".into());
    }
    Ok(out.join("\n") + "\n")
}

/// The build that rebuilds a template from the build file it was made by,
/// on `req.base` when given: every step runs again unless the step cache has
/// it for the same inputs (a new base is a new input for the steps after
/// it), and the template is re-pointed at the result. 404 for an unknown
/// template, 409 for one promoted from a checkpoint (there are no steps to
/// run again).
pub fn rebuild_request(
    st: &Shared,
    name: &str,
    req: strata_api::RebuildTemplateRequest,
) -> EngineResult<BuildTemplateRequest> {
    if crate::tenancy::find_template(st, name)?.is_none() {
        return Err(not_found(name));
    }
    let Some(mut build_req) = recipe(st, name)? else {
        return Err(EngineError::new(
            ErrorCode::InvalidState,
            format!("template {name:?} was promoted from a checkpoint, not built from a build file: there are no steps to run again (rebase a sandbox made from it and promote that)"),
        ));
    };
    if let Some(base) = &req.base {
        build_req.file = with_base(&build_req.file, base).map_err(EngineError::bad_request)?;
    }
    build_req.name = name.to_string();
    build_req.no_cache = req.no_cache;
    build_req.accept_findings = req.accept_findings;
    Ok(build_req)
}

/// Runs a build, streaming events; returns the template (which remembers the
/// build, for [`rebuild`]).
pub async fn build(
    st: &Shared,
    req: BuildTemplateRequest,
    tx: &Sender<BuildEvent>,
    actor: &str,
) -> Result<Template, (usize, EngineError)> {
    let recipe = BuildTemplateRequest { no_cache: false, accept_findings: false, ..req.clone() };
    ids::validate_new_name(&req.name, true).map_err(|e| (0, EngineError::from(e)))?;
    name_usable(st, &req.name).map_err(|e| (0, e))?;
    let steps = parse(&req.file).map_err(|e| (0, EngineError::bad_request(format!("build file: {e}"))))?;
    // COPY reads files on the daemon's host (`context`): the operator's privilege, like image import.
    if steps.iter().any(|(_, s)| matches!(s, Step::Copy(..))) && !crate::tenancy::may_read_host_paths() {
        return Err((0, EngineError::new(ErrorCode::Forbidden, "COPY reads files on the daemon's host (context): not allowed for a tenant token; upload files into a sandbox and template it instead")));
    }
    let context = req.context.as_deref().map(PathBuf::from);
    if req.ready_cmd.is_some() && req.start_cmd.is_none() {
        return Err((
            0,
            EngineError::bad_request("ready_cmd without start_cmd: it says when the start command is ready"),
        ));
    }
    let opts = BuildOpts {
        no_cache: req.no_cache,
        accept_findings: req.accept_findings,
        start_cmd: req.start_cmd.clone().filter(|c| !c.trim().is_empty()),
        ready_cmd: req.ready_cmd.clone().filter(|c| !c.trim().is_empty()),
        recipe: Some(recipe),
    };
    build_steps(st, &req.name, steps, context, opts, tx, actor).await
}

/// Runs a build of already parsed steps (the first a `FROM`), streaming
/// events; returns the template. `context` is where `COPY` sources are read
/// (a caller's host path is checked by [`build`]).
pub async fn build_steps(
    st: &Shared,
    name: &str,
    steps: Vec<(String, Step)>,
    context: Option<PathBuf>,
    opts: BuildOpts,
    tx: &Sender<BuildEvent>,
    actor: &str,
) -> Result<Template, (usize, EngineError)> {
    let started = Instant::now();
    ids::validate_new_name(name, true).map_err(|e| (0, EngineError::from(e)))?;
    name_usable(st, name).map_err(|e| (0, e))?;
    let req = BuildTemplateRequest {
        name: name.to_string(),
        file: String::new(),
        context: None,
        no_cache: opts.no_cache,
        accept_findings: opts.accept_findings,
        start_cmd: None,
        ready_cmd: None,
    };
    let count = steps.len();
    let Some((_, Step::From(_))) = steps.first() else {
        return Err((0, EngineError::bad_request("a build starts with FROM")));
    };
    let Step::From(from) = &steps[0].1 else { unreachable!("parse checks FROM") };
    let source = lifecycle::resolve_source(st, from).map_err(|e| (1, e))?;
    let mut b = Build { st, tx, name: req.name.clone(), sandbox: None, config: source.config.clone() };
    // The base: the FROM source's identity (image id, or checkpoint id).
    let mut current_from = source.checkpoint.clone().unwrap_or_else(|| source.name.clone());
    // The cache is per tenant: a tenant never reuses (or learns of) another's build steps.
    let tenant = source.tenant.clone().unwrap_or_else(crate::tenancy::creating_tenant);
    let mut k = key(
        &format!("tenant {tenant}"),
        &format!("FROM {}", source.checkpoint.as_deref().unwrap_or(&source.image_id)),
        b"",
    );
    b.emit(BuildEvent::Step { index: 1, count, instruction: steps[0].0.clone(), cached: true }).await;
    let (mut run, mut cached) = (0usize, 1usize);
    for (i, (text, step)) in steps.iter().enumerate().skip(1) {
        let index = i + 1;
        let res: EngineResult<()> = async {
            match step {
                Step::Env(pairs) => {
                    for (kk, v) in pairs {
                        b.config.env.retain(|e| !e.starts_with(&format!("{kk}=")));
                        b.config.env.push(format!("{kk}={v}"));
                    }
                }
                Step::Workdir(d) => b.config.working_dir = Some(d.clone()),
                Step::User(u) => b.config.user = Some(u.clone()),
                _ => {}
            }
            let extra = match step {
                Step::Copy(srcs, _) => copy_digest(context.as_deref(), srcs)?,
                Step::CopyArchive { digest, .. } => digest.as_bytes().to_vec(),
                _ => Vec::new(),
            };
            k = key(&k, &format!("{text}\n{}", serde_json::to_string(&b.config).expect("config serializes")), &extra);
            if !matches!(step, Step::Run(_) | Step::Copy(..) | Step::RunAs { .. } | Step::CopyArchive { .. }) {
                if let Some(sb) = &b.sandbox {
                    st.db.set_image_config(sb, &b.config)?;
                }
                b.emit(BuildEvent::Step { index, count, instruction: text.clone(), cached: true }).await;
                cached += 1;
                return Ok(());
            }
            if !req.no_cache {
                if let Some(c) = st.db.cached_step(&k)?.filter(|c| st.db.checkpoint_by_id(c).ok().flatten().is_some()) {
                    b.emit(BuildEvent::Step { index, count, instruction: text.clone(), cached: true }).await;
                    b.drop_sandbox().await;
                    current_from = c;
                    cached += 1;
                    return Ok(());
                }
            }
            b.emit(BuildEvent::Step { index, count, instruction: text.clone(), cached: false }).await;
            let t = Instant::now();
            let sb = b.sandbox(&current_from).await?;
            st.db.set_image_config(&sb, &b.config)?;
            if let Some(w) = b.config.working_dir.clone().filter(|w| w.starts_with('/')) {
                // Like Docker, WORKDIR creates the directory.
                build_mkdir(st, &sb, w, 0o755).await?;
            }
            match step {
                Step::Run(cmd) => b.run(&sb, cmd, None).await?,
                Step::RunAs { cmd, user } => b.run(&sb, cmd, Some(user)).await?,
                Step::CopyArchive { archive, src, dest, owner, mode, .. } => {
                    b.copy_archive(&sb, archive, src, dest, owner.as_deref(), mode.as_deref()).await?
                }
                Step::Copy(srcs, dst) => {
                    let dst = match (dst.starts_with('/'), &b.config.working_dir) {
                        (true, _) => dst.clone(),
                        (false, Some(w)) => format!("{}/{dst}", w.trim_end_matches('/')),
                        (false, None) => format!("/{dst}"),
                    };
                    // One file to a path not ending in '/' is copied to that path (not into it).
                    let single_file = match srcs.as_slice() {
                        [one] if !dst.ends_with('/') => {
                            Some(context_file(context.as_deref(), one)?).filter(|p| p.is_file())
                        }
                        _ => None,
                    };
                    let file = match single_file {
                        Some(src) => {
                            use std::os::unix::fs::PermissionsExt;
                            // Streamed into the sandbox (opened here, read there), never read whole.
                            let f = std::fs::File::open(&src)
                                .map_err(|e| EngineError::bad_request(format!("COPY source {}: {e}", src.display())))?;
                            let mode = f.metadata().map(|m| m.permissions().mode() & 0o777).unwrap_or(0o644);
                            Some((f, mode))
                        }
                        None => None,
                    };
                    match file {
                        Some((f, mode)) => build_put(st, &sb, dst, Put::File(mode), Box::new(f)).await?,
                        None => {
                            // The tar is made on a thread of its own while the sandbox side
                            // reads it from a pipe: never whole in memory.
                            let (reader, writer) =
                                std::io::pipe().map_err(|e| EngineError::internal("COPY pipe", &e))?;
                            let (ctx, srcs) = (context.clone(), srcs.clone());
                            let producer = std::thread::spawn(move || copy_tar(ctx.as_deref(), &srcs, writer));
                            let applied = build_put(st, &sb, dst, Put::Tar, Box::new(reader)).await;
                            let made = producer
                                .join()
                                .map_err(|_| EngineError::new(ErrorCode::Internal, "COPY archive thread panicked"))?;
                            // A source that could not be read is the cause of a broken archive.
                            made?;
                            applied?;
                        }
                    }
                }
                _ => unreachable!("only RUN and COPY run"),
            }
            let c = checkpoints::checkpoint(
                st,
                &sb,
                CheckpointRequest {
                    labels: [("strata.build".into(), b.name.clone()), ("strata.step".into(), index.to_string())].into(),
                    ..Default::default()
                },
            )
            .await?;
            st.db.cache_step(&k, &c.id, &now())?;
            b.emit(BuildEvent::StepDone {
                index,
                checkpoint: c.id.clone(),
                duration_ms: t.elapsed().as_millis() as u64,
            })
            .await;
            current_from = c.id;
            run += 1;
            Ok(())
        }
        .await;
        if let Err(e) = res {
            b.drop_sandbox().await;
            return Err((index, e));
        }
    }
    // The template needs a checkpoint carrying the final config.
    let needs_final = match st.db.checkpoint_by_id(&current_from).map_err(|e| (count, e.into()))? {
        Some((_, cfg)) => cfg != b.config,
        None => true,
    };
    let final_ckpt = if needs_final {
        let res: EngineResult<String> = async {
            let final_key = key(&k, "final", b"");
            if let Some(c) = st
                .db
                .cached_step(&final_key)?
                .filter(|c| !req.no_cache && st.db.checkpoint_by_id(c).ok().flatten().is_some())
            {
                return Ok(c);
            }
            let sb = b.sandbox(&current_from).await?;
            st.db.set_image_config(&sb, &b.config)?;
            let c = checkpoints::checkpoint(
                st,
                &sb,
                CheckpointRequest { labels: [("strata.build".into(), b.name.clone())].into(), ..Default::default() },
            )
            .await?;
            st.db.cache_step(&final_key, &c.id, &now())?;
            Ok(c.id)
        }
        .await;
        match res {
            Ok(c) => c,
            Err(e) => {
                b.drop_sandbox().await;
                return Err((count, e));
            }
        }
    } else {
        current_from
    };
    b.drop_sandbox().await;
    // A start command: the template is the built filesystem with it running.
    let final_ckpt = match &opts.start_cmd {
        Some(cmd) => match b.warm(&final_ckpt, cmd, opts.ready_cmd.as_deref()).await {
            Ok(c) => c,
            Err(e) => {
                b.drop_sandbox().await;
                return Err((count, e));
            }
        },
        None => final_ckpt,
    };
    // The same gate as promotion, except that system-path changes are what a
    // build file is for (its RUN and COPY steps are declared and reviewable).
    let accepted = crate::scan::gate(st, &final_ckpt, req.accept_findings, actor, &["system_path"])
        .await
        .map_err(|e| (count, e))?;
    let mut template = register(st, &req.name, &final_ckpt, true, accepted.as_ref()).map_err(|e| (count, e))?;
    // Remembered before the build is reported done: a rebuild right after it finds the steps.
    let recipe = opts.recipe.as_ref().map(|r| serde_json::to_string(r).expect("a build request serializes"));
    st.db.set_template_build(&req.name, recipe.as_deref()).map_err(|e| (count, e.into()))?;
    template.built_from = opts.recipe.as_ref().and_then(from_of);
    b.emit(BuildEvent::Done {
        template: template.clone(),
        steps_run: run,
        steps_cached: cached,
        duration_ms: started.elapsed().as_millis() as u64,
    })
    .await;
    Ok(template)
}

/// 404 for a template.
pub fn not_found(name: &str) -> EngineError {
    EngineError::new(ErrorCode::ImageNotFound, format!("no template named {name:?}"))
}

/// The templates the current caller may see.
pub fn list(st: &Shared) -> EngineResult<Vec<Template>> {
    let mut out = Vec::new();
    for (name, ckpt, created) in st.db.list_templates()? {
        if !st.db.template_tenant(&name)?.is_some_and(|t| crate::tenancy::visible(&t)) {
            continue;
        }
        out.push(template_view(st, &name, &ckpt, &created)?);
    }
    Ok(out)
}

/// Removes a template (its checkpoint stays until deleted or collected); 404
/// when there is none by that name. Which tenant may is decided by the route's
/// owner check.
pub fn delete(st: &Shared, name: &str) -> EngineResult<()> {
    if !st.db.delete_template(name)? {
        return Err(not_found(name));
    }
    // A pool of it drains now rather than at its next look.
    st.pools.wake.notify_one();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_dockerfile_subset() {
        let steps = parse("# comment\nFROM busybox\nENV A=1 B=\"two\"\nWORKDIR /app\nRUN echo a && \\\n  echo b\nRUN [\"echo\", \"it's\"]\nCOPY a b /app/\nUSER user\n").unwrap();
        let kinds: Vec<&Step> = steps.iter().map(|(_, s)| s).collect();
        assert_eq!(kinds[0], &Step::From("busybox".into()));
        assert_eq!(kinds[1], &Step::Env(vec![("A".into(), "1".into()), ("B".into(), "two".into())]));
        assert_eq!(kinds[3], &Step::Run("echo a &&    echo b".into()));
        assert_eq!(kinds[4], &Step::Run("'echo' 'it'\\''s'".into()));
        assert_eq!(kinds[5], &Step::Copy(vec!["a".into(), "b".into()], "/app/".into()));
        assert!(parse("RUN true").is_err(), "FROM first");
        assert!(parse("FROM a\nFROM b").is_err());
        assert!(parse("FROM a\nHEALTHCHECK x").unwrap_err().contains("unsupported instruction HEALTHCHECK"));
        assert!(parse("FROM a\nRUN").is_err());
    }
}
