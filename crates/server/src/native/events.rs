//! HTTP handlers of `events` (see [`strata_engine::events`]).

use crate::error::ApiResult;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;
use strata_api::{DaemonInfo, DoctorReport, SandboxEvent};
use strata_engine::events::*;
use strata_engine::state::Shared;

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
pub async fn events_handler(State(st): State<Shared>, Query(q): Query<EventsQuery>) -> ApiResult<Response> {
    let sandbox = q.sandbox.as_deref().map(|s| sandbox_key(&st, s)).transpose()?;
    let read = reader();
    if !q.follow {
        return Ok(Json(read(&st, sandbox.as_deref(), q.after, LIST_LIMIT)?).into_response());
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<SandboxEvent>(64);
    let mut changed = st.events_tx.subscribe();
    tokio::spawn(async move {
        let mut after = q.after;
        loop {
            changed.mark_unchanged();
            let Ok(evs) = read(&st, sandbox.as_deref(), after, 1000) else { return };
            for ev in evs {
                after = ev.seq;
                if tx.send(ev).await.is_err() {
                    return;
                }
            }
            // Wake on new events; poll now and then to notice closed clients.
            match tokio::time::timeout(Duration::from_secs(15), changed.changed()).await {
                Ok(Err(_)) => return,
                Err(_) if tx.is_closed() => return,
                _ => {}
            }
        }
    });
    Ok(crate::ndjson::response(rx))
}

/// Daemon version and counts.
#[utoipa::path(get, path = "/v1/info", tag = "host", responses((status = 200, body = DaemonInfo)))]
pub async fn info_handler(State(st): State<Shared>) -> ApiResult<Json<DaemonInfo>> {
    let mut sandboxes = BTreeMap::new();
    for r in st.db.list_sandboxes()?.into_iter().filter(|r| strata_engine::tenancy::visible(&r.sandbox.tenant)) {
        *sandboxes.entry(r.sandbox.state.to_string()).or_insert(0) += 1;
    }
    Ok(Json(DaemonInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        state_dir: st.state_dir.display().to_string(),
        sandboxes,
        images: st.db.list_images()?.len() as u64,
        default_limits: st.admission.defaults().clone(),
    }))
}

/// What this host supports.
#[utoipa::path(get, path = "/v1/doctor", tag = "host", responses((status = 200, body = DoctorReport)))]
pub async fn doctor_handler(State(st): State<Shared>) -> ApiResult<Json<DoctorReport>> {
    let mut report = tokio::task::spawn_blocking(strata_runtime::probe::doctor)
        .await
        .map_err(|e| crate::error::ApiError::internal("doctor", &e))?;
    report.names_like_ids = names_like_ids(&st)?;
    Ok(Json(report))
}
