//! Wire models of the strata HTTP API.
//!
//! Every request and response body the daemon speaks is defined here, with its
//! OpenAPI schema, so the daemon, the typed client and the CLI share one
//! definition. This crate has no runtime dependencies (no tokio, no nix).

pub mod advice;
pub mod approval;
pub mod checkpoint;
pub mod cost;
pub mod error;
pub mod fanout;
pub mod files;
pub mod host;
pub mod image;
pub mod network;
pub mod pipeline;
pub mod policy;
pub mod pool;
pub mod preview;
pub mod process;
pub mod quarantine;
pub mod quota;
pub mod sandbox;
pub mod scan;
pub mod secret;
pub mod template;
pub mod tenant;

pub use advice::*;
pub use approval::*;
pub use checkpoint::*;
pub use cost::*;
pub use error::{ApiErrorBody, ErrorCode};
pub use fanout::*;
pub use files::*;
pub use host::*;
pub use image::*;
pub use network::*;
pub use pipeline::*;
pub use policy::*;
pub use pool::*;
pub use preview::*;
pub use process::*;
pub use quarantine::*;
pub use quota::*;
pub use sandbox::*;
pub use scan::*;
pub use secret::*;
pub use template::*;
pub use tenant::*;

/// Version prefix of every native route.
pub const API_PREFIX: &str = "/v1";
