//! `strata preview ...`: sandbox ports opened as preview URLs.

use clap::Subcommand;

use super::{JsonOutput, SandboxId};

#[derive(Debug, Subcommand)]
pub enum PreviewCmd {
    /// Open a port bound on the sandbox's 127.0.0.1; prints the signed URL (its token is shown only now).
    Create {
        #[command(flatten)]
        sandbox: SandboxId,
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
        #[command(flatten)]
        sandbox: SandboxId,
        /// Include revoked and expired previews.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        out: JsonOutput,
    },
    /// Revoke a preview: its token and URLs are refused (401) from the next request on.
    Revoke {
        #[command(flatten)]
        sandbox: SandboxId,
        /// Preview id.
        preview: String,
        #[command(flatten)]
        out: JsonOutput,
    },
}
