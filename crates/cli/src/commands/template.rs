//! `strata template ...`: promote a checkpoint to a template, build one from a build
//! file (streaming its steps), list and remove templates.

use std::io::Write;

use anyhow::{bail, Context, Result};
use strata_client::Client;

use super::each;
use super::security::print_findings;
use crate::args::template::{TemplateCmd, TemplateOnFindingsArg};
use crate::args::JsonOutput;
use crate::output;

/// `strata template ...`.
pub(super) async fn template_cmd(c: &Client, cmd: TemplateCmd) -> Result<i32> {
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
        TemplateCmd::Ls(JsonOutput { json }) => {
            let list = c.list_templates().await?;
            if json {
                output::json(&list);
            } else {
                output::table(
                    &["NAME", "CHECKPOINT", "IMAGE", "LAYERS", "ISOLATION", "CREATED", "CHECKS", "LAST CHECK"],
                    list.iter()
                        .map(|t| {
                            vec![
                                t.name.clone(),
                                t.checkpoint.clone(),
                                t.image.clone(),
                                t.layers.to_string(),
                                t.isolation.to_string(),
                                output::age(&t.created_at),
                                t.check_every
                                    .as_deref()
                                    .map_or("-".into(), |e| format!("every {e}, {}", t.on_findings)),
                                t.last_check.as_ref().map_or("-".into(), |l| {
                                    format!("{}: {} finding(s)", output::age(&l.time), l.findings.len())
                                }),
                            ]
                        })
                        .collect(),
                );
            }
        }
        TemplateCmd::Update { name, check_every, on_findings, json } => {
            let on_findings = on_findings.map(|o| match o {
                TemplateOnFindingsArg::Record => strata_api::OnFindings::Record,
                TemplateOnFindingsArg::Quarantine => strata_api::OnFindings::Quarantine,
            });
            let t = c.set_template_policy(&name, &strata_api::TemplatePolicyPatch { check_every, on_findings }).await?;
            match json {
                true => output::json(&t),
                false => println!(
                    "template {}: checks {}, on findings: {}",
                    t.name,
                    t.check_every.as_deref().map_or("off".to_string(), |e| format!("every {e}")),
                    t.on_findings
                ),
            }
        }
        TemplateCmd::Check { name, json } => {
            let r = c.check_template(&name).await?;
            if json {
                output::json(&r);
            } else {
                print_findings(&r.findings);
                println!(
                    "template {} (checkpoint {}, image {}): {} paths above its image, {}; {} ({} ms)",
                    r.template,
                    r.checkpoint,
                    r.image.as_deref().unwrap_or("(not registered)"),
                    r.changed_paths,
                    if r.findings.is_empty() { "clean".to_string() } else { format!("{} findings", r.findings.len()) },
                    r.action,
                    r.duration_ms
                );
            }
            return Ok(if r.findings.is_empty() { 0 } else { 2 });
        }
        TemplateCmd::Rm { names } => return each(names, |n| async { c.delete_template(&n).await.map(|_| n) }).await,
        TemplateCmd::Rebuild { name, base, no_cache, accept_findings, json } => {
            let req = strata_api::RebuildTemplateRequest { base, no_cache, accept_findings };
            let events = c.rebuild_template(&name, &req).await?;
            return follow_build(events, json, "rebuilt").await;
        }
        TemplateCmd::Build { name, file, no_cache, accept_findings, start_cmd, ready_cmd, json } => {
            let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            let context = std::fs::canonicalize(&file)?.parent().map(|p| p.display().to_string());
            let events = c
                .build_template(&strata_api::BuildTemplateRequest {
                    name,
                    file: text,
                    context,
                    no_cache,
                    accept_findings,
                    start_cmd,
                    ready_cmd,
                })
                .await?;
            return follow_build(events, json, "built").await;
        }
    }
    Ok(0)
}

/// Prints a build's (or rebuild's) events as they come; the exit code.
async fn follow_build(
    mut events: strata_client::NdjsonStream<strata_api::BuildEvent>,
    json: bool,
    verb: &str,
) -> Result<i32> {
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
                        "{verb} template {} ({steps_run} steps run, {steps_cached} cached, {duration_ms} ms)",
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
