//! Security: the Rule of Two's approval queue (`approvals ...`), the audit log
//! (`audit`, `audit verify`), state-hygiene scans (`scan`) and reading the `--secret`
//! values of new sandboxes on the CLI's side.

use anyhow::{anyhow, bail, Context, Result};
use strata_client::Client;

use crate::args::security::{
    ApprovalCmd, ApprovalId, AuditArgs, AuditCmd, CheckArgs, DecisionArgs, QuarantineCmd, ScanArgs, SecretArgs,
};
use crate::args::JsonOutput;
use crate::output;

/// `strata approvals ...`.
pub(super) async fn approvals_cmd(c: &Client, cmd: ApprovalCmd) -> Result<i32> {
    match cmd {
        ApprovalCmd::Ls { state, out: JsonOutput { json } } => {
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
        ApprovalCmd::Show { approval: ApprovalId { id }, out: JsonOutput { json } } => {
            let a = c.get_approval(&id).await?;
            if json {
                output::json(&a);
            } else {
                print_approval(&a);
            }
            Ok(0)
        }
        ApprovalCmd::Approve(DecisionArgs { approval: ApprovalId { id }, reason }) => {
            let a = c.decide_approval(&id, true, reason).await?;
            println!("{} {}", a.id, a.state);
            Ok(0)
        }
        ApprovalCmd::Deny(DecisionArgs { approval: ApprovalId { id }, reason }) => {
            let a = c.decide_approval(&id, false, reason).await?;
            println!("{} {}", a.id, a.state);
            Ok(0)
        }
        ApprovalCmd::Wait(ApprovalId { id }) => loop {
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

/// `strata audit`: the last entries, or `audit verify` (exit status 1 when the chain is broken).
pub(super) async fn audit(c: &Client, a: AuditArgs) -> Result<i32> {
    match a.command {
        Some(AuditCmd::Verify(JsonOutput { json })) => {
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
            if a.out.json {
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
    }
}

/// `strata check ID`: exit status 2 when there are findings.
pub(super) async fn check(c: &Client, a: CheckArgs) -> Result<i32> {
    let r = c.check_sandbox(&a.id).await?;
    if a.json {
        output::json(&r);
    } else {
        print_findings(&r.findings);
        println!(
            "sandbox {} ({}): {} paths changed above its image, {}; {} ({} ms)",
            r.sandbox_id,
            r.state,
            r.changed_paths,
            if r.findings.is_empty() { "clean".to_string() } else { format!("{} findings", r.findings.len()) },
            r.action,
            r.duration_ms
        );
    }
    Ok(if r.findings.is_empty() { 0 } else { 2 })
}

/// `strata quarantine ...`.
pub(super) async fn quarantine_cmd(c: &Client, cmd: QuarantineCmd) -> Result<i32> {
    let line = |e: &strata_api::QuarantineEntry| {
        println!(
            "{} {} ({}) quarantined since {} by {}: {}",
            e.kind, e.name, e.id, e.quarantine.since, e.quarantine.by, e.quarantine.reason
        )
    };
    match cmd {
        QuarantineCmd::Add { id, reason } => line(&c.quarantine(&id, &reason).await?),
        QuarantineCmd::Lift { id, reason } => {
            let e = c.lift_quarantine(&id, &reason).await?;
            println!("{} {} ({}): quarantine lifted", e.kind, e.name, e.id);
        }
        QuarantineCmd::Ls { out: JsonOutput { json } } => {
            let list = c.quarantined().await?;
            if json {
                output::json(&list);
            } else {
                output::table(
                    &["KIND", "ID", "NAME", "TENANT", "SINCE", "BY", "REASON"],
                    list.iter()
                        .map(|e| {
                            vec![
                                e.kind.clone(),
                                e.id.clone(),
                                e.name.clone(),
                                e.tenant.clone(),
                                e.quarantine.since.clone(),
                                e.quarantine.by.clone(),
                                e.quarantine.reason.clone(),
                            ]
                        })
                        .collect(),
                );
            }
        }
    }
    Ok(0)
}

/// `strata scan`: exit status 2 when there are findings.
pub(super) async fn scan(c: &Client, a: ScanArgs) -> Result<i32> {
    let ScanArgs { id, json } = a;
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

/// Prints state-hygiene findings, one per line, to stderr.
pub(super) fn print_findings(findings: &[strata_api::Finding]) {
    for f in findings {
        eprintln!("{:<8} {:<28} {}  ({})", f.severity, f.rule, f.path, f.reason);
    }
}

/// Reads `--secret NAME=@FILE|env:VAR|env` values here, on the CLI's side,
/// and marks the `--secret-env` ones.
pub(super) fn secrets(a: &SecretArgs) -> Result<Vec<strata_api::SecretSpec>> {
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
