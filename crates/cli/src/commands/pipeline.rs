//! Multi-step work: `pipeline ...` (run, follow, pause, resume, list), `fork` (plain, or
//! fan-out and select with `--run`) and `advise`.

use anyhow::{anyhow, Context, Result};
use strata_api::Lifecycle;
use strata_client::Client;

use super::cost::money;
use crate::args::pipeline::{AdviseArgs, ForkArgs, PipelineCmd, RunId, SelectArg};
use crate::args::sandbox::LifecycleArg;
use crate::args::JsonOutput;
use crate::output;

/// `strata pipeline ...`.
pub(super) async fn pipeline(c: &Client, cmd: PipelineCmd) -> Result<i32> {
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
        PipelineCmd::Status { run: RunId { id }, follow, out: JsonOutput { json } } => {
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
        PipelineCmd::Ls(JsonOutput { json }) => {
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
        PipelineCmd::Pause(RunId { id }) => {
            let run = c.pause_pipeline(&id).await?;
            eprintln!("run {} pauses before its next stage", run.id);
            Ok(0)
        }
        PipelineCmd::Resume { run: RunId { id }, detach, out: JsonOutput { json } } => {
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

/// `strata fork`: prints the children's ids or, with --run, the table of attempts (exit
/// status 1 when there is no winner).
pub(super) async fn fork(c: &Client, a: ForkArgs) -> Result<i32> {
    let ForkArgs { source, count, fanout, name_prefix, lifecycle, ttl, warm, isolation, out: JsonOutput { json } } = a;
    let lifecycle = match lifecycle {
        LifecycleArg::Ephemeral => Lifecycle::Ephemeral,
        LifecycleArg::Persistent => Lifecycle::Persistent,
    };
    if let Some(run) = fanout.run {
        if isolation.is_some() {
            anyhow::bail!("--isolation is for plain forks: a fan-out's attempts run on their source's tier");
        }
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
            losers: if fanout.keep_losers { strata_api::LoserPolicy::Keep } else { strata_api::LoserPolicy::Destroy },
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
            isolation,
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

/// `strata advise`: the recommendation, why, and every alternative priced.
pub(super) async fn advise(c: &Client, a: AdviseArgs) -> Result<i32> {
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
    if a.out.json {
        output::json(&advice);
    } else {
        print_advice(&advice);
    }
    Ok(0)
}

fn print_advice(a: &strata_api::Advice) {
    println!("recommendation: {}", a.recommendation.as_str());
    for r in &a.reasons {
        println!("  - {r}");
    }
    println!("isolation: {}", a.isolation);
    println!("  - {}", a.isolation_reason);
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
