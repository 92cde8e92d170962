//! Sandbox lifecycle: create, start, stop, destroy, TTL expiry, init watching
//! and re-adoption after a daemon restart.
//!
//! Every state change goes through [`transition`], which asks the core state
//! machine whether it is legal and records it (with its event) in one transaction.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant, SystemTime};

use strata_api::{CreateSandboxRequest, ErrorCode, Lifecycle, Sandbox, SandboxEvent, SandboxState};
use strata_core::lifecycle::{has_processes, next_state};
use strata_core::{ids, rule_of_two, units, Action};
use strata_runtime::{SandboxHandle, SandboxSpec};
use strata_store::db::{SandboxRecord, Transition};
use tracing::{info, info_span, warn, Instrument};

use crate::error::{EngineError, EngineResult};
use crate::state::Shared;

/// Grace period between SIGTERM and SIGKILL when stopping.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// Now, RFC 3339 with milliseconds.
pub fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

fn parse_time(s: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(s).ok()
}

/// Loads a sandbox the current caller may see ([`crate::tenancy`]) or fails with 404.
pub fn load(st: &Shared, id: &str) -> EngineResult<SandboxRecord> {
    crate::tenancy::find_sandbox(st, id)?.ok_or_else(|| EngineError::sandbox_not_found(id))
}

/// Loads a sandbox a transition is asked of: one that was destroyed is a 409
/// with state `destroyed` (the event log remembers its id); an id never seen is a 404.
pub fn load_for_transition(st: &Shared, id: &str) -> EngineResult<SandboxRecord> {
    match crate::tenancy::find_sandbox(st, id)? {
        Some(rec) => Ok(rec),
        None if st.db.sandbox_tenant_by_id(id)?.is_some_and(|t| !crate::tenancy::visible(&t)) => {
            Err(EngineError::sandbox_not_found(id))
        }
        None => match st.db.destroyed_event(id)? {
            Some(ev) => Err(EngineError::invalid_state(
                SandboxState::Destroyed,
                format!("sandbox {id} was destroyed at {} ({})", ev.time, ev.reason),
            )),
            None => Err(EngineError::sandbox_not_found(id)),
        },
    }
}

/// Takes a sandbox's operation lock (one transition at a time) and loads its
/// record as it is under the lock ([`load_for_transition`]). Keep the guard
/// while changing the sandbox.
pub async fn lock_and_load(st: &Shared, id: &str) -> EngineResult<(tokio::sync::OwnedMutexGuard<()>, SandboxRecord)> {
    let rec = load_for_transition(st, id)?;
    let guard = st.lock_for(&rec.sandbox.id).lock_owned().await;
    Ok((guard, load(st, &rec.sandbox.id)?))
}

/// The init handle of a record in a state with processes.
pub fn handle_of(rec: &SandboxRecord) -> Option<SandboxHandle> {
    Some(SandboxHandle { init_pid: rec.sandbox.init_pid?, init_start_time: rec.init_start_time? })
}

/// A requested state change: the action and why.
#[derive(Debug, Clone, Copy)]
pub struct Change<'a> {
    /// What to do.
    pub action: Action,
    /// Reason code recorded in the event.
    pub reason: &'a str,
    /// Optional detail recorded in the event.
    pub detail: Option<&'a str>,
}

impl<'a> Change<'a> {
    /// A change with a reason and no detail.
    pub fn new(action: Action, reason: &'a str) -> Self {
        Change { action, reason, detail: None }
    }

    /// Adds a detail.
    pub fn detail(mut self, detail: &'a str) -> Self {
        self.detail = Some(detail);
        self
    }
}

/// Applies `action` to a sandbox in state `from`: checks the transition table,
/// records the new state and its event atomically, and wakes event followers.
pub fn transition(
    st: &Shared,
    id: &str,
    from: SandboxState,
    change: Change<'_>,
    started: Instant,
    init: Option<&SandboxHandle>,
) -> EngineResult<SandboxEvent> {
    let Change { action, reason, detail } = change;
    let to = next_state(from, action)?;
    // Error messages may quote a process's words: never a secret's value.
    let redacted = detail.map(|d| st.secrets.get_or_empty(id).redact_str(d));
    let detail = redacted.as_deref();
    let t = Transition { to, reason, detail, duration_ms: started.elapsed().as_millis() as u64, time: &now() };
    let ev = st
        .db
        .transition(id, from, &t, init.map(|h| (h.init_pid, h.init_start_time)))?
        .ok_or_else(|| EngineError::new(ErrorCode::InvalidState, format!("sandbox {id} changed state concurrently")))?;
    info!(sandbox = id, from = %from, to = %to, reason, "transition");
    st.metrics.transition(to, reason);
    if let Some(phase) = crate::metrics::phase_of(action) {
        st.metrics.observe(phase, started.elapsed());
    }
    crate::accounting::on_transition(st, id, from, to, action);
    st.notify_events(ev.seq);
    Ok(ev)
}

/// Makes sure the sandbox's own disk (when it has one) exists and is mounted.
async fn ensure_disk(st: &Shared, rec: &SandboxRecord) -> EngineResult<()> {
    let (Some(bytes), true) =
        (rec.sandbox.limits.disk_bytes, crate::disk::enforced(rec.sandbox.limits.disk_quota.as_deref()))
    else {
        return Ok(());
    };
    let (dir, pool) = (st.sandbox_dir(&rec.sandbox.id), st.disks.clone());
    tokio::task::spawn_blocking(move || crate::disk::ensure(&dir, bytes, &pool))
        .await
        .map_err(|e| EngineError::internal("disk task", &e))?
        .map_err(|e| {
            EngineError::new(
                ErrorCode::Internal,
                format!("the disk of sandbox {} ({}): {e}", rec.sandbox.id, units::format_size(bytes)),
            )
        })
}

/// The runtime's description of `rec` (its disk must be in place: [`ensure_disk`]).
fn spec_for(st: &Shared, rec: &SandboxRecord) -> EngineResult<SandboxSpec> {
    let dir = st.sandbox_dir(&rec.sandbox.id);
    let lower_dirs = rec
        .layers
        .iter()
        .map(|d| st.layers.fs_dir(d).map_err(|e| EngineError::internal("layer", &e)))
        .collect::<EngineResult<Vec<_>>>()?;
    for d in &rec.layers {
        if !st.layers.contains(d) {
            return Err(EngineError::new(
                ErrorCode::Internal,
                format!("layer {d} of sandbox {} is missing from the layer store", rec.sandbox.id),
            ));
        }
    }
    Ok(SandboxSpec {
        id: rec.sandbox.id.clone(),
        hostname: rec.sandbox.hostname.clone(),
        lower_dirs,
        upper_dir: crate::disk::upper_dir(&dir),
        work_dir: crate::disk::work_dir(&dir),
        rootfs_dir: dir.join("rootfs"),
        limits: rec.sandbox.limits.clone(),
        log_path: dir.join("init.log"),
        machine_id: machine_id(&rec.sandbox.id),
        fork_generation: rec.sandbox.fork_generation,
        secrets: st.secrets.get(&rec.sandbox.id)?.files(),
        secrets_owner: rec.image_config.user.clone().filter(|u| !u.is_empty()),
        // Filled in by crate::network::prepare for egress sandboxes.
        netns_path: None,
        resolv_conf: None,
    })
}

/// Chains longer than this are mounted through one flattened lower directory
/// (overlayfs takes a bounded number of lower layers). Checkpoints, layers and
/// their ids stay as they are; only the mount changes.
pub const SQUASH_AT: usize = 24;

/// Where the flattened form of a deep chain is kept: `layers/squashed/<sha256 of the chain>`.
pub fn squashed_dir(layers: &strata_store::LayerStore, chain_dirs: &[std::path::PathBuf]) -> std::path::PathBuf {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for d in chain_dirs {
        h.update(d.as_os_str().as_encoded_bytes());
        h.update(b"\n");
    }
    layers.root().join("squashed").join(hex::encode(h.finalize()))
}

/// Replaces a deep chain of lower directories with its flattened form, building
/// it (staged, then renamed into place) the first time.
fn flatten_if_deep(
    mut spec: SandboxSpec,
    layers: &strata_store::LayerStore,
) -> Result<SandboxSpec, strata_runtime::RuntimeError> {
    if spec.lower_dirs.len() <= SQUASH_AT {
        return Ok(spec);
    }
    let dir = squashed_dir(layers, &spec.lower_dirs);
    if !dir.join("fs").is_dir() {
        let t = Instant::now();
        let staging = layers.root().join("staging").join(format!("squash-{}", ids::new_id()));
        let fs_dir = staging.join("fs");
        let build = || -> Result<(), String> {
            std::fs::create_dir_all(&fs_dir).map_err(|e| e.to_string())?;
            strata_image::squash::squash(&spec.lower_dirs, &fs_dir).map_err(|e| crate::error::chain(&e))?;
            std::fs::create_dir_all(dir.parent().expect("squashed/ parent")).map_err(|e| e.to_string())?;
            match std::fs::rename(&staging, &dir) {
                Ok(()) => Ok(()),
                // Built concurrently by another start of the same chain: use that one.
                Err(_) if dir.join("fs").is_dir() => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        };
        let res = build();
        let _ = strata_store::fsutil::remove_dir_all_if_exists(&staging);
        res.map_err(|e| {
            strata_runtime::RuntimeError::Setup(format!("flattening a {}-layer chain: {e}", spec.lower_dirs.len()))
        })?;
        info!(layers = spec.lower_dirs.len(), ms = t.elapsed().as_millis() as u64, "flattened a deep layer chain");
    }
    spec.lower_dirs = vec![dir.join("fs")];
    Ok(spec)
}

/// A sandbox's /etc/machine-id: stable across its restarts, different for every sandbox (and fork).
fn machine_id(id: &str) -> String {
    use sha2::Digest;
    hex::encode(&sha2::Sha256::digest(format!("strata machine-id {id}").as_bytes())[..16])
}

/// The RFC 3339 time `ttl` from now (`None` without a TTL).
pub fn expiry(ttl: Option<&str>) -> EngineResult<Option<String>> {
    match ttl {
        None => Ok(None),
        Some(t) => {
            let d = units::parse_duration(t)?;
            Ok(Some(humantime::format_rfc3339_millis(SystemTime::now() + d).to_string()))
        }
    }
}

/// The mount description of `rec`'s root (deep chains flattened), as its init would get it.
pub(crate) async fn mount_spec(st: &Shared, rec: &SandboxRecord) -> EngineResult<SandboxSpec> {
    ensure_disk(st, rec).await?;
    let spec = spec_for(st, rec)?;
    let layers = st.layers.clone();
    tokio::task::spawn_blocking(move || flatten_if_deep(spec, &layers))
        .await
        .map_err(|e| EngineError::internal("flatten task", &e))?
        .map_err(|e| EngineError::internal("flatten", &e))
}

/// Starts init for `rec` (in `from` state) and records `action`; the caller
/// holds the sandbox's operation lock.
pub(crate) async fn boot(
    st: &Shared,
    rec: &SandboxRecord,
    from: SandboxState,
    action: Action,
    reason: &str,
) -> EngineResult<SandboxHandle> {
    let started = Instant::now();
    if let Err(e) = ensure_disk(st, rec).await {
        transition(
            st,
            &rec.sandbox.id,
            from,
            Change::new(Action::Fail, "start_failed").detail(&e.body.message),
            started,
            None,
        )?;
        return Err(e);
    }
    let mut spec = spec_for(st, rec)?;
    if let Err(e) = crate::network::prepare(st, &rec.sandbox.id, &mut spec).await {
        transition(
            st,
            &rec.sandbox.id,
            from,
            Change::new(Action::Fail, "start_failed").detail(&e.body.message),
            started,
            None,
        )?;
        return Err(e);
    }
    let rt = st.runtime.clone();
    let layers = st.layers.clone();
    let result = tokio::task::spawn_blocking(move || flatten_if_deep(spec, &layers).and_then(|spec| rt.start(&spec)))
        .await
        .map_err(|e| EngineError::internal("start task", &e))?;
    match result {
        Ok(handle) => {
            transition(st, &rec.sandbox.id, from, Change::new(action, reason), started, Some(&handle))?;
            st.db.set_expires_at(&rec.sandbox.id, expiry(rec.sandbox.ttl.as_deref())?.as_deref())?;
            watch_init(st.clone(), rec.sandbox.id.clone(), handle.clone());
            Ok(handle)
        }
        Err(e) => {
            let msg = crate::error::chain(&e);
            transition(
                st,
                &rec.sandbox.id,
                from,
                Change::new(Action::Fail, "start_failed").detail(&msg),
                started,
                None,
            )?;
            // An image that cannot run is the caller's input (400), anything else the host's (500).
            let code = if matches!(e, strata_runtime::RuntimeError::Image(_)) {
                ErrorCode::BadRequest
            } else {
                ErrorCode::Internal
            };
            Err(EngineError::new(code, format!("sandbox {} failed to start: {msg}", rec.sandbox.id)))
        }
    }
}

/// Creates and starts a sandbox.
pub async fn create(st: &Shared, req: CreateSandboxRequest) -> EngineResult<Sandbox> {
    create_with(st, req, Lineage::default()).await
}

/// Where a new sandbox's filesystem comes from beyond its source, for forks.
#[derive(Debug, Default, Clone)]
pub struct Lineage {
    /// Fork generation of the new sandbox.
    pub fork_generation: u32,
    /// The Rule of Two was already checked for this create (a fork checks once for all its children).
    pub rule_of_two_checked: bool,
}

/// The layer chain, image identity and defaults a sandbox starts from: an image,
/// or a checkpoint (whose id becomes the sandbox's base and head).
pub struct Source {
    /// Image or checkpoint name shown as the sandbox's source.
    pub name: String,
    /// Image id at the bottom of the chain.
    pub image_id: String,
    /// Layers, bottom first.
    pub layers: Vec<String>,
    /// Process defaults.
    pub config: strata_api::ImageConfig,
    /// The checkpoint, when the source is one.
    pub checkpoint: Option<String>,
    /// The checkpoint's tenant, which a sandbox made from it joins.
    pub tenant: Option<String>,
    /// Rule-of-Two capabilities declared on the checkpoint, which a sandbox made from it inherits.
    pub capabilities: Vec<strata_api::Capability>,
    /// The checkpoint kept its processes (a warm checkpoint).
    pub warm: bool,
}

/// Resolves a source key among images (shared by every tenant), templates
/// and checkpoints the caller may see, in the order of [`strata_core::ids`]:
/// an exact id (a checkpoint's, an image's `sha256:...`), then an exact name
/// (an image's, a template's, a checkpoint's, in that order), then an id
/// prefix that only one image or visible checkpoint has.
pub fn resolve_source(st: &Shared, key: &str) -> EngineResult<Source> {
    let of_image = |image: strata_api::Image| Source {
        name: image.name,
        image_id: image.id,
        layers: image.layers.into_iter().map(|l| l.digest).collect(),
        config: image.config,
        checkpoint: None,
        tenant: None,
        capabilities: Vec::new(),
        warm: false,
    };
    let of_checkpoint = |name: String, c: strata_api::Checkpoint, config: strata_api::ImageConfig| Source {
        name,
        image_id: c.image_id,
        layers: c.layers,
        config,
        warm: c.processes.is_some(),
        checkpoint: Some(c.id),
        tenant: Some(c.tenant),
        capabilities: c.capabilities,
    };
    // 1. Exact ids.
    if let Some((c, config)) = st.db.checkpoint_by_id(key)?.filter(|(c, _)| crate::tenancy::visible(&c.tenant)) {
        return Ok(of_checkpoint(c.name.clone(), c, config));
    }
    let image = st.db.get_image(key)?;
    if let Some(image) = image.clone().filter(|i| i.id == key || i.name == key) {
        // 2. ... then names, an image's first (get_image tried its id before its name).
        return Ok(of_image(image));
    }
    if let Some((ckpt, _)) = crate::tenancy::find_template(st, key)? {
        if let Some((c, config)) = st.db.checkpoint_by_id(&ckpt)? {
            return Ok(of_checkpoint(key.to_string(), c, config));
        }
    }
    let checkpoint = crate::tenancy::find_checkpoint(st, key)?;
    if let Some((c, config)) = checkpoint.clone().filter(|(c, _)| c.name == key) {
        return Ok(of_checkpoint(c.name.clone(), c, config));
    }
    // 3. An id prefix: unique across images and the caller's checkpoints.
    match (image, checkpoint) {
        (Some(image), None) => Ok(of_image(image)),
        (None, Some((c, config))) => Ok(of_checkpoint(c.name.clone(), c, config)),
        _ => Err(EngineError::new(ErrorCode::ImageNotFound, format!("no image, template or checkpoint named {key:?} (see `strata image ls`, `strata template ls`, `strata checkpoint ls`)"))),
    }
}

/// Creates and starts a sandbox with the given lineage.
pub async fn create_with(st: &Shared, req: CreateSandboxRequest, lineage: Lineage) -> EngineResult<Sandbox> {
    let started = Instant::now();
    let sb = create_inner(st, req, lineage).await?;
    st.metrics.observe("ready", started.elapsed());
    Ok(sb)
}

async fn create_inner(st: &Shared, req: CreateSandboxRequest, lineage: Lineage) -> EngineResult<Sandbox> {
    let source = resolve_source(st, &req.source)?;
    let id = ids::new_id();
    let name = match &req.name {
        Some(n) => {
            ids::validate_new_name(n, false)?;
            n.clone()
        }
        None => id.clone(),
    };
    if let Some(t) = &req.ttl {
        units::parse_duration(t)?;
    }
    let mut policy = crate::policy::initial(req.lifecycle, req.policy.as_ref())?;
    // The daemon's defaults fill what the request leaves out (recorded on the
    // sandbox); then every limit must be one a sandbox can run with on this host.
    let mut req = req;
    st.admission.apply_defaults(&mut req.limits);
    st.admission.validate(&req.limits)?;
    req.limits.disk_quota = Some(crate::disk::describe(req.limits.disk_bytes));
    for k in req.env.keys() {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(EngineError::bad_request(format!("invalid environment variable name {k:?}")));
        }
    }
    // Read and checked before anything is recorded: a bad secret creates nothing.
    let secrets = crate::secrets::validate(&req.secrets)?;
    // From a warm checkpoint the processes come along unless asked otherwise.
    let warm_from = match (source.warm, req.processes, &source.checkpoint) {
        (true, None | Some(true), Some(c)) => {
            crate::warm::check_startable(st, &id, !req.secrets.is_empty(), c)?;
            Some(c.clone())
        }
        (false, Some(true), _) => {
            return Err(EngineError::bad_request(format!(
                "{} kept no processes (processes: true needs a checkpoint taken with processes)",
                source.name
            )))
        }
        _ => None,
    };
    let network = crate::network::check(st, req.network.as_ref())?;
    let tenant = source.tenant.clone().unwrap_or_else(crate::tenancy::creating_tenant);
    // Host admission and the tenant's quota, before anything is recorded: the
    // reservation counts this sandbox in every other check until its record does.
    let _admitted = st.admission.admit(st, &id, &tenant, &req.limits, crate::admission::Purpose::Create)?;
    // The Rule of Two, before anything is recorded: all three capabilities need an approval.
    let secret_names: Vec<String> = req.secrets.iter().map(|s| s.name.clone()).collect();
    let grants = rule_of_two::grants(&rule_of_two::Exposure {
        declared: &req.capabilities,
        inherited: Some((source.name.as_str(), source.capabilities.as_slice())),
        secrets: &secret_names,
        network: network.as_ref().map(|(spec, _)| spec),
        ..Default::default()
    });
    if !lineage.rule_of_two_checked {
        let target = match &req.name {
            Some(n) => format!("from {} named {n}", source.name),
            None => format!("from {}", source.name),
        };
        crate::approvals::gate(st, &tenant, "create sandbox", &target, &grants)?;
    }
    // Declared and inherited capabilities stay with the sandbox (and its checkpoints).
    policy.capabilities = req
        .capabilities
        .iter()
        .chain(&source.capabilities)
        .copied()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let hostname = match &req.hostname {
        Some(h) => {
            ids::validate_name(h, false)?;
            h.clone()
        }
        None => ids::hostname_for(if req.name.is_some() { &name } else { &id[..12] }),
    };
    let time = now();
    let rec = SandboxRecord {
        sandbox: Sandbox {
            id: id.clone(),
            tenant,
            name,
            state: SandboxState::Creating,
            state_reason: "user".into(),
            state_detail: None,
            source: source.name.clone(),
            image_id: source.image_id.clone(),
            runtime: st.runtime.name().into(),
            lifecycle: req.lifecycle,
            created_at: time.clone(),
            updated_at: time,
            inactive_since: None,
            policy,
            ttl: req.ttl.clone(),
            expires_at: None,
            limits: req.limits.clone(),
            env: req.env.clone(),
            hostname,
            labels: req.labels.clone(),
            init_pid: None,
            oom_kills: 0,
            base_checkpoint: source.checkpoint.clone(),
            head_checkpoint: source.checkpoint.clone(),
            fork_generation: lineage.fork_generation,
            standby: None,
            secrets: Vec::new(),
            network: Default::default(),
            capabilities: Vec::new(),
            allow_setuid: req.allow_setuid,
        },
        layers: source.layers,
        init_start_time: None,
        image_config: source.config,
    };
    let lock = st.lock_for(&id);
    let _g = lock.lock().await;
    st.secrets.put(&id, secrets)?;
    if let Err(e) = crate::network::register(st, &id, network) {
        st.secrets.remove(&id);
        return Err(e);
    }
    if let Err(e) = st.db.insert_sandbox(&rec) {
        st.secrets.remove(&id);
        crate::network::forget(st, &id).await;
        return Err(e.into());
    }
    let span = info_span!("sandbox", id = %id);
    let res = match &warm_from {
        Some(c) => {
            crate::warm::boot(st, &rec, c, SandboxState::Creating, Action::Ready, "created").instrument(span).await
        }
        None => boot(st, &rec, SandboxState::Creating, Action::Ready, "created").instrument(span).await,
    };
    if let Err(mut e) = res {
        // A sandbox that never started holds nothing worth keeping: roll the
        // creation back completely (record, disk, cgroup, secrets, network);
        // the event log keeps its creating -> error -> destroyed story.
        drop(_g);
        match destroy(st, &id, true, "start_failed").await {
            Ok(_) => e.body.message.push_str(" (nothing was kept: the sandbox was removed)"),
            Err(d) => warn!(sandbox = %id, error = %d.body.message, "removing a sandbox that failed to start"),
        }
        return Err(e);
    }
    Ok(load(st, &id)?.sandbox)
}

/// Stops a sandbox's processes, keeping its filesystem.
pub async fn stop(st: &Shared, id: &str, reason: &str, grace: Duration) -> EngineResult<SandboxEvent> {
    let (_g, rec) = lock_and_load(st, id).await?;
    stop_locked(st, &rec, reason, grace).await
}

/// Stops a sandbox whose operation lock the caller holds.
pub async fn stop_locked(
    st: &Shared,
    rec: &SandboxRecord,
    reason: &str,
    grace: Duration,
) -> EngineResult<SandboxEvent> {
    let started = Instant::now();
    let from = rec.sandbox.state;
    next_state(from, Action::Stop)?;
    if has_processes(from) {
        crate::hooks::run(st, rec, crate::hooks::Stage::BeforeStop).await;
        crate::accounting::final_sample(st, &rec.sandbox.id);
    }
    kill_processes(st, rec, grace).await?;
    crate::network::release(st, &rec.sandbox.id).await;
    // A stopped sandbox starts afresh: a standby image has nothing left to resume.
    crate::standby::discard(st, &rec.sandbox.id);
    let ev = transition(st, &rec.sandbox.id, from, Change::new(Action::Stop, reason), started, None)?;
    st.db.set_expires_at(&rec.sandbox.id, None)?;
    Ok(ev)
}

/// Kills every process of a sandbox (if any; SIGTERM, SIGKILL after `grace`)
/// and releases its cgroup.
pub(crate) async fn kill_processes(st: &Shared, rec: &SandboxRecord, grace: Duration) -> EngineResult<()> {
    let id = rec.sandbox.id.clone();
    let handle = handle_of(rec);
    let rt = st.runtime.clone();
    tokio::task::spawn_blocking(move || -> Result<(), strata_runtime::RuntimeError> {
        if let Some(h) = handle {
            rt.stop(&id, &h, grace)?;
        }
        rt.cleanup(&id)
    })
    .await
    .map_err(|e| EngineError::internal("stop task", &e))?
    .map_err(|e| EngineError::internal("stop", &e))?;
    Ok(())
}

/// SIGKILLs every process of a sandbox and waits until they are gone.
async fn kill_only(st: &Shared, rec: &SandboxRecord) -> EngineResult<()> {
    let Some(h) = handle_of(rec) else { return Ok(()) };
    let (rt, id) = (st.runtime.clone(), rec.sandbox.id.clone());
    tokio::task::spawn_blocking(move || rt.stop(&id, &h, Duration::ZERO))
        .await
        .map_err(|e| EngineError::internal("kill task", &e))?
        .map_err(|e| EngineError::internal("kill", &e))?;
    Ok(())
}

/// Removes the cgroup and directory of a sandbox that has no processes and no record.
fn release_resources(st: &Shared, id: &str) {
    if let Err(e) = st.runtime.cleanup(id) {
        warn!(sandbox = id, error = %crate::error::chain(&e), "releasing cgroup");
    }
    crate::disk::release(&st.sandbox_dir(id));
    if let Err(e) = strata_store::fsutil::remove_dir_all_if_exists(&st.sandbox_dir(id)) {
        warn!(sandbox = id, error = %e, "removing sandbox directory");
    }
}

/// After a daemon (re)start: mounts the disk of every sandbox that has one (idempotent;
/// they stay mounted across daemon restarts unless the host rebooted).
pub async fn mount_disks(st: &Shared) {
    let Ok(list) = st.db.list_sandboxes() else { return };
    for rec in list {
        let l = &rec.sandbox.limits;
        let (Some(bytes), true) = (l.disk_bytes, crate::disk::enforced(l.disk_quota.as_deref())) else { continue };
        let dir = st.sandbox_dir(&rec.sandbox.id);
        if rec.sandbox.state == SandboxState::Archived || !dir.join(crate::disk::IMAGE).exists() {
            continue;
        }
        let (id, pool) = (rec.sandbox.id.clone(), st.disks.clone());
        match tokio::task::spawn_blocking(move || crate::disk::ensure(&dir, bytes, &pool)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(sandbox = %id, error = %e, "mounting the sandbox's disk"),
            Err(e) => warn!(sandbox = %id, error = %e, "mounting the sandbox's disk"),
        }
    }
}

/// Removes directories and cgroups of sandboxes that have no record (left by a
/// crash between a destroy's commit and its background cleanup).
pub fn sweep_orphans(st: &Shared) -> Result<(), EngineError> {
    let known: std::collections::HashSet<String> = st.db.list_sandboxes()?.into_iter().map(|r| r.sandbox.id).collect();
    // Pipeline runs that may still run a stage keep their stages' secrets too.
    let mut keep = known.clone();
    keep.extend(crate::pipelines::live_secret_keys(st)?);
    st.secrets.sweep(&keep);
    let Ok(entries) = std::fs::read_dir(&st.sandboxes_dir) else { return Ok(()) };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !known.contains(&name) {
            info!(sandbox = %name, "removing leftovers of a destroyed sandbox");
            release_resources(st, &name);
        }
    }
    Ok(())
}

/// Starts a stopped (or failed) sandbox again on its kept filesystem.
pub async fn start(st: &Shared, id: &str) -> EngineResult<Sandbox> {
    start_because(st, id, "user").await
}

/// [`start`] recording `reason` on the transition.
pub async fn start_because(st: &Shared, id: &str, reason: &str) -> EngineResult<Sandbox> {
    let (_g, mut rec) = lock_and_load(st, id).await?;
    // Getting processes again takes memory: admitted like a create (429/503), before anything changes.
    let _admitted = admit_start(st, &rec)?;
    if matches!(rec.sandbox.state, SandboxState::Archived | SandboxState::Error)
        && crate::archive::pointer(st, &rec.sandbox.id).is_some()
    {
        // Its files are in the archive (also after a failed restore): never start on an empty layer.
        rec = crate::archive::unarchive_locked(st, &rec, reason).await?;
    }
    if rec.sandbox.state == SandboxState::Standby {
        // Archived from standby: starting it afresh discards the process image
        // (stop_locked drops it).
        stop_locked(st, &rec, reason, Duration::ZERO).await?;
        rec = load(st, &rec.sandbox.id)?;
    }
    next_state(rec.sandbox.state, Action::Start)?;
    if matches!(rec.sandbox.state, SandboxState::Error | SandboxState::Lost) {
        // Leftovers of a crashed run must go before a new init starts.
        kill_processes(st, &rec, Duration::from_secs(1)).await?;
    }
    boot(st, &rec, rec.sandbox.state, Action::Start, reason).await?;
    Ok(load(st, &rec.sandbox.id)?.sandbox)
}

/// Admits a sandbox that is about to get processes again (start, resume,
/// a warm restore) against the host's memory and its tenant's memory quota;
/// `None` when it holds memory already.
pub fn admit_start(st: &Shared, rec: &SandboxRecord) -> EngineResult<Option<crate::admission::Reservation>> {
    if crate::admission::holds_memory(rec.sandbox.state) || rec.sandbox.state == SandboxState::Destroyed {
        return Ok(None);
    }
    let s = &rec.sandbox;
    st.admission.admit(st, &s.id, &s.tenant, &s.limits, crate::admission::Purpose::Start).map(Some)
}

/// Destroys a sandbox: processes, cgroup, writable layer, record.
pub async fn destroy(st: &Shared, id: &str, force: bool, reason: &str) -> EngineResult<SandboxEvent> {
    let (_g, rec) = lock_and_load(st, id).await?;
    let started = Instant::now();
    let from = rec.sandbox.state;
    let to = next_state(from, Action::Destroy)?;
    if has_processes(from) && !force {
        return Err(EngineError::invalid_state(
            from,
            format!("sandbox {} is {from}; stop it first or remove it with force", rec.sandbox.id),
        ));
    }
    if has_processes(from) {
        crate::accounting::final_sample(st, &rec.sandbox.id);
    }
    // Destroying discards everything, so there is nothing to shut down gracefully.
    kill_only(st, &rec).await?;
    let t = Transition { to, reason, detail: None, duration_ms: started.elapsed().as_millis() as u64, time: &now() };
    let archived = crate::archive::pointer(st, &rec.sandbox.id);
    let Some(ev) = st.db.delete_sandbox(&rec.sandbox.id, from, &t)? else {
        // Unreachable while transitions hold the sandbox's lock; a 409 with the
        // state it is in now if one ever does not.
        let current = st.db.sandbox_by_id(&rec.sandbox.id)?.map_or(SandboxState::Destroyed, |r| r.sandbox.state);
        return Err(EngineError::invalid_state(
            current,
            format!("sandbox {} changed state while being destroyed", rec.sandbox.id),
        ));
    };
    st.secrets.remove(&rec.sandbox.id);
    crate::network::forget_later(st, &rec.sandbox.id);
    if let Some(m) = archived {
        let st2 = st.clone();
        tokio::spawn(crate::tenancy::as_daemon(async move { crate::archive::delete_remote(&st2, &m).await }));
    }
    st.processes.forget(&rec.sandbox.id);
    st.metrics.transition(SandboxState::Destroyed, reason);
    st.metrics.observe("destroy", started.elapsed());
    st.notify_events(ev.seq);
    drop(_g);
    st.drop_lock(&rec.sandbox.id);
    // The record is gone and every process is dead: releasing the cgroup and the
    // writable layer can finish in the background (startup sweeps what a crash leaves).
    let (st2, id) = (st.clone(), rec.sandbox.id.clone());
    tokio::task::spawn_blocking(move || release_resources(&st2, &id));
    info!(sandbox = %rec.sandbox.id, reason, "destroyed");
    Ok(ev)
}

fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a freshly created descriptor that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Watches a sandbox's init: when it dies without strata asking, the sandbox
/// becomes `lost` (reason `oom` when the OOM killer fired), and an ephemeral
/// one is destroyed.
pub fn watch_init(st: Shared, id: String, handle: SandboxHandle) {
    // What follows an init's end is the daemon's work, whoever started the sandbox.
    tokio::spawn(crate::tenancy::as_daemon(async move {
        let fd = match pidfd_open(handle.init_pid) {
            Ok(fd) => fd,
            Err(e) => {
                warn!(sandbox = %id, error = %e, "cannot watch init");
                return;
            }
        };
        // SAFETY: `fd` is an owned, open pidfd that the AsyncFd keeps until dropped.
        match unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) } {
            Ok(afd) => {
                let _ = afd.readable().await;
                // A task that CRIU had seized (standby) becomes reapable only once CRIU
                // lets go of it: wait for that off the async threads.
                let fd = afd.into_inner();
                let _ = tokio::task::spawn_blocking(move || reap_pidfd(fd.as_raw_fd())).await;
            }
            Err(e) => {
                warn!(sandbox = %id, error = %e, "cannot watch init");
                return;
            }
        }
        on_init_exit(&st, &id, &handle).await;
    }));
}

/// Reaps the process behind a (still open, exited) pidfd if it is our child:
/// sandbox inits are reparented to the daemon, which is a child subreaper.
/// Blocks until the exit can be collected (a ptrace-stopped exit, e.g. under
/// CRIU, becomes reapable when the tracer detaches); returns at once with
/// ECHILD when the process is not our child (re-adopted after a restart).
fn reap_pidfd(raw: std::os::fd::RawFd) {
    loop {
        // SAFETY: siginfo_t is plain data; waitid with P_PIDFD only writes into it, and `raw` is open.
        let r = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(libc::P_PIDFD, raw as libc::id_t, &mut info, libc::WEXITED)
        };
        if r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

async fn on_init_exit(st: &Shared, id: &str, handle: &SandboxHandle) {
    let lock = st.lock_for(id);
    let _g = lock.lock().await;
    let Ok(Some(rec)) = st.db.sandbox_by_id(id) else { return };
    if !has_processes(rec.sandbox.state) || handle_of(&rec).as_ref() != Some(handle) {
        return; // stopped or restarted on purpose
    }
    let usage = st.runtime.usage(id);
    let reason = if usage.oom_kills > rec.sandbox.oom_kills { "oom" } else { "init_exited" };
    warn!(sandbox = id, reason, "sandbox init exited unexpectedly");
    let _ = kill_processes(st, &rec, Duration::from_millis(100)).await;
    crate::network::release(st, id).await;
    let _ = st.db.set_oom_kills(id, usage.oom_kills.max(rec.sandbox.oom_kills));
    let _ = transition(
        st,
        id,
        rec.sandbox.state,
        Change::new(Action::Lose, reason).detail("the sandbox's init process exited"),
        Instant::now(),
        None,
    );
    if rec.sandbox.lifecycle == Lifecycle::Ephemeral {
        drop(_g);
        let _ = destroy(st, id, true, reason).await;
    }
}

/// Brings the daemon's view in line with reality after a (re)start: running
/// sandboxes whose init still lives are re-adopted, the others marked lost;
/// creations interrupted by a crash are failed; ephemeral leftovers are destroyed.
pub async fn reconcile(st: &Shared) -> Result<(), EngineError> {
    sweep_orphans(st)?;
    for rec in st.db.list_sandboxes()? {
        crate::archive::reconcile(st, &rec).await;
        let id = rec.sandbox.id.clone();
        crate::standby::sweep_spent(st, &id);
        let state = rec.sandbox.state;
        let alive = handle_of(&rec).is_some_and(|h| st.runtime.is_alive(&h));
        let ephemeral = rec.sandbox.lifecycle == Lifecycle::Ephemeral;
        match state {
            SandboxState::Running | SandboxState::Paused if alive => {
                info!(sandbox = %id, "re-adopted running sandbox");
                if state == SandboxState::Running {
                    // A daemon that died mid-checkpoint may have left it frozen.
                    if let Err(e) = st.runtime.set_frozen(&id, false) {
                        warn!(sandbox = %id, error = %crate::error::chain(&e), "thawing a re-adopted sandbox");
                    }
                }
                watch_init(st.clone(), id.clone(), handle_of(&rec).expect("alive implies handle"));
                crate::standby::drop_stale_image(st, &id);
            }
            SandboxState::Running | SandboxState::Paused if crate::standby::complete_interrupted(st, &rec)? => {
                info!(sandbox = %id, "completed a standby interrupted by the daemon's stop");
            }
            SandboxState::Running | SandboxState::Paused => {
                let _ = kill_processes(st, &rec, Duration::from_millis(100)).await;
                transition(
                    st,
                    &id,
                    state,
                    Change::new(Action::Lose, "init_gone").detail("init was gone when the daemon started"),
                    Instant::now(),
                    None,
                )?;
                if ephemeral {
                    destroy(st, &id, true, "init_gone").await?;
                }
            }
            SandboxState::Creating => {
                let _ = kill_processes(st, &rec, Duration::from_millis(100)).await;
                transition(
                    st,
                    &id,
                    state,
                    Change::new(Action::Fail, "interrupted").detail("the daemon stopped during creation"),
                    Instant::now(),
                    None,
                )?;
                if ephemeral {
                    destroy(st, &id, true, "interrupted").await?;
                }
            }
            SandboxState::Standby => crate::standby::reconcile_standby(st, &rec)?,
            _ if ephemeral && state != SandboxState::Destroyed => {
                destroy(st, &id, true, "ephemeral_leftover").await?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Runs forever: applies TTL expiry (ephemeral: destroy; persistent: stop).
pub async fn ttl_reaper(st: Shared) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut last_gc = Instant::now();
    loop {
        tick.tick().await;
        // Checkpoint retention and layer garbage collection, once a minute.
        if last_gc.elapsed() >= Duration::from_secs(60) {
            last_gc = Instant::now();
            if let Err(e) = crate::checkpoints::gc(&st).await {
                warn!(error = %e.body.message, "automatic garbage collection failed");
            }
        }
        // Only sandboxes with a deadline are loaded: idle hosts with many parked
        // sandboxes stay idle.
        let Ok(ids) = st.db.with_expiry() else { continue };
        let now = SystemTime::now();
        for id in ids {
            let Ok(Some(rec)) = st.db.sandbox_by_id(&id) else { continue };
            let Some(exp) = rec.sandbox.expires_at.as_deref().and_then(parse_time) else { continue };
            if exp > now {
                continue;
            }
            let id = rec.sandbox.id.clone();
            let result = if rec.sandbox.lifecycle == Lifecycle::Ephemeral {
                destroy(&st, &id, true, "ttl_expired").await.map(|_| ())
            } else if has_processes(rec.sandbox.state) {
                stop(&st, &id, "ttl_expired", STOP_GRACE).await.map(|_| ())
            } else {
                st.db.set_expires_at(&id, None).map_err(EngineError::from)
            };
            if let Err(e) = result {
                warn!(sandbox = %id, error = %e.body.message, "TTL action failed");
            }
        }
    }
}

/// Refreshes the OOM counter of a sandbox from its cgroup; records an `oom`
/// event when it grew. Returns the new count.
pub fn refresh_oom(st: &Shared, rec: &SandboxRecord) -> u64 {
    let n = st.runtime.usage(&rec.sandbox.id).oom_kills;
    if n > rec.sandbox.oom_kills {
        let _ = st.db.set_oom_kills(&rec.sandbox.id, n);
        let detail = format!(
            "{} process(es) killed by the OOM killer inside the memory limit of {} bytes",
            n - rec.sandbox.oom_kills,
            rec.sandbox.limits.memory_bytes.unwrap_or(0)
        );
        if let Ok(ev) = st.db.record_event(&rec.sandbox.id, rec.sandbox.state, "oom", Some(&detail), &now()) {
            st.notify_events(ev.seq);
        }
    }
    n.max(rec.sandbox.oom_kills)
}

/// Fills in a sandbox's secrets (names and sizes; values never leave the store).
pub fn with_secret_names(st: &Shared, mut sb: Sandbox) -> Sandbox {
    sb.secrets = st.secrets.get_or_empty(&sb.id).refs();
    sb.network = st.network.spec_of(&sb.id);
    let facts = exposure_facts(st, &sb);
    sb.capabilities = rule_of_two::grants(&exposure(&sb, &facts));
    sb
}

/// What the Rule of Two looks at besides a sandbox's view: the names of its
/// secrets and the ports of its live previews (0: every port).
#[derive(Debug, Clone, Default)]
pub struct ExposureFacts {
    /// Secret names.
    pub secret_names: Vec<String>,
    /// Ports of previews that are neither revoked nor expired.
    pub preview_ports: Vec<u16>,
}

/// The [`ExposureFacts`] of a sandbox view (its secrets filled in, see [`with_secret_names`]).
pub fn exposure_facts(st: &Shared, sb: &Sandbox) -> ExposureFacts {
    let now = std::time::SystemTime::now();
    let preview_ports = st
        .db
        .list_previews(&sb.id)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.revoked_at.is_none() && humantime::parse_rfc3339_weak(&p.expires_at).is_ok_and(|e| e > now))
        .map(|p| p.port.unwrap_or(0))
        .collect();
    ExposureFacts { secret_names: sb.secrets.iter().map(|r| r.name.clone()).collect(), preview_ports }
}

/// What a sandbox (its view with secrets and network filled in) exposes, for the Rule of Two.
pub fn exposure<'a>(sb: &'a Sandbox, facts: &'a ExposureFacts) -> rule_of_two::Exposure<'a> {
    rule_of_two::Exposure {
        declared: &sb.policy.capabilities,
        secrets: &facts.secret_names,
        network: Some(&sb.network),
        previews: &facts.preview_ports,
        ..Default::default()
    }
}
