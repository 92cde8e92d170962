//! Create: a sandbox from an image, template or checkpoint (its source resolved
//! for the caller), admitted, booted and recorded `running`.

use std::time::Instant;

use strata_api::{CreateSandboxRequest, ErrorCode, Sandbox, SandboxState};
use strata_core::{ids, rule_of_two, units, Action};
use strata_store::db::SandboxRecord;
use tracing::{info_span, warn, Instrument};

use super::{boot, destroy};
use crate::error::{EngineError, EngineResult};
use crate::record::{load, now};
use crate::state::Shared;

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
    /// A warm-pool member ([`crate::pool`]): recorded in the pool's tenant, never adopting one itself.
    pub pooled: bool,
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
    /// The checkpoint's tier (its sandbox's): a sandbox made from it runs
    /// there unless the request names another. `None` for an image.
    pub isolation: Option<strata_api::Isolation>,
    /// Whether the checkpoint's sandbox ran in a user namespace (a sandbox
    /// made from it does unless asked otherwise). `None` for an image.
    pub userns: Option<bool>,
    /// Where the checkpoint's sandbox kept `/tmp` (a sandbox made from it
    /// does unless asked otherwise). `None` for an image.
    pub tmp: Option<strata_api::TmpStorage>,
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
        isolation: None,
        userns: None,
        tmp: None,
    };
    let of_checkpoint = |name: String, c: strata_api::Checkpoint, config: strata_api::ImageConfig| {
        if c.retired_at().is_some() {
            return Err(EngineError::checkpoint_retired(&c));
        }
        crate::quarantine::refuse_checkpoint(&c, "be restored into a new sandbox")?;
        Ok(Source {
            name,
            image_id: c.image_id,
            layers: c.layers,
            config,
            warm: c.processes.is_some(),
            isolation: Some(c.isolation),
            userns: Some(c.userns),
            tmp: Some(c.tmp),
            checkpoint: Some(c.id),
            tenant: Some(c.tenant),
            capabilities: c.capabilities,
        })
    };
    // 1. Exact ids.
    if let Some((c, config)) = st.db.checkpoint_by_id(key)?.filter(|(c, _)| crate::tenancy::visible(&c.tenant)) {
        return of_checkpoint(c.name.clone(), c, config);
    }
    let image = st.db.get_image(key)?;
    if let Some(image) = image.clone().filter(|i| i.id == key || i.name == key) {
        // 2. ... then names, an image's first (get_image tried its id before its name).
        return Ok(of_image(image));
    }
    if let Some((ckpt, _)) = crate::tenancy::find_template(st, key)? {
        if let Some((c, config)) = st.db.checkpoint_by_id(&ckpt)? {
            return of_checkpoint(key.to_string(), c, config);
        }
    }
    let checkpoint = crate::tenancy::find_checkpoint(st, key)?;
    if let Some((c, config)) = checkpoint.clone().filter(|(c, _)| c.name == key) {
        return of_checkpoint(c.name.clone(), c, config);
    }
    // 3. An id prefix: unique across images and the caller's checkpoints.
    match (image, checkpoint) {
        (Some(image), None) => Ok(of_image(image)),
        (None, Some((c, config))) => of_checkpoint(c.name.clone(), c, config),
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

pub(crate) async fn create_inner(st: &Shared, req: CreateSandboxRequest, lineage: Lineage) -> EngineResult<Sandbox> {
    // A warm-pool member is the daemon's: its source resolves as the daemon sees them.
    let source = match lineage.pooled {
        true => crate::caller::sync_as_daemon(|| resolve_source(st, &req.source))?,
        false => resolve_source(st, &req.source)?,
    };
    // The tier: the request's, else the checkpoint's (a template remembers its
    // tier), else the daemon's default. One this host cannot run is refused
    // (501, with why), never replaced by another.
    let tier = st.tiers.resolve(req.isolation.or(source.isolation))?;
    if let (true, Some(from), false) = (source.warm, source.isolation, req.processes == Some(false)) {
        if from != tier {
            return Err(EngineError::bad_request(format!(
                "{} keeps processes of the {from} tier, which cannot start on the {tier} tier; start it on {from}, or without processes (processes: false)",
                source.name
            )));
        }
    }
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
    let mut policy = crate::policy_spec::initial(req.lifecycle, req.policy.as_ref())?;
    // The daemon's defaults fill what the request leaves out (recorded on the
    // sandbox); then every limit must be one a sandbox can run with on this host.
    let mut req = req;
    // Started with a warm checkpoint's processes: its source's limits before the daemon's.
    if let (true, Some(c), false) = (source.warm, &source.checkpoint, req.processes == Some(false)) {
        if let Some(saved) = crate::lifecycle::warm::saved_limits(st, c) {
            let l = &mut req.limits;
            l.memory_bytes = l.memory_bytes.or(saved.memory_bytes);
            l.cpus = l.cpus.or(saved.cpus);
            l.pids = l.pids.or(saved.pids);
            l.disk_bytes = l.disk_bytes.or(saved.disk_bytes);
        }
    }
    st.admission.apply_defaults(&mut req.limits);
    st.admission.validate(&req.limits)?;
    req.limits.disk_quota = Some(match (tier, req.limits.disk_bytes) {
        // The guest's own ext4 disk of that size (strata_runtime::microvm::disks).
        (strata_api::Isolation::Microvm, Some(b)) => {
            format!("enforced (the microVM's own ext4 disk of {})", units::format_size(b))
        }
        _ => strata_runtime::disk::describe(req.limits.disk_bytes),
    });
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
            crate::lifecycle::warm::check_startable(st, tier, &id, !req.secrets.is_empty(), c)?;
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
    let untrusted =
        req.capabilities.iter().chain(&source.capabilities).any(|c| *c == strata_api::Capability::UntrustedInput);
    let userns = st.tiers.userns(tier, req.userns, source.userns, untrusted)?;
    // Processes saved with (or without) a user namespace come back only so.
    if let (Some(_), Some(saved)) = (&warm_from, source.userns) {
        if saved != userns {
            let (had, asked) = if saved { ("a", "userns: false") } else { ("no", "userns: true") };
            return Err(EngineError::bad_request(format!(
                "{} keeps the processes of a sandbox with {had} user namespace, which come back only the same way; drop {asked}, or start it without processes (processes: false)",
                source.name
            )));
        }
    }
    // /tmp: the request's, else the source's, else part of the filesystem;
    // processes come back only with the layout they were saved with.
    let tmp = req.tmp.or(source.tmp).unwrap_or_default();
    if let (Some(_), Some(saved)) = (&warm_from, source.tmp) {
        if saved != tmp {
            return Err(EngineError::bad_request(format!(
                "{} keeps the processes of a sandbox whose /tmp was {}, which come back only so; drop tmp: {}, or start it without processes (processes: false)",
                source.name,
                saved.as_str(),
                tmp.as_str()
            )));
        }
    }
    let network = crate::network::check(st, req.network.as_ref())?;
    let tenant = match lineage.pooled {
        true => strata_store::db::POOL_TENANT.to_string(),
        false => source.tenant.clone().unwrap_or_else(crate::tenancy::creating_tenant),
    };
    // Host admission and the tenant's quota, before anything is recorded: the
    // reservation counts this sandbox in every other check until its record does.
    let _admitted = st.admission.admit(&st.db, &id, &tenant, &req.limits, crate::admission::Purpose::Create)?;
    // The Rule of Two, before anything is recorded: all three capabilities need an approval.
    let secret_names: Vec<String> = req.secrets.iter().map(|s| s.name.clone()).collect();
    let grants = rule_of_two::grants(&rule_of_two::Exposure {
        declared: &req.capabilities,
        inherited: Some((source.name.as_str(), source.capabilities.as_slice())),
        secrets: &secret_names,
        network: network.as_ref().map(|(spec, _)| spec),
        ..Default::default()
    });
    if !lineage.rule_of_two_checked && !lineage.pooled {
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
    let mut rec = SandboxRecord {
        sandbox: Sandbox {
            id: id.clone(),
            tenant,
            name,
            state: SandboxState::Creating,
            state_reason: "user".into(),
            state_detail: None,
            source: source.name.clone(),
            image_id: source.image_id.clone(),
            runtime: st.runtime_for(tier).name().into(),
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
            // The range is picked when the record is inserted.
            userns: userns.then_some(strata_api::UserNamespace { host_base: 0, size: 0 }),
            tmp,
            quarantine: None,
        },
        layers: source.layers,
        init_start_time: None,
        image_config: source.config,
    };
    // A warm-pool sandbox booted from the same source with the same fixed
    // settings is taken instead of booting one.
    if !lineage.pooled && lineage.fork_generation == 0 {
        let refused = match () {
            _ if network.as_ref().is_some_and(|(n, _)| n.mode != strata_api::NetworkMode::None) => {
                Some("a network (pool sandboxes have none)")
            }
            _ if !secrets.is_empty() => Some("secrets (injected at boot)"),
            _ if req.allow_setuid => Some("allow_setuid (fixed at boot)"),
            _ => None,
        };
        let wanted = super::adopt::Wanted {
            fit: crate::state::pool::Fit {
                tier,
                layers: rec.layers.clone(),
                checkpoint: source.checkpoint.clone(),
                warm: warm_from.is_some(),
                userns,
                tmp,
                memory_bytes: req.limits.memory_bytes,
                disk_bytes: req.limits.disk_bytes,
            },
            refused,
            named: req.name.is_some(),
            hostname_given: req.hostname.is_some(),
        };
        if let Some(sb) = super::adopt::adopt(st, wanted, &rec).await? {
            return Ok(sb);
        }
    }
    let lock = st.lock_for(&id);
    let _g = lock.lock().await;
    st.secrets.put(&id, secrets)?;
    if let Err(e) = crate::network::register(st, &id, network) {
        st.secrets.remove(&id);
        return Err(e);
    }
    if let Err(e) = st.db.insert_sandbox(&mut rec) {
        st.secrets.remove(&id);
        crate::network::forget(st, &id).await;
        return Err(e.into());
    }
    let span = info_span!("sandbox", id = %id);
    let res = match &warm_from {
        Some(c) => {
            crate::lifecycle::warm::boot(st, &rec, c, SandboxState::Creating, Action::Ready, "created")
                .instrument(span)
                .await
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
