//! `strata cost`: what sandboxes and pipeline runs cost.

use clap::Args;

use super::JsonOutput;

/// `strata cost`.
#[derive(Debug, Args)]
pub struct CostArgs {
    /// Sandbox id, id prefix or name (default: every sandbox).
    pub id: Option<String>,
    /// The cost of a pipeline run, per stage, instead.
    #[arg(long, conflicts_with = "id")]
    pub pipeline: Option<String>,
    #[command(flatten)]
    pub out: JsonOutput,
}
