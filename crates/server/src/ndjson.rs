//! NDJSON streaming responses: one JSON value per line, sent as they come.

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use serde::Serialize;
use tokio::sync::mpsc::Receiver;

/// One value as a JSON line.
pub fn line<T: Serialize>(v: &T) -> Bytes {
    let mut b = serde_json::to_vec(v).expect("API models serialize");
    b.push(b'\n');
    Bytes::from(b)
}

/// A 200 `application/x-ndjson` response streaming every value received on `rx`
/// until all senders are gone.
pub fn response<T: Serialize + Send + 'static>(mut rx: Receiver<T>) -> Response {
    stream(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
}

/// A 200 `application/x-ndjson` response streaming every value of `values`
/// (whatever it holds, e.g. a sandbox's activity hold, until it ends).
pub fn stream<T, S>(values: S) -> Response
where
    T: Serialize + Send + 'static,
    S: futures_util::Stream<Item = T> + Send + 'static,
{
    let lines = futures_util::StreamExt::map(values, |v| Ok::<_, std::convert::Infallible>(line(&v)));
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(lines))
        .expect("valid response")
}
