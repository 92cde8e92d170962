//! Fan-out and select (`POST /v1/fanout`): fork N children from a checkpoint
//! (or a live sandbox), run one attempt in each concurrently, pick the winner
//! by a rule, optionally checkpoint it under a name (promotion), and destroy or
//! keep the losers.
//!
//! The selection itself ([`select`]) and the expansion of a plan into attempts
//! ([`expand`]) are pure and unit-tested; [`fanout`] does the I/O. A fan-out
//! without a winner is a normal result (`winner: null` with the reason), not
//! an error: the caller needs the attempts' outputs to see why.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use strata_api::{
    AttemptOutcome, AttemptSpec, CheckpointRequest, ErrorCode, ExecRequest, FanoutAttempt, FanoutPlan, FanoutRequest,
    FanoutResult, ForkRequest, LoserPolicy, ProcessStatus, SandboxState, SelectRule, FANOUT_TAIL_BYTES,
};
use strata_core::{ids, units};
use tracing::{info, warn};

use crate::checkpoints::{self, MAX_FORK};
use crate::error::{EngineError, EngineResult};
use crate::lifecycle;
use crate::processes::{self, Proc};
use crate::record::now;
use crate::state::Shared;

/// How long a score command may run when the plan gives no timeout.
const DEFAULT_SCORE_TIMEOUT: Duration = Duration::from_secs(300);

/// Expands a plan into its attempts (argv + env), validating it: 1 to
/// [`MAX_FORK`] attempts, no empty command, `{arg}` only with `args`, a score
/// command for `best_score`, a valid timeout.
pub fn expand(plan: &FanoutPlan) -> Result<Vec<AttemptSpec>, String> {
    let attempts = if !plan.attempts.is_empty() {
        if plan.run.is_some() || !plan.args.is_empty() || plan.count.is_some() {
            return Err("give either `attempts` or `run` (with `args` or `count`), not both".into());
        }
        for (i, a) in plan.attempts.iter().enumerate() {
            if a.cmd.first().is_none_or(|p| p.trim().is_empty()) {
                return Err(format!("attempt {}: empty command", i + 1));
            }
        }
        plan.attempts.clone()
    } else {
        let Some(run) = plan.run.as_deref() else {
            return Err("no attempts: give `attempts`, or `run` with `args` or `count`".into());
        };
        if run.trim().is_empty() {
            return Err("empty command in `run`".into());
        }
        let n = match (plan.args.len(), plan.count) {
            (0, None) => return Err("`run` needs `args` (one attempt each) or `count`".into()),
            (0, Some(c)) => c as usize,
            (a, None) => a,
            (a, Some(c)) if a == c as usize => a,
            (a, Some(c)) => return Err(format!("count {c} does not match the {a} args given")),
        };
        if plan.args.is_empty() && run.contains("{arg}") {
            return Err("`run` uses {arg} but no `args` were given".into());
        }
        (1..=n)
            .map(|i| {
                let arg = plan.args.get(i - 1).map(String::as_str).unwrap_or("");
                let cmd = run.replace("{i}", &i.to_string()).replace("{arg}", arg);
                AttemptSpec { cmd: vec!["sh".into(), "-c".into(), cmd], env: Default::default() }
            })
            .collect()
    };
    if attempts.is_empty() || attempts.len() > MAX_FORK as usize {
        return Err(format!("a fan-out needs between 1 and {MAX_FORK} attempts, got {}", attempts.len()));
    }
    if plan.select == SelectRule::BestScore && plan.score_cmd.as_deref().is_none_or(|s| s.trim().is_empty()) {
        return Err("select = best_score needs a score command (`score_cmd`)".into());
    }
    if plan.score_cmd.as_deref().is_some_and(|s| s.trim().is_empty()) {
        return Err("empty `score_cmd`".into());
    }
    if let Some(t) = &plan.timeout {
        units::parse_duration(t).map_err(|e| format!("timeout: {e}"))?;
    }
    Ok(attempts)
}

/// Picks the winner: `Ok(index)` or `Err(reason)`. `order` lists attempt
/// indexes in the order they finished (for `first_success`); `scored` tells
/// whether a score command ran.
pub fn select(rule: SelectRule, attempts: &[FanoutAttempt], order: &[u32], scored: bool) -> Result<u32, String> {
    let describe = |a: &FanoutAttempt| match a.outcome {
        AttemptOutcome::Passed => format!("attempt {} passed", a.index),
        AttemptOutcome::Failed => format!("attempt {} exited {}", a.index, a.exit_code.unwrap_or(-1)),
        AttemptOutcome::TimedOut => format!("attempt {} timed out", a.index),
        AttemptOutcome::Cancelled => format!("attempt {} was cancelled", a.index),
    };
    let passed: Vec<&FanoutAttempt> = attempts.iter().filter(|a| a.outcome == AttemptOutcome::Passed).collect();
    let best_score = |candidates: &[&FanoutAttempt]| -> Result<u32, String> {
        let mut best: Option<&FanoutAttempt> = None;
        for a in candidates {
            if let Some(s) = a.score {
                // Strictly greater: ties keep the lower index (candidates are by index).
                if best.is_none_or(|b| s > b.score.unwrap_or(f64::NEG_INFINITY)) {
                    best = Some(a);
                }
            }
        }
        best.map(|a| a.index).ok_or_else(|| {
            let why: Vec<String> = candidates
                .iter()
                .map(|a| format!("attempt {}: {}", a.index, a.score_error.as_deref().unwrap_or("no score")))
                .collect();
            format!("no attempt produced a score ({})", why.join("; "))
        })
    };
    let mut by_index = passed.clone();
    by_index.sort_by_key(|a| a.index);
    match rule {
        SelectRule::FirstSuccess => {
            order.iter().find(|i| passed.iter().any(|a| a.index == **i)).copied().ok_or_else(|| {
                format!("no attempt exited 0 ({})", attempts.iter().map(describe).collect::<Vec<_>>().join(", "))
            })
        }
        SelectRule::AllSuccess => {
            let failed: Vec<String> =
                attempts.iter().filter(|a| a.outcome != AttemptOutcome::Passed).map(describe).collect();
            if !failed.is_empty() {
                return Err(format!(
                    "all_success: {} of {} attempts did not pass ({})",
                    failed.len(),
                    attempts.len(),
                    failed.join(", ")
                ));
            }
            if scored {
                best_score(&by_index)
            } else {
                by_index.first().map(|a| a.index).ok_or_else(|| "no attempts".to_string())
            }
        }
        SelectRule::BestScore => {
            if by_index.is_empty() {
                return Err(format!(
                    "no attempt exited 0 ({})",
                    attempts.iter().map(describe).collect::<Vec<_>>().join(", ")
                ));
            }
            best_score(&by_index)
        }
    }
}

/// Parses the score from a score command's stdout: its last non-empty line, as a finite number.
pub fn parse_score(stdout: &[u8]) -> Result<f64, String> {
    let text = String::from_utf8_lossy(stdout);
    let Some(line) = text.lines().map(str::trim).rfind(|l| !l.is_empty()) else {
        return Err("score command printed nothing".into());
    };
    match line.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(format!("last line of the score command's output is not a number: {:?}", truncate(line, 80))),
    }
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

fn tail(b: &[u8]) -> String {
    let start = b.len().saturating_sub(FANOUT_TAIL_BYTES);
    String::from_utf8_lossy(&b[start..]).into_owned()
}

/// Kills an attempt's process and everything in its session (it is a session
/// and process-group leader), so nothing of a losing attempt keeps running.
fn kill_attempt(st: &Shared, p: &Proc) {
    let info = p.info();
    if info.status != ProcessStatus::Running {
        return;
    }
    if let Some(ns) = info.pid {
        st.runtime_by_id(&info.sandbox_id).signal(&info.sandbox_id, ns, libc::SIGKILL, true);
    }
}

/// One child and what it runs.
struct Child {
    index: u32,
    sandbox_id: String,
    sandbox_name: String,
    spec: AttemptSpec,
}

/// How every attempt runs: the plan's per-attempt settings.
#[derive(Clone)]
struct AttemptOpts {
    timeout: Option<String>,
    score_cmd: Option<String>,
    user: Option<String>,
    workdir: Option<String>,
}

impl AttemptOpts {
    fn of(plan: &FanoutPlan) -> Self {
        AttemptOpts {
            timeout: plan.timeout.clone(),
            score_cmd: plan.score_cmd.clone(),
            user: plan.user.clone(),
            workdir: plan.workdir.clone(),
        }
    }

    fn exec(&self, cmd: Vec<String>, env: BTreeMap<String, String>) -> ExecRequest {
        ExecRequest {
            cmd,
            env,
            timeout: self.timeout.clone(),
            user: self.user.clone(),
            cwd: self.workdir.clone(),
            ..Default::default()
        }
    }
}

/// Runs one attempt (and then the score command, when there is one and it passed).
async fn run_attempt(
    st: Shared,
    c: Child,
    opts: AttemptOpts,
    mut cancel: tokio::sync::watch::Receiver<bool>,
) -> FanoutAttempt {
    let started = Instant::now();
    let mut env = c.spec.env.clone();
    env.entry("STRATA_ATTEMPT".into()).or_insert_with(|| c.index.to_string());
    let mut a = FanoutAttempt {
        index: c.index,
        sandbox_id: c.sandbox_id.clone(),
        sandbox_name: c.sandbox_name.clone(),
        cmd: c.spec.cmd.clone(),
        outcome: AttemptOutcome::Failed,
        exit_code: None,
        duration_ms: 0,
        score: None,
        score_error: None,
        stdout_tail: String::new(),
        stderr_tail: String::new(),
        kept: true,
    };
    let req = opts.exec(c.spec.cmd.clone(), env.clone());
    let p = match processes::spawn(&st, &c.sandbox_id, req).await {
        Ok(p) => p,
        Err(e) => {
            a.exit_code = Some(127);
            a.stderr_tail = tail(e.body.message.as_bytes());
            a.duration_ms = started.elapsed().as_millis() as u64;
            return a;
        }
    };
    let cancelled = async {
        while !*cancel.borrow_and_update() {
            if cancel.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    };
    let info = tokio::select! {
        info = p.wait(None) => info,
        _ = cancelled => {
            kill_attempt(&st, &p);
            a.outcome = AttemptOutcome::Cancelled;
            p.wait(Some(Duration::from_secs(10))).await
        }
    };
    a.duration_ms = started.elapsed().as_millis() as u64;
    let (out, err, _) = p.captured_output();
    a.stdout_tail = tail(&out);
    a.stderr_tail = tail(&err);
    if a.outcome == AttemptOutcome::Cancelled {
        return a;
    }
    a.exit_code = Some(info.exit_status());
    a.outcome = if info.timed_out {
        AttemptOutcome::TimedOut
    } else if info.status == ProcessStatus::Exited && info.exit_status() == 0 {
        AttemptOutcome::Passed
    } else {
        AttemptOutcome::Failed
    };
    if let (AttemptOutcome::Passed, Some(score_cmd)) = (a.outcome, opts.score_cmd.clone()) {
        let req = opts.exec(vec!["sh".into(), "-c".into(), score_cmd], env);
        match processes::spawn(&st, &c.sandbox_id, req).await {
            Err(e) => a.score_error = Some(format!("score command: {}", e.body.message)),
            Ok(sp) => {
                let si = sp.wait(Some(DEFAULT_SCORE_TIMEOUT)).await;
                let (sout, serr, _) = sp.captured_output();
                if si.status != ProcessStatus::Exited {
                    kill_attempt(&st, &sp);
                    a.score_error = Some("score command did not finish".into());
                } else if si.timed_out || si.exit_status() != 0 {
                    a.score_error = Some(format!(
                        "score command exited {}: {}",
                        si.exit_status(),
                        truncate(String::from_utf8_lossy(&serr).trim(), 200)
                    ));
                } else {
                    match parse_score(&sout) {
                        Ok(s) => a.score = Some(s),
                        Err(e) => a.score_error = Some(e),
                    }
                }
            }
        }
    }
    a
}

fn record(st: &Shared, sandbox_id: &str, reason: &str, detail: &str) {
    let state = st.db.sandbox_by_id(sandbox_id).ok().flatten().map_or(SandboxState::Running, |r| r.sandbox.state);
    if let Ok(ev) = st.db.record_event(sandbox_id, state, reason, Some(detail), &now()) {
        st.notify_events(ev.seq);
    }
}

/// Forks one child per attempt, runs them concurrently, selects, promotes and cleans up.
pub async fn fanout(st: &Shared, req: FanoutRequest) -> EngineResult<FanoutResult> {
    let started = Instant::now();
    let specs = expand(&req.plan).map_err(EngineError::bad_request)?;
    if let Some(name) = &req.promote_as {
        ids::validate_new_name(name, false)?;
        if st.db.checkpoint_name_taken(name)? {
            return Err(EngineError::new(
                ErrorCode::NameConflict,
                format!("a checkpoint named {name:?} exists (promote_as)"),
            ));
        }
    }
    let fork = checkpoints::fork(
        st,
        ForkRequest {
            source: req.source.clone(),
            count: specs.len() as u32,
            name_prefix: req.name_prefix.clone(),
            lifecycle: req.lifecycle,
            ttl: req.ttl.clone(),
            limits: req.limits.clone(),
            network: None,
            processes: None,
            isolation: None,
        },
    )
    .await?;
    let plan = &req.plan;
    let (cancel_tx, cancel_rx) = tokio::sync::watch::channel(false);
    let mut running = FuturesUnordered::new();
    for (i, (sid, spec)) in fork.sandboxes.iter().zip(specs).enumerate() {
        let name = st.db.sandbox_by_id(sid)?.map_or_else(|| sid.clone(), |r| r.sandbox.name);
        let child = Child { index: i as u32 + 1, sandbox_id: sid.clone(), sandbox_name: name, spec };
        running.push(crate::tenancy::spawn(run_attempt(st.clone(), child, AttemptOpts::of(plan), cancel_rx.clone())));
    }
    let mut attempts = Vec::new();
    let mut order = Vec::new();
    while let Some(done) = running.next().await {
        let a = done.map_err(|e| EngineError::internal("fan-out attempt task", &e))?;
        if plan.select == SelectRule::FirstSuccess && a.outcome == AttemptOutcome::Passed {
            let _ = cancel_tx.send(true);
        }
        order.push(a.index);
        attempts.push(a);
    }
    attempts.sort_by_key(|a| a.index);
    let chosen = select(plan.select, &attempts, &order, plan.score_cmd.is_some());
    let winner = chosen.as_ref().ok().copied();
    for a in attempts.iter_mut() {
        let score = a.score.map(|s| format!(", score {s}")).unwrap_or_default();
        let won = winner == Some(a.index);
        let detail = format!(
            "attempt {} of {}: {:?}, exit {:?}, {} ms{score}{}",
            a.index,
            fork.sandboxes.len(),
            a.outcome,
            a.exit_code,
            a.duration_ms,
            if won { ", winner" } else { "" }
        );
        record(st, &a.sandbox_id, if won { "fanout_winner" } else { "fanout_attempt" }, &detail);
        if won {
            continue;
        }
        match plan.losers {
            LoserPolicy::Destroy => match lifecycle::destroy(st, &a.sandbox_id, true, "fanout_loser").await {
                Ok(_) => a.kept = false,
                Err(e) => warn!(sandbox = %a.sandbox_id, error = %e.body.message, "destroying a fan-out loser failed"),
            },
            LoserPolicy::Keep => {}
        }
    }
    let mut result = FanoutResult {
        checkpoint: fork.checkpoint.clone(),
        select: plan.select,
        winner,
        winner_sandbox: None,
        promoted: None,
        reason: chosen.err(),
        attempts,
        duration_ms: 0,
    };
    if let Some(w) = winner {
        let sid = result.attempts[(w - 1) as usize].sandbox_id.clone();
        if let Some(name) = &req.promote_as {
            let labels = [("strata.fanout".to_string(), format!("winner of {} (attempt {w})", fork.checkpoint))].into();
            result.promoted = Some(
                checkpoints::checkpoint(
                    st,
                    &sid,
                    CheckpointRequest { name: Some(name.clone()), labels, ..Default::default() },
                )
                .await?,
            );
        }
        result.winner_sandbox = Some(sid);
    }
    result.duration_ms = started.elapsed().as_millis() as u64;
    info!(checkpoint = %result.checkpoint, attempts = result.attempts.len(), winner = ?result.winner, rule = plan.select.as_str(), ms = result.duration_ms, "fan-out");
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(index: u32, outcome: AttemptOutcome, score: Option<f64>) -> FanoutAttempt {
        FanoutAttempt {
            index,
            sandbox_id: format!("s{index}"),
            sandbox_name: format!("n{index}"),
            cmd: vec![],
            outcome,
            exit_code: Some(if outcome == AttemptOutcome::Passed { 0 } else { 1 }),
            duration_ms: 0,
            score,
            score_error: score.is_none().then(|| "printed nothing".to_string()),
            stdout_tail: String::new(),
            stderr_tail: String::new(),
            kept: true,
        }
    }

    #[test]
    fn templates_expand_over_args_or_a_count() {
        let plan =
            FanoutPlan { run: Some("fix {i} {arg}".into()), args: vec!["a".into(), "b".into()], ..Default::default() };
        let a = expand(&plan).unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(a[1].cmd, ["sh", "-c", "fix 2 b"]);
        let plan = FanoutPlan { run: Some("try {i}".into()), count: Some(3), ..Default::default() };
        assert_eq!(expand(&plan).unwrap()[2].cmd[2], "try 3");
    }

    #[test]
    fn bad_plans_are_refused_with_the_reason() {
        let bad = |p: FanoutPlan| expand(&p).unwrap_err();
        assert!(bad(FanoutPlan { run: Some("x".into()), count: Some(0), ..Default::default() })
            .contains("between 1 and 64"));
        assert!(bad(FanoutPlan { run: Some("x".into()), count: Some(65), ..Default::default() })
            .contains("between 1 and 64"));
        assert!(
            bad(FanoutPlan { run: Some("  ".into()), count: Some(2), ..Default::default() }).contains("empty command")
        );
        assert!(
            bad(FanoutPlan { attempts: vec![AttemptSpec::default()], ..Default::default() }).contains("empty command")
        );
        assert!(bad(FanoutPlan { run: Some("x {arg}".into()), count: Some(2), ..Default::default() }).contains("{arg}"));
        assert!(bad(FanoutPlan {
            run: Some("x".into()),
            count: Some(2),
            select: SelectRule::BestScore,
            ..Default::default()
        })
        .contains("score"));
        assert!(bad(FanoutPlan {
            run: Some("x".into()),
            args: vec!["a".into()],
            count: Some(2),
            ..Default::default()
        })
        .contains("does not match"));
        assert!(bad(FanoutPlan::default()).contains("no attempts"));
    }

    #[test]
    fn first_success_takes_the_first_to_finish_with_exit_0() {
        use AttemptOutcome::*;
        let a = [attempt(1, Failed, None), attempt(2, Passed, None), attempt(3, Passed, None)];
        assert_eq!(select(SelectRule::FirstSuccess, &a, &[1, 3, 2], false), Ok(3));
        let none = [attempt(1, Failed, None), attempt(2, TimedOut, None)];
        let why = select(SelectRule::FirstSuccess, &none, &[1, 2], false).unwrap_err();
        assert!(why.contains("attempt 1 exited 1") && why.contains("attempt 2 timed out"), "{why}");
    }

    #[test]
    fn all_success_fails_on_any_failure_and_best_score_breaks_ties_by_index() {
        use AttemptOutcome::*;
        let a = [attempt(1, Passed, None), attempt(2, Failed, None)];
        assert!(select(SelectRule::AllSuccess, &a, &[1, 2], false).unwrap_err().contains("1 of 2"));
        let a = [attempt(1, Passed, None), attempt(2, Passed, None)];
        assert_eq!(select(SelectRule::AllSuccess, &a, &[2, 1], false), Ok(1));
        let a = [
            attempt(1, Passed, Some(0.5)),
            attempt(2, Passed, Some(2.0)),
            attempt(3, Passed, Some(2.0)),
            attempt(4, Failed, None),
        ];
        assert_eq!(select(SelectRule::BestScore, &a, &[4, 3, 2, 1], true), Ok(2));
        let a = [attempt(1, Passed, None), attempt(2, Failed, None)];
        assert!(select(SelectRule::BestScore, &a, &[1, 2], true).unwrap_err().contains("no attempt produced a score"));
    }

    #[test]
    fn scores_come_from_the_last_line() {
        assert_eq!(parse_score(b"running\n 3.5 \n\n"), Ok(3.5));
        assert!(parse_score(b"").unwrap_err().contains("printed nothing"));
        assert!(parse_score(b"1\nok\n").unwrap_err().contains("not a number"));
        assert!(parse_score(b"NaN\n").is_err());
    }
}
