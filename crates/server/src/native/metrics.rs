//! HTTP handlers of `metrics` (see [`strata_engine::state::metrics`]).

use axum::http::header;
use axum::response::IntoResponse;

use crate::error::ApiResult;
use crate::native::acting::Acting;

/// Prometheus metrics (OpenMetrics text format).
#[utoipa::path(get, path = "/metrics", tag = "metrics",
    responses((status = 200, description = "OpenMetrics text: strata_phase_duration_seconds, strata_transitions_total, strata_sandboxes, strata_sandbox_memory_bytes, strata_sandbox_cpu_seconds_total, strata_sandbox_pids", content_type = "application/openmetrics-text", body = String)))]
pub async fn metrics_handler(Acting(engine): Acting) -> ApiResult<impl IntoResponse> {
    let body = engine.metrics().await?;
    Ok(([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], body))
}
