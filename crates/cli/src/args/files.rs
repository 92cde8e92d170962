//! Files of a sandbox: `diff` and `export` (changes since a checkpoint), `cp` (to and
//! from the host) and `fs ls|stat|mkdir|rm|mv|watch`.

use clap::{Args, Subcommand};

use super::{JsonOutput, SandboxId};

/// The changes of a sandbox since a checkpoint (`diff` and `export`).
#[derive(Debug, Args)]
pub struct ChangeSet {
    #[command(flatten)]
    pub sandbox: SandboxId,
    /// The checkpoint to compare against (the sandbox's last one).
    #[arg(long)]
    pub against: Option<String>,
}

/// `strata diff`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    #[command(flatten)]
    pub changes: ChangeSet,
    #[command(flatten)]
    pub out: JsonOutput,
}

/// `strata export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub changes: ChangeSet,
    /// Output file.
    #[arg(short, long)]
    pub output: std::path::PathBuf,
}

/// `strata cp`.
#[derive(Debug, Args)]
pub struct CpArgs {
    /// Source.
    pub src: String,
    /// Destination.
    pub dst: String,
}

#[derive(Debug, Subcommand)]
pub enum FsCmd {
    /// List a directory.
    Ls {
        #[command(flatten)]
        at: SandboxPath,
        #[command(flatten)]
        out: JsonOutput,
    },
    /// Metadata of a path.
    Stat(SandboxPath),
    /// Create a directory.
    Mkdir {
        #[command(flatten)]
        at: SandboxPath,
        /// Create parents.
        #[arg(short, long)]
        parents: bool,
    },
    /// Remove a path.
    Rm {
        #[command(flatten)]
        at: SandboxPath,
        /// Recursive.
        #[arg(short, long)]
        recursive: bool,
    },
    /// Watch a directory: one line per change as it happens (until interrupted,
    /// or the watch ends: the directory removed, the sandbox stopped).
    Watch {
        #[command(flatten)]
        at: SandboxPath,
        /// Every directory under it too.
        #[arg(short, long)]
        recursive: bool,
        #[command(flatten)]
        out: JsonOutput,
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

/// A path in a sandbox: the positional `ID PATH`.
#[derive(Debug, Args)]
pub struct SandboxPath {
    /// Sandbox.
    pub id: String,
    /// Path.
    pub path: String,
}
