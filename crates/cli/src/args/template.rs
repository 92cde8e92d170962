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
        /// JSON lines output (the build events).
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
