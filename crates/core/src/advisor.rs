//! The lifecycle advisor: applies the decision framework of docs/advisor.md to
//! one stage. Pure: the daemon supplies the prices, the CLI the description.
//!
//! Every alternative is priced with the same model: a sandbox reserves its CPUs
//! and memory for as long as it exists with processes (billed like a container
//! service), and pays storage for what it keeps on disk by the hour. The
//! recommendation is the cheapest alternative that keeps what the stage must
//! keep and respects its trust (untrusted input starts clean every turn when it
//! can), with two refinements: short idle gaps stay on (standby churn is not
//! worth it), and multi-turn work on generated files gets checkpoints.

use strata_api::{Advice, Keep, Prices, Strategy, StrategyCost};

/// Idle gaps shorter than this stay running: a standby/resume cycle (an idle
/// timeout, ~0.2 s of dump, ~0.1 s of resume) buys little under it.
pub const MIN_IDLE_FOR_STANDBY_SECONDS: f64 = 30.0;
/// Setup shorter than this is cheap enough to repeat every turn.
pub const CHEAP_SETUP_SECONDS: f64 = 10.0;
/// Assumed time to resume from standby (measured: ~0.1 s for 100 MiB).
pub const RESUME_SECONDS: f64 = 0.15;
/// Assumed time to create a sandbox from a template or checkpoint, or to start a stopped one.
pub const START_SECONDS: f64 = 0.05;

/// A stage, in numbers (see [`strata_api::AdviseRequest`]).
#[derive(Debug, Clone, PartialEq)]
pub struct StageProfile {
    /// What must survive.
    pub keep: Vec<Keep>,
    /// Seconds to set the environment up from nothing.
    pub setup_seconds: f64,
    /// Invocations.
    pub turns: u32,
    /// Active seconds per turn.
    pub turn_seconds: f64,
    /// Idle seconds between turns.
    pub idle_seconds: f64,
    /// Processes untrusted input.
    pub untrusted_input: bool,
    /// Parallel attempts (fan-out); <= 1: none.
    pub fan_out: u32,
    /// Reserved CPUs.
    pub cpus: f64,
    /// Reserved memory, GB.
    pub memory_gb: f64,
    /// State on disk, GB.
    pub disk_gb: f64,
}

impl Default for StageProfile {
    fn default() -> Self {
        StageProfile {
            keep: Vec::new(),
            setup_seconds: 0.0,
            turns: 1,
            turn_seconds: 60.0,
            idle_seconds: 0.0,
            untrusted_input: false,
            fan_out: 0,
            cpus: 1.0,
            memory_gb: 1.0,
            disk_gb: 1.0,
        }
    }
}

/// Price and check every alternative, pick one, and say why.
pub fn advise(p: &StageProfile, prices: &Prices) -> Advice {
    let turns = p.turns.max(1);
    let gaps = f64::from(turns - 1);
    let keeps = |k: Keep| p.keep.contains(&k);
    let rate = p.cpus * prices.cpu_second + p.memory_gb * prices.memory_gb_second;
    let store = |gb: f64, seconds: f64, price_gb_hour: f64| gb * seconds / 3600.0 * price_gb_hour;
    let span = p.setup_seconds + f64::from(turns) * p.turn_seconds + gaps * p.idle_seconds;
    let not_recreatable: Vec<&str> = p.keep.iter().filter(|k| !k.recreated_by_setup()).map(|k| k.as_str()).collect();
    let clean_start_unmet = (!not_recreatable.is_empty())
        .then(|| format!("starts clean every turn: {} would be lost", not_recreatable.join(", ")));
    let cost = |strategy: Strategy,
                description: String,
                unmet: Option<String>,
                setup_runs: u32,
                waiting: f64,
                running_seconds: f64,
                storage: f64| {
        let compute_cost = running_seconds * rate;
        StrategyCost {
            strategy,
            description,
            satisfies_keep: unmet.is_none(),
            unmet,
            setup_runs,
            waiting_seconds: waiting,
            compute_cost,
            storage_cost: storage,
            total_cost: compute_cost + storage,
        }
    };
    let mut all = Vec::new();
    if p.fan_out >= 2 {
        let n = f64::from(p.fan_out);
        all.push(cost(
            Strategy::EphemeralOnly,
            format!("{} fresh sandboxes, each repeating the {}s setup", p.fan_out, p.setup_seconds),
            None,
            p.fan_out,
            p.setup_seconds,
            n * (p.setup_seconds + p.turn_seconds),
            0.0,
        ));
        all.push(cost(
            Strategy::AlwaysOn,
            format!("{} long-lived sandboxes, each set up once and kept running", p.fan_out),
            None,
            p.fan_out,
            p.setup_seconds,
            n * span,
            store(n * p.disk_gb, span, prices.storage_gb_hour.writable),
        ));
        all.push(cost(
            Strategy::ForkFromCheckpoint,
            format!("set up once, checkpoint, fork {} copy-on-write children, keep the winner", p.fan_out),
            None,
            1,
            p.setup_seconds + START_SECONDS,
            p.setup_seconds + n * p.turn_seconds,
            store(p.disk_gb, span, prices.storage_gb_hour.checkpoint),
        ));
    } else {
        all.push(cost(
            Strategy::EphemeralOnly,
            format!("a fresh sandbox per turn, repeating the {}s setup {} times", p.setup_seconds, turns),
            clean_start_unmet.clone(),
            turns,
            f64::from(turns) * p.setup_seconds,
            f64::from(turns) * (p.setup_seconds + p.turn_seconds),
            0.0,
        ));
        all.push(cost(
            Strategy::TemplateThenEphemeral,
            "setup once into a template; every turn starts clean from it".into(),
            clean_start_unmet.clone(),
            1,
            p.setup_seconds + f64::from(turns) * START_SECONDS,
            p.setup_seconds + f64::from(turns) * p.turn_seconds,
            store(p.disk_gb, span, prices.storage_gb_hour.template),
        ));
        all.push(cost(
            Strategy::AlwaysOn,
            "one sandbox running through every turn and idle gap".into(),
            None,
            1,
            p.setup_seconds,
            span,
            store(p.disk_gb, span, prices.storage_gb_hour.writable),
        ));
        all.push(cost(
            Strategy::PersistentWithCheckpoints,
            "running through the turns, a checkpoint after each (rollback to any turn)".into(),
            None,
            1,
            p.setup_seconds,
            span,
            // Each checkpoint holds the turn's changes; assume a tenth of the state per turn.
            store(p.disk_gb, span, prices.storage_gb_hour.writable)
                + store(p.disk_gb * 0.1 * f64::from(turns), span / 2.0, prices.storage_gb_hour.checkpoint),
        ));
        if turns > 1 {
            let active = p.setup_seconds + f64::from(turns) * p.turn_seconds;
            all.push(cost(
                Strategy::StopBetweenTurns,
                "stopped while idle (files kept), started on the next call".into(),
                keeps(Keep::Processes).then(|| "processes end when it stops".to_string()),
                1,
                p.setup_seconds + gaps * START_SECONDS,
                active + gaps * START_SECONDS,
                store(p.disk_gb, span, prices.storage_gb_hour.writable),
            ));
            all.push(cost(
                Strategy::StandbyBetweenTurns,
                "standby while idle (processes and memory on disk, compute released), resumed on the next call".into(),
                None,
                1,
                p.setup_seconds + gaps * RESUME_SECONDS,
                active + gaps * RESUME_SECONDS,
                store(p.disk_gb, span, prices.storage_gb_hour.writable)
                    + store(p.memory_gb, gaps * p.idle_seconds, prices.storage_gb_hour.standby),
            ));
        }
    }
    all.sort_by(|a, b| a.total_cost.total_cmp(&b.total_cost).then(a.waiting_seconds.total_cmp(&b.waiting_seconds)));

    let mut reasons = Vec::new();
    let mut warnings = Vec::new();
    let by = |s: Strategy| all.iter().find(|c| c.strategy == s).cloned();
    let cheapest_feasible = |allowed: &dyn Fn(Strategy) -> bool| {
        all.iter().filter(|c| c.satisfies_keep && allowed(c.strategy)).map(|c| c.strategy).next()
    };
    let clean = |s: Strategy| matches!(s, Strategy::EphemeralOnly | Strategy::TemplateThenEphemeral);

    let mut pick = if p.fan_out >= 2 {
        reasons.push(format!("{} attempts from one starting point: forks share the set-up state copy-on-write instead of repeating setup {} times", p.fan_out, p.fan_out));
        Strategy::ForkFromCheckpoint
    } else if p.untrusted_input && clean_start_unmet.is_none() {
        reasons.push("the input is untrusted and nothing it produces has to be kept: every turn starts clean, nothing is carried over".into());
        cheapest_feasible(&clean).unwrap_or(Strategy::EphemeralOnly)
    } else {
        cheapest_feasible(&|_| true).unwrap_or(Strategy::AlwaysOn)
    };
    if p.fan_out < 2 {
        if !p.keep.is_empty() {
            reasons.push(format!("must keep: {}", p.keep.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")));
        }
        if let Some(unmet) = &clean_start_unmet {
            reasons.push(format!(
                "a clean start per turn does not fit: {}",
                unmet.trim_start_matches("starts clean every turn: ")
            ));
        }
        if matches!(pick, Strategy::StandbyBetweenTurns | Strategy::StopBetweenTurns)
            && p.idle_seconds < MIN_IDLE_FOR_STANDBY_SECONDS
        {
            reasons.push(format!("idle gaps of {}s are shorter than {MIN_IDLE_FOR_STANDBY_SECONDS}s: standby/resume churn is not worth it, it stays running", p.idle_seconds));
            pick = Strategy::AlwaysOn;
        }
        if pick == Strategy::AlwaysOn && turns > 1 && keeps(Keep::GeneratedFiles) {
            reasons.push("several turns change generated files: a checkpoint after each makes any turn undoable for little storage".into());
            pick = Strategy::PersistentWithCheckpoints;
        }
        if pick == Strategy::TemplateThenEphemeral
            && p.setup_seconds < CHEAP_SETUP_SECONDS
            && by(Strategy::EphemeralOnly).is_some_and(|e| e.satisfies_keep)
        {
            reasons.push(format!(
                "setup takes {}s (< {CHEAP_SETUP_SECONDS}s): repeating it costs less than keeping a template",
                p.setup_seconds
            ));
            pick = Strategy::EphemeralOnly;
        }
        if turns > 1 && p.idle_seconds >= MIN_IDLE_FOR_STANDBY_SECONDS && matches!(pick, Strategy::StandbyBetweenTurns)
        {
            reasons.push(format!("idle {}s between turns: standby releases CPU and RAM and keeps the processes; resume takes ~{RESUME_SECONDS}s", p.idle_seconds));
        }
        if pick == Strategy::StopBetweenTurns {
            reasons.push("no processes to keep: stopping keeps the files without a memory image".into());
        }
        if pick == Strategy::TemplateThenEphemeral {
            reasons.push(format!(
                "setup takes {}s: paying it once into a template saves {} repeats",
                p.setup_seconds,
                turns.saturating_sub(1)
            ));
        }
    }
    let chosen = by(pick).expect("the pick is one of the alternatives");
    if let Some(eph) = by(Strategy::EphemeralOnly) {
        if eph.strategy != pick {
            let waiting = if (chosen.waiting_seconds - eph.waiting_seconds).abs() >= 1.0 {
                format!(", {:.1}s instead of {:.1}s waiting", chosen.waiting_seconds, eph.waiting_seconds)
            } else {
                String::new()
            };
            reasons.push(format!(
                "vs ephemeral-only: {} instead of {} setup runs{waiting}, cost {} vs {}",
                chosen.setup_runs,
                eph.setup_runs,
                money(chosen.total_cost),
                money(eph.total_cost)
            ));
        }
    }
    if let Some(on) = by(Strategy::AlwaysOn) {
        if on.strategy != pick {
            reasons.push(format!("vs always-on: cost {} vs {}", money(chosen.total_cost), money(on.total_cost)));
        }
    }
    if p.untrusted_input && !clean(pick) {
        warnings.push(format!(
            "this keeps state produced from untrusted input ({}): scan it (`strata scan`) before another stage trusts it, never promote it to a template without a clean scan, and export only the outputs you need",
            if p.keep.is_empty() { "the sandbox".to_string() } else { p.keep.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ") }
        ));
    }
    if keeps(Keep::Tokens) {
        warnings.push("tokens should not live in kept state: pass them as secrets (re-injected on resume, never in checkpoints, images or templates)".into());
    }
    if keeps(Keep::Processes) && p.fan_out >= 2 {
        warnings.push("forks share files, not processes: each child starts its processes again".into());
    }
    let (isolation, isolation_reason) = tier_for(p);
    Advice {
        recommendation: pick,
        isolation,
        isolation_reason,
        reasons,
        warnings,
        alternatives: all,
        currency: prices.currency.clone(),
    }
}

/// The tier a stage's trust calls for: untrusted input runs behind a kernel
/// of its own (gVisor's user-space kernel; a microVM's guest kernel is the
/// stronger, slower alternative), trusted work on the host's kernel.
fn tier_for(p: &StageProfile) -> (strata_api::Isolation, String) {
    use strata_api::Isolation;
    if p.untrusted_input {
        (
            Isolation::Gvisor,
            "the stage processes untrusted input: run it behind a kernel of its own, gvisor (a user-space kernel \
             between it and the host's) or microvm (a guest kernel, stronger and slower to start), not on the \
             host's kernel"
                .into(),
        )
    } else {
        (
            Isolation::Namespace,
            "the input is trusted: the namespace tier (the host's kernel behind namespaces, seccomp and a reduced \
             capability set) is the cheapest boundary that fits"
                .into(),
        )
    }
}

fn money(x: f64) -> String {
    format!("{x:.5}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prices() -> Prices {
        Prices::default()
    }

    #[test]
    fn nothing_to_keep_and_cheap_setup_is_ephemeral() {
        let a = advise(&StageProfile { setup_seconds: 2.0, turns: 1, ..Default::default() }, &prices());
        assert_eq!(a.recommendation, Strategy::EphemeralOnly, "{a:#?}");
        assert!(a.warnings.is_empty());
    }

    #[test]
    fn expensive_setup_repeated_over_turns_goes_to_a_template() {
        let a = advise(
            &StageProfile {
                keep: vec![Keep::Packages],
                setup_seconds: 600.0,
                turns: 10,
                turn_seconds: 30.0,
                idle_seconds: 3600.0,
                ..Default::default()
            },
            &prices(),
        );
        assert_eq!(a.recommendation, Strategy::TemplateThenEphemeral, "{a:#?}");
        let eph = a.alternatives.iter().find(|c| c.strategy == Strategy::EphemeralOnly).unwrap();
        assert_eq!(eph.setup_runs, 10);
        assert!(a.reasons.iter().any(|r| r.contains("vs ephemeral-only")), "{:?}", a.reasons);
    }

    #[test]
    fn running_processes_and_long_idle_go_to_standby() {
        let a = advise(
            &StageProfile {
                keep: vec![Keep::Processes, Keep::GeneratedFiles],
                setup_seconds: 120.0,
                turns: 5,
                turn_seconds: 60.0,
                idle_seconds: 1800.0,
                ..Default::default()
            },
            &prices(),
        );
        assert_eq!(a.recommendation, Strategy::StandbyBetweenTurns, "{a:#?}");
        let on = a.alternatives.iter().find(|c| c.strategy == Strategy::AlwaysOn).unwrap();
        let sb = a.alternatives.iter().find(|c| c.strategy == Strategy::StandbyBetweenTurns).unwrap();
        assert!(sb.total_cost < on.total_cost);
        // Stop would lose the processes; clean starts would lose everything.
        assert!(!a.alternatives.iter().find(|c| c.strategy == Strategy::StopBetweenTurns).unwrap().satisfies_keep);
        assert!(!a.alternatives.iter().find(|c| c.strategy == Strategy::EphemeralOnly).unwrap().satisfies_keep);
    }

    #[test]
    fn short_idle_stays_on_with_checkpoints_for_generated_files() {
        let a = advise(
            &StageProfile {
                keep: vec![Keep::GeneratedFiles],
                setup_seconds: 60.0,
                turns: 8,
                turn_seconds: 20.0,
                idle_seconds: 5.0,
                ..Default::default()
            },
            &prices(),
        );
        assert_eq!(a.recommendation, Strategy::PersistentWithCheckpoints, "{a:#?}");
        assert!(a.reasons.iter().any(|r| r.contains("shorter than")), "{:?}", a.reasons);
    }

    #[test]
    fn files_without_processes_over_long_idle_stop() {
        let a = advise(
            &StageProfile {
                keep: vec![Keep::GeneratedFiles],
                setup_seconds: 60.0,
                turns: 4,
                turn_seconds: 60.0,
                idle_seconds: 7200.0,
                ..Default::default()
            },
            &prices(),
        );
        assert_eq!(a.recommendation, Strategy::StopBetweenTurns, "{a:#?}");
    }

    #[test]
    fn the_tier_follows_the_stages_trust() {
        let trusted = advise(&StageProfile::default(), &prices());
        assert_eq!(trusted.isolation, strata_api::Isolation::Namespace);
        let untrusted = advise(&StageProfile { untrusted_input: true, ..Default::default() }, &prices());
        assert_eq!(untrusted.isolation, strata_api::Isolation::Gvisor);
        assert!(untrusted.isolation_reason.contains("untrusted input"), "{}", untrusted.isolation_reason);
    }

    #[test]
    fn untrusted_input_starts_clean_and_warns_when_state_is_kept() {
        let a = advise(
            &StageProfile { untrusted_input: true, setup_seconds: 300.0, turns: 3, ..Default::default() },
            &prices(),
        );
        assert_eq!(a.recommendation, Strategy::TemplateThenEphemeral, "{a:#?}");
        assert!(a.warnings.is_empty(), "{:?}", a.warnings);
        let a = advise(
            &StageProfile {
                untrusted_input: true,
                keep: vec![Keep::GeneratedFiles, Keep::Tokens],
                turns: 3,
                idle_seconds: 600.0,
                ..Default::default()
            },
            &prices(),
        );
        assert!(!matches!(a.recommendation, Strategy::EphemeralOnly | Strategy::TemplateThenEphemeral));
        assert!(a.warnings.iter().any(|w| w.contains("untrusted input")), "{:?}", a.warnings);
        assert!(a.warnings.iter().any(|w| w.contains("secrets")), "{:?}", a.warnings);
    }

    #[test]
    fn fan_out_forks_and_costs_less_than_repeating_setup() {
        let a = advise(
            &StageProfile { fan_out: 4, setup_seconds: 300.0, turn_seconds: 30.0, ..Default::default() },
            &prices(),
        );
        assert_eq!(a.recommendation, Strategy::ForkFromCheckpoint);
        let fork = a.alternatives.iter().find(|c| c.strategy == Strategy::ForkFromCheckpoint).unwrap();
        let eph = a.alternatives.iter().find(|c| c.strategy == Strategy::EphemeralOnly).unwrap();
        assert_eq!((fork.setup_runs, eph.setup_runs), (1, 4));
        assert!(fork.total_cost < eph.total_cost);
    }

    #[test]
    fn alternatives_are_sorted_by_cost_and_always_include_the_two_baselines() {
        let a = advise(&StageProfile { turns: 3, idle_seconds: 100.0, ..Default::default() }, &prices());
        assert!(a.alternatives.windows(2).all(|w| w[0].total_cost <= w[1].total_cost));
        for s in [Strategy::EphemeralOnly, Strategy::AlwaysOn] {
            assert!(a.alternatives.iter().any(|c| c.strategy == s));
        }
    }
}
