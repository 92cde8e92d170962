//! `strata cost`: the cost of one sandbox, of every sandbox, or of a pipeline run per stage,
//! and the money format `advise` shares.

use anyhow::Result;
use strata_client::Client;

use crate::args::cost::CostArgs;
use crate::args::JsonOutput;
use crate::output;

/// `strata cost [ID]` or `strata cost --pipeline RUN`.
pub(super) async fn cost(c: &Client, a: CostArgs) -> Result<i32> {
    let CostArgs { id, pipeline, out: JsonOutput { json } } = a;
    if let Some(run) = pipeline {
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
        return Ok(0);
    }
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

/// A cost or quantity readable at any magnitude: fixed point, or 4 significant digits when small.
pub(super) fn money(v: f64) -> String {
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
