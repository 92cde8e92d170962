//! Multi-step work: `pipeline ...` runs, `fork` (and its fan-out and select with
//! `--run`), and `advise`, the lifecycle recommendation for a pipeline stage.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

use super::checkpoint::WarmArgs;
use super::sandbox::LifecycleArg;
use super::JsonOutput;

/// `strata pipeline ...`.
#[derive(Debug, Subcommand)]
pub enum PipelineCmd {
    /// Run a pipeline spec (TOML, see docs/pipelines.md), streaming a line per stage
    /// event and ending with a table per stage; exit status 1 when it fails, 2 when it was paused.
    Run {
        /// The spec file.
        file: PathBuf,
        /// Print the run and return at once.
        #[arg(long)]
        detach: bool,
        /// JSON output (NDJSON events while following).
        #[arg(long)]
        json: bool,
    },
    /// Show a run stage by stage.
    Status {
        #[command(flatten)]
        run: RunId,
        /// Follow it until it ends.
        #[arg(long)]
        follow: bool,
        #[command(flatten)]
        out: JsonOutput,
    },
    /// List runs.
    Ls(JsonOutput),
    /// Pause a running run at its next stage boundary (the current stage finishes first).
    Pause(RunId),
    /// Continue a failed, interrupted or paused run from its first unfinished stage.
    Resume {
        #[command(flatten)]
        run: RunId,
        /// Print the run and return at once.
        #[arg(long)]
        detach: bool,
        #[command(flatten)]
        out: JsonOutput,
    },
}

/// The positional run of `pipeline status|pause|resume`.
#[derive(Debug, Args)]
pub struct RunId {
    /// Run id or unique prefix.
    pub id: String,
}

/// `strata fork`.
#[derive(Debug, Args)]
pub struct ForkArgs {
    /// Checkpoint or sandbox.
    pub source: String,
    /// Number of children (with --run and --arg: defaults to the number of args).
    #[arg(long, short = 'n')]
    pub count: Option<u32>,
    #[command(flatten)]
    pub fanout: FanoutArgs,
    /// Children are named PREFIX-1..N.
    #[arg(long)]
    pub name_prefix: Option<String>,
    /// Lifecycle of the children.
    #[arg(long, value_enum, default_value = "persistent")]
    pub lifecycle: LifecycleArg,
    /// TTL of the children.
    #[arg(long)]
    pub ttl: Option<String>,
    #[command(flatten)]
    pub warm: WarmArgs,
    /// Isolation tier of the children (default: the source's; children with
    /// the source's processes must stay on its tier).
    #[arg(long, value_name = "TIER", value_parser = super::sandbox::parse_isolation)]
    pub isolation: Option<strata_api::Isolation>,
    #[command(flatten)]
    pub out: JsonOutput,
}

/// Fan-out flags of `strata fork --run`.
#[derive(Debug, Args)]
pub struct FanoutArgs {
    /// Shell command run in each child (`sh -c`); `{i}` is the attempt's index, `{arg}` its --arg.
    #[arg(long)]
    pub run: Option<String>,
    /// One attempt per argument (repeat).
    #[arg(long = "arg", requires = "run")]
    pub args: Vec<String>,
    /// Winner rule: first to exit 0, all must exit 0, or the best --score-cmd.
    #[arg(long, value_enum, default_value = "first", requires = "run")]
    pub select: SelectArg,
    /// Shell command printing a score (last stdout line), run in each child after its attempt.
    #[arg(long, requires = "run")]
    pub score_cmd: Option<String>,
    /// Keep the losing children (default: destroyed).
    #[arg(long, requires = "run")]
    pub keep_losers: bool,
    /// Per-attempt timeout, e.g. 60s.
    #[arg(long, requires = "run")]
    pub timeout: Option<String>,
    /// Checkpoint the winner under this name.
    #[arg(long, requires = "run")]
    pub promote: Option<String>,
    /// User (name or uid) the attempts run as (default: the image's).
    #[arg(long = "user", short = 'u', requires = "run")]
    pub user: Option<String>,
    /// Working directory of the attempts.
    #[arg(long, short = 'w', requires = "run")]
    pub workdir: Option<String>,
}

/// `--select` values.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum SelectArg {
    /// The first attempt to exit 0 wins; the others are killed.
    First,
    /// Every attempt must exit 0.
    All,
    /// The highest score (of --score-cmd) among the attempts that exit 0.
    Score,
}

/// `strata advise`: a stage described in numbers.
#[derive(Debug, Args)]
pub struct AdviseArgs {
    /// What must survive to the next turn or stage (repeat or comma-separate):
    /// repository, packages, generated-files, tokens, processes.
    #[arg(long, value_delimiter = ',', value_parser = parse_keep)]
    pub keep: Vec<strata_api::Keep>,
    /// Time to set the environment up from nothing (e.g. 5m).
    #[arg(long)]
    pub setup: Option<String>,
    /// How many times the stage is invoked (agent turns).
    #[arg(long)]
    pub turns: Option<u32>,
    /// Active time per turn (default 1m).
    #[arg(long)]
    pub turn: Option<String>,
    /// Idle time between turns.
    #[arg(long)]
    pub idle: Option<String>,
    /// The stage processes untrusted input (uploads, web content, third-party code).
    #[arg(long)]
    pub untrusted: bool,
    /// Parallel attempts from one starting point (fan-out).
    #[arg(long)]
    pub fan_out: Option<u32>,
    /// CPUs the sandbox reserves (default 1).
    #[arg(long)]
    pub cpus: Option<f64>,
    /// Memory the sandbox reserves (default 1g).
    #[arg(long)]
    pub memory: Option<String>,
    /// State on disk (default 1g).
    #[arg(long)]
    pub disk: Option<String>,
    #[command(flatten)]
    pub out: JsonOutput,
}

fn parse_keep(s: &str) -> Result<strata_api::Keep, String> {
    use strata_api::Keep;
    Ok(match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
        "repository" | "repo" => Keep::Repository,
        "packages" => Keep::Packages,
        "generated-files" | "files" => Keep::GeneratedFiles,
        "tokens" => Keep::Tokens,
        "processes" => Keep::Processes,
        other => {
            return Err(format!("unknown {other:?}: one of repository, packages, generated-files, tokens, processes"))
        }
    })
}
