//! The Connect protocol's wire format (<https://connectrpc.com/docs/protocol>),
//! as far as envd's clients use it: JSON codec, no compression.
//!
//! * Unary calls: `POST` with `Content-Type: application/json`, the message as
//!   the body; errors are a JSON `{"code": "not_found", "message": ...}` with
//!   the HTTP status the code maps to.
//! * Streaming calls: `Content-Type: application/connect+json`, every message
//!   in an envelope (a flags byte, a big-endian `u32` length, the payload);
//!   the response ends with an end-of-stream envelope (flag `0x02`) holding
//!   `{}` or `{"error": {"code", "message"}}`.
//!
//! Malformed input is an error value, never a panic (see the unit tests).

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};

/// Flag of a compressed envelope (refused: the SDK never compresses).
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Flag of the end-of-stream envelope.
pub const FLAG_END_STREAM: u8 = 0x02;
/// Largest accepted envelope payload.
pub const MAX_FRAME: u32 = 16 * 1024 * 1024;

/// A Connect error code (the gRPC codes, spelt the Connect way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// `canceled` (499).
    Canceled,
    /// `unknown` (500).
    Unknown,
    /// `invalid_argument` (400).
    InvalidArgument,
    /// `deadline_exceeded` (504).
    DeadlineExceeded,
    /// `not_found` (404).
    NotFound,
    /// `already_exists` (409).
    AlreadyExists,
    /// `permission_denied` (403).
    PermissionDenied,
    /// `failed_precondition` (400).
    FailedPrecondition,
    /// `unimplemented` (501).
    Unimplemented,
    /// `internal` (500).
    Internal,
    /// `unavailable` (503).
    Unavailable,
    /// `unauthenticated` (401).
    Unauthenticated,
    /// `resource_exhausted` (429): a limit was hit.
    ResourceExhausted,
}

impl Code {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::Unauthenticated => "unauthenticated",
            Code::ResourceExhausted => "resource_exhausted",
        }
    }

    /// The HTTP status of a unary error with this code.
    pub fn http_status(self) -> StatusCode {
        match self {
            Code::Canceled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            Code::Unknown | Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        }
    }
}

/// An error of one RPC: a code and a message for the client.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct ConnectError {
    /// The code.
    pub code: Code,
    /// What went wrong, for a human.
    pub message: String,
}

impl ConnectError {
    /// An error with `code` and `message`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        ConnectError { code, message: message.into() }
    }

    /// The JSON error object.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code.as_str(), "message": self.message})
    }

    /// The unary error response.
    pub fn unary_response(&self) -> Response {
        (self.code.http_status(), [(header::CONTENT_TYPE, "application/json")], self.json().to_string()).into_response()
    }
}

/// Why a request's envelopes could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The body ends inside an envelope.
    #[error("malformed Connect envelope: the body ends inside a frame ({have} of {need} bytes)")]
    Truncated {
        /// Bytes present.
        have: usize,
        /// Bytes the header announced (header included).
        need: usize,
    },
    /// A compressed envelope (no compression was negotiated).
    #[error("malformed Connect envelope: compressed frame, but no compression was negotiated")]
    Compressed,
    /// An envelope larger than [`MAX_FRAME`].
    #[error("malformed Connect envelope: frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(u32),
}

impl From<FrameError> for ConnectError {
    fn from(e: FrameError) -> Self {
        ConnectError::new(Code::InvalidArgument, e.to_string())
    }
}

/// One envelope: `flags`, then the payload's length, then the payload.
pub fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + payload.len());
    b.put_u8(flags);
    b.put_u32(payload.len() as u32);
    b.put_slice(payload);
    b.freeze()
}

/// The end-of-stream envelope: `{}` or `{"error": ...}`.
pub fn end_stream(err: Option<&ConnectError>) -> Bytes {
    let body = match err {
        Some(e) => serde_json::json!({"error": e.json()}),
        None => serde_json::json!({}),
    };
    envelope(FLAG_END_STREAM, body.to_string().as_bytes())
}

/// Splits a complete request body into its envelopes (flags, payload).
pub fn decode_all(body: &[u8]) -> Result<Vec<(u8, Bytes)>, FrameError> {
    let mut d = Decoder::default();
    d.push(body);
    let mut out = Vec::new();
    while let Some(f) = d.next_frame()? {
        out.push(f);
    }
    if !d.buf.is_empty() {
        return Err(d.truncated());
    }
    Ok(out)
}

/// Incremental envelope reader for streamed request bodies.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: BytesMut,
}

impl Decoder {
    /// Appends received bytes.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Bytes received and not yet returned as a frame.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    fn truncated(&self) -> FrameError {
        let need = if self.buf.len() >= 5 {
            5 + u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize
        } else {
            5
        };
        FrameError::Truncated { have: self.buf.len(), need }
    }

    /// The next complete frame, if the buffer holds one.
    pub fn next_frame(&mut self) -> Result<Option<(u8, Bytes)>, FrameError> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let flags = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
        if len > MAX_FRAME {
            return Err(FrameError::TooLarge(len));
        }
        if flags & FLAG_COMPRESSED != 0 {
            return Err(FrameError::Compressed);
        }
        if self.buf.len() < 5 + len as usize {
            return Ok(None);
        }
        let mut frame = self.buf.split_to(5 + len as usize);
        let payload = frame.split_off(5).freeze();
        Ok(Some((flags, payload)))
    }

    /// The error for a body that ended with bytes left over.
    pub fn leftover_error(&self) -> Option<FrameError> {
        (!self.buf.is_empty()).then(|| self.truncated())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut body = envelope(0, b"{\"a\":1}").to_vec();
        body.extend_from_slice(&end_stream(None));
        let frames = decode_all(&body).unwrap();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0], (0, Bytes::from_static(b"{\"a\":1}")));
        assert_eq!(frames[1].0, FLAG_END_STREAM);
        assert_eq!(&frames[1].1[..], b"{}");
    }

    #[test]
    fn garbage_is_an_error_never_a_panic() {
        // Truncated header, truncated payload, oversized, compressed, random bytes.
        let cases: Vec<Vec<u8>> = vec![
            vec![0],
            vec![0, 0, 0],
            vec![0, 0, 0, 0, 10, b'x'],
            vec![0, 0xff, 0xff, 0xff, 0xff],
            vec![1, 0, 0, 0, 1, b'x'],
            (0..=255u8).collect(),
            b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        ];
        for c in cases {
            assert!(decode_all(&c).is_err(), "{c:?} decoded");
        }
        // Every prefix of a valid stream either decodes or is an error.
        let mut body = envelope(0, b"hello").to_vec();
        body.extend_from_slice(&envelope(0, b"world"));
        for n in 0..body.len() {
            let _ = decode_all(&body[..n]);
        }
        // Pseudo-random garbage.
        let mut x: u32 = 12345;
        for _ in 0..2000 {
            let len = (x % 64) as usize;
            let mut buf = Vec::with_capacity(len);
            for _ in 0..len {
                x = x.wrapping_mul(1103515245).wrapping_add(12345);
                buf.push((x >> 16) as u8);
            }
            let _ = decode_all(&buf);
        }
    }

    #[test]
    fn error_json_and_status() {
        let e = ConnectError::new(Code::NotFound, "process 7 not found");
        assert_eq!(e.json()["code"], "not_found");
        assert_eq!(e.code.http_status(), StatusCode::NOT_FOUND);
        let end = end_stream(Some(&e));
        let frames = decode_all(&end).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&frames[0].1).unwrap();
        assert_eq!(v["error"]["code"], "not_found");
    }
}
