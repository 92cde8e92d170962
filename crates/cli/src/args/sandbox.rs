//! A sandbox's life: `create`, `run`, `ps`, `inspect`, `update`, `stop`, `pause`,
//! `unpause`, `standby`, `resume`, `archive`, `start`, `rm` and `events`, with the
//! limit and lifecycle-policy flags of new sandboxes.

use clap::{Args, ValueEnum};

use super::checkpoint::WarmArgs;
use super::network::NetworkArgs;
use super::process::ProcOpts;
use super::security::SecretArgs;
use super::{JsonOutput, SandboxId, SandboxIds};

/// `strata create`.
#[derive(Debug, Args, Clone)]
pub struct CreateArgs {
    /// Image to start from.
    pub source: String,
    /// Name.
    #[arg(long)]
    pub name: Option<String>,
    /// Lifecycle.
    #[arg(long, value_enum, default_value = "persistent")]
    pub lifecycle: LifecycleArg,
    /// Time to live (e.g. 10m, 2h).
    #[arg(long)]
    pub ttl: Option<String>,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Environment for every process (repeatable).
    #[arg(short, long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Hostname.
    #[arg(long)]
    pub hostname: Option<String>,
    /// Label (repeatable).
    #[arg(long = "label", value_name = "K=V")]
    pub labels: Vec<String>,
    #[command(flatten)]
    pub secrets: SecretArgs,
    #[command(flatten)]
    pub network: NetworkArgs,
    /// Declare a Rule-of-Two capability (repeatable): untrusted_input, sensitive_access,
    /// external_comms. Secrets and egress imply the last two; all three need an approval.
    #[arg(long = "capability", value_name = "CAP", value_parser = parse_capability)]
    pub capabilities: Vec<strata_api::Capability>,
    /// Let setuid binaries (sudo, su) take effect inside: processes run without
    /// no_new_privs. They can become the sandbox's root, with its reduced
    /// capabilities and seccomp filter, and no more (see docs/security.md).
    #[arg(long)]
    pub allow_setuid: bool,
    #[command(flatten)]
    pub warm: WarmArgs,
    /// Isolation tier: namespace, gvisor or microvm (default: the daemon's
    /// --default-isolation). A tier this host cannot run is refused with why
    /// (`strata doctor` lists each tier's capabilities here).
    #[arg(long, value_name = "TIER", value_parser = parse_isolation)]
    pub isolation: Option<strata_api::Isolation>,
    #[command(flatten)]
    pub userns: UsernsArgs,
    /// Where /tmp lives: disk (part of the filesystem: kept in checkpoints,
    /// forks, templates and exports; the default) or tmpfs (scratch, never
    /// kept). Default from a checkpoint or template: its sandbox's.
    #[arg(long, value_enum)]
    pub tmp: Option<TmpArg>,
}

/// `--tmp`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum TmpArg {
    /// Part of the sandbox's filesystem.
    Disk,
    /// A scratch tmpfs, never kept.
    Tmpfs,
}

impl From<TmpArg> for strata_api::TmpStorage {
    fn from(a: TmpArg) -> Self {
        match a {
            TmpArg::Disk => strata_api::TmpStorage::Disk,
            TmpArg::Tmpfs => strata_api::TmpStorage::Tmpfs,
        }
    }
}

/// `strata run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Destroy the sandbox when the command ends (an ephemeral sandbox: nothing survives).
    #[arg(long)]
    pub rm: bool,
    /// Image to start from.
    pub source: String,
    /// Name.
    #[arg(long)]
    pub name: Option<String>,
    /// Time to live (default with --rm: 24h, so a crashed client leaves nothing behind for long).
    #[arg(long)]
    pub ttl: Option<String>,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub policy: PolicyArgs,
    #[command(flatten)]
    pub secrets: SecretArgs,
    #[command(flatten)]
    pub network: NetworkArgs,
    #[command(flatten)]
    pub opts: ProcOpts,
    /// Isolation tier: namespace, gvisor or microvm (default: the daemon's
    /// --default-isolation). A tier this host cannot run is refused with why
    /// (`strata doctor` lists each tier's capabilities here).
    #[arg(long, value_name = "TIER", value_parser = parse_isolation)]
    pub isolation: Option<strata_api::Isolation>,
    #[command(flatten)]
    pub userns: UsernsArgs,
    /// Where /tmp lives: disk (part of the filesystem: kept in checkpoints,
    /// forks, templates and exports; the default) or tmpfs (scratch, never
    /// kept). Default from a checkpoint or template: its sandbox's.
    #[arg(long, value_enum)]
    pub tmp: Option<TmpArg>,
    /// Command and arguments.
    #[arg(last = true, required = true)]
    pub cmd: Vec<String>,
}

/// `strata inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub sandbox: SandboxId,
    #[command(flatten)]
    pub out: JsonOutput,
}

/// `strata update`.
#[derive(Debug, Args)]
pub struct UpdateArgs {
    #[command(flatten)]
    pub sandbox: SandboxId,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Declare a further Rule-of-Two capability (repeatable; declared ones cannot be dropped).
    #[arg(long = "capability", value_name = "CAP", value_parser = parse_capability)]
    pub capabilities: Vec<strata_api::Capability>,
    /// JSON output (the updated sandbox).
    #[arg(long)]
    pub json: bool,
}

/// `strata standby`.
#[derive(Debug, Args)]
pub struct StandbyArgs {
    /// Stop the processes and keep only the filesystem (recorded on the sandbox)
    /// instead of failing where processes cannot be dumped.
    #[arg(long)]
    pub fs_only: bool,
    #[command(flatten)]
    pub sandboxes: SandboxIds,
}

/// `strata resume`.
#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// JSON output (the resume results).
    #[arg(long)]
    pub json: bool,
    /// From standby: start afresh from the filesystem and drop the process
    /// image (e.g. one this host cannot restore); its processes are lost.
    #[arg(long)]
    pub fs_only: bool,
    #[command(flatten)]
    pub sandboxes: SandboxIds,
}

/// `strata rm`.
#[derive(Debug, Args)]
pub struct RmArgs {
    /// Stop running sandboxes first.
    #[arg(short, long)]
    pub force: bool,
    #[command(flatten)]
    pub sandboxes: SandboxIds,
}

/// `strata events`.
#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Only this sandbox.
    pub id: Option<String>,
    /// Keep following new events.
    #[arg(short, long)]
    pub follow: bool,
    /// JSON lines output.
    #[arg(long)]
    pub json: bool,
}

/// `--lifecycle` values.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LifecycleArg {
    Ephemeral,
    Persistent,
}

/// Resource limits of a new sandbox.
#[derive(Debug, Args, Clone)]
pub struct LimitArgs {
    /// Memory limit (e.g. 512m, 2g).
    #[arg(long)]
    pub memory: Option<String>,
    /// CPU limit in cores (e.g. 0.5, 2).
    #[arg(long)]
    pub cpus: Option<String>,
    /// Maximum number of processes.
    #[arg(long)]
    pub pids: Option<u64>,
    /// Size of the writable layer (e.g. 512m, 20g); writes beyond it fail with
    /// "No space left on device". Default: the daemon's --default-disk.
    #[arg(long)]
    pub disk: Option<String>,
}

/// What happens to an idle sandbox.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OnIdleArg {
    /// Processes and memory to disk, compute released.
    Standby,
    /// Processes stopped, filesystem kept.
    Stop,
    /// Sandbox destroyed.
    Destroy,
    /// Nothing.
    Keep,
}

/// `strata ps`.
#[derive(Debug, Args)]
pub struct PsArgs {
    /// Also what each sandbox has accumulated: its writable layer (bytes,
    /// entries, growth per day), its checkpoints and their storage, its base's
    /// age (each writable layer is walked).
    #[arg(long)]
    pub wide: bool,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

/// Lifecycle policy of a sandbox. Durations: 30s, 10m, 2h, 7d; `none` removes
/// a max-lifetime/archive-after/delete-after limit.
#[derive(Debug, Args, Clone, Default)]
pub struct PolicyArgs {
    /// Action once idle (default: standby for persistent, destroy for ephemeral sandboxes).
    #[arg(long, value_enum)]
    pub on_idle: Option<OnIdleArg>,
    /// Idle time before the on-idle action (default 15m).
    #[arg(long, value_name = "DUR")]
    pub idle_timeout: Option<String>,
    /// Maximum age: a running sandbox then gets --on-max-lifetime.
    #[arg(long, value_name = "DUR")]
    pub max_lifetime: Option<String>,
    /// Action at the maximum age: stop, standby or destroy (default: stop
    /// when persistent, destroy when ephemeral).
    #[arg(long, value_enum)]
    pub on_max_lifetime: Option<OnIdleArg>,
    /// Archive after this long stopped or in standby.
    #[arg(long, value_name = "DUR")]
    pub archive_after: Option<String>,
    /// Destroy after this long stopped, in standby or archived.
    #[arg(long, value_name = "DUR")]
    pub delete_after: Option<String>,
    /// Shell command run inside (`sh -c`) before standby. Hooks given together
    /// replace all current hooks.
    #[arg(long, value_name = "CMD")]
    pub hook_before_standby: Option<String>,
    /// Shell command run inside before a stop.
    #[arg(long, value_name = "CMD")]
    pub hook_before_stop: Option<String>,
    /// Shell command run inside after a resume.
    #[arg(long, value_name = "CMD")]
    pub hook_after_resume: Option<String>,
    /// How long each hook may run (default 30s).
    #[arg(long, value_name = "DUR")]
    pub hook_timeout: Option<String>,
    /// Flush rule (repeatable): wipe this directory's contents (absolute, or
    /// ~/... for the image user's home) before every checkpoint, fork and
    /// template creation. Given together they replace the current rules;
    /// `--flush none` removes them.
    #[arg(long = "flush", value_name = "PATH")]
    pub flush: Vec<String>,
    /// Whether a call that needs the sandbox running (exec, files, previews)
    /// resumes, thaws or starts it when parked (default true); with false
    /// such calls are refused (409) until `strata resume` or `strata start`.
    #[arg(long, value_name = "BOOL")]
    pub resume_on_access: Option<bool>,
    /// Check the sandbox's state (the hygiene scan of what its layers add to
    /// its image; a parked sandbox is not resumed) this often, e.g. 6h (at
    /// least 1m), or `none`. Each check is a `checked` event.
    #[arg(long, value_name = "DUR")]
    pub check_every: Option<String>,
    /// What a check with findings does: record (default), quarantine, flush
    /// (the flush rules, when it runs) or stop.
    #[arg(long, value_enum)]
    pub on_findings: Option<OnFindingsArg>,
    /// A writable layer larger than this (e.g. 5G) is a check finding, or `none`.
    #[arg(long, value_name = "SIZE")]
    pub max_writable: Option<String>,
    /// A base (image or checkpoint) older than this (e.g. 30d) is a check finding, or `none`.
    #[arg(long, value_name = "DUR")]
    pub max_age: Option<String>,
}

/// What a check with findings does.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OnFindingsArg {
    /// Only the event.
    Record,
    /// Quarantine the sandbox.
    Quarantine,
    /// Apply its flush rules.
    Flush,
    /// Stop it.
    Stop,
}

/// Whether a namespace-tier sandbox runs in a user namespace of its own.
#[derive(Debug, Clone, Copy, Args)]
pub struct UsernsArgs {
    /// Run in a user namespace of its own: root inside is an unprivileged
    /// host uid (namespace tier). Default: the source checkpoint's for forks
    /// and templates, else the daemon's --default-userns (on where the host
    /// supports it), and always with --capability untrusted_input.
    #[arg(long, conflicts_with = "no_userns")]
    pub userns: bool,
    /// Run without a user namespace even where the default would give one.
    #[arg(long)]
    pub no_userns: bool,
}

impl UsernsArgs {
    /// The request field.
    pub fn choice(&self) -> Option<bool> {
        match (self.userns, self.no_userns) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }
}

/// An isolation tier by name.
pub fn parse_isolation(s: &str) -> Result<strata_api::Isolation, String> {
    strata_api::Isolation::parse(s).ok_or_else(|| format!("unknown isolation tier {s:?} (namespace, gvisor, microvm)"))
}

/// Parses a Rule-of-Two capability name.
pub fn parse_capability(s: &str) -> Result<strata_api::Capability, String> {
    strata_api::Capability::parse(s)
        .ok_or_else(|| format!("unknown capability {s:?} (untrusted_input, sensitive_access, external_comms)"))
}
