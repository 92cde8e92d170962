//! Checkpoints: `checkpoint` (take one) and `checkpoint ls|inspect|rm`, `restore`,
//! `lineage` (the tree around a sandbox or checkpoint) and `gc`.

use anyhow::Result;
use strata_client::Client;

use super::{each, kv};
use crate::args::checkpoint::{CheckpointArgs, CheckpointCmd, LineageArgs, RestoreArgs};
use crate::args::{JsonOutput, SandboxId};
use crate::output;

/// `strata checkpoint [ID]`, or one of its subcommands.
pub(super) async fn checkpoint_cmd(c: &Client, a: CheckpointArgs) -> Result<i32> {
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
        Some(CheckpointCmd::Ls { id, out: JsonOutput { json } }) => {
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
        Some(CheckpointCmd::Inspect { id, out: JsonOutput { json } }) => {
            let ck = c.get_checkpoint(&id).await?;
            if json {
                output::json(&ck);
            } else {
                print_one(&ck);
            }
        }
        Some(CheckpointCmd::Rm { ids, when_unused: false }) => {
            return each(ids, |i| async { c.delete_checkpoint(&i).await.map(|_| i) }).await
        }
        Some(CheckpointCmd::Rm { ids, when_unused: true }) => {
            return each(ids, |i| async move {
                let r = c.retire_checkpoint(&i).await?;
                Ok(if r.deleted {
                    r.id
                } else {
                    format!("{} retired (its layers stay while {} need them)", r.id, r.kept_by.join(", "))
                })
            })
            .await
        }
    }
    Ok(0)
}

/// `strata restore`: prints the sandbox id (and the checkpoint of the previous state, if kept).
pub(super) async fn restore(c: &Client, a: RestoreArgs) -> Result<i32> {
    let RestoreArgs { sandbox: SandboxId { id }, to, keep_current, warm, out: JsonOutput { json } } = a;
    let r =
        c.restore(&id, &strata_api::RestoreRequest { checkpoint: to, keep_current, processes: warm.choice() }).await?;
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

/// `strata lineage`.
pub(super) async fn lineage(c: &Client, a: LineageArgs) -> Result<i32> {
    let LineageArgs { id, out: JsonOutput { json } } = a;
    let l = c.lineage(&id).await?;
    if json {
        output::json(&l);
    } else {
        print_lineage(&l);
    }
    Ok(0)
}

/// `strata gc`.
pub(super) async fn gc(c: &Client, JsonOutput { json }: JsonOutput) -> Result<i32> {
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
