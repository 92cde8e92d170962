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
    Ls(JsonOutput),
    /// Show an image.
    Inspect {
        /// Image name or id.
        name: String,
        #[command(flatten)]
        out: JsonOutput,
    },
    /// Remove an image.
    Rm {
        /// Image names.
        #[arg(required = true)]
        names: Vec<String>,
    },
}
