//! `strata template ...`: templates (warm starting points) promoted from checkpoints
//! or built from a build file.

use clap::Subcommand;

use super::JsonOutput;

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
        /// Start this command once the steps are done: the template is a warm checkpoint with it running.
        #[arg(long)]
        start_cmd: Option<String>,
        /// Poll this command every 2 s until it exits 0 before the warm checkpoint (default: 20 s).
        #[arg(long, requires = "start_cmd")]
        ready_cmd: Option<String>,
        /// JSON lines output (the build events).
        #[arg(long)]
        json: bool,
    },
    /// Rebuild a template from the build file it was built from: on a new base
    /// with --base (e.g. a re-imported, patched image); unchanged steps come from the cache.
    Rebuild {
        /// Template name.
        name: String,
        /// The image (or template, or checkpoint) its FROM becomes (default: the same FROM;
        /// an image name means that name's newest version).
        #[arg(long)]
        base: Option<String>,
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
    /// Set a template's checks at set times: its checkpoint scanned again under the
    /// current rules, and a newer version of its image reported (`image.outdated`).
    Update {
        /// Template name.
        name: String,
        /// Check interval (e.g. 24h; at least 1m), or `none`.
        #[arg(long, value_name = "DUR")]
        check_every: Option<String>,
        /// What a check with findings does: record, or quarantine its checkpoint
        /// (no new sandbox starts from it until an operator lifts it).
        #[arg(long)]
        on_findings: Option<TemplateOnFindingsArg>,
        /// JSON output (the template).
        #[arg(long)]
        json: bool,
    },
    /// Check a template now (exit status 2 when there are findings).
    Check {
        /// Template name.
        name: String,
        /// JSON output (`TemplateCheckReport`).
        #[arg(long)]
        json: bool,
    },
    /// List templates.
    Ls(JsonOutput),
    /// Remove templates.
    Rm {
        /// Template names.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

/// What a check of a template with findings does.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum TemplateOnFindingsArg {
    /// Only the report (its `last_check`).
    Record,
    /// Quarantine its checkpoint.
    Quarantine,
}
