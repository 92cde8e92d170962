//! `strata image ...`: importing, pulling, listing and removing images.

use std::path::PathBuf;

use clap::Subcommand;

use super::JsonOutput;

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
        /// Import a new version of an existing image name (the name then means
        /// it; the old version is kept for what was made from it: see `strata outdated`).
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
    /// List images (the newest version of each name).
    Ls {
        /// Every version of every name, not only the newest.
        #[arg(long, short)]
        all: bool,
        #[command(flatten)]
        out: JsonOutput,
    },
    /// Every version of an image's name, newest first, with its lineage.
    Versions {
        /// Image name or id.
        name: String,
        #[command(flatten)]
        out: JsonOutput,
    },
    /// Show an image.
    Inspect {
        /// Image name or id.
        name: String,
        #[command(flatten)]
        out: JsonOutput,
    },
    /// Remove an image: by name, every version of it; by id, that one version.
    Rm {
        /// Image names or ids.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

/// `strata rebase`.
#[derive(Debug, clap::Args)]
pub struct RebaseArgs {
    /// Sandbox id or name (stopped or in standby).
    pub id: String,
    /// The image to move onto (a name means its newest version; or an id).
    #[arg(long)]
    pub onto: String,
    /// Settle paths both the sandbox and the new base changed: keep the
    /// sandbox's version, or take the base's. Without it, conflicts refuse.
    #[arg(long, value_enum)]
    pub prefer: Option<PreferArg>,
    /// JSON output (the report).
    #[arg(long)]
    pub json: bool,
}

/// Which side wins a rebase conflict.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum PreferArg {
    /// The sandbox's version stays.
    Sandbox,
    /// The new base's version is written over the sandbox's.
    Base,
}
