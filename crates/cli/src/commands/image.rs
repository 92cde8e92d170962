//! `strata image ...`: import and pull (with a progress spinner), list, inspect, remove.

use anyhow::{bail, Context, Result};
use strata_api::{ImportEvent, ImportImageRequest, PullImageRequest};
use strata_client::Client;

use super::each;
use crate::args::image::{ImageCmd, PreferArg, RebaseArgs};
use crate::args::JsonOutput;
use crate::output;

/// `strata image ...`.
pub(super) async fn image(c: &Client, cmd: ImageCmd) -> Result<i32> {
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
        ImageCmd::Ls { all, out: JsonOutput { json } } => {
            let list = match all {
                true => {
                    let mut v = Vec::new();
                    for i in c.list_images().await? {
                        v.extend(c.image_versions(&i.name).await?);
                    }
                    v
                }
                false => c.list_images().await?,
            };
            print_images(&list, json);
            Ok(0)
        }
        ImageCmd::Versions { name, out: JsonOutput { json } } => {
            print_images(&c.image_versions(&name).await?, json);
            Ok(0)
        }
        ImageCmd::Inspect { name, out: JsonOutput { json } } => {
            let i = c.get_image(&name).await?;
            if json {
                output::json(&i);
            } else {
                println!(
                    "name     {}\nversion  {}{}\nid       {}\nprevious {}\nplatform {}\nsource   {} ({})\nsize     {}\nlayers",
                    i.name,
                    i.version,
                    if i.newest { " (newest)" } else { "" },
                    i.id,
                    i.previous.as_deref().unwrap_or("-"),
                    platform(&i),
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

/// `strata outdated`.
pub(super) async fn outdated(c: &Client, a: JsonOutput) -> Result<i32> {
    let list = c.outdated().await?;
    if a.json {
        output::json(&list);
        return Ok(0);
    }
    output::table(
        &["KIND", "NAME", "IMAGE", "ON", "NEWEST", "DAYS BEHIND", "HOW"],
        list.iter()
            .map(|e| {
                vec![
                    e.kind.clone(),
                    e.name.clone(),
                    e.image.clone(),
                    e.version.to_string(),
                    e.newest_version.to_string(),
                    e.days_behind.to_string(),
                    e.how.clone(),
                ]
            })
            .collect(),
    );
    Ok(0)
}

/// `strata rebase`.
pub(super) async fn rebase(c: &Client, a: RebaseArgs) -> Result<i32> {
    let prefer = a.prefer.map(|p| match p {
        PreferArg::Sandbox => strata_api::Prefer::Sandbox,
        PreferArg::Base => strata_api::Prefer::Base,
    });
    let r = match c.rebase(&a.id, &strata_api::RebaseRequest { onto: a.onto, prefer }).await {
        Ok(r) => r,
        Err(strata_client::ClientError::Api { body, .. }) if !body.conflicts.is_empty() && !a.json => {
            eprintln!("{:<48} {:<9} BASE", "CONFLICT", "SANDBOX");
            for x in &body.conflicts {
                eprintln!("{:<48} {:<9} {}", x.path, x.sandbox, x.base);
            }
            match prefer {
                None => bail!("{} ({}): rerun with --prefer sandbox or --prefer base", body.message, body.code),
                Some(_) => bail!("{} ({})", body.message, body.code),
            }
        }
        Err(e) => return Err(e.into()),
    };
    if a.json {
        output::json(&r);
        return Ok(0);
    }
    for x in &r.conflicts {
        eprintln!(
            "conflict {} (sandbox {}, base {}): kept the {}",
            x.path,
            x.sandbox,
            x.base,
            match r.prefer {
                Some(strata_api::Prefer::Base) => "base's",
                _ => "sandbox's",
            }
        );
    }
    for f in &r.scan.findings {
        eprintln!("finding {} {}: {}", f.rule, f.path, f.reason);
    }
    println!(
        "rebased {} from {} onto {} ({} base changes, {} paths in the sandbox's layers, {} conflicts; scan {}; {} ms: compare {} ms, scan {} ms)",
        r.sandbox_id,
        r.from_image,
        r.onto_image,
        r.base_changes,
        r.sandbox_paths,
        r.conflicts.len(),
        if r.scan.clean { "clean".to_string() } else { format!("{} findings", r.scan.findings.len()) },
        r.duration_ms,
        r.compare_ms,
        r.scan_ms
    );
    eprintln!("note: {}", r.note);
    Ok(0)
}

/// `os/arch family version` of an image, or `-` when not read yet.
fn platform(i: &strata_api::Image) -> String {
    match &i.platform {
        Some(p) => format!(
            "{}/{} {}{}",
            p.os,
            p.architecture,
            p.family,
            p.version.as_deref().map(|v| format!(" {v}")).unwrap_or_default()
        ),
        None => "-".into(),
    }
}

fn print_images(list: &[strata_api::Image], json: bool) {
    if json {
        return output::json(&list);
    }
    output::table(
        &["NAME", "VERSION", "ID", "LAYERS", "SIZE", "PLATFORM", "SOURCE", "CREATED"],
        list.iter()
            .map(|i| {
                vec![
                    format!("{}{}", i.name, if i.newest { "" } else { " (old)" }),
                    i.version.to_string(),
                    i.id.trim_start_matches("sha256:").chars().take(12).collect(),
                    i.layers.len().to_string(),
                    output::size(i.size),
                    platform(i),
                    i.source_kind.clone(),
                    output::age(&i.created_at),
                ]
            })
            .collect(),
    );
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
                    let lineage = match (&report.image.previous, report.image.version) {
                        (Some(p), v) => format!(
                            " version {v}, after {}",
                            p.trim_start_matches("sha256:").chars().take(12).collect::<String>()
                        ),
                        (None, v) if v > 1 => format!(" version {v}, unchanged"),
                        _ => String::new(),
                    };
                    println!(
                        "{}{lineage} {} ({} layers: {} new, {} reused; {} stored; {} ms)",
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
