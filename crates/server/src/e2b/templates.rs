//! E2B's template SDK (build system 2.0: `Template().from_image(...).run_cmd(...)
//! .copy(...).set_start_cmd(...)` and `Template.build`) on strata's template
//! builds ([`strata_engine::templates::build_steps`]): the same cached step
//! layers, the same scan, a start command giving a warm template.
//!
//! The SDK's calls: `POST /v3/templates` (a build is requested: the template
//! id is its name), `GET /templates/{id}/files/{hash}` for each `COPY` (whether
//! its files are here, else a signed URL on this daemon to `PUT` them to),
//! `POST /v2/templates/{id}/builds/{build}` (the steps; the build starts), then
//! `GET /templates/{id}/builds/{build}/status?logsOffset=N` until `ready` or
//! `error`, with its log entries. Builds are kept in memory (a daemon restart
//! forgets builds in progress; the templates they made stay).

use std::collections::HashMap;
use std::path::PathBuf;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};
use strata_api::BuildEvent;
use strata_engine::templates::{BuildOpts, Step};
use tracing::info;

use super::{access, E2bError, SharedE2b, BASE_TEMPLATE};

/// What E2B calls its base image; strata's `base` template.
const E2B_BASE_IMAGE: &str = "e2bdev/base";
/// The most bytes one `COPY` upload may have.
const MAX_FILES_UPLOAD: u64 = 2 << 30;
/// How long a files upload URL is good for.
const UPLOAD_URL_TTL: u64 = 3600;
/// The most log entries one status answer carries (E2B's page).
const LOG_PAGE: usize = 100;

/// A build of the E2B layer.
#[derive(Debug, Clone)]
pub struct TemplateBuild {
    /// The caller's tenant (only it sees the build).
    tenant: String,
    template_id: String,
    /// `waiting` (requested), `building`, `ready`, `error`.
    status: &'static str,
    entries: Vec<Value>,
    reason: Option<Value>,
    /// When it ended (`ready` or `error`): kept [`KEEP_FINISHED`] after that.
    finished: Option<std::time::Instant>,
    /// The strata templates it makes, one per tag ([`tagged`]): the first
    /// is built, the others point at the same checkpoint.
    targets: Vec<String>,
    /// Output lines of its steps so far (kept up to [`MAX_OUTPUT_LINES`]).
    output_lines: usize,
}

/// How long a finished build (its status and logs) stays to be read.
const KEEP_FINISHED: std::time::Duration = std::time::Duration::from_secs(3600);

/// The template id and the tag of a name (`name` or `name:tag`): the id is a
/// strata template name (letters, digits, `-_./@`).
fn split_name(name: &str) -> Result<(String, Option<String>), E2bError> {
    let (id, tag) = match name.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n, Some(t.to_string())),
        _ => (name, None),
    };
    strata_core::ids::validate_new_name(id, true)
        .map_err(|e| E2bError::BadRequest(format!("template name {name:?}: {e}")))?;
    if let Some(t) = &tag {
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
            return Err(E2bError::BadRequest(format!("tag {t:?}: letters, digits, '-', '_', '.'")));
        }
    }
    Ok((id.to_string(), tag))
}

/// The template id of a name (its tag left out).
fn template_id(name: &str) -> Result<String, E2bError> {
    split_name(name).map(|(id, _)| id)
}

/// The strata template that is template `id` at `tag`: E2B's `default` tag is
/// the name alone (what `Sandbox.create("id")` starts), any other `id:tag`.
fn tagged(id: &str, tag: &str) -> String {
    if tag == "default" {
        id.to_string()
    } else {
        format!("{id}:{tag}")
    }
}

/// A stable UUID for a build (E2B's build ids are UUIDs): from the template's checkpoint.
fn build_uuid(checkpoint: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(checkpoint.as_bytes());
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    uuid_v4_of(b)
}

/// 16 bytes as a version-4 UUID (the version and variant bits set).
fn uuid_v4_of(mut b: [u8; 16]) -> String {
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

fn entry(level: &str, message: impl Into<String>, step: Option<&str>) -> Value {
    let mut v = json!({"timestamp": now_rfc3339(), "level": level, "message": message.into()});
    if let Some(s) = step {
        v["step"] = json!(s);
    }
    v
}

/// E2B's step label of strata's 1-based build step `index` (the first is the base).
fn e2b_step(index: usize) -> String {
    if index <= 1 {
        "base".into()
    } else {
        (index - 1).to_string()
    }
}

/// Where a tenant's uploaded `COPY` files live on the daemon.
fn files_dir(e: &SharedE2b, tenant: &str) -> PathBuf {
    e.st.state_dir.join("e2b").join("template-files").join(tenant)
}

fn valid_hash(h: &str) -> bool {
    h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// Body of `POST /v3/templates` (and the old `POST /v2/templates`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct BuildRequest {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    alias: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
}

/// `POST /v3/templates`: a build is requested; 202 with its ids.
pub(super) async fn request_build(
    State(e): State<SharedE2b>,
    call: super::control::Control,
    Json(req): Json<BuildRequest>,
) -> Result<Response, E2bError> {
    let name = req.name.or(req.alias).ok_or_else(|| E2bError::BadRequest("name missing".into()))?;
    let (id, name_tag) = split_name(&name)?;
    let tenant = call.engine.caller().creating_tenant();
    let build_id = uuid_v4();
    prune_files(&e, &tenant);
    let mut tags: Vec<String> = name_tag.into_iter().chain(req.tags).collect();
    tags.dedup();
    if tags.is_empty() {
        tags.push("default".into());
    }
    for t in &tags {
        split_name(&format!("{id}:{t}"))?;
    }
    let targets: Vec<String> = tags.iter().map(|t| tagged(&id, t)).collect();
    let mut st = e.lock();
    // Finished builds are forgotten an hour after they ended (their templates stay).
    st.builds.retain(|_, b| b.finished.is_none_or(|t| t.elapsed() < KEEP_FINISHED));
    st.builds.insert(
        build_id.clone(),
        TemplateBuild {
            tenant,
            template_id: id.clone(),
            status: "waiting",
            entries: Vec::new(),
            reason: None,
            finished: None,
            targets,
            output_lines: 0,
        },
    );
    drop(st);
    info!(template = %id, build = %build_id, "e2b template build requested");
    let body =
        json!({"templateID": id, "buildID": build_id, "public": false, "names": [id], "aliases": [id], "tags": tags});
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

/// A random UUID (version 4), as E2B's build ids are.
fn uuid_v4() -> String {
    uuid_v4_of(rand::random())
}

/// How long uploaded `COPY` files are kept unused (a build that names them
/// again keeps them; a step already cached does not need them).
const KEEP_FILES: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Removes a tenant's uploaded files unused for [`KEEP_FILES`].
fn prune_files(e: &SharedE2b, tenant: &str) {
    let Ok(dir) = std::fs::read_dir(files_dir(e, tenant)) else { return };
    for f in dir.flatten() {
        let old = f
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > KEEP_FILES);
        if old {
            let _ = std::fs::remove_file(f.path());
        }
    }
}

/// `GET /templates/{id}/files/{hash}`: whether a `COPY`'s files are here;
/// when not, a signed URL on this daemon to `PUT` them to (201).
pub(super) async fn files_link(
    State(e): State<SharedE2b>,
    call: super::control::Control,
    headers: HeaderMap,
    Path((_id, hash)): Path<(String, String)>,
) -> Result<Response, E2bError> {
    if !valid_hash(&hash) {
        return Err(E2bError::BadRequest(format!("files hash {hash:?}: 64 lowercase hex digits")));
    }
    let tenant = call.engine.caller().creating_tenant();
    let held = files_dir(&e, &tenant).join(&hash);
    // Used again: its age restarts (see [`prune_files`]).
    let present = std::fs::File::options()
        .write(true)
        .open(&held)
        .and_then(|f| f.set_modified(std::time::SystemTime::now()))
        .is_ok();
    let expires = access::unix_now() + UPLOAD_URL_TTL;
    let sig = access::files_upload_signature(&e.operator_token, &tenant, &hash, expires);
    let host = headers.get(axum::http::header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("localhost");
    let scheme = match headers.get("x-forwarded-proto").and_then(|v| v.to_str().ok()) {
        Some("https") => "https",
        _ => "http",
    };
    let url = format!("{scheme}://{host}/e2b/template-files/{tenant}/{hash}?expires={expires}&signature={sig}");
    Ok((StatusCode::CREATED, Json(json!({"present": present, "url": url}))).into_response())
}

/// Query of a files upload URL.
#[derive(Debug, Deserialize)]
pub(super) struct UploadQuery {
    expires: u64,
    signature: String,
}

/// `PUT /e2b/template-files/{tenant}/{hash}?expires=&signature=`: a `COPY`'s
/// files (the SDK's tar, gzipped or not), kept under their hash; the signed
/// URL is the credential (as an object store's presigned URL is). Written
/// aside and renamed into place once whole and synced.
pub(super) async fn upload_files(
    State(e): State<SharedE2b>,
    Path((tenant, hash)): Path<(String, String)>,
    Query(q): Query<UploadQuery>,
    body: Body,
) -> Result<Response, E2bError> {
    let refuse = |m: &str| E2bError::Unauthorized(m.to_string());
    if !valid_hash(&hash) || strata_engine::tenancy::validate_tenant(&tenant).is_err() {
        return Err(E2bError::BadRequest("not a files upload URL".into()));
    }
    if !access::is_files_upload_signature(&e.operator_token, &tenant, &hash, q.expires, &q.signature) {
        return Err(refuse("invalid signature"));
    }
    if q.expires < access::unix_now() {
        return Err(refuse("signature is already expired"));
    }
    let dir = files_dir(&e, &tenant);
    std::fs::create_dir_all(&dir).map_err(files_io)?;
    let tmp = dir.join(format!(".{hash}.{}", strata_core::ids::new_id()));
    let written = write_body(&tmp, body).await;
    match written {
        Ok(()) => std::fs::rename(&tmp, dir.join(&hash)).map_err(files_io)?,
        Err(err) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(err);
        }
    }
    Ok(StatusCode::OK.into_response())
}

/// An I/O failure of the template files store (500).
fn files_io(err: std::io::Error) -> E2bError {
    E2bError::Engine(strata_engine::error::EngineError::internal("template files", &err))
}

/// Streams `body` into a new file at `path` (at most [`MAX_FILES_UPLOAD`] bytes), synced.
async fn write_body(path: &std::path::Path, body: Body) -> Result<(), E2bError> {
    use futures_util::StreamExt;
    use tokio::io::AsyncWriteExt;
    let mut f = tokio::fs::OpenOptions::new().write(true).create_new(true).open(path).await.map_err(files_io)?;
    let mut stream = body.into_data_stream();
    let mut total = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|err| E2bError::BadRequest(format!("reading the upload: {err}")))?;
        total += chunk.len() as u64;
        if total > MAX_FILES_UPLOAD {
            return Err(E2bError::BadRequest(format!("files upload larger than {MAX_FILES_UPLOAD} bytes")));
        }
        f.write_all(&chunk).await.map_err(files_io)?;
    }
    f.sync_all().await.map_err(files_io)
}

/// A step of `POST /v2/templates/{id}/builds/{build}`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct E2bStep {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    force: bool,
    #[serde(default)]
    files_hash: Option<String>,
}

/// Body of `POST /v2/templates/{id}/builds/{build}`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct BuildSpec {
    #[serde(default)]
    from_image: Option<String>,
    #[serde(default)]
    from_template: Option<String>,
    #[serde(default)]
    from_image_registry: Option<Value>,
    #[serde(default)]
    start_cmd: Option<String>,
    #[serde(default)]
    ready_cmd: Option<String>,
    #[serde(default)]
    force: bool,
    #[serde(default)]
    steps: Vec<E2bStep>,
}

/// The strata build of an E2B build spec: its steps, and whether the cache is skipped.
fn strata_steps(e: &SharedE2b, tenant: &str, spec: &BuildSpec) -> Result<(Vec<(String, Step)>, bool), E2bError> {
    if spec.from_image_registry.is_some() {
        return Err(E2bError::Unsupported(
            "not supported by strata: images from private registries in a template build (import or pull the image with `strata image import` / `strata image pull`, then name it in from_image)".into(),
        ));
    }
    let base = match (&spec.from_template, &spec.from_image) {
        (Some(t), _) if t == "base" => BASE_TEMPLATE.to_string(),
        (Some(t), _) => t.clone(),
        (None, Some(img)) if img.split(':').next() == Some(E2B_BASE_IMAGE) => BASE_TEMPLATE.to_string(),
        (None, Some(img)) => img.clone(),
        (None, None) => BASE_TEMPLATE.to_string(),
    };
    let mut steps = vec![(format!("FROM {base}"), Step::From(base))];
    let arg = |s: &E2bStep, i: usize| s.args.get(i).cloned().unwrap_or_default();
    for (n, s) in spec.steps.iter().enumerate() {
        let bad = |m: &str| E2bError::BadRequest(format!("step {} ({}): {m}", n + 1, s.kind));
        match s.kind.as_str() {
            "RUN" => {
                let cmd = arg(s, 0);
                if cmd.is_empty() {
                    return Err(bad("no command"));
                }
                match s.args.get(1).filter(|u| !u.is_empty()) {
                    Some(user) => steps.push((format!("RUN [{user}] {cmd}"), Step::RunAs { cmd, user: user.clone() })),
                    None => steps.push((format!("RUN {cmd}"), Step::Run(cmd))),
                }
            }
            "COPY" => {
                let (src, dest) = (arg(s, 0), arg(s, 1));
                let hash = s.files_hash.clone().filter(|h| valid_hash(h)).ok_or_else(|| bad("no filesHash"))?;
                if src.is_empty() || dest.is_empty() {
                    return Err(bad("COPY takes a source and a destination"));
                }
                let archive = files_dir(e, tenant).join(&hash);
                if !archive.is_file() {
                    return Err(bad(&format!("the files of {src} (hash {hash}) were not uploaded")));
                }
                let owner =
                    Some(arg(s, 2))
                        .filter(|o| !o.is_empty())
                        .map(|o| if o.contains(':') { o } else { format!("{o}:{o}") });
                let mode = Some(arg(s, 3)).filter(|m| !m.is_empty());
                if mode.as_deref().is_some_and(|m| !m.bytes().all(|b| (b'0'..=b'7').contains(&b))) {
                    return Err(bad("mode is not octal"));
                }
                let text = format!(
                    "COPY {src} {dest} {} {} {hash}",
                    owner.as_deref().unwrap_or("-"),
                    mode.as_deref().unwrap_or("-")
                );
                steps.push((text, Step::CopyArchive { archive, digest: hash, src, dest, owner, mode }));
            }
            "ENV" => {
                if s.args.len() % 2 != 0 {
                    return Err(bad("ENV takes name/value pairs"));
                }
                let pairs: Vec<(String, String)> = s.args.chunks(2).map(|kv| (kv[0].clone(), kv[1].clone())).collect();
                let text =
                    format!("ENV {}", pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "));
                steps.push((text, Step::Env(pairs)));
            }
            "WORKDIR" => {
                let dir = arg(s, 0);
                if dir.is_empty() {
                    return Err(bad("no directory"));
                }
                steps.push((format!("WORKDIR {dir}"), Step::Workdir(dir)));
            }
            "USER" => {
                let user = arg(s, 0);
                if user.is_empty() || !user.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
                    return Err(bad("a user name: letters, digits, '-', '_', '.'"));
                }
                // E2B makes the user when the image has none.
                let cmd =
                    format!("id -u {user} >/dev/null 2>&1 || useradd -m -s /bin/bash {user} || adduser -D {user}");
                steps.push((format!("RUN [root] {cmd}"), Step::RunAs { cmd, user: "root".into() }));
                steps.push((format!("USER {user}"), Step::User(user)));
            }
            other => return Err(bad(&format!("unknown step type {other:?} (RUN, COPY, ENV, WORKDIR, USER)"))),
        }
    }
    let force = spec.force || spec.steps.iter().any(|s| s.force);
    Ok((steps, force))
}

/// `POST /v2/templates/{id}/builds/{build}`: the build starts (202).
pub(super) async fn start_build(
    State(e): State<SharedE2b>,
    call: super::control::Control,
    Path((id, build_id)): Path<(String, String)>,
    Json(spec): Json<BuildSpec>,
) -> Result<Response, E2bError> {
    let tenant = call.engine.caller().creating_tenant();
    let targets = {
        let st = e.lock();
        let b = own_build(&st.builds, &tenant, &id, &build_id)?;
        if b.status != "waiting" {
            return Err(E2bError::BadRequest(format!("build {build_id} is {}, not waiting", b.status)));
        }
        b.targets.clone()
    };
    let (first, more) = match targets.split_first() {
        Some((f, m)) => (f.clone(), m.to_vec()),
        None => (id.clone(), Vec::new()),
    };
    let (steps, force) = strata_steps(&e, &tenant, &spec)?;
    let opts = BuildOpts {
        no_cache: force,
        // E2B has no scan gate: the findings are recorded on the template, and logged.
        accept_findings: true,
        start_cmd: spec.start_cmd.clone().filter(|c| !c.is_empty()),
        ready_cmd: spec.ready_cmd.clone().filter(|c| !c.is_empty()),
        // Its steps come from E2B's build spec (archives uploaded for it): not a build file to run again.
        recipe: None,
    };
    let count = steps.len();
    let mut events = call.engine.build_template_steps(first, steps, opts);
    let engine = call.engine.clone();
    set_status(&e, &build_id, "building", None, entry("info", format!("building template {id}: {count} steps"), None));
    tokio::spawn(async move {
        let mut step = String::from("base");
        while let Some(ev) = events.recv().await {
            match ev {
                BuildEvent::Step { index, count, instruction, cached } => {
                    step = e2b_step(index);
                    let note = if cached { " (cached)" } else { "" };
                    push(&e, &build_id, entry("info", format!("[{index}/{count}] {instruction}{note}"), Some(&step)));
                }
                BuildEvent::Output { data_b64, .. } => {
                    let bytes = base64::engine::general_purpose::STANDARD.decode(&data_b64).unwrap_or_default();
                    for line in String::from_utf8_lossy(&bytes).lines().filter(|l| !l.is_empty()) {
                        push_output(&e, &build_id, entry("info", line, Some(&step)));
                    }
                }
                BuildEvent::StepDone { index, duration_ms, .. } => {
                    push(&e, &build_id, entry("debug", format!("step {index} done in {duration_ms} ms"), Some(&step)));
                }
                BuildEvent::Done { template, steps_run, steps_cached, duration_ms } => {
                    if let Some(a) = &template.accepted_findings {
                        let msg = format!(
                            "the state-hygiene scan had findings, recorded on the template: {}",
                            serde_json::to_string(a).unwrap_or_default()
                        );
                        push(&e, &build_id, entry("warn", msg, Some("finalize")));
                    }
                    // The build's other tags: templates of the same checkpoint.
                    for t in &more {
                        let req = strata_api::CreateTemplateRequest {
                            name: t.clone(),
                            from: template.checkpoint.clone(),
                            replace: true,
                            accept_findings: true,
                        };
                        if let Err(err) = engine.create_template(&req).await {
                            let reason = json!({"message": err.body.message, "step": "finalize"});
                            let line = entry("error", format!("tag {t}: {}", err.body.message), Some("finalize"));
                            set_status(&e, &build_id, "error", Some(reason), line);
                            return;
                        }
                    }
                    let also = if more.is_empty() { String::new() } else { format!(" (also as {})", more.join(", ")) };
                    let msg = format!(
                        "template {} ready{also}: {steps_run} steps run, {steps_cached} cached, {duration_ms} ms",
                        template.name
                    );
                    set_status(&e, &build_id, "ready", None, entry("info", msg, Some("finalize")));
                }
                BuildEvent::Failed { index, error } => {
                    let at = e2b_step(index);
                    let reason = json!({"message": error.message, "step": at});
                    set_status(&e, &build_id, "error", Some(reason), entry("error", error.message.clone(), Some(&at)));
                }
            }
        }
    });
    Ok(StatusCode::ACCEPTED.into_response())
}

fn push(e: &SharedE2b, build: &str, v: Value) {
    if let Some(b) = e.lock().builds.get_mut(build) {
        b.entries.push(v);
    }
}

/// The most output lines one build keeps for its status (its steps, its end
/// and its error are always kept; the native build stream has all output).
const MAX_OUTPUT_LINES: usize = 20_000;

/// A line of a step's output, while the build keeps fewer than
/// [`MAX_OUTPUT_LINES`]; then one warning says the rest is not kept.
fn push_output(e: &SharedE2b, build: &str, v: Value) {
    if let Some(b) = e.lock().builds.get_mut(build) {
        b.output_lines += 1;
        if b.output_lines <= MAX_OUTPUT_LINES {
            b.entries.push(v);
        } else if b.output_lines == MAX_OUTPUT_LINES + 1 {
            let note = format!("the build's output past {MAX_OUTPUT_LINES} lines is not kept here");
            b.entries.push(entry("warn", note, v["step"].as_str()));
        }
    }
}

fn set_status(e: &SharedE2b, build: &str, status: &'static str, reason: Option<Value>, v: Value) {
    if let Some(b) = e.lock().builds.get_mut(build) {
        b.status = status;
        b.reason = reason.or(b.reason.take());
        b.entries.push(v);
        if matches!(status, "ready" | "error") {
            b.finished = Some(std::time::Instant::now());
        }
    }
}

fn own_build<'a>(
    builds: &'a HashMap<String, TemplateBuild>,
    tenant: &str,
    id: &str,
    build_id: &str,
) -> Result<&'a TemplateBuild, E2bError> {
    builds
        .get(build_id)
        .filter(|b| b.tenant == tenant && b.template_id == id)
        .ok_or_else(|| E2bError::NotFound(format!("build {build_id} of template {id} not found")))
}

/// Query of a build's status.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct StatusQuery {
    #[serde(default)]
    logs_offset: Option<usize>,
}

/// `GET /templates/{id}/builds/{build}/status?logsOffset=N`: the status and
/// the log entries from N on (at most 100 per answer).
pub(super) async fn build_status(
    State(e): State<SharedE2b>,
    call: super::control::Control,
    Path((id, build_id)): Path<(String, String)>,
    Query(q): Query<StatusQuery>,
) -> Result<Response, E2bError> {
    let tenant = call.engine.caller().creating_tenant();
    let st = e.lock();
    let b = own_build(&st.builds, &tenant, &id, &build_id)?;
    let from = q.logs_offset.unwrap_or(0).min(b.entries.len());
    let page: Vec<Value> = b.entries[from..].iter().take(LOG_PAGE).cloned().collect();
    let logs: Vec<Value> = page.iter().map(|v| v["message"].clone()).collect();
    let mut body = json!({"templateID": id, "buildID": build_id, "status": b.status, "logs": logs, "logEntries": page});
    if let Some(r) = &b.reason {
        body["reason"] = r.clone();
    }
    Ok(Json(body).into_response())
}

/// `GET /templates/aliases/{alias}`: 200 when a template (or image) of that
/// name is the caller's to use, else 404.
pub(super) async fn alias(call: super::control::Control, Path(alias): Path<String>) -> Result<Response, E2bError> {
    let id = template_id(&alias)?;
    let known = call.engine.list_templates().await?.into_iter().any(|t| t.name == id);
    if !known {
        return Err(E2bError::NotFound(format!("template {alias:?} not found")));
    }
    Ok(Json(json!({"templateID": id, "public": false})).into_response())
}

/// The tags of template `id`: `default` for the template of that name, `t`
/// for each `id:t`.
async fn tags_of(call: &super::control::Control, id: &str) -> Result<Vec<(String, strata_api::Template)>, E2bError> {
    let prefix = format!("{id}:");
    Ok(call
        .engine
        .list_templates()
        .await?
        .into_iter()
        .filter_map(|t| match t.name.strip_prefix(&prefix) {
            Some(tag) => Some((tag.to_string(), t)),
            None if t.name == id => Some(("default".to_string(), t)),
            None => None,
        })
        .collect())
}

/// `GET /templates/{id}/tags`: `[{tag, buildID, createdAt}]` (the build: a UUID of its checkpoint).
pub(super) async fn get_tags(call: super::control::Control, Path(name): Path<String>) -> Result<Response, E2bError> {
    let id = template_id(&name)?;
    let tags = tags_of(&call, &id).await?;
    if tags.is_empty() {
        return Err(E2bError::NotFound(format!("template {id:?} not found")));
    }
    let body: Vec<Value> = tags
        .iter()
        .map(|(tag, t)| json!({"tag": tag, "buildID": build_uuid(&t.checkpoint), "createdAt": t.created_at}))
        .collect();
    Ok(Json(body).into_response())
}

/// Body of `POST /templates/tags`.
#[derive(Debug, Deserialize)]
pub(super) struct AssignTags {
    target: String,
    tags: Vec<String>,
}

/// `POST /templates/tags`: the build `target` (`name:tag`, or `name`: its
/// default) is also tagged `tags` (each a template of the same checkpoint); 201.
pub(super) async fn assign_tags(
    call: super::control::Control,
    Json(req): Json<AssignTags>,
) -> Result<Response, E2bError> {
    let (id, tag) = split_name(&req.target)?;
    let source = tagged(&id, tag.as_deref().unwrap_or("default"));
    let from = tags_of(&call, &id)
        .await?
        .into_iter()
        .find(|(_, t)| t.name == source)
        .map(|(_, t)| t.checkpoint)
        .ok_or_else(|| E2bError::NotFound(format!("template {:?} not found", req.target)))?;
    if req.tags.is_empty() {
        return Err(E2bError::BadRequest("tags missing".into()));
    }
    for t in &req.tags {
        split_name(&format!("{id}:{t}"))?;
    }
    for t in &req.tags {
        let create = strata_api::CreateTemplateRequest {
            name: tagged(&id, t),
            from: from.clone(),
            replace: true,
            accept_findings: true,
        };
        call.engine.create_template(&create).await?;
    }
    let body = json!({"tags": req.tags, "buildID": build_uuid(&from)});
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// Body of `DELETE /templates/tags`.
#[derive(Debug, Deserialize)]
pub(super) struct RemoveTags {
    name: String,
    tags: Vec<String>,
}

/// `DELETE /templates/tags`: the templates of those tags are removed (their
/// checkpoints stay while anything needs them); 204, or 404 naming a tag the
/// template does not have (then nothing is removed).
pub(super) async fn remove_tags(
    call: super::control::Control,
    Json(req): Json<RemoveTags>,
) -> Result<Response, E2bError> {
    let id = template_id(&req.name)?;
    let have: Vec<String> = tags_of(&call, &id).await?.into_iter().map(|(t, _)| t).collect();
    if let Some(missing) = req.tags.iter().find(|t| !have.contains(t)) {
        return Err(E2bError::NotFound(format!("template {id:?} has no tag {missing:?}")));
    }
    for t in &req.tags {
        call.engine.delete_template(&tagged(&id, t)).await?;
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_steps_and_ids() {
        assert_eq!(template_id("my-tpl:v2").unwrap(), "my-tpl");
        assert_eq!(split_name("app:v1").unwrap(), ("app".to_string(), Some("v1".to_string())));
        assert_eq!(split_name("app").unwrap(), ("app".to_string(), None));
        assert!(split_name("app:v 1").is_err());
        assert_eq!((tagged("app", "default"), tagged("app", "v1")), ("app".to_string(), "app:v1".to_string()));
        assert_eq!(build_uuid("abc"), build_uuid("abc"));
        assert_eq!((build_uuid("abc").len(), &build_uuid("abc")[14..15]), (36, "4"));
        assert_eq!(template_id("team/x").unwrap(), "team/x", "strata names take '/', as image names do");
        assert!(template_id("").is_err() && template_id("a b").is_err());
        assert_eq!(
            (e2b_step(0), e2b_step(1), e2b_step(2), e2b_step(5)),
            ("base".into(), "base".into(), "1".into(), "4".into())
        );
        let u = uuid_v4();
        assert_eq!((u.len(), &u[14..15]), (36, "4"));
        assert!(valid_hash(&"a".repeat(64)) && !valid_hash(&"A".repeat(64)) && !valid_hash("abc"));
    }
}
