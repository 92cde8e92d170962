//! Subcommand implementations.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{anyhow, bail, Context, Result};
use strata_api::{
    CreateSandboxRequest, ExecRequest, ImportEvent, ImportImageRequest, Lease, Lifecycle, OnIdle, PolicyPatch,
    PullImageRequest, ResourceLimits, Sandbox, UpdateSandboxRequest,
};
use strata_client::{Client, Endpoint};

use crate::args::*;
use crate::{exec, output, transfer};

fn kv(items: &[String], what: &str) -> Result<BTreeMap<String, String>> {
    items
        .iter()
        .map(|s| {
            s.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| anyhow!("{what} {s:?} must be K=V"))
        })
        .collect()
}

/// Reads `--secret NAME=@FILE|env:VAR|env` values here, on the CLI's side,
/// and marks the `--secret-env` ones.
fn secrets(a: &SecretArgs) -> Result<Vec<strata_api::SecretSpec>> {
    use base64::Engine;
    let (items, env_names) = (&a.secrets, &a.secret_env);
    let mut out = Vec::new();
    for s in items {
        let (name, src) =
            s.split_once('=').ok_or_else(|| anyhow!("--secret {s:?} must be NAME=@FILE, NAME=env:VAR or NAME=env"))?;
        let value = if let Some(path) = src.strip_prefix('@') {
            std::fs::read(path).with_context(|| format!("--secret {name}: reading {path}"))?
        } else if src == "env" || src.starts_with("env:") {
            let var = src.strip_prefix("env:").unwrap_or(name);
            std::env::var_os(var)
                .ok_or_else(|| anyhow!("--secret {name}: environment variable {var} is not set"))?
                .into_encoded_bytes()
        } else {
            bail!("--secret {name}: give the value as @FILE, env:VAR or env (literal values would end up in shell history and ps)");
        };
        out.push(strata_api::SecretSpec {
            name: name.to_string(),
            value_b64: Some(base64::engine::general_purpose::STANDARD.encode(value)),
            host_file: None,
            env: env_names.iter().any(|n| n == name),
        });
    }
    if let Some(n) = env_names.iter().find(|n| !out.iter().any(|s| &s.name == *n)) {
        bail!("--secret-env {n}: no --secret named {n}");
    }
    Ok(out)
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

fn exec_request(cmd: Vec<String>, o: &ProcOpts) -> Result<ExecRequest> {
    Ok(ExecRequest {
        cmd,
        env: kv(&o.env, "--env")?,
        cwd: o.cwd.clone(),
        user: o.user.clone(),
        timeout: o.timeout.clone(),
        ..Default::default()
    })
}

fn client(cli: &Cli) -> Client {
    let c = match &cli.host {
        Some(h) => Client::new(Endpoint::Tcp { addr: h.clone(), token: cli.token.clone() }),
        None => Client::unix(&cli.socket),
    };
    c.with_tenant(cli.as_tenant.clone()).with_approval(cli.approval.clone())
}

fn token_rows(list: &[strata_api::TokenInfo]) -> Vec<Vec<String>> {
    let status = |t: &strata_api::TokenInfo| match (&t.revoked_at, &t.expires_at) {
        (Some(r), _) => format!("revoked {r}"),
        (None, Some(e)) if humantime::parse_rfc3339_weak(e).is_ok_and(|e| e <= std::time::SystemTime::now()) => {
            format!("expired {e}")
        }
        (None, Some(e)) => format!("expires {e}"),
        (None, None) => "active".into(),
    };
    list.iter()
        .map(|t| {
            vec![
                t.id.clone(),
                t.name.clone(),
                t.tenant.clone(),
                t.created_at.clone(),
                t.last_used_at.clone().unwrap_or_else(|| "-".into()),
                status(t),
            ]
        })
        .collect()
}

async fn approvals_cmd(c: &Client, cmd: ApprovalCmd) -> Result<i32> {
    match cmd {
        ApprovalCmd::Ls { state, json } => {
            let list = c.list_approvals(state.as_deref()).await?;
            if json {
                output::json(&list);
            } else {
                let rows: Vec<Vec<String>> = list
                    .iter()
                    .map(|a| {
                        vec![
                            a.id.clone(),
                            a.state.to_string(),
                            a.tenant.clone(),
                            format!("{} {}", a.action, a.target),
                            a.requested_by.clone(),
                            a.expires_at.clone(),
                        ]
                    })
                    .collect();
                output::table(&["ID", "STATE", "TENANT", "REQUEST", "BY", "EXPIRES"], rows);
            }
            Ok(0)
        }
        ApprovalCmd::Show { id, json } => {
            let a = c.get_approval(&id).await?;
            if json {
                output::json(&a);
            } else {
                print_approval(&a);
            }
            Ok(0)
        }
        ApprovalCmd::Approve { id, reason } => {
            let a = c.decide_approval(&id, true, reason).await?;
            println!("{} {}", a.id, a.state);
            Ok(0)
        }
        ApprovalCmd::Deny { id, reason } => {
            let a = c.decide_approval(&id, false, reason).await?;
            println!("{} {}", a.id, a.state);
            Ok(0)
        }
        ApprovalCmd::Wait { id } => loop {
            let a = c.get_approval(&id).await?;
            if a.state != strata_api::ApprovalState::Pending {
                print_approval(&a);
                return Ok(if a.state == strata_api::ApprovalState::Approved { 0 } else { 1 });
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        },
    }
}

fn print_approval(a: &strata_api::Approval) {
    println!("id:           {}", a.id);
    println!("state:        {}", a.state);
    println!("tenant:       {}", a.tenant);
    println!("request:      {} {}", a.action, a.target);
    println!("requested by: {} at {}", a.requested_by, a.requested_at);
    println!("expires:      {}", a.expires_at);
    for g in &a.capabilities {
        println!("capability:   {} ({})", g.capability, g.because);
    }
    if let Some(by) = &a.decided_by {
        println!(
            "decided by:   {} at {}{}",
            by,
            a.decided_at.as_deref().unwrap_or("?"),
            a.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default()
        );
    }
    if let Some(u) = &a.used_at {
        println!("used at:      {u}");
    }
}

fn preview_rows(list: &[strata_api::Preview]) -> Vec<Vec<String>> {
    let status = |p: &strata_api::Preview| match &p.revoked_at {
        Some(r) => format!("revoked {r}"),
        None if humantime::parse_rfc3339_weak(&p.expires_at).is_ok_and(|e| e <= std::time::SystemTime::now()) => {
            format!("expired {}", p.expires_at)
        }
        None => format!("expires {}", p.expires_at),
    };
    list.iter()
        .map(|p| {
            vec![
                p.id.clone(),
                p.port.map_or_else(|| "all".into(), |p| p.to_string()),
                if p.public { "public".into() } else { "token".into() },
                status(p),
                p.url_path.clone(),
                p.url_host.clone(),
            ]
        })
        .collect()
}

async fn preview_cmd(c: &Client, cmd: PreviewCmd) -> anyhow::Result<i32> {
    match cmd {
        PreviewCmd::Create { id, port, public, ttl, json } => {
            let port = match port.as_str() {
                "all" | "*" => None,
                p => Some(
                    p.parse::<u16>()
                        .ok()
                        .filter(|p| *p != 0)
                        .ok_or_else(|| anyhow::anyhow!("invalid port {p:?}: 1-65535, or `all`"))?,
                ),
            };
            let ttl_secs = match ttl {
                Some(t) => {
                    Some(strata_core::units::parse_duration(&t).map_err(|e| anyhow::anyhow!("--ttl: {e}"))?.as_secs())
                }
                None => None,
            };
            let p = c.create_preview(&id, &strata_api::CreatePreviewRequest { port, public, ttl_secs }).await?;
            if json {
                output::json(&p);
            } else {
                println!("{}", p.signed_url);
                eprintln!(
                    "preview {} of sandbox {} ({}, expires {}); token (shown only now): {}\nhost-based: {}",
                    p.preview.id,
                    p.preview.sandbox_id,
                    if p.preview.public { "public" } else { "token required" },
                    p.preview.expires_at,
                    p.token,
                    p.preview.url_host
                );
            }
            Ok(0)
        }
        PreviewCmd::Ls { id, all, json } => {
            let list = c.list_previews(&id, all).await?;
            if json {
                output::json(&list);
            } else {
                output::table(&["ID", "PORT", "ACCESS", "STATUS", "URL", "HOST URL"], preview_rows(&list));
            }
            Ok(0)
        }
        PreviewCmd::Revoke { id, preview, json } => {
            let p = c.revoke_preview(&id, &preview).await?;
            if json {
                output::json(&p);
            } else {
                println!("revoked preview {} of sandbox {}", p.id, p.sandbox_id);
            }
            Ok(0)
        }
    }
}

/// Prints an error with its whole cause chain.
fn print_error(e: &anyhow::Error) {
    let mut msg = format!("error: {e}");
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.ends_with(&c) {
            msg.push_str(&format!(": {c}"));
        }
    }
    eprintln!("{msg}");
}

/// Runs the command line; returns the process exit code.
pub async fn run(cli: Cli) -> i32 {
    match dispatch(cli).await {
        Ok(code) => code,
        Err(e) => {
            print_error(&e);
            // A distinct code for scripts: the request waits for a human (`strata approvals`).
            match e.downcast_ref::<strata_client::ClientError>() {
                Some(strata_client::ClientError::Api { body, .. })
                    if body.code == strata_api::ErrorCode::ApprovalRequired =>
                {
                    3
                }
                _ => 1,
            }
        }
    }
}

/// The admission settings of `strata daemon` (absent flags: the built-in defaults).
fn admission_config(a: &DaemonArgs) -> strata_engine::admission::AdmissionConfig {
    use strata_engine::admission::{AdmissionConfig, DefaultLimit};
    let d = AdmissionConfig::default();
    AdmissionConfig {
        default_memory: a.default_memory.unwrap_or(DefaultLimit::Builtin),
        default_cpus: a.default_cpus.unwrap_or(DefaultLimit::Builtin),
        default_pids: a.default_pids.unwrap_or(DefaultLimit::Builtin),
        // `--default-disk 0` meant no default disk before `none` existed.
        default_disk: match a.default_disk {
            Some(DefaultLimit::Value(0)) => DefaultLimit::NoLimit,
            other => other.unwrap_or(DefaultLimit::Builtin),
        },
        memory_overcommit: a.memory_overcommit.map_or(d.memory_overcommit, |r| r.0),
        memory_reserve: a.memory_reserve.unwrap_or(d.memory_reserve),
        disk_overcommit: a.disk_overcommit.map_or(d.disk_overcommit, |r| r.0),
        disk_reserve: a.disk_reserve.unwrap_or(d.disk_reserve),
        tenant_quota: a.tenant_quota.unwrap_or(d.tenant_quota),
    }
}

/// A quota value of `strata tenant quota set`: `None` drops the override (`default`).
fn quota_value(flag: &str, v: &str, bytes: bool) -> Result<Option<strata_api::QuotaValue>> {
    use strata_api::QuotaValue;
    Ok(match v.trim() {
        "default" => None,
        "unlimited" | "none" => Some(QuotaValue::Unlimited),
        n if bytes => Some(QuotaValue::Limit(
            strata_core::units::parse_size(n).map_err(|e| anyhow!("--{flag}: {e}, `unlimited` or `default`"))?,
        )),
        n => Some(QuotaValue::Limit(
            n.parse().map_err(|_| anyhow!("--{flag}: {n:?} is not a count, `unlimited` or `default`"))?,
        )),
    })
}

fn quota_cell(v: Option<u64>, bytes: bool) -> String {
    match v {
        None => "unlimited".into(),
        Some(n) if bytes => output::size(n),
        Some(n) => n.to_string(),
    }
}

fn print_quota(q: &strata_api::TenantQuota) {
    let o = &q.overrides;
    let over =
        |v: Option<strata_api::QuotaValue>, bytes: bool| v.map_or("-".to_string(), |v| quota_cell(v.limit(), bytes));
    let (e, d) = (&q.effective, &q.defaults);
    println!(
        "tenant {}{}",
        q.tenant,
        q.updated_at.as_deref().map(|t| format!(" (override set {t})")).unwrap_or_else(|| " (daemon defaults)".into())
    );
    output::table(
        &["QUOTA", "LIMIT", "OVERRIDE", "DEFAULT"],
        vec![
            vec![
                "sandboxes".into(),
                quota_cell(e.sandboxes, false),
                over(o.sandboxes, false),
                quota_cell(d.sandboxes, false),
            ],
            vec![
                "memory".into(),
                quota_cell(e.memory_bytes, true),
                over(o.memory_bytes, true),
                quota_cell(d.memory_bytes, true),
            ],
            vec![
                "disk".into(),
                quota_cell(e.disk_bytes, true),
                over(o.disk_bytes, true),
                quota_cell(d.disk_bytes, true),
            ],
            vec![
                "forks-per-minute".into(),
                quota_cell(e.forks_per_minute, false),
                over(o.forks_per_minute, false),
                quota_cell(d.forks_per_minute, false),
            ],
        ],
    );
}

async fn tenant_cmd(c: &Client, cli_tenant: Option<&str>, cmd: TenantCmd) -> Result<i32> {
    match cmd {
        TenantCmd::Quota(QuotaCmd::Show { tenant, json }) => {
            let q = c.tenant_quota(&tenant).await?;
            if json {
                output::json(&q)
            } else {
                print_quota(&q)
            }
        }
        TenantCmd::Quota(QuotaCmd::Set { tenant, sandboxes, memory, disk, forks_per_minute, json }) => {
            let mut o = c.tenant_quota(&tenant).await?.overrides;
            for (flag, given, slot, bytes) in [
                ("sandboxes", sandboxes, &mut o.sandboxes, false),
                ("memory", memory, &mut o.memory_bytes, true),
                ("disk", disk, &mut o.disk_bytes, true),
                ("forks-per-minute", forks_per_minute, &mut o.forks_per_minute, false),
            ] {
                if let Some(v) = given {
                    *slot = quota_value(flag, &v, bytes)?;
                }
            }
            let q = c.set_tenant_quota(&tenant, &o).await?;
            if json {
                output::json(&q)
            } else {
                print_quota(&q)
            }
        }
        TenantCmd::Quota(QuotaCmd::Reset { tenant, json }) => {
            let q = c.reset_tenant_quota(&tenant).await?;
            if json {
                output::json(&q)
            } else {
                print_quota(&q)
            }
        }
        TenantCmd::Usage { tenant, json } => {
            let tenant = tenant
                .or_else(|| cli_tenant.map(str::to_string))
                .ok_or_else(|| anyhow!("name the tenant: strata tenant usage TENANT (or --as-tenant TENANT)"))?;
            let u = c.tenant_usage(&tenant).await?;
            if json {
                output::json(&u);
            } else {
                let row = |name: &str, q: &strata_api::QuotaUsage, bytes: bool| {
                    vec![
                        name.to_string(),
                        if bytes { output::size(q.used) } else { q.used.to_string() },
                        quota_cell(q.limit, bytes),
                    ]
                };
                println!("tenant {}", u.tenant);
                output::table(
                    &["QUOTA", "USED", "LIMIT"],
                    vec![
                        row("sandboxes", &u.sandboxes, false),
                        row("memory", &u.memory_bytes, true),
                        row("disk", &u.disk_bytes, true),
                        row("forks-per-minute", &u.forks_per_minute, false),
                    ],
                );
            }
        }
    }
    Ok(0)
}

async fn dispatch(cli: Cli) -> Result<i32> {
    let c = client(&cli);
    match cli.command {
        Command::Daemon(a) => {
            init_logging();
            let helper_exe = std::env::current_exe().context("locating the strata binary")?;
            let admission = admission_config(&a);
            strata_server::run(strata_server::Config {
                engine: strata_engine::Config {
                    state_dir: a.state_dir,
                    helper_exe,
                    init_binary: a.init_binary,
                    archive_url: a.archive_url,
                    prices: a.prices,
                    network: strata_engine::network::NetworkConfig {
                        pool: a.network_pool,
                        dns_upstream: a.dns_upstream,
                    },
                    admission,
                    disk_pool: a.disk_pool,
                    approval_timeout: a.approval_timeout,
                    preview_domain: a.preview_domain,
                },
                socket: cli.socket,
                listen: a.listen,
            })
            .await?;
            Ok(0)
        }
        Command::Mcp => {
            // stdout carries the protocol: nothing else may be printed there.
            strata_mcp::serve_stdio(strata_mcp::StrataMcp::new(c)).await?;
            Ok(0)
        }
        Command::Openapi => {
            println!("{}", strata_server::openapi::spec_json());
            Ok(0)
        }
        Command::Doctor { json } => doctor(&c, json).await,
        Command::Image(cmd) => image(&c, cmd).await,
        Command::Pipeline(cmd) => pipeline(&c, cmd).await,
        Command::Create(a) => {
            let created = c.create_sandbox(&create_request(&a)?).await?;
            println!("{}", created.id);
            Ok(0)
        }
        Command::Run(a) => run_oneshot(&c, a).await,
        Command::Ps { json } => {
            let list = c.list_sandboxes().await?;
            if json {
                output::json(&list);
            } else {
                output::table(
                    &["ID", "NAME", "STATE", "SOURCE", "CREATED"],
                    list.iter()
                        .map(|s| {
                            vec![
                                s.id.clone(),
                                s.name.clone(),
                                s.state.to_string(),
                                s.source.clone(),
                                output::age(&s.created_at),
                            ]
                        })
                        .collect(),
                );
            }
            Ok(0)
        }
        Command::Inspect { id, json } => {
            let s = c.get_sandbox(&id).await?;
            if json {
                output::json(&s);
            } else {
                print_sandbox(&s);
            }
            Ok(0)
        }
        Command::Network(NetworkCmd::Show { id, json }) => {
            let n = c.get_network(&id).await?;
            if json {
                output::json(&n);
            } else {
                print_network(&n);
            }
            Ok(0)
        }
        Command::Network(NetworkCmd::Set { id, network, json }) => {
            let Some(spec) = network_spec(&network) else {
                bail!("nothing to set: give --network none|egress and/or --allow-host / --allow-cidr rules");
            };
            let n = c.set_network(&id, &spec).await?;
            if json {
                output::json(&n);
            } else {
                print_network(&n);
            }
            Ok(0)
        }
        Command::Update(a) => {
            let patch = policy_patch(&a.policy);
            if patch.is_none() && a.capabilities.is_empty() {
                bail!("nothing to update: give --on-idle, --idle-timeout, --max-lifetime, --archive-after, --delete-after or --capability");
            }
            // Declared capabilities only grow: send the current ones with the new.
            let capabilities = if a.capabilities.is_empty() {
                None
            } else {
                let current = c.get_sandbox(&a.id).await?.policy.capabilities;
                Some(current.into_iter().chain(a.capabilities.iter().copied()).collect())
            };
            let s = c.update_sandbox(&a.id, &UpdateSandboxRequest { policy: patch, capabilities }).await?;
            if a.json {
                output::json(&s);
            } else {
                println!("{}", s.id);
            }
            Ok(0)
        }
        Command::Lease(a) => lease_cmd(&c, a).await,
        Command::Stop { ids } => each(ids, |id| async { c.stop_sandbox(&id).await.map(|_| id) }).await,
        Command::Pause { ids } => each(ids, |id| async { c.pause_sandbox(&id).await.map(|_| id) }).await,
        Command::Unpause { ids } => each(ids, |id| async { c.unpause_sandbox(&id).await.map(|_| id) }).await,
        Command::Standby { fs_only, ids } => {
            let c = &c;
            each(ids, |id| async move { c.standby_sandbox(&id, fs_only).await.map(|_| id) }).await
        }
        Command::Resume { json, ids } => {
            let mut results = Vec::new();
            let mut failed = false;
            for id in ids {
                match c.resume_sandbox(&id).await {
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
        Command::Archive { ids } => each(ids, |id| async { c.archive_sandbox(&id).await.map(|_| id) }).await,
        Command::Start { ids } => each(ids, |id| async { c.start_sandbox(&id).await.map(|_| id) }).await,
        Command::Rm { force, ids } => each(ids, |id| async { c.remove_sandbox(&id, force).await.map(|_| id) }).await,
        Command::Exec(a) => {
            let req = exec_request(a.cmd, &a.opts)?;
            if a.detach {
                let p = c.start_process(&a.id, &req).await?;
                println!("{}", p.id);
                return Ok(0);
            }
            exec::run(&c, &a.id, req, a.opts.interactive).await
        }
        Command::Proc(cmd) => proc_cmd(&c, cmd).await,
        Command::Checkpoint(a) => checkpoint_cmd(&c, a).await,
        Command::Template(cmd) => template_cmd(&c, cmd).await,
        Command::Gc { json } => {
            let r = c.gc().await?;
            if json {
                output::json(&r);
            } else {
                println!(
                    "{} checkpoints expired, {} layers removed, {} freed",
                    r.checkpoints_expired.len(),
                    r.layers_removed,
                    output::size(r.bytes_freed)
                );
            }
            Ok(0)
        }
        Command::Advise(a) => {
            let req = strata_api::AdviseRequest {
                keep: a.keep,
                setup: a.setup,
                turns: a.turns,
                turn: a.turn,
                idle: a.idle,
                untrusted_input: a.untrusted,
                fan_out: a.fan_out,
                cpus: a.cpus,
                memory: a.memory,
                disk: a.disk,
            };
            let advice = c.advise(&req).await?;
            if a.json {
                output::json(&advice);
            } else {
                print_advice(&advice);
            }
            Ok(0)
        }
        Command::Cost { id, pipeline: Some(run), json } => {
            let _ = id;
            let r = c.pipeline_cost(&run).await?;
            if json {
                output::json(&r);
            } else {
                let mut rows: Vec<Vec<String>> = r
                    .stages
                    .iter()
                    .map(|s| vec![s.name.clone(), s.sandboxes.len().to_string(), format!("{:.6}", s.total)])
                    .collect();
                rows.push(vec!["total".into(), String::new(), format!("{:.6}", r.total)]);
                output::table(&["STAGE", "SANDBOXES", "COST"], rows);
            }
            Ok(0)
        }
        Command::Cost { id, pipeline: None, json } => {
            match id {
                Some(id) => {
                    let r = c.cost(&id).await?;
                    if json {
                        output::json(&r);
                    } else {
                        print_cost(&r);
                    }
                }
                None => {
                    let s = c.cost_summary().await?;
                    if json {
                        output::json(&s);
                    } else {
                        let cur = &s.prices.currency;
                        output::table(
                            &[
                                "ID",
                                "NAME",
                                "STATE",
                                "CPU-S",
                                "MEM-GB-S",
                                "COMPUTE",
                                "STORAGE",
                                "TOTAL",
                                "EPHEMERAL-ONLY",
                                "ALWAYS-ON",
                            ],
                            s.sandboxes
                                .iter()
                                .map(|r| {
                                    vec![
                                        r.sandbox_id.chars().take(12).collect(),
                                        r.name.clone(),
                                        r.state.to_string(),
                                        format!("{:.2}", r.usage.compute.cpu_seconds),
                                        format!("{:.2}", r.usage.compute.memory_gb_seconds),
                                        money(r.compute.total),
                                        money(r.storage_total),
                                        money(r.total),
                                        money(r.ephemeral_only.total),
                                        money(r.always_on.total),
                                    ]
                                })
                                .collect(),
                        );
                        println!(
                            "total {} {cur} (ephemeral-only {}, always-on {})",
                            money(s.total),
                            money(s.ephemeral_only_total),
                            money(s.always_on_total)
                        );
                    }
                }
            }
            Ok(0)
        }
        Command::Lineage { id, json } => {
            let l = c.lineage(&id).await?;
            if json {
                output::json(&l);
            } else {
                print_lineage(&l);
            }
            Ok(0)
        }
        Command::Restore { id, to, keep_current, warm, json } => {
            let r = c
                .restore(&id, &strata_api::RestoreRequest { checkpoint: to, keep_current, processes: warm.choice() })
                .await?;
            if json {
                output::json(&r);
            } else {
                if let Some(k) = &r.kept {
                    eprintln!("kept the previous state as checkpoint {} ({})", k.id, k.name);
                }
                println!("{}", r.sandbox.id);
            }
            Ok(0)
        }
        Command::Fork { source, count, fanout, name_prefix, lifecycle, ttl, warm, json } => {
            let lifecycle = match lifecycle {
                LifecycleArg::Ephemeral => Lifecycle::Ephemeral,
                LifecycleArg::Persistent => Lifecycle::Persistent,
            };
            if let Some(run) = fanout.run {
                let plan = strata_api::FanoutPlan {
                    run: Some(run),
                    args: fanout.args,
                    count,
                    select: match fanout.select {
                        SelectArg::First => strata_api::SelectRule::FirstSuccess,
                        SelectArg::All => strata_api::SelectRule::AllSuccess,
                        SelectArg::Score => strata_api::SelectRule::BestScore,
                    },
                    score_cmd: fanout.score_cmd,
                    timeout: fanout.timeout,
                    losers: if fanout.keep_losers {
                        strata_api::LoserPolicy::Keep
                    } else {
                        strata_api::LoserPolicy::Destroy
                    },
                    attempts: vec![],
                    user: fanout.user,
                    workdir: fanout.workdir,
                };
                let r = c
                    .fanout(&strata_api::FanoutRequest {
                        source,
                        plan,
                        promote_as: fanout.promote,
                        name_prefix,
                        lifecycle,
                        ttl,
                        limits: None,
                    })
                    .await?;
                if json {
                    output::json(&r);
                } else {
                    print_fanout(&r);
                }
                return Ok(if r.winner.is_some() { 0 } else { 1 });
            }
            let count = count.ok_or_else(|| anyhow!("--count is required (or --run with --arg)"))?;
            let r = c
                .fork(&strata_api::ForkRequest {
                    source,
                    count,
                    name_prefix,
                    lifecycle,
                    ttl,
                    limits: None,
                    network: None,
                    processes: warm.choice(),
                })
                .await?;
            if json {
                output::json(&r);
            } else {
                for id in &r.sandboxes {
                    println!("{id}");
                }
            }
            Ok(0)
        }
        Command::Scan { id, json } => {
            let r = c.scan(&id).await?;
            if json {
                output::json(&r);
            } else {
                print_findings(&r.findings);
                println!(
                    "{} {} ({}): {} paths changed above image {}, {}",
                    r.kind,
                    r.name,
                    r.id,
                    r.changed_paths,
                    r.image,
                    if r.clean { "clean".to_string() } else { format!("{} findings", r.findings.len()) }
                );
                if !r.packaged.is_empty() {
                    println!("({} credential-pattern matches in files shipped by installed Python packages, verified against their RECORD, are not counted; --json lists them)", r.packaged.len());
                }
            }
            Ok(if r.clean { 0 } else { 2 })
        }
        Command::Approvals(cmd) => approvals_cmd(&c, cmd).await,
        Command::Preview(cmd) => preview_cmd(&c, cmd).await,
        Command::Tenant(cmd) => tenant_cmd(&c, cli.as_tenant.as_deref(), cmd).await,
        Command::Token(cmd) => match cmd {
            TokenCmd::Create { name, tenant, expires, json } => {
                let t = c.create_token(&strata_api::CreateTokenRequest { name, tenant, expires }).await?;
                if json {
                    output::json(&t);
                } else {
                    println!("{}", t.secret);
                    eprintln!(
                        "token {} ({}) for tenant {:?}{}: the secret above is shown only now",
                        t.token.id,
                        t.token.name,
                        t.token.tenant,
                        t.token.expires_at.as_deref().map(|e| format!(", expires {e}")).unwrap_or_default()
                    );
                }
                Ok(0)
            }
            TokenCmd::Ls { tenant, all, json } => {
                let list = c.list_tokens(tenant.as_deref(), all).await?;
                if json {
                    output::json(&list);
                } else {
                    output::table(&["ID", "NAME", "TENANT", "CREATED", "LAST USED", "STATUS"], token_rows(&list));
                }
                Ok(0)
            }
            TokenCmd::Revoke { id, tenant, json } => {
                let t = c.revoke_token(&id, tenant.as_deref()).await?;
                if json {
                    output::json(&t);
                } else {
                    println!("revoked token {} ({}) of tenant {:?}", t.id, t.name, t.tenant);
                }
                Ok(0)
            }
        },
        Command::Audit(a) => match a.command {
            Some(AuditCmd::Verify { json }) => {
                let v = c.audit_verify().await?;
                if json {
                    output::json(&v);
                } else if v.ok {
                    println!("audit log ok: {} entries, chain intact", v.entries);
                } else {
                    println!(
                        "audit log BROKEN at entry {}: {} ({} entries)",
                        v.first_bad.unwrap_or_default(),
                        v.reason.clone().unwrap_or_default(),
                        v.entries
                    );
                }
                Ok(if v.ok { 0 } else { 1 })
            }
            None => {
                let list = c.audit(Some(a.limit)).await?;
                if a.json {
                    output::json(&list);
                } else {
                    output::table(
                        &["SEQ", "TIME", "ACTOR", "TENANT", "METHOD", "ROUTE", "TARGET", "STATUS"],
                        list.iter()
                            .map(|e| {
                                vec![
                                    e.seq.to_string(),
                                    e.time.clone(),
                                    e.actor.clone(),
                                    e.tenant.clone().unwrap_or_else(|| "-".into()),
                                    e.method.clone(),
                                    e.route.clone(),
                                    e.target.clone().unwrap_or_default(),
                                    e.status.to_string(),
                                ]
                            })
                            .collect(),
                    );
                }
                Ok(0)
            }
        },
        Command::Diff { id, against, json } => {
            let list = c.diff(&id, against.as_deref()).await?;
            if json {
                output::json(&list);
            } else {
                for ch in &list {
                    let mark = match ch.change {
                        strata_api::ChangeKind::Added => 'A',
                        strata_api::ChangeKind::Modified => 'M',
                        strata_api::ChangeKind::Deleted => 'D',
                    };
                    let size = if ch.change == strata_api::ChangeKind::Deleted || ch.kind == "dir" {
                        String::new()
                    } else {
                        format!("  ({})", output::size(ch.size))
                    };
                    println!("{mark} {}{size}", ch.path);
                }
            }
            Ok(0)
        }
        Command::Export { id, against, output: out } => {
            transfer::download_to(c.export_stream(&id, against.as_deref()).await?, &out, 0o644).await?;
            Ok(0)
        }
        Command::Cp { src, dst } => cp(&c, &src, &dst).await,
        Command::Fs(cmd) => fs_cmd(&c, cmd).await,
        Command::Events { id, follow, json } => events(&c, id, follow, json).await,
    }
}

fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("STRATA_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}

/// Applies `f` to each id, printing the ids that succeeded and every error; fails if any failed.
async fn each<F, Fut>(ids: Vec<String>, f: F) -> Result<i32>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<String, strata_client::ClientError>>,
{
    let mut failed = 0;
    for id in ids {
        match f(id.clone()).await {
            Ok(id) => println!("{id}"),
            Err(e) => {
                print_error(&anyhow::Error::new(e).context(format!("sandbox {id}")));
                failed += 1;
            }
        }
    }
    Ok(if failed > 0 { 1 } else { 0 })
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
    })
}

/// The network of `--network`/`--allow-*` (None when no flag is given).
fn network_spec(a: &NetworkArgs) -> Option<strata_api::NetworkSpec> {
    let allow: Vec<String> = a.allow_host.iter().chain(&a.allow_cidr).cloned().collect();
    let mode = match a.network {
        Some(NetworkModeArg::Egress) => strata_api::NetworkMode::Egress,
        Some(NetworkModeArg::None) => strata_api::NetworkMode::None,
        None if !allow.is_empty() => strata_api::NetworkMode::Egress,
        None => return None,
    };
    Some(strata_api::NetworkSpec { mode, allow })
}

fn print_network(n: &strata_api::NetworkInfo) {
    let fc = |c: &strata_api::FlowCounter| format!("{} packets, {} bytes", c.packets, c.bytes);
    let mut rows = vec![
        ("mode", n.spec.mode.as_str().to_string()),
        ("allow", if n.spec.allow.is_empty() { "-".into() } else { n.spec.allow.join(" ") }),
    ];
    if let (Some(a), Some(g)) = (&n.address, &n.gateway) {
        rows.push(("address", format!("{a} (gateway and DNS {g}){}", if n.attached { "" } else { ", not attached" })));
        rows.push(("allowed", fc(&n.allowed)));
        rows.push(("denied", fc(&n.denied)));
        rows.push(("received", fc(&n.received)));
        rows.push(("dns", format!("{} answered, {} refused", n.dns_answered, n.dns_refused)));
        if !n.recent_denied.is_empty() {
            rows.push(("recently denied", n.recent_denied.join(", ")));
        }
    }
    for (k, v) in rows {
        println!("{k:<16} {v}");
    }
}

async fn run_oneshot(c: &Client, a: RunArgs) -> Result<i32> {
    let req = CreateSandboxRequest {
        source: a.source.clone(),
        name: a.name.clone(),
        lifecycle: if a.rm { Lifecycle::Ephemeral } else { Lifecycle::Persistent },
        ttl: a.ttl.clone().or_else(|| a.rm.then(|| "24h".to_string())),
        limits: limits(&a.limits)?,
        policy: policy_patch(&a.policy),
        secrets: secrets(&a.secrets)?,
        network: network_spec(&a.network),
        ..Default::default()
    };
    let created = c.create_sandbox(&req).await?;
    let req = exec_request(a.cmd, &a.opts)?;
    let result = exec::run(c, &created.id, req, a.opts.interactive).await;
    if a.rm {
        if let Err(e) = c.remove_sandbox(&created.id, true).await {
            eprintln!("strata: removing sandbox {}: {e}", created.id);
        }
    } else {
        eprintln!("strata: sandbox {} kept (persistent)", created.id);
    }
    result
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
            "on_idle={} after {}, max_lifetime={}, archive_after={}, delete_after={}",
            p.on_idle,
            p.idle_timeout,
            opt(&p.max_lifetime),
            opt(&p.archive_after),
            opt(&p.delete_after)
        ),
    ));
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
    if s.allow_setuid {
        rows.push(("setuid", "allowed (no no_new_privs: sudo works, up to the sandbox's root)".into()));
    }
    for (k, v) in rows {
        println!("{k:<10} {v}");
    }
}

async fn lease_cmd(c: &Client, a: LeaseArgs) -> Result<i32> {
    let print = |l: &Lease, json: bool| {
        if json {
            output::json(l);
        } else {
            println!("{}  {}", l.id, l.expires_at);
        }
    };
    match a.command {
        None => {
            let id = a.id.expect("clap requires the sandbox id");
            let duration = a.duration.expect("clap requires --for");
            print(&c.create_lease(&id, &duration).await?, a.json);
        }
        Some(LeaseCmd::Renew { id, lease, duration, json }) => {
            print(&c.renew_lease(&id, &lease, &duration).await?, json)
        }
        Some(LeaseCmd::Release { id, lease }) => {
            c.release_lease(&id, &lease).await?;
            println!("{lease}");
        }
        Some(LeaseCmd::Ls { id, json }) => {
            let list = c.list_leases(&id).await?;
            if json {
                output::json(&list);
            } else {
                output::table(
                    &["LEASE", "EXPIRES", "CREATED"],
                    list.iter().map(|l| vec![l.id.clone(), l.expires_at.clone(), output::age(&l.created_at)]).collect(),
                );
            }
        }
    }
    Ok(0)
}

async fn doctor(c: &Client, json: bool) -> Result<i32> {
    // The daemon's view when it runs; probe locally otherwise (doctor must work before setup).
    let report = match c.doctor().await {
        Ok(r) => r,
        Err(_) => tokio::task::spawn_blocking(strata_runtime::probe::doctor).await?,
    };
    if json {
        output::json(&report);
        return Ok(0);
    }
    println!("kernel {} · cgroups {}", report.kernel, report.cgroup_version);
    for f in &report.features {
        let mark = if f.available { "ok " } else { "-- " };
        let extra = if f.available { String::new() } else { format!("  (disables: {})", f.disables) };
        println!("  {mark} {:<18} {}{extra}", f.name, f.detail);
    }
    println!("tiers:");
    for t in &report.tiers {
        println!("  {} {:<10} {}", if t.available { "ok " } else { "-- " }, t.name, t.detail);
    }
    if !report.names_like_ids.is_empty() {
        println!("names that could be read as ids (from before such names were refused; use their ids):");
        for n in &report.names_like_ids {
            println!(
                "  {:<12} {:<20} id {}{}",
                n.kind,
                n.name,
                n.id,
                n.tenant.as_deref().map(|t| format!("  tenant {t}")).unwrap_or_default()
            );
        }
    }
    Ok(0)
}

async fn image(c: &Client, cmd: ImageCmd) -> Result<i32> {
    match cmd {
        ImageCmd::Import { src, name, trusted, replace, json } => {
            let src = std::fs::canonicalize(&src).with_context(|| format!("source {}", src.display()))?;
            let req = ImportImageRequest { source: src.display().to_string(), name, trusted, replace };
            let events = c.import_image_stream(&req).await?;
            follow_import(events, json, "import").await
        }
        ImageCmd::Pull { reference, name, insecure, json } => {
            let req = PullImageRequest { reference, name, insecure };
            let events = c.pull_image_stream(&req).await?;
            follow_import(events, json, "pull").await
        }
        ImageCmd::Ls { json } => {
            let list = c.list_images().await?;
            if json {
                output::json(&list);
            } else {
                output::table(
                    &["NAME", "ID", "LAYERS", "SIZE", "SOURCE", "CREATED"],
                    list.iter()
                        .map(|i| {
                            vec![
                                i.name.clone(),
                                i.id.trim_start_matches("sha256:").chars().take(12).collect(),
                                i.layers.len().to_string(),
                                output::size(i.size),
                                i.source_kind.clone(),
                                output::age(&i.created_at),
                            ]
                        })
                        .collect(),
                );
            }
            Ok(0)
        }
        ImageCmd::Inspect { name, json } => {
            let i = c.get_image(&name).await?;
            if json {
                output::json(&i);
            } else {
                println!(
                    "name     {}\nid       {}\nsource   {} ({})\nsize     {}\nlayers",
                    i.name,
                    i.id,
                    i.source,
                    i.source_kind,
                    output::size(i.size)
                );
                for l in &i.layers {
                    println!("  {} {}", l.digest, output::size(l.size));
                }
            }
            Ok(0)
        }
        ImageCmd::Rm { names } => each(names, |n| async { c.remove_image(&n).await.map(|_| n) }).await,
    }
}

/// Shows an import or pull progress stream and prints its report (`what`
/// names the operation in errors).
async fn follow_import(mut events: strata_client::NdjsonStream<ImportEvent>, json: bool, what: &str) -> Result<i32> {
    let bar = indicatif::ProgressBar::new_spinner();
    if json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} {bytes}/{total_bytes}").expect("valid template"),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    while let Some(ev) = events.next().await? {
        match ev {
            ImportEvent::Progress { phase, done, total } => {
                bar.set_message(phase);
                bar.set_length(total.unwrap_or(done));
                bar.set_position(done);
            }
            ImportEvent::Done { report } => {
                bar.finish_and_clear();
                if json {
                    output::json(&report);
                } else {
                    for w in &report.warnings {
                        eprintln!("warning: {w}");
                    }
                    println!(
                        "{} {} ({} layers: {} new, {} reused; {} stored; {} ms)",
                        report.image.name,
                        report.image.id,
                        report.image.layers.len(),
                        report.layers_new,
                        report.layers_reused,
                        output::size(report.bytes_stored),
                        report.duration_ms
                    );
                }
                return Ok(0);
            }
            ImportEvent::Failed { error } => {
                bar.finish_and_clear();
                bail!("{what} failed: {} ({})", error.message, error.code);
            }
        }
    }
    bail!("the daemon closed the {what} stream without a result")
}

async fn proc_cmd(c: &Client, cmd: ProcCmd) -> Result<i32> {
    match cmd {
        ProcCmd::Ls { id, json } => {
            let list = c.list_processes(&id).await?;
            if json {
                output::json(&list);
            } else {
                output::table(
                    &["ID", "PID", "STATUS", "EXIT", "COMMAND"],
                    list.iter()
                        .map(|p| {
                            let exit = match p.status {
                                strata_api::ProcessStatus::Running => String::new(),
                                strata_api::ProcessStatus::Exited => p.exit_status().to_string(),
                            };
                            vec![
                                p.id.to_string(),
                                p.pid.map(|x| x.to_string()).unwrap_or_default(),
                                format!("{:?}", p.status).to_lowercase(),
                                exit,
                                p.cmd.join(" "),
                            ]
                        })
                        .collect(),
                );
            }
            Ok(0)
        }
        ProcCmd::Logs { id, pid, follow } => {
            let mut events = c.logs(&id, pid, 0, follow).await?;
            let b64 = base64::engine::general_purpose::STANDARD;
            while let Some(ev) = events.next().await? {
                if let strata_api::ProcessEvent::Output { stream, data_b64, .. } = ev {
                    let data = base64::Engine::decode(&b64, data_b64)?;
                    match stream {
                        strata_api::StreamKind::Stdout => std::io::stdout().write_all(&data)?,
                        strata_api::StreamKind::Stderr => std::io::stderr().write_all(&data)?,
                    }
                }
            }
            Ok(0)
        }
        ProcCmd::Kill { id, pid, signal } => {
            c.signal(&id, pid, &signal).await?;
            Ok(0)
        }
        ProcCmd::Wait { id, pid, timeout } => {
            let p = c.wait(&id, pid, timeout.as_deref()).await?;
            if p.status == strata_api::ProcessStatus::Running {
                bail!("process {pid} still running after {}", timeout.unwrap_or_default());
            }
            Ok(exec::status_of(&p))
        }
    }
}

/// Splits `ID:/path` into (id, path); local paths have no `:` before a `/`.
fn remote(spec: &str) -> Option<(&str, &str)> {
    let (id, path) = spec.split_once(':')?;
    (!id.is_empty() && !id.contains('/') && path.starts_with('/')).then_some((id, path))
}

async fn cp(c: &Client, src: &str, dst: &str) -> Result<i32> {
    match (remote(src), remote(dst)) {
        (None, Some((id, path))) => {
            let local = std::path::Path::new(src);
            let meta = std::fs::metadata(local).with_context(|| format!("reading {src}"))?;
            if meta.is_dir() {
                // The tar is made while it is sent: nothing is held whole in memory.
                let root = local.to_path_buf();
                let (chunks, archived) = transfer::produce(move |w| {
                    let mut b = tar::Builder::new(w);
                    b.follow_symlinks(false);
                    b.append_dir_all(".", &root)?;
                    b.finish()
                });
                let sent = c.upload_stream(id, path, chunks, None, true).await;
                archived.await.context("archiving thread")?.with_context(|| format!("archiving {src}"))?;
                sent?;
            } else {
                use std::os::unix::fs::PermissionsExt;
                let file = tokio::fs::File::open(local).await.with_context(|| format!("reading {src}"))?;
                // Copying into an existing directory keeps the file name, like cp(1).
                let target = match c.stat(id, path).await {
                    Ok(s) if s.kind == strata_api::FileKind::Dir => format!(
                        "{}/{}",
                        path.trim_end_matches('/'),
                        local.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
                    ),
                    _ => path.to_string(),
                };
                c.upload_stream(
                    id,
                    &target,
                    transfer::file_chunks(file),
                    Some(meta.permissions().mode() & 0o777),
                    false,
                )
                .await?;
            }
            Ok(0)
        }
        (Some((id, path)), None) => {
            let st = c.stat(id, path).await?;
            if st.kind == strata_api::FileKind::Dir {
                let dst_path = std::path::Path::new(dst);
                // Like cp -r: into an existing directory keeps the name, otherwise the copy is named `dst`.
                let (into, rename_to) = if dst_path.is_dir() {
                    (dst_path.to_path_buf(), None)
                } else {
                    (
                        dst_path
                            .parent()
                            .filter(|p| !p.as_os_str().is_empty())
                            .unwrap_or(std::path::Path::new("."))
                            .to_path_buf(),
                        Some(dst_path),
                    )
                };
                let staging = tempfile_dir(&into)?;
                // Unpacked while it arrives (the tar crate's unpack refuses entries that would leave the target directory).
                let target_dir = staging.clone();
                let res = transfer::consume(c.download_stream(id, path, true).await?, move |r| {
                    tar::Archive::new(r).unpack(&target_dir)
                })
                .await
                .with_context(|| format!("extracting into {}", staging.display()));
                let res = res.and_then(|_| {
                    let target = rename_to.map(|p| p.to_path_buf()).unwrap_or_else(|| into.join(&st.name));
                    std::fs::rename(staging.join(&st.name), &target)
                        .with_context(|| format!("moving into {}", target.display()))
                });
                let _ = std::fs::remove_dir_all(&staging);
                res?;
            } else {
                let target = if std::path::Path::new(dst).is_dir() {
                    std::path::Path::new(dst).join(&st.name)
                } else {
                    dst.into()
                };
                transfer::download_to(c.download_stream(id, path, false).await?, &target, st.mode & 0o777).await?;
            }
            Ok(0)
        }
        (Some(_), Some(_)) => bail!("copying between two sandboxes is not supported; copy through a local path"),
        (None, None) => bail!("one side of cp must be ID:/absolute/path"),
    }
}

async fn fs_cmd(c: &Client, cmd: FsCmd) -> Result<i32> {
    match cmd {
        FsCmd::Ls { id, path, json } => {
            let list = c.list_dir(&id, &path).await?;
            if json {
                output::json(&list);
            } else {
                output::table(
                    &["MODE", "UID", "GID", "SIZE", "NAME"],
                    list.iter()
                        .map(|f| {
                            let name = match &f.link_target {
                                Some(t) => format!("{} -> {t}", f.name),
                                None => f.name.clone(),
                            };
                            vec![
                                format!("{:?} {:o}", f.kind, f.mode).to_lowercase(),
                                f.uid.to_string(),
                                f.gid.to_string(),
                                f.size.to_string(),
                                name,
                            ]
                        })
                        .collect(),
                );
            }
        }
        FsCmd::Stat { id, path } => output::json(&c.stat(&id, &path).await?),
        FsCmd::Mkdir { id, path, parents } => c.mkdir(&id, &path, parents).await?,
        FsCmd::Rm { id, path, recursive } => c.remove_path(&id, &path, recursive).await?,
        FsCmd::Mv { id, from, to } => c.move_path(&id, &from, &to).await?,
    }
    Ok(0)
}

async fn events(c: &Client, id: Option<String>, follow: bool, json: bool) -> Result<i32> {
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

/// A fresh hidden directory inside `parent` for staging a download.
fn tempfile_dir(parent: &std::path::Path) -> Result<std::path::PathBuf> {
    let p = parent.join(format!(".strata-cp-{}", std::process::id()));
    std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
    Ok(p)
}

async fn checkpoint_cmd(c: &Client, a: CheckpointArgs) -> Result<i32> {
    let print_one = |ck: &strata_api::Checkpoint| {
        println!(
            "id        {}\nname      {}\nsandbox   {}\nparent    {}\nimage     {} ({})\nlayer     {} ({})\nchain     {} layers\nchanged   {} paths\nfrozen    {} ms (took {} ms)\ncreated   {}",
            ck.id,
            ck.name,
            ck.sandbox_id,
            ck.parent.as_deref().unwrap_or("-"),
            ck.image,
            ck.image_id,
            ck.layer.as_deref().unwrap_or("none (nothing changed)"),
            output::size(ck.layer_size),
            ck.layers.len(),
            ck.changed_paths,
            ck.frozen_ms,
            ck.duration_ms,
            ck.created_at
        )
    };
    match a.command {
        None => {
            let id = a.id.expect("clap requires the sandbox id");
            let req = strata_api::CheckpointRequest {
                name: a.name,
                labels: kv(&a.labels, "--label")?,
                ttl: a.ttl,
                pinned: a.pin,
                processes: a.processes,
            };
            let ck = c.checkpoint(&id, &req).await?;
            if a.json {
                output::json(&ck);
            } else {
                println!("{}", ck.id);
            }
        }
        Some(CheckpointCmd::Ls { id, json }) => {
            let list = c.list_checkpoints(id.as_deref()).await?;
            if json {
                output::json(&list);
            } else {
                output::table(
                    &["ID", "NAME", "SANDBOX", "PARENT", "LAYER SIZE", "CREATED"],
                    list.iter()
                        .map(|k| {
                            vec![
                                k.id.clone(),
                                k.name.clone(),
                                k.sandbox_id.clone(),
                                k.parent.clone().unwrap_or_else(|| "-".into()),
                                output::size(k.layer_size),
                                output::age(&k.created_at),
                            ]
                        })
                        .collect(),
                );
            }
        }
        Some(CheckpointCmd::Inspect { id, json }) => {
            let ck = c.get_checkpoint(&id).await?;
            if json {
                output::json(&ck);
            } else {
                print_one(&ck);
            }
        }
        Some(CheckpointCmd::Rm { ids }) => {
            return each(ids, |i| async { c.delete_checkpoint(&i).await.map(|_| i) }).await
        }
    }
    Ok(0)
}

async fn template_cmd(c: &Client, cmd: TemplateCmd) -> Result<i32> {
    match cmd {
        TemplateCmd::Create { name, from, replace, accept_findings } => {
            let t = match c
                .create_template(&strata_api::CreateTemplateRequest { name, from, replace, accept_findings })
                .await
            {
                Ok(t) => t,
                Err(strata_client::ClientError::Api { status, body })
                    if body.code == strata_api::ErrorCode::ScanFindings =>
                {
                    print_findings(&body.findings);
                    return Err(strata_client::ClientError::Api { status, body }.into());
                }
                Err(e) => return Err(e.into()),
            };
            if let Some(a) = &t.accepted_findings {
                eprintln!("accepted {} state-hygiene finding(s) (recorded on the template)", a.count);
            }
            println!("{}", t.name);
        }
        TemplateCmd::Ls { json } => {
            let list = c.list_templates().await?;
            if json {
                output::json(&list);
            } else {
                output::table(
                    &["NAME", "CHECKPOINT", "IMAGE", "LAYERS", "CREATED"],
                    list.iter()
                        .map(|t| {
                            vec![
                                t.name.clone(),
                                t.checkpoint.clone(),
                                t.image.clone(),
                                t.layers.to_string(),
                                output::age(&t.created_at),
                            ]
                        })
                        .collect(),
                );
            }
        }
        TemplateCmd::Rm { names } => return each(names, |n| async { c.delete_template(&n).await.map(|_| n) }).await,
        TemplateCmd::Build { name, file, no_cache, accept_findings, json } => {
            let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            let context = std::fs::canonicalize(&file)?.parent().map(|p| p.display().to_string());
            let mut events = c
                .build_template(&strata_api::BuildTemplateRequest {
                    name,
                    file: text,
                    context,
                    no_cache,
                    accept_findings,
                })
                .await?;
            let b64 = base64::engine::general_purpose::STANDARD;
            while let Some(ev) = events.next().await? {
                if json {
                    println!("{}", serde_json::to_string(&ev)?);
                }
                match ev {
                    strata_api::BuildEvent::Step { index, count, instruction, cached } if !json => {
                        eprintln!("[{index}/{count}] {instruction}{}", if cached { "  (cached)" } else { "" });
                    }
                    strata_api::BuildEvent::Output { stream, data_b64 } if !json => {
                        let data = base64::Engine::decode(&b64, data_b64)?;
                        match stream {
                            strata_api::StreamKind::Stdout => std::io::stdout().write_all(&data)?,
                            strata_api::StreamKind::Stderr => std::io::stderr().write_all(&data)?,
                        }
                    }
                    strata_api::BuildEvent::Done { template, steps_run, steps_cached, duration_ms } => {
                        if !json {
                            eprintln!(
                                "built template {} ({steps_run} steps run, {steps_cached} cached, {duration_ms} ms)",
                                template.name
                            );
                            println!("{}", template.name);
                        }
                        return Ok(0);
                    }
                    strata_api::BuildEvent::Failed { index, error } => {
                        if !json {
                            print_findings(&error.findings);
                        }
                        bail!("build failed at step {index}: {} ({})", error.message, error.code)
                    }
                    _ => {}
                }
            }
            bail!("the daemon closed the build stream without a result");
        }
    }
    Ok(0)
}

/// Prints state-hygiene findings, one per line, to stderr.
fn print_findings(findings: &[strata_api::Finding]) {
    for f in findings {
        eprintln!("{:<8} {:<28} {}  ({})", f.severity, f.rule, f.path, f.reason);
    }
}

/// Prints a lineage as an indented tree, marking the node asked about.
fn print_lineage(l: &strata_api::Lineage) {
    fn walk(l: &strata_api::Lineage, idx: usize, prefix: &str, last: bool, root: bool) {
        let n = &l.nodes[idx];
        let mark = if n.id == l.focus { "  <==" } else { "" };
        let branch = if root {
            ""
        } else if last {
            "└─ "
        } else {
            "├─ "
        };
        let name = if n.name != n.id { format!("{} ({})", n.name, n.id) } else { n.id.clone() };
        println!("{prefix}{branch}{} {name}  [{}]{mark}", n.kind, n.detail);
        let kids: Vec<usize> = l
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, c)| c.parent.as_deref() == Some(n.id.as_str()) && c.id != n.id)
            .map(|(i, _)| i)
            .collect();
        let child_prefix = if root { String::new() } else { format!("{prefix}{}", if last { "   " } else { "│  " }) };
        for (k, &i) in kids.iter().enumerate() {
            walk(l, i, &child_prefix, k + 1 == kids.len(), false);
        }
    }
    if !l.nodes.is_empty() {
        walk(l, 0, "", true, true);
    }
}

/// A cost or quantity readable at any magnitude: fixed point, or 4 significant digits when small.
fn money(v: f64) -> String {
    // An empty sum is -0.0: print it as 0.
    let v = if v == 0.0 { 0.0 } else { v };
    if v == 0.0 || v.abs() >= 0.01 {
        format!("{v:.4}")
    } else {
        format!("{v:.3e}")
    }
}

fn print_cost(r: &strata_api::CostReport) {
    let cur = &r.prices.currency;
    let u = &r.usage;
    println!(
        "sandbox    {} ({}) {}, lifetime {:.1} s, running {:.1} s",
        r.sandbox_id, r.name, r.state, r.lifetime_seconds, u.compute.running_seconds
    );
    println!(
        "compute    cpu {} CPU-s = {} {cur}; memory {} GB-s = {} {cur}; peak memory {}",
        money(u.compute.cpu_seconds),
        money(r.compute.cpu),
        money(u.compute.memory_gb_seconds),
        money(r.compute.memory),
        output::size(u.peak_memory_bytes)
    );
    for kind in strata_api::STORAGE_KINDS {
        let gbh = u.storage_gb_hours.get(kind).copied().unwrap_or(0.0);
        println!(
            "storage    {kind:<10} {} GB-h = {} {cur}",
            money(gbh),
            money(r.storage.get(kind).copied().unwrap_or(0.0))
        );
    }
    println!(
        "total      {} {cur} (compute {}, storage {})",
        money(r.total),
        money(r.compute.total),
        money(r.storage_total)
    );
    println!(
        "ephemeral-only {} {cur} (+{:.1} s of repeated setup): {}",
        money(r.ephemeral_only.total),
        r.ephemeral_only.extra_seconds,
        r.ephemeral_only.method
    );
    println!("always-on      {} {cur}: {}", money(r.always_on.total), r.always_on.method);
}

fn print_advice(a: &strata_api::Advice) {
    println!("recommendation: {}", a.recommendation.as_str());
    for r in &a.reasons {
        println!("  - {r}");
    }
    for w in &a.warnings {
        println!("  warning: {w}");
    }
    println!();
    output::table(
        &["ALTERNATIVE", "KEEPS ALL", "SETUP RUNS", "WAITING", "COMPUTE", "STORAGE", "TOTAL"],
        a.alternatives
            .iter()
            .map(|c| {
                let mark = if c.strategy == a.recommendation { " *" } else { "" };
                vec![
                    format!("{}{mark}", c.strategy.as_str()),
                    if c.satisfies_keep { "yes".into() } else { format!("no: {}", c.unmet.as_deref().unwrap_or("")) },
                    c.setup_runs.to_string(),
                    format!("{:.1}s", c.waiting_seconds),
                    money(c.compute_cost),
                    money(c.storage_cost),
                    money(c.total_cost),
                ]
            })
            .collect(),
    );
    println!("costs in {} (the daemon's price table; see `strata cost`)", a.currency);
}

/// The attempts of a fan-out as a table, then the winner (or why there is none).
fn print_fanout(r: &strata_api::FanoutResult) {
    let rows = r
        .attempts
        .iter()
        .map(|a| {
            let last = |t: &str| {
                t.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").chars().take(60).collect::<String>()
            };
            vec![
                format!("{}{}", a.index, if r.winner == Some(a.index) { " *" } else { "" }),
                a.sandbox_name.clone(),
                format!("{:?}", a.outcome).to_lowercase().replace("timedout", "timed_out"),
                a.exit_code.map_or("-".into(), |c| c.to_string()),
                format!("{:.1}s", a.duration_ms as f64 / 1000.0),
                match (a.score, &a.score_error) {
                    (Some(s), _) => s.to_string(),
                    (None, Some(e)) => format!("- ({})", e.chars().take(40).collect::<String>()),
                    _ => "-".into(),
                },
                if a.kept { "kept" } else { "destroyed" }.to_string(),
                last(if a.stderr_tail.trim().is_empty() { &a.stdout_tail } else { &a.stderr_tail }),
            ]
        })
        .collect();
    output::table(&["#", "SANDBOX", "OUTCOME", "EXIT", "TIME", "SCORE", "KEPT", "LAST OUTPUT"], rows);
    match (&r.winner, &r.winner_sandbox) {
        (Some(w), Some(sb)) => {
            let promoted = r
                .promoted
                .as_ref()
                .map(|c| format!(", promoted as checkpoint {} ({})", c.name, c.id))
                .unwrap_or_default();
            println!("winner: attempt {w}, sandbox {sb}{promoted}");
        }
        _ => println!("no winner: {}", r.reason.as_deref().unwrap_or("unknown")),
    }
}

/// `strata pipeline ...`.
async fn pipeline(c: &Client, cmd: PipelineCmd) -> Result<i32> {
    use strata_api::{PipelineEvent, PipelineState, RunPipelineRequest};
    let follow_out = |json: bool, mut stream: strata_client::NdjsonStream<PipelineEvent>| async move {
        let mut last = None;
        // A stage is saved (and streamed) at every step; a step that changes nothing shown is not repeated.
        let mut shown = String::new();
        while let Some(ev) = stream.next().await? {
            if json {
                println!("{}", serde_json::to_string(&ev).expect("serializes"));
            }
            match ev {
                PipelineEvent::Stage { stage, .. } if !json => {
                    let line = stage_line(&stage);
                    if line != shown {
                        println!("{line}");
                        shown = line;
                    }
                }
                PipelineEvent::Stage { .. } => {}
                PipelineEvent::Finished { run } => last = Some(*run),
            }
        }
        let run = last.ok_or_else(|| anyhow!("the daemon ended the stream before the run ended"))?;
        if !json {
            print_run(&run);
        }
        Ok::<i32, anyhow::Error>(match run.state {
            PipelineState::Succeeded => 0,
            PipelineState::Paused => 2,
            _ => 1,
        })
    };
    match cmd {
        PipelineCmd::Run { file, detach, json } => {
            let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            let req = if file.extension().is_some_and(|e| e == "json") {
                RunPipelineRequest {
                    toml: None,
                    spec: Some(serde_json::from_str(&text).with_context(|| format!("parsing {}", file.display()))?),
                }
            } else {
                RunPipelineRequest { toml: Some(text), spec: None }
            };
            if detach {
                let run = c.run_pipeline(&req).await?;
                if json {
                    output::json(&run);
                } else {
                    println!("{}", run.id);
                }
                return Ok(0);
            }
            let stream = c.run_pipeline_follow(&req).await?;
            follow_out(json, stream).await
        }
        PipelineCmd::Status { id, follow, json } => {
            if follow {
                return follow_out(json, c.pipeline_follow(&id).await?).await;
            }
            let run = c.pipeline(&id).await?;
            if json {
                output::json(&run);
            } else {
                print_run(&run);
            }
            Ok(0)
        }
        PipelineCmd::Ls { json } => {
            let runs = c.list_pipelines().await?;
            if json {
                output::json(&runs);
            } else {
                let rows = runs
                    .iter()
                    .map(|r| {
                        let done = r.stages.iter().filter(|s| s.state == strata_api::StageState::Succeeded).count();
                        vec![
                            r.id.clone(),
                            r.name.clone(),
                            r.state.as_str().to_string(),
                            format!("{done}/{}", r.stages.len()),
                            output::age(&r.created_at),
                        ]
                    })
                    .collect();
                output::table(&["RUN", "NAME", "STATE", "STAGES", "CREATED"], rows);
            }
            Ok(0)
        }
        PipelineCmd::Pause { id } => {
            let run = c.pause_pipeline(&id).await?;
            eprintln!("run {} pauses before its next stage", run.id);
            Ok(0)
        }
        PipelineCmd::Resume { id, detach, json } => {
            if detach {
                let run = c.resume_pipeline(&id).await?;
                if json {
                    output::json(&run);
                } else {
                    println!("{}", run.id);
                }
                return Ok(0);
            }
            let stream = c.resume_pipeline_follow(&id).await?;
            follow_out(json, stream).await
        }
    }
}

fn stage_line(s: &strata_api::StageResult) -> String {
    use strata_api::StageState;
    match s.state {
        StageState::Pending => format!("stage {}: pending", s.name),
        StageState::Running => match (s.exit_codes.last(), s.sandboxes.last()) {
            (Some(code), _) => format!("stage {}: command {} exited {code}", s.name, s.exit_codes.len()),
            (None, Some(sb)) if s.lifecycle != strata_api::StageLifecycle::Fork => {
                format!("stage {}: sandbox {sb} ready", s.name)
            }
            _ => format!(
                "stage {}: running ({}{})",
                s.name,
                s.lifecycle.as_str(),
                if s.attempts > 1 { format!(", attempt {}", s.attempts) } else { String::new() }
            ),
        },
        StageState::Succeeded => format!(
            "stage {}: succeeded in {:.1}s, kept {}{}",
            s.name,
            s.duration_ms as f64 / 1000.0,
            output::size(s.state_kept_bytes),
            s.checkpoint
                .as_ref()
                .map(|c| format!(", checkpoint {c}"))
                .or_else(|| s.output_sandbox.as_ref().map(|b| format!(", standby sandbox {b}")))
                .unwrap_or_default()
        ),
        StageState::Failed => format!("stage {}: FAILED: {}", s.name, s.error.as_deref().unwrap_or("?")),
    }
}

/// A run as a table per stage, then its state.
fn print_run(r: &strata_api::PipelineRun) {
    let rows = r
        .stages
        .iter()
        .map(|s| {
            let kept = match (s.lifecycle, s.state) {
                (_, strata_api::StageState::Pending) => "-".to_string(),
                (strata_api::StageLifecycle::Ephemeral, _) => "nothing".to_string(),
                _ => output::size(s.state_kept_bytes),
            };
            let overhead = match s.state {
                strata_api::StageState::Succeeded => {
                    format!("{:.2}s", s.duration_ms.saturating_sub(s.commands_ms) as f64 / 1000.0)
                }
                _ => "-".to_string(),
            };
            vec![
                s.name.clone(),
                s.lifecycle.as_str().to_string(),
                format!("{:.1}s", s.duration_ms as f64 / 1000.0),
                format!("{:.1}s", s.commands_ms as f64 / 1000.0),
                overhead,
                kept,
                format!("{:.6}", s.cost),
                format!("{:?}", s.state).to_lowercase()
                    + &s.template.as_ref().map(|t| format!(" (template {t})")).unwrap_or_default(),
            ]
        })
        .collect();
    output::table(&["STAGE", "LIFECYCLE", "TIME", "COMMANDS", "OVERHEAD", "STATE KEPT", "COST", "OUTCOME"], rows);
    println!(
        "run {} ({}): {}{}",
        r.id,
        r.name,
        r.state.as_str(),
        r.reason.as_ref().map(|m| format!(": {m}")).unwrap_or_default()
    );
}
