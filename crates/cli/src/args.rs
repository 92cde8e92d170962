//! Command-line arguments.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use strata_engine::admission::DefaultLimit;

/// strata: sandboxes for multi-step AI-agent pipelines.
#[derive(Debug, Parser)]
#[command(name = "strata", version, about, propagate_version = true)]
pub struct Cli {
    /// Daemon socket.
    #[arg(long, global = true, env = "STRATA_SOCKET", default_value = "/run/strata/strata.sock")]
    pub socket: PathBuf,
    /// Talk to the daemon over TCP instead (host:port); the token comes from STRATA_TOKEN.
    #[arg(long, global = true, env = "STRATA_HOST")]
    pub host: Option<String>,
    /// Bearer token for --host: a tenant token (`strata token create`) or the operator's <state-dir>/api-token.
    #[arg(long, global = true, env = "STRATA_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Act as this tenant (operator: create in it and see only it; sent as X-Strata-Tenant).
    #[arg(long = "as-tenant", global = true, env = "STRATA_TENANT", value_name = "TENANT")]
    pub as_tenant: Option<String>,
    /// Cite an approved Rule-of-Two approval (sent as X-Strata-Approval) when repeating
    /// a request that was refused with `approval required`.
    #[arg(long, global = true, env = "STRATA_APPROVAL", value_name = "APPROVAL_ID")]
    pub approval: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon.
    Daemon(DaemonArgs),
    /// Report what this host supports and what each missing piece disables.
    Doctor {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Manage images.
    #[command(subcommand)]
    Image(ImageCmd),
    /// Manage API tokens (operator only): each belongs to a tenant and sees only its sandboxes,
    /// checkpoints, templates and pipeline runs.
    #[command(subcommand)]
    Token(TokenCmd),
    /// Tenant quotas (sandboxes, memory, disk, forks per minute) and usage against them.
    #[command(subcommand)]
    Tenant(TenantCmd),
    /// The Rule of Two's approval queue: requests that would give one sandbox untrusted
    /// input, sensitive access and external communication at once wait here for a human.
    #[command(subcommand, alias = "approval")]
    Approvals(ApprovalCmd),
    /// Run pipelines (a TOML spec of stages, each with its own lifecycle) and follow them.
    #[command(subcommand)]
    Pipeline(PipelineCmd),
    /// Create and start a sandbox; prints its id.
    Create(CreateArgs),
    /// One-shot: create a sandbox, run a command, and (with --rm) destroy it.
    Run(RunArgs),
    /// List sandboxes.
    Ps {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Show a sandbox in detail.
    Inspect {
        /// Sandbox id or name.
        id: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Change a sandbox's lifecycle policy (only the flags given change).
    Update(UpdateArgs),
    /// Show or change a sandbox's network (mode, allow rules, counters).
    #[command(subcommand)]
    Network(NetworkCmd),
    /// Open sandbox ports as preview URLs (HTTP and WebSocket through the daemon's proxy).
    #[command(subcommand)]
    Preview(PreviewCmd),
    /// Keep a sandbox awake with a lease (prints the lease id and expiry), or manage leases.
    Lease(LeaseArgs),
    /// Stop sandboxes (processes killed, filesystem kept).
    Stop {
        /// Sandbox ids or names.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Freeze sandboxes' processes (memory kept, no CPU).
    Pause {
        /// Sandbox ids or names.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Thaw paused sandboxes.
    Unpause {
        /// Sandbox ids or names.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Dump sandboxes' processes and memory to disk, releasing their CPU and RAM.
    Standby {
        /// Stop the processes and keep only the filesystem (recorded on the sandbox)
        /// instead of failing where processes cannot be dumped.
        #[arg(long)]
        fs_only: bool,
        /// Sandbox ids or names.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Bring sandboxes back from standby (same processes), or thaw / start them.
    Resume {
        /// JSON output (the resume results).
        #[arg(long)]
        json: bool,
        /// Sandbox ids or names.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Pack stopped or standby sandboxes into the archive store, freeing their local disk
    /// (`resume` or `start` brings them back).
    Archive {
        /// Sandbox ids or names.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Start stopped sandboxes.
    Start {
        /// Sandbox ids or names.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Destroy sandboxes.
    Rm {
        /// Stop running sandboxes first.
        #[arg(short, long)]
        force: bool,
        /// Sandbox ids or names.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Run a command in a running sandbox; exits with its exit code.
    Exec(ExecArgs),
    /// Checkpoint a sandbox (prints the checkpoint id), or manage checkpoints.
    Checkpoint(CheckpointArgs),
    /// Delete expired checkpoints nothing needs and layers nothing references.
    Gc {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Cost of a sandbox (destroyed ones too) or of all: compute, storage by kind,
    /// and the ephemeral-only and always-on counterfactuals.
    Cost {
        /// Sandbox id, id prefix or name (default: every sandbox).
        id: Option<String>,
        /// The cost of a pipeline run, per stage, instead.
        #[arg(long, conflicts_with = "id")]
        pipeline: Option<String>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Recommend a lifecycle for a pipeline stage: from what it must keep, how long it
    /// idles, what its setup costs and whether its input is trusted, the lifecycle,
    /// why, and every alternative priced (ephemeral-only and always-on included).
    Advise(AdviseArgs),
    /// The tree of images, checkpoints, forks and templates around a sandbox or checkpoint.
    Lineage {
        /// Sandbox or checkpoint.
        id: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Manage templates (warm starting points).
    #[command(subcommand)]
    Template(TemplateCmd),
    /// Roll a sandbox back to a checkpoint.
    Restore {
        /// Sandbox id or name.
        id: String,
        /// Checkpoint id or name.
        #[arg(long = "to")]
        to: String,
        /// Checkpoint the current state first instead of discarding it.
        #[arg(long)]
        keep_current: bool,
        #[command(flatten)]
        warm: WarmArgs,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Fork N sandboxes from a checkpoint or a live sandbox; prints their ids.
    /// With --run: fan-out and select (one attempt per child, a winner by --select;
    /// prints a table of attempts, exit status 1 when there is no winner).
    Fork {
        /// Checkpoint or sandbox.
        source: String,
        /// Number of children (with --run and --arg: defaults to the number of args).
        #[arg(long, short = 'n')]
        count: Option<u32>,
        #[command(flatten)]
        fanout: FanoutArgs,
        /// Children are named PREFIX-1..N.
        #[arg(long)]
        name_prefix: Option<String>,
        /// Lifecycle of the children.
        #[arg(long, value_enum, default_value = "persistent")]
        lifecycle: LifecycleArg,
        /// TTL of the children.
        #[arg(long)]
        ttl: Option<String>,
        #[command(flatten)]
        warm: WarmArgs,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// State-hygiene scan: credentials, setuid files, system-path changes and
    /// persistence hooks that a sandbox (or checkpoint) adds on top of its image.
    /// Exit status 2 when there are findings.
    Scan {
        /// Sandbox or checkpoint id or name.
        id: String,
        /// JSON output (the report).
        #[arg(long)]
        json: bool,
    },
    /// The hash-chained audit log of API actions (mutations), or `audit verify`.
    Audit(AuditArgs),
    /// Paths added, modified and deleted since the last checkpoint.
    Diff {
        /// Sandbox id or name.
        id: String,
        /// The checkpoint to compare against (the sandbox's last one).
        #[arg(long)]
        against: Option<String>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Write the change set since the last checkpoint as a tar (deletions as .wh. entries).
    Export {
        /// Sandbox id or name.
        id: String,
        /// The checkpoint to compare against (the sandbox's last one).
        #[arg(long)]
        against: Option<String>,
        /// Output file.
        #[arg(short, long)]
        output: std::path::PathBuf,
    },
    /// Manage background processes of a sandbox.
    #[command(subcommand)]
    Proc(ProcCmd),
    /// Copy files: `strata cp LOCAL ID:/path` or `strata cp ID:/path LOCAL`.
    Cp {
        /// Source.
        src: String,
        /// Destination.
        dst: String,
    },
    /// File operations inside a sandbox.
    #[command(subcommand)]
    Fs(FsCmd),
    /// Lifecycle events.
    Events {
        /// Only this sandbox.
        id: Option<String>,
        /// Keep following new events.
        #[arg(short, long)]
        follow: bool,
        /// JSON lines output.
        #[arg(long)]
        json: bool,
    },
    /// Serve strata's sandbox tools to an MCP client (Claude Desktop, IDEs, agent
    /// frameworks) over stdin/stdout; every tool call goes to the daemon (see docs/mcp.md).
    Mcp,
    /// Print the OpenAPI document of the native API.
    #[command(hide = true)]
    Openapi,
}

#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// State directory.
    #[arg(long, env = "STRATA_STATE_DIR", default_value = "/var/lib/strata")]
    pub state_dir: PathBuf,
    /// Also listen on TCP (bearer token required; it is written to <state-dir>/api-token).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Object store for archives: file:///path or s3://bucket/prefix (S3 needs a build
    /// with the strata-engine/s3 feature). Default: <state-dir>/archive.
    #[arg(long, env = "STRATA_ARCHIVE_URL")]
    pub archive_url: Option<String>,
    /// The static strata-init binary run inside sandboxes (default: next to strata,
    /// then target/x86_64-unknown-linux-gnu/release/ of a source tree, then /usr/local/lib/strata).
    #[arg(long, env = "STRATA_INIT_BINARY")]
    pub init_binary: Option<PathBuf>,
    /// Prices for cost accounting, a JSON file (see docs/metrics.md); missing
    /// fields keep the built-in defaults.
    #[arg(long, env = "STRATA_PRICES")]
    pub prices: Option<PathBuf>,
    /// Address pool of egress sandboxes (IPv4 CIDR, /8 to /28; each sandbox takes a /30).
    /// Daemons sharing a host need disjoint pools. Default: 10.213.0.0/16.
    #[arg(long, env = "STRATA_NETWORK_POOL")]
    pub network_pool: Option<String>,
    /// Upstream DNS server of the sandboxes' filtering resolver (IP:PORT).
    /// Default: the first IPv4 nameserver in /etc/resolv.conf.
    #[arg(long, env = "STRATA_DNS_UPSTREAM")]
    pub dns_upstream: Option<std::net::SocketAddr>,
    /// Writable-layer size of sandboxes created without --disk (each gets its
    /// own ext4 filesystem of that size on a loop device); `none`: no default
    /// disk limit. Default: 10g (at most the state filesystem's size).
    #[arg(long, env = "STRATA_DEFAULT_DISK", value_name = "SIZE|none", value_parser = parse_default_size)]
    pub default_disk: Option<DefaultLimit<u64>>,
    /// Memory limit of sandboxes created without --memory (it also caps their
    /// /tmp); `none`: no default memory limit. Default: 2g (at most MemTotal).
    #[arg(long, env = "STRATA_DEFAULT_MEMORY", value_name = "SIZE|none", value_parser = parse_default_size)]
    pub default_memory: Option<DefaultLimit<u64>>,
    /// CPU limit of sandboxes created without --cpus; `none`: no default CPU
    /// limit. Default: 2, or the host's CPUs when it has fewer.
    #[arg(long, env = "STRATA_DEFAULT_CPUS", value_name = "CPUS|none", value_parser = parse_default_cpus)]
    pub default_cpus: Option<DefaultLimit<f64>>,
    /// Process limit of sandboxes created without --pids (a fork bomb stops
    /// there); `none`: no default pids limit. Default: 1024.
    #[arg(long, env = "STRATA_DEFAULT_PIDS", value_name = "N|none", value_parser = parse_default_count)]
    pub default_pids: Option<DefaultLimit<u64>>,
    /// How far the memory limits of sandboxes holding memory (creating, running,
    /// paused) may add up beyond the host's MemTotal, as a ratio; beyond it a
    /// create, start or resume is refused (503). `none`: no bound. Default: 20.
    #[arg(long, env = "STRATA_MEMORY_OVERCOMMIT", value_name = "RATIO|none", value_parser = parse_ratio)]
    pub memory_overcommit: Option<Ratio>,
    /// No sandbox is created, started or resumed while the host's MemAvailable
    /// is below this (503). Default: 256m.
    #[arg(long, env = "STRATA_MEMORY_RESERVE", value_name = "SIZE", value_parser = parse_size)]
    pub memory_reserve: Option<u64>,
    /// How far the nominal disk sizes of all sandboxes may add up beyond the
    /// state filesystem's size, as a ratio (disks are sparse); beyond it a create
    /// is refused (507). `none`: no bound. Default: 64.
    #[arg(long, env = "STRATA_DISK_OVERCOMMIT", value_name = "RATIO|none", value_parser = parse_ratio)]
    pub disk_overcommit: Option<Ratio>,
    /// Free space of the state filesystem no new disk may take: a disk larger
    /// than the free space minus this is refused (507). Default: 2g.
    #[arg(long, env = "STRATA_DISK_RESERVE", value_name = "SIZE", value_parser = parse_size)]
    pub disk_reserve: Option<u64>,
    /// The default quota of every tenant (overridden per tenant with `strata
    /// tenant quota set`): comma-separated KEY=VALUE, keys sandboxes, memory
    /// (sum of running sandboxes' limits), disk (sum of nominal disk sizes),
    /// forks-per-minute; VALUE a count or size, N% (memory: of MemTotal, disk:
    /// of the state filesystem) or `unlimited`. Keys not given keep the default:
    /// sandboxes=100,memory=100%,disk=100%,forks-per-minute=120. The operator
    /// acting in no tenant has no quota.
    #[arg(long, env = "STRATA_TENANT_QUOTA", value_name = "KEY=VALUE,...", value_parser = parse_tenant_quota)]
    pub tenant_quota: Option<strata_engine::admission::TenantQuotaConfig>,
    /// How many disks of the default size the daemon keeps formatted and
    /// mounted ahead of need, so a create or fork child does not wait for one
    /// (each costs a loop device and about 0.2 MiB of disk); 0 makes every
    /// disk on demand.
    #[arg(long, env = "STRATA_DISK_POOL", default_value_t = 8)]
    pub disk_pool: usize,
    /// How long a Rule-of-Two approval waits for an operator before it is
    /// denied, and an approved one for the request to be repeated (e.g. 15m, 1h).
    #[arg(long, env = "STRATA_APPROVAL_TIMEOUT", value_parser = parse_timeout)]
    pub approval_timeout: Option<std::time::Duration>,
    /// Domain of host-based preview URLs: `http://<port>-<sandbox>.<domain>` reaches
    /// the port on the TCP listener (point a wildcard DNS record at the daemon).
    /// Default: preview.localhost.
    #[arg(long, env = "STRATA_PREVIEW_DOMAIN")]
    pub preview_domain: Option<String>,
}

fn parse_default_size(s: &str) -> Result<DefaultLimit<u64>, String> {
    match s.trim() {
        "none" => Ok(DefaultLimit::NoLimit),
        v => strata_core::units::parse_size(v).map(DefaultLimit::Value).map_err(|e| format!("{e}, or `none`")),
    }
}

fn parse_default_cpus(s: &str) -> Result<DefaultLimit<f64>, String> {
    match s.trim() {
        "none" => Ok(DefaultLimit::NoLimit),
        v => strata_core::units::parse_cpus(v).map(DefaultLimit::Value).map_err(|e| format!("{e}, or `none`")),
    }
}

fn parse_default_count(s: &str) -> Result<DefaultLimit<u64>, String> {
    match s.trim() {
        "none" => Ok(DefaultLimit::NoLimit),
        v => v
            .parse::<u64>()
            .map(DefaultLimit::Value)
            .map_err(|_| format!("invalid count {v:?} (expected a number, or `none`)")),
    }
}

/// An over-commit ratio, `None` for `none` (no bound).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratio(pub Option<f64>);

fn parse_ratio(s: &str) -> Result<Ratio, String> {
    match s.trim() {
        "none" => Ok(Ratio(None)),
        v => match v.parse::<f64>() {
            Ok(r) if r.is_finite() && r > 0.0 => Ok(Ratio(Some(r))),
            _ => Err(format!("invalid ratio {v:?} (expected a positive number, e.g. 1.5, or `none`)")),
        },
    }
}

fn parse_size(s: &str) -> Result<u64, String> {
    strata_core::units::parse_size(s).map_err(|e| e.to_string())
}

fn parse_tenant_quota(s: &str) -> Result<strata_engine::admission::TenantQuotaConfig, String> {
    strata_engine::admission::parse_tenant_quota(s)
}

fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    strata_core::units::parse_duration(s).map_err(|e| e.to_string())
}

#[derive(Debug, Subcommand)]
pub enum ImageCmd {
    /// Import an OCI layout directory, docker-save archive, rootfs tarball or rootfs directory.
    Import {
        /// Source path.
        src: PathBuf,
        /// Name to register.
        #[arg(long)]
        name: String,
        /// Keep setuid/setgid bits and file capabilities (trusted sources only).
        #[arg(long)]
        trusted: bool,
        /// Replace an existing image of that name.
        #[arg(long)]
        replace: bool,
        /// JSON output (the import report).
        #[arg(long)]
        json: bool,
    },
    /// Pull an image from a registry (anonymously), e.g. 127.0.0.1:5000/busybox:latest.
    /// Pulling again under the same name updates the image; stored layers are reused.
    Pull {
        /// Image reference: [REGISTRY[:PORT]/]REPOSITORY[:TAG][@DIGEST] (no registry: Docker Hub).
        reference: String,
        /// Name to register (default: the reference).
        #[arg(long)]
        name: Option<String>,
        /// Talk plain HTTP to the registry (e.g. a registry on loopback).
        #[arg(long)]
        insecure: bool,
        /// JSON output (the import report).
        #[arg(long)]
        json: bool,
    },
    /// List images.
    Ls {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Show an image.
    Inspect {
        /// Image name or id.
        name: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Remove an image.
    Rm {
        /// Image names.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LifecycleArg {
    Ephemeral,
    Persistent,
}

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
}

/// Whether a sandbox starts with the running processes a checkpoint kept.
#[derive(Debug, Clone, Copy, Args)]
pub struct WarmArgs {
    /// Start with the running processes of the source checkpoint (a live fork
    /// source is checkpointed with its processes). Default: when the checkpoint kept them.
    #[arg(long, conflicts_with = "no_processes")]
    pub processes: bool,
    /// Boot the filesystem fresh, even from a checkpoint that kept processes.
    #[arg(long)]
    pub no_processes: bool,
}

impl WarmArgs {
    /// The request field: `Some(true)`, `Some(false)` or the source's default.
    pub fn choice(&self) -> Option<bool> {
        match (self.processes, self.no_processes) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }
}

/// Parses a Rule-of-Two capability name.
pub fn parse_capability(s: &str) -> Result<strata_api::Capability, String> {
    strata_api::Capability::parse(s)
        .ok_or_else(|| format!("unknown capability {s:?} (untrusted_input, sensitive_access, external_comms)"))
}

/// Network of a sandbox (see docs/network.md).
#[derive(Debug, Args, Clone, Default)]
pub struct NetworkArgs {
    /// `none`: loopback only (the default); `egress`: outbound traffic that an
    /// --allow-host or --allow-cidr rule permits, nothing else. Implied by any --allow-*.
    #[arg(long = "network", value_enum)]
    pub network: Option<NetworkModeArg>,
    /// Allow a domain name (exact, or `*.example.com` for its subdomains), optionally
    /// with ports: pypi.org, *.pythonhosted.org:443 (repeatable).
    #[arg(long = "allow-host", value_name = "HOST[:PORTS]")]
    pub allow_host: Vec<String>,
    /// Allow an IPv4 address or network, optionally with ports: 10.0.0.0/8:443,
    /// 198.51.100.7:8000-8100 (repeatable).
    #[arg(long = "allow-cidr", value_name = "CIDR[:PORTS]")]
    pub allow_cidr: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NetworkModeArg {
    None,
    Egress,
}

#[derive(Debug, Subcommand)]
pub enum NetworkCmd {
    /// Mode, rules, address, flow counters and recently denied destinations.
    Show {
        /// Sandbox id or name.
        id: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Replace the mode and rules (live on a running sandbox): e.g.
    /// `strata network set ID --allow-host pypi.org` or `--network none`.
    Set {
        /// Sandbox id or name.
        id: String,
        #[command(flatten)]
        network: NetworkArgs,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

/// Secrets of a new sandbox.
#[derive(Debug, Args, Clone, Default)]
pub struct SecretArgs {
    /// Secret, mounted read-only at /run/secrets/NAME (repeatable): NAME=@FILE
    /// (the file's content), NAME=env:VAR (the CLI's variable VAR) or NAME=env
    /// (the CLI's variable NAME). Never stored in layers, checkpoints, standby
    /// images, forks, templates or archives; redacted from output and events.
    #[arg(long = "secret", value_name = "NAME=@FILE|env:VAR")]
    pub secrets: Vec<String>,
    /// Also expose secret NAME as an environment variable of every process
    /// (repeatable). Such a sandbox cannot keep its processes in standby.
    #[arg(long = "secret-env", value_name = "NAME")]
    pub secret_env: Vec<String>,
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
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct AuditArgs {
    #[command(subcommand)]
    pub command: Option<AuditCmd>,
    /// Show the last N entries.
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum ApprovalCmd {
    /// List approvals (a tenant sees its own), oldest first.
    Ls {
        /// Only those in this state: pending, approved, denied, used.
        #[arg(long)]
        state: Option<String>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Show one approval: what was asked, the capabilities and why, the decision.
    Show {
        /// Approval id.
        id: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Approve a pending request (operator only); the caller then repeats it once.
    Approve {
        /// Approval id.
        id: String,
        /// Why (recorded on the approval and in the audit log).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Deny a pending request (operator only).
    Deny {
        /// Approval id.
        id: String,
        /// Why (recorded on the approval and in the audit log).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Wait until an approval is decided (or times out); exit 0 when approved.
    Wait {
        /// Approval id.
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCmd {
    /// Create a token; prints its secret (shown only now) for STRATA_TOKEN or E2B_API_KEY.
    Create {
        /// Token name (unique among the tenant's live tokens).
        #[arg(long)]
        name: String,
        /// Tenant the token acts in (default: `default`, or --as-tenant).
        #[arg(long)]
        tenant: Option<String>,
        /// Lifetime, e.g. `30d`, `12h` (default: until revoked).
        #[arg(long)]
        expires: Option<String>,
        /// JSON output (the token and its secret).
        #[arg(long)]
        json: bool,
    },
    /// List tokens (never their secrets).
    Ls {
        /// Only this tenant's tokens.
        #[arg(long)]
        tenant: Option<String>,
        /// Include revoked tokens.
        #[arg(long)]
        all: bool,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by id or name; refused from the next request on.
    Revoke {
        /// Token id or name.
        id: String,
        /// The tenant a name is looked up in (when several tenants use it).
        #[arg(long)]
        tenant: Option<String>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum TenantCmd {
    /// Show or change a tenant's quota (operator only).
    #[command(subcommand)]
    Quota(QuotaCmd),
    /// A tenant's usage against its quota (a tenant token sees only its own).
    Usage {
        /// Tenant (default: the one --as-tenant names).
        tenant: Option<String>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum QuotaCmd {
    /// The quota in force, the tenant's override and the daemon's defaults.
    Show {
        /// Tenant.
        tenant: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Change a tenant's override; only the quotas given change. VALUE: a
    /// number (sizes: 512m, 20g), `unlimited`, or `default` (back to the
    /// daemon's default for that quota).
    Set {
        /// Tenant.
        tenant: String,
        /// Live sandboxes.
        #[arg(long, value_name = "VALUE")]
        sandboxes: Option<String>,
        /// Sum of the memory limits of its sandboxes holding memory.
        #[arg(long, value_name = "VALUE")]
        memory: Option<String>,
        /// Sum of the nominal disk sizes of its sandboxes.
        #[arg(long, value_name = "VALUE")]
        disk: Option<String>,
        /// Fork and fan-out children per minute.
        #[arg(long, value_name = "VALUE")]
        forks_per_minute: Option<String>,
        /// JSON output (the quota afterwards).
        #[arg(long)]
        json: bool,
    },
    /// Remove a tenant's override: the daemon's defaults hold again.
    Reset {
        /// Tenant.
        tenant: String,
        /// JSON output (the quota afterwards).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum PreviewCmd {
    /// Open a port bound on the sandbox's 127.0.0.1; prints the signed URL (its token is shown only now).
    Create {
        /// Sandbox id or name.
        id: String,
        /// Port inside the sandbox, or `all` for every port.
        port: String,
        /// No token needed: anyone who can reach the daemon's listener may use it.
        #[arg(long)]
        public: bool,
        /// Lifetime, e.g. `1h`, `7d` (default 1 day, at most 30 days).
        #[arg(long)]
        ttl: Option<String>,
        /// JSON output (the preview, its token and URLs).
        #[arg(long)]
        json: bool,
    },
    /// List a sandbox's previews (never their tokens).
    Ls {
        /// Sandbox id or name.
        id: String,
        /// Include revoked and expired previews.
        #[arg(long)]
        all: bool,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a preview: its token and URLs are refused (401) from the next request on.
    Revoke {
        /// Sandbox id or name.
        id: String,
        /// Preview id.
        preview: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum AuditCmd {
    /// Recompute the hash chain; exit status 1 and the first bad entry when it is broken.
    Verify {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct UpdateArgs {
    /// Sandbox id or name.
    pub id: String,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Declare a further Rule-of-Two capability (repeatable; declared ones cannot be dropped).
    #[arg(long = "capability", value_name = "CAP", value_parser = parse_capability)]
    pub capabilities: Vec<strata_api::Capability>,
    /// JSON output (the updated sandbox).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct LeaseArgs {
    #[command(subcommand)]
    pub command: Option<LeaseCmd>,
    /// Sandbox to hold awake.
    #[arg(required = true)]
    pub id: Option<String>,
    /// How long the lease holds (e.g. 10m).
    #[arg(long = "for", value_name = "DUR", required = true)]
    pub duration: Option<String>,
    /// JSON output (the lease).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum LeaseCmd {
    /// Extend a lease to DUR from now.
    Renew {
        /// Sandbox id or name.
        id: String,
        /// Lease id.
        lease: String,
        /// New duration from now (e.g. 10m).
        #[arg(long = "for", value_name = "DUR")]
        duration: String,
        /// JSON output (the lease).
        #[arg(long)]
        json: bool,
    },
    /// Release a lease.
    Release {
        /// Sandbox id or name.
        id: String,
        /// Lease id.
        lease: String,
    },
    /// List the leases a sandbox holds.
    Ls {
        /// Sandbox id or name.
        id: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args, Clone)]
pub struct ProcOpts {
    /// Environment for this command (repeatable).
    #[arg(short, long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Working directory.
    #[arg(short = 'w', long)]
    pub cwd: Option<String>,
    /// User (name, uid, name:group or uid:gid).
    #[arg(short, long)]
    pub user: Option<String>,
    /// Kill the command after this long (e.g. 30s).
    #[arg(long)]
    pub timeout: Option<String>,
    /// Pass stdin through.
    #[arg(short, long)]
    pub interactive: bool,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Sandbox id or name.
    pub id: String,
    #[command(flatten)]
    pub opts: ProcOpts,
    /// Start in the background and print the process id.
    #[arg(short, long)]
    pub detach: bool,
    /// Command and arguments.
    #[arg(last = true, required = true)]
    pub cmd: Vec<String>,
}

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
    /// Command and arguments.
    #[arg(last = true, required = true)]
    pub cmd: Vec<String>,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct CheckpointArgs {
    #[command(subcommand)]
    pub command: Option<CheckpointCmd>,
    /// Sandbox to checkpoint.
    #[arg(required = true)]
    pub id: Option<String>,
    /// Checkpoint name.
    #[arg(long)]
    pub name: Option<String>,
    /// Label (repeatable).
    #[arg(long = "label", value_name = "K=V")]
    pub labels: Vec<String>,
    /// Retention: garbage collection deletes it after this long unless something needs it.
    #[arg(long)]
    pub ttl: Option<String>,
    /// Never expire.
    #[arg(long)]
    pub pin: bool,
    /// Also keep the running processes (memory, open files): sandboxes forked or
    /// created from the checkpoint start with them running (needs CRIU; not for
    /// sandboxes with secrets).
    #[arg(long)]
    pub processes: bool,
    /// JSON output (the checkpoint).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum CheckpointCmd {
    /// List checkpoints (of one sandbox, or all).
    Ls {
        /// Sandbox.
        id: Option<String>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Show a checkpoint.
    Inspect {
        /// Checkpoint id or name.
        id: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Delete checkpoints.
    Rm {
        /// Checkpoint ids or names.
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum TemplateCmd {
    /// Promote a checkpoint (or a sandbox, checkpointed first) to a template.
    Create {
        /// Template name.
        name: String,
        /// Checkpoint or sandbox.
        #[arg(long)]
        from: String,
        /// Re-point an existing template.
        #[arg(long)]
        replace: bool,
        /// Promote even if the state-hygiene scan has findings (recorded on the template).
        #[arg(long)]
        accept_findings: bool,
    },
    /// Build a template from a build file (FROM, RUN, COPY, ENV, WORKDIR, USER); steps are cached.
    Build {
        /// Template name.
        name: String,
        /// Build file; COPY sources are relative to its directory.
        #[arg(short, long)]
        file: std::path::PathBuf,
        /// Ignore the step cache.
        #[arg(long)]
        no_cache: bool,
        /// Register the template even if the scan of its final state has findings (recorded).
        #[arg(long)]
        accept_findings: bool,
        /// JSON lines output (the build events).
        #[arg(long)]
        json: bool,
    },
    /// List templates.
    Ls {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Remove templates.
    Rm {
        /// Template names.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ProcCmd {
    /// List processes started through strata.
    Ls {
        /// Sandbox.
        id: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Print a process's buffered output (and follow it with -f).
    Logs {
        /// Sandbox.
        id: String,
        /// Process id.
        pid: u64,
        /// Follow until it exits.
        #[arg(short, long)]
        follow: bool,
    },
    /// Send a signal.
    Kill {
        /// Sandbox.
        id: String,
        /// Process id.
        pid: u64,
        /// Signal name or number.
        #[arg(short, long, default_value = "TERM")]
        signal: String,
    },
    /// Wait for a process to exit; exits with its status.
    Wait {
        /// Sandbox.
        id: String,
        /// Process id.
        pid: u64,
        /// Give up after this long.
        #[arg(long)]
        timeout: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum FsCmd {
    /// List a directory.
    Ls {
        /// Sandbox.
        id: String,
        /// Path.
        path: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Metadata of a path.
    Stat {
        /// Sandbox.
        id: String,
        /// Path.
        path: String,
    },
    /// Create a directory.
    Mkdir {
        /// Sandbox.
        id: String,
        /// Path.
        path: String,
        /// Create parents.
        #[arg(short, long)]
        parents: bool,
    },
    /// Remove a path.
    Rm {
        /// Sandbox.
        id: String,
        /// Path.
        path: String,
        /// Recursive.
        #[arg(short, long)]
        recursive: bool,
    },
    /// Move a path.
    Mv {
        /// Sandbox.
        id: String,
        /// From.
        from: String,
        /// To.
        to: String,
    },
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
    /// JSON output.
    #[arg(long)]
    pub json: bool,
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
        /// Run id or unique prefix.
        id: String,
        /// Follow it until it ends.
        #[arg(long)]
        follow: bool,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// List runs.
    Ls {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Pause a running run at its next stage boundary (the current stage finishes first).
    Pause {
        /// Run id or unique prefix.
        id: String,
    },
    /// Continue a failed, interrupted or paused run from its first unfinished stage.
    Resume {
        /// Run id or unique prefix.
        id: String,
        /// Print the run and return at once.
        #[arg(long)]
        detach: bool,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}
