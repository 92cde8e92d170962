//! Request-body checks shared by the native and E2B upload handlers.

/// Whether a request announces (`Content-Length`) a body larger than `limit`.
pub fn announced_over(headers: &axum::http::HeaderMap, limit: u64) -> bool {
    headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > limit)
}
