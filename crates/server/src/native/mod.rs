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
pub mod patching;
pub mod pipelines;
pub mod policy;
pub mod preview;
pub mod processes;
pub mod quarantine;
pub mod quotas;
pub mod sandboxes;
pub mod scan;
pub mod standby;
pub mod templates;
pub mod tenancy;
pub mod transfer;

/// An optional JSON body: an empty body (with or without a JSON content type,
/// as clients send for calls whose body is optional) is `None`; anything else
/// must parse, or the call is a 400 naming why.
pub struct OptionalJson<T>(pub Option<T>);

impl<T, S> axum::extract::FromRequest<S> for OptionalJson<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = crate::error::ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| crate::error::ApiError::bad_request(format!("reading the request body: {e}")))?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJson(None));
        }
        serde_json::from_slice(&bytes)
            .map(|v| OptionalJson(Some(v)))
            .map_err(|e| crate::error::ApiError::bad_request(format!("Failed to parse the request body as JSON: {e}")))
    }
}
