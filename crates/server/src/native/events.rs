//! HTTP handlers of `events`, `info` and `doctor` (see [`strata_engine::events`]).

use crate::error::ApiResult;
use axum::extract::Query;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use strata_api::{DaemonInfo, DoctorReport, SandboxEvent, WarmPoolStatus};

use crate::native::acting::Acting;

/// Query of `GET /v1/events`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct EventsQuery {
    /// Only events of this sandbox id.
    #[serde(default)]
    pub sandbox: Option<String>,
    /// Only events with a sequence number above this.
    #[serde(default)]
    pub after: i64,
    /// Keep the stream open (NDJSON) and send new events as they happen.
    #[serde(default)]
    pub follow: bool,
}

/// List lifecycle events (JSON array), or follow them as NDJSON with `follow=true`.
#[utoipa::path(get, path = "/v1/events", tag = "events", params(EventsQuery),
    responses((status = 200, body = [SandboxEvent], description = "Events (NDJSON stream of SandboxEvent with follow=true)")))]
pub async fn events_handler(Acting(engine): Acting, Query(q): Query<EventsQuery>) -> ApiResult<Response> {
    if !q.follow {
        return Ok(Json(engine.events(q.sandbox.as_deref(), q.after).await?).into_response());
    }
    Ok(crate::ndjson::response(engine.follow_events(q.sandbox.as_deref(), q.after).await?))
}

/// Daemon version and counts.
#[utoipa::path(get, path = "/v1/info", tag = "host", responses((status = 200, body = DaemonInfo)))]
pub async fn info_handler(Acting(engine): Acting) -> ApiResult<Json<DaemonInfo>> {
    Ok(Json(engine.info().await?))
}

/// The warm pools (`strata daemon --warm-pool`): size, members ready, adoptions and misses.
#[utoipa::path(get, path = "/v1/warm-pool", tag = "host", responses((status = 200, body = [WarmPoolStatus])))]
pub async fn warm_pool_handler(Acting(engine): Acting) -> ApiResult<Json<Vec<WarmPoolStatus>>> {
    Ok(Json(engine.warm_pools().await?))
}

/// What this host supports.
#[utoipa::path(get, path = "/v1/doctor", tag = "host", responses((status = 200, body = DoctorReport)))]
pub async fn doctor_handler(Acting(engine): Acting) -> ApiResult<Json<DoctorReport>> {
    Ok(Json(engine.doctor().await?))
}
