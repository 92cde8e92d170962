//! `strata image ...`: import and pull (with a progress spinner), list, inspect, remove.

use anyhow::{bail, Context, Result};
use strata_api::{ImportEvent, ImportImageRequest, PullImageRequest};
use strata_client::Client;

use super::each;
use crate::args::image::ImageCmd;
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
        ImageCmd::Ls(JsonOutput { json }) => {
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
        ImageCmd::Inspect { name, out: JsonOutput { json } } => {
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
