//! Request-body checks shared by the native and E2B upload handlers.

/// The body length a request announces (`Content-Length`), if it does.
pub fn announced_length(headers: &axum::http::HeaderMap) -> Option<u64> {
    headers.get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok())
}

/// Whether a request announces a body larger than `limit`.
pub fn announced_over(headers: &axum::http::HeaderMap, limit: u64) -> bool {
    announced_length(headers).is_some_and(|n| n > limit)
}
