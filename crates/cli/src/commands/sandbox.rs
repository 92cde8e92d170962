//! A sandbox's life: `create`, `run` (create, exec, destroy), `ps`, `inspect`, `update`,
//! `stop`, `pause`, `unpause`, `standby`, `resume`, `archive`, `start`, `rm` and `events`,
//! and the request fields of new sandboxes built from their flags.

use anyhow::{bail, Result};
use strata_api::{CreateSandboxRequest, Lifecycle, OnIdle, PolicyPatch, ResourceLimits, Sandbox, UpdateSandboxRequest};
use strata_client::Client;

use super::network::network_spec;
use super::process::exec_request;
use super::security::secrets;
use super::{each, kv, print_error};
use crate::args::sandbox::{
    CreateArgs, EventsArgs, InspectArgs, LifecycleArg, LimitArgs, OnFindingsArg, OnIdleArg, PolicyArgs, PsArgs,
    ResumeArgs, RmArgs, RunArgs, StandbyArgs, UpdateArgs,
};
use crate::args::{JsonOutput, SandboxId, SandboxIds};
use crate::{exec, output};

/// `strata create`: prints the new sandbox's id.
pub(super) async fn create(c: &Client, a: CreateArgs) -> Result<i32> {
    let created = c.create_sandbox(&create_request(&a)?).await?;
    println!("{}", created.id);
    Ok(0)
}

/// `strata run`: a sandbox for one command (destroyed afterwards with --rm).
pub(super) async fn run_oneshot(c: &Client, a: RunArgs) -> Result<i32> {
    let req = CreateSandboxRequest {
        source: a.source.clone(),
        name: a.name.clone(),
        lifecycle: if a.rm { Lifecycle::Ephemeral } else { Lifecycle::Persistent },
        ttl: a.ttl.clone().or_else(|| a.rm.then(|| "24h".to_string())),
        limits: limits(&a.limits)?,
        policy: policy_patch(&a.policy),
        secrets: secrets(&a.secrets)?,
        network: network_spec(&a.network),
        isolation: a.isolation,
        userns: a.userns.choice(),
        tmp: a.tmp.map(Into::into),
        ..Default::default()
    };
    let created = c.create_sandbox(&req).await?;
    let req = exec_request(a.cmd, &a.opts)?;
    let result = exec::run(c, &created.id, req, a.opts.interactive, a.opts.tty).await;
    if a.rm {
        if let Err(e) = c.remove_sandbox(&created.id, true).await {
            eprintln!("strata: removing sandbox {}: {e}", created.id);
        }
    } else {
        eprintln!("strata: sandbox {} kept (persistent)", created.id);
    }
    result
}

/// `strata ps`.
pub(super) async fn ps(c: &Client, PsArgs { wide, json }: PsArgs) -> Result<i32> {
    let list = c.list_sandboxes().await?;
    if wide {
        let mut rows = Vec::new();
        for s in &list {
            rows.push((s, c.accumulation(&s.id).await.ok()));
        }
        if json {
            let with: Vec<serde_json::Value> = rows.iter().map(|(s, a)| with_accumulation(s, a.as_ref())).collect();
            output::json(&with);
            return Ok(0);
        }
        output::table(
            &[
                "ID",
                "NAME",
                "STATE",
                "SOURCE",
                "CREATED",
                "WRITABLE",
                "GROWTH/DAY",
                "CHECKPOINTS",
                "BASE AGE",
                "BEHIND",
                "OVER",
            ],
            rows.iter()
                .map(|(s, a)| {
                    let mut row = ps_row(s);
                    row.extend(match a {
                        Some(a) => vec![
                            format!("{} ({} entries)", output::size(a.writable_bytes), a.writable_files),
                            output::size(a.growth_per_day_bytes),
                            format!("{} ({})", a.checkpoints, output::size(a.checkpoint_bytes)),
                            format!("{}d", a.base_age_days),
                            behind(a),
                            if a.over.is_empty() { "-".into() } else { a.over.len().to_string() },
                        ],
                        None => vec!["-".into(); 6],
                    });
                    row
                })
                .collect(),
        );
        return Ok(0);
    }
    if json {
        output::json(&list);
    } else {
        output::table(&["ID", "NAME", "STATE", "SOURCE", "CREATED"], list.iter().map(ps_row).collect());
    }
    Ok(0)
}

/// How far a sandbox's image is behind its name's newest version (`-` when it is on it).
fn behind(a: &strata_api::Accumulation) -> String {
    match &a.newer_image {
        Some(n) => format!("{n} is newer ({}d)", a.days_behind_newest),
        None => "-".into(),
    }
}

/// The columns every `strata ps` row has.
fn ps_row(s: &Sandbox) -> Vec<String> {
    vec![s.id.clone(), s.name.clone(), s.state.to_string(), s.source.clone(), output::age(&s.created_at)]
}

/// `strata inspect`.
pub(super) async fn inspect(c: &Client, a: InspectArgs) -> Result<i32> {
    let InspectArgs { sandbox: SandboxId { id }, out: JsonOutput { json } } = a;
    let s = c.get_sandbox(&id).await?;
    // Not on the host while archived (or creating): shown without it.
    let acc = c.accumulation(&s.id).await.ok();
    if json {
        output::json(&with_accumulation(&s, acc.as_ref()));
    } else {
        print_sandbox(&s);
        if let Some(a) = acc {
            let mut rows = vec![
                (
                    "writable",
                    format!(
                        "{} in {} entries ({}/day); since the last checkpoint ({}): {} in {} paths",
                        output::size(a.writable_bytes),
                        a.writable_files,
                        output::size(a.growth_per_day_bytes),
                        a.checkpoint_since,
                        output::size(a.since_checkpoint_bytes),
                        a.since_checkpoint_paths
                    ),
                ),
                ("checkpoints", format!("{} ({})", a.checkpoints, output::size(a.checkpoint_bytes))),
                ("base", format!("{}, made {} ({} days ago)", a.base, a.base_created_at, a.base_age_days)),
                (
                    "image",
                    match (&a.image, &a.newer_image) {
                        (Some(i), Some(n)) => {
                            format!("{i}; {n} is newer ({} days): strata rebase", a.days_behind_newest)
                        }
                        (Some(i), None) => format!("{i} (its name's newest version)"),
                        (None, _) => "(no longer registered)".into(),
                    },
                ),
            ];
            rows.extend(a.over.iter().map(|o| ("OVER", o.clone())));
            for (k, v) in rows {
                println!("{k:<10} {v}");
            }
        }
    }
    Ok(0)
}

/// A sandbox's JSON with `accumulation` added (when it could be measured).
fn with_accumulation(s: &Sandbox, a: Option<&strata_api::Accumulation>) -> serde_json::Value {
    let mut v = serde_json::to_value(s).expect("a sandbox serializes");
    if let (Some(a), Some(obj)) = (a, v.as_object_mut()) {
        obj.insert("accumulation".into(), serde_json::to_value(a).expect("serializes"));
    }
    v
}

/// `strata update`: the policy flags given and further capabilities.
pub(super) async fn update(c: &Client, a: UpdateArgs) -> Result<i32> {
    let patch = policy_patch(&a.policy);
    if patch.is_none() && a.capabilities.is_empty() {
        bail!("nothing to update: give --on-idle, --idle-timeout, --max-lifetime, --archive-after, --delete-after or --capability");
    }
    // Declared capabilities only grow: send the current ones with the new.
    let capabilities = if a.capabilities.is_empty() {
        None
    } else {
        let current = c.get_sandbox(&a.sandbox.id).await?.policy.capabilities;
        Some(current.into_iter().chain(a.capabilities.iter().copied()).collect())
    };
    let s = c.update_sandbox(&a.sandbox.id, &UpdateSandboxRequest { policy: patch, capabilities }).await?;
    if a.json {
        output::json(&s);
    } else {
        println!("{}", s.id);
    }
    Ok(0)
}

/// `strata stop`.
pub(super) async fn stop(c: &Client, SandboxIds { ids }: SandboxIds) -> Result<i32> {
    each(ids, |id| async { c.stop_sandbox(&id).await.map(|_| id) }).await
}

/// `strata pause`.
pub(super) async fn pause(c: &Client, SandboxIds { ids }: SandboxIds) -> Result<i32> {
    each(ids, |id| async { c.pause_sandbox(&id).await.map(|_| id) }).await
}

/// `strata unpause`.
pub(super) async fn unpause(c: &Client, SandboxIds { ids }: SandboxIds) -> Result<i32> {
    each(ids, |id| async { c.unpause_sandbox(&id).await.map(|_| id) }).await
}

/// `strata standby`.
pub(super) async fn standby(c: &Client, a: StandbyArgs) -> Result<i32> {
    let StandbyArgs { fs_only, sandboxes: SandboxIds { ids } } = a;
    each(ids, |id| async move { c.standby_sandbox(&id, fs_only).await.map(|_| id) }).await
}

/// `strata resume`: each sandbox in turn, the failures reported and the rest still resumed.
pub(super) async fn resume(c: &Client, a: ResumeArgs) -> Result<i32> {
    let ResumeArgs { json, fs_only, sandboxes: SandboxIds { ids } } = a;
    let mut results = Vec::new();
    let mut failed = false;
    let req = strata_api::ResumeRequest { fs_only };
    for id in ids {
        match c.resume_sandbox_with(&id, &req).await {
            Ok(r) => {
                if !json {
                    println!(
                        "{id} resumed from {} in {} ms{}",
                        r.from,
                        r.duration_ms,
                        if r.processes_restored { "" } else { " (init started afresh)" }
                    );
                }
                results.push(r);
            }
            Err(e) => {
                print_error(&anyhow::Error::from(e).context(format!("resuming {id}")));
                failed = true;
            }
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    }
    Ok(i32::from(failed))
}

/// `strata archive`.
pub(super) async fn archive(c: &Client, SandboxIds { ids }: SandboxIds) -> Result<i32> {
    each(ids, |id| async { c.archive_sandbox(&id).await.map(|_| id) }).await
}

/// `strata start`.
pub(super) async fn start(c: &Client, SandboxIds { ids }: SandboxIds) -> Result<i32> {
    each(ids, |id| async { c.start_sandbox(&id).await.map(|_| id) }).await
}

/// `strata rm`.
pub(super) async fn rm(c: &Client, a: RmArgs) -> Result<i32> {
    let RmArgs { force, sandboxes: SandboxIds { ids } } = a;
    each(ids, |id| async { c.remove_sandbox(&id, force).await.map(|_| id) }).await
}

/// `strata events`: the lifecycle events so far, or (with -f) followed.
pub(super) async fn events(c: &Client, a: EventsArgs) -> Result<i32> {
    let EventsArgs { id, follow, json } = a;
    let print = |e: &strata_api::SandboxEvent| {
        if json {
            println!("{}", serde_json::to_string(e).expect("serializes"));
        } else {
            let from = e.from.map(|f| f.to_string()).unwrap_or_else(|| "-".into());
            println!(
                "{}  {}  {} -> {}  {}{}  ({} ms)",
                e.time,
                e.sandbox_id,
                from,
                e.to,
                e.reason,
                e.detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default(),
                e.duration_ms
            );
        }
    };
    if follow {
        let mut s = c.follow_events(id.as_deref(), 0).await?;
        while let Some(e) = s.next().await? {
            print(&e);
        }
    } else {
        for e in c.events(id.as_deref(), 0).await? {
            print(&e);
        }
    }
    Ok(0)
}

fn create_request(a: &CreateArgs) -> Result<CreateSandboxRequest> {
    Ok(CreateSandboxRequest {
        source: a.source.clone(),
        name: a.name.clone(),
        lifecycle: match a.lifecycle {
            LifecycleArg::Ephemeral => Lifecycle::Ephemeral,
            LifecycleArg::Persistent => Lifecycle::Persistent,
        },
        ttl: a.ttl.clone(),
        limits: limits(&a.limits)?,
        env: kv(&a.env, "--env")?,
        hostname: a.hostname.clone(),
        labels: kv(&a.labels, "--label")?,
        policy: policy_patch(&a.policy),
        secrets: secrets(&a.secrets)?,
        network: network_spec(&a.network),
        capabilities: a.capabilities.clone(),
        allow_setuid: a.allow_setuid,
        processes: a.warm.choice(),
        isolation: a.isolation,
        userns: a.userns.choice(),
        tmp: a.tmp.map(Into::into),
    })
}

fn limits(l: &LimitArgs) -> Result<ResourceLimits> {
    Ok(ResourceLimits {
        memory_bytes: l.memory.as_deref().map(strata_core::units::parse_size).transpose()?,
        cpus: l.cpus.as_deref().map(strata_core::units::parse_cpus).transpose()?,
        pids: l.pids,
        disk_bytes: l.disk.as_deref().map(strata_core::units::parse_size).transpose()?,
        disk_quota: None,
    })
}

/// The policy fields given on the command line (`None` when none were).
fn policy_patch(p: &PolicyArgs) -> Option<PolicyPatch> {
    let action = |a: OnIdleArg| match a {
        OnIdleArg::Standby => OnIdle::Standby,
        OnIdleArg::Stop => OnIdle::Stop,
        OnIdleArg::Destroy => OnIdle::Destroy,
        OnIdleArg::Keep => OnIdle::Keep,
    };
    let patch = PolicyPatch {
        on_idle: p.on_idle.map(action),
        idle_timeout: p.idle_timeout.clone(),
        max_lifetime: p.max_lifetime.clone(),
        on_max_lifetime: p.on_max_lifetime.map(action),
        archive_after: p.archive_after.clone(),
        delete_after: p.delete_after.clone(),
        hooks: None,
        flush: match p.flush.as_slice() {
            [] => None,
            [one] if one == "none" => Some(Vec::new()),
            many => Some(many.to_vec()),
        },
        resume_on_access: p.resume_on_access,
        check_every: p.check_every.clone(),
        max_writable: p.max_writable.clone(),
        max_age: p.max_age.clone(),
        on_findings: p.on_findings.map(|o| match o {
            OnFindingsArg::Record => strata_api::OnFindings::Record,
            OnFindingsArg::Quarantine => strata_api::OnFindings::Quarantine,
            OnFindingsArg::Flush => strata_api::OnFindings::Flush,
            OnFindingsArg::Stop => strata_api::OnFindings::Stop,
        }),
    };
    let sh = |c: &Option<String>| c.as_ref().map(|c| vec!["sh".to_string(), "-c".to_string(), c.clone()]);
    let hooks = strata_api::LifecycleHooks {
        before_standby: sh(&p.hook_before_standby),
        before_stop: sh(&p.hook_before_stop),
        after_resume: sh(&p.hook_after_resume),
        timeout: p.hook_timeout.clone(),
    };
    let patch = PolicyPatch { hooks: (!hooks.is_empty()).then_some(hooks), ..patch };
    (!patch.is_empty()).then_some(patch)
}

fn print_sandbox(s: &Sandbox) {
    let mut rows = vec![
        ("id", s.id.clone()),
        ("name", s.name.clone()),
        (
            "state",
            format!(
                "{} ({}{})",
                s.state,
                s.state_reason,
                s.state_detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default()
            ),
        ),
        ("source", format!("{} ({})", s.source, s.image_id)),
        ("runtime", s.runtime.clone()),
        ("tmp", s.tmp.as_str().to_string()),
        ("lifecycle", format!("{:?}", s.lifecycle).to_lowercase()),
        ("hostname", s.hostname.clone()),
        ("created", s.created_at.clone()),
        ("updated", s.updated_at.clone()),
    ];
    if let Some(t) = &s.ttl {
        rows.push(("ttl", format!("{t} (expires {})", s.expires_at.as_deref().unwrap_or("when started"))));
    }
    let l = &s.limits;
    rows.push((
        "limits",
        format!(
            "memory={} cpus={} pids={} disk={}",
            l.memory_bytes.map(output::size).unwrap_or("none".into()),
            l.cpus.map(|c| c.to_string()).unwrap_or("none".into()),
            l.pids.map(|p| p.to_string()).unwrap_or("none".into()),
            l.disk_bytes.map(output::size).unwrap_or("none".into())
        ),
    ));
    if let Some(q) = &l.disk_quota {
        rows.push(("disk_quota", q.clone()));
    }
    let p = &s.policy;
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "none".into());
    rows.push((
        "policy",
        format!(
            "on_idle={} after {}, max_lifetime={}, archive_after={}, delete_after={}, resume_on_access={}",
            p.on_idle,
            p.idle_timeout,
            opt(&p.max_lifetime),
            opt(&p.archive_after),
            opt(&p.delete_after),
            p.resume_on_access
        ),
    ));
    if let Some(every) = &p.check_every {
        rows.push(("checks", format!("every {every}, on findings: {}", p.on_findings)));
    }
    if let Some(q) = &s.quarantine {
        rows.push(("QUARANTINED", format!("since {} by {}: {}", q.since, q.by, q.reason)));
    }
    if let Some(t) = &s.inactive_since {
        rows.push(("inactive", format!("since {t}")));
    }
    if let Some(p) = s.init_pid {
        rows.push(("init pid", p.to_string()));
    }
    rows.push(("oom kills", s.oom_kills.to_string()));
    if !s.capabilities.is_empty() {
        let caps: Vec<String> = s.capabilities.iter().map(|g| format!("{} ({})", g.capability, g.because)).collect();
        rows.push(("rule of 2", caps.join("; ")));
    }
    if let Some(u) = s.userns {
        rows.push(("userns", format!("root is host uid {} ({} ids mapped from 0)", u.host_base, u.size)));
    }
    if s.allow_setuid {
        rows.push(("setuid", "allowed (no no_new_privs: sudo works, up to the sandbox's root)".into()));
    }
    for (k, v) in rows {
        println!("{k:<10} {v}");
    }
}
