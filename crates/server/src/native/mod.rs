//! The native HTTP API: one file per resource, each a set of handlers that
//! extract a request, call the engine through the [`acting::Acting`]
//! extractor (the engine acting for the request's caller) and shape the
//! answer (routes in [`crate::router_with_mcp`]).

pub mod accounting;
pub mod acting;
pub mod activity;
pub mod advisor;
pub mod approvals;
pub mod archive;
pub mod audit;
pub mod checkpoints;
pub mod events;
pub mod fanout;
pub mod files;
pub mod images;
pub mod metrics;
pub mod network;
pub mod pipelines;
pub mod policy;
pub mod preview;
pub mod processes;
pub mod quotas;
pub mod sandboxes;
pub mod scan;
pub mod standby;
pub mod templates;
pub mod tenancy;
pub mod transfer;
