//! gzip on `/files`, as envd does it: a request body sent with
//! `Content-Encoding: gzip` is decompressed as it streams in (its bytes count
//! against the upload limit once decompressed), and a download is compressed
//! when the client's `Accept-Encoding` prefers gzip (`flate2`, fast level).

use std::io::Write;

use axum::body::Bytes;
use axum::http::{header, HeaderMap};
use flate2::write::{GzEncoder, MultiGzDecoder};
use futures_util::{Stream, StreamExt};

/// A body encoding `/files` speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Encoding {
    Identity,
    Gzip,
}

/// What the error messages say is supported.
const SUPPORTED: &str = "supported: [gzip]";

/// The encoding of a request body (`Content-Encoding`, any case, parameters
/// ignored); an unsupported one is refused with envd's message.
pub(super) fn request_encoding(headers: &HeaderMap) -> Result<Encoding, String> {
    let Some(v) = headers.get(header::CONTENT_ENCODING) else { return Ok(Encoding::Identity) };
    let raw = v.to_str().unwrap_or("");
    match raw.split(';').next().unwrap_or("").trim().to_ascii_lowercase().as_str() {
        "" | "identity" => Ok(Encoding::Identity),
        "gzip" => Ok(Encoding::Gzip),
        _ => Err(format!("error decompressing request body: unsupported Content-Encoding: {raw}, {SUPPORTED}")),
    }
}

/// The encoding of a download, chosen from `Accept-Encoding` as envd chooses:
/// entries by falling `q` (ties in the order given), the first acceptable one
/// decides (`*` means identity, unless identity is refused with `q=0`);
/// without the header, identity. A range request is never compressed.
pub(super) fn response_encoding(headers: &HeaderMap) -> Result<Encoding, String> {
    if headers.contains_key(header::RANGE) {
        return Ok(Encoding::Identity);
    }
    let Some(v) = headers.get(header::ACCEPT_ENCODING) else { return Ok(Encoding::Identity) };
    let mut offers: Vec<(String, f32)> = v
        .to_str()
        .unwrap_or("")
        .split(',')
        .filter_map(|item| {
            let mut parts = item.split(';');
            let name = parts.next()?.trim().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.trim().strip_prefix("q="))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            (!name.is_empty()).then_some((name, q))
        })
        .collect();
    offers.sort_by(|a, b| b.1.total_cmp(&a.1));
    let identity_refused = offers.iter().any(|(n, q)| n == "identity" && *q <= 0.0);
    for (name, q) in &offers {
        if *q <= 0.0 {
            continue;
        }
        match name.as_str() {
            "identity" => return Ok(Encoding::Identity),
            "gzip" => return Ok(Encoding::Gzip),
            "*" if identity_refused => return Ok(Encoding::Gzip),
            "*" => return Ok(Encoding::Identity),
            _ => {}
        }
    }
    if identity_refused {
        return Err(format!("error parsing Accept-Encoding: no acceptable encoding found, {SUPPORTED}"));
    }
    Ok(Encoding::Identity)
}

/// Compressed input fed to the decoder at once: bounds what one step can
/// inflate to (gzip expands at most ~1000:1), so a small body cannot make a
/// huge buffer.
const FEED: usize = 4096;

/// `body` decompressed (one or more gzip members) as it arrives; a malformed
/// or cut-off stream ends with an error naming it.
pub(super) fn gunzip<S, E>(body: S) -> impl Stream<Item = Result<Bytes, String>> + Send
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin + 'static,
    E: std::fmt::Display,
{
    let fail = |e: std::io::Error| format!("error decompressing request body: {e}");
    futures_util::stream::unfold(Some((body, MultiGzDecoder::new(Vec::new()), false)), move |state| async move {
        let (mut body, mut dec, mut seen) = state?;
        loop {
            match body.next().await {
                Some(Ok(chunk)) => {
                    seen |= !chunk.is_empty();
                    for piece in chunk.chunks(FEED) {
                        if let Err(e) = dec.write_all(piece) {
                            return Some((Err(fail(e)), None));
                        }
                    }
                    let out = std::mem::take(dec.get_mut());
                    if !out.is_empty() {
                        return Some((Ok(Bytes::from(out)), Some((body, dec, seen))));
                    }
                }
                Some(Err(e)) => return Some((Err(format!("reading the upload: {e}")), None)),
                None if !seen => {
                    let eof = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "EOF");
                    return Some((Err(fail(eof)), None));
                }
                None => {
                    // The end: the last member must be whole (its CRC and
                    // length trailer read and checked), or it was cut off.
                    return match dec.try_finish() {
                        Ok(()) => {
                            let rest = std::mem::take(dec.get_mut());
                            (!rest.is_empty()).then(|| (Ok(Bytes::from(rest)), None))
                        }
                        Err(e) => Some((Err(fail(e)), None)),
                    };
                }
            }
        }
    })
}

/// `body` compressed with gzip as it is read.
pub(super) fn gzip<S, E>(body: S) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let enc = GzEncoder::new(Vec::new(), flate2::Compression::fast());
    futures_util::stream::unfold(Some((body, enc)), |state| async move {
        let (mut body, mut enc) = state?;
        loop {
            match body.next().await {
                Some(Ok(chunk)) => {
                    if let Err(e) = enc.write_all(&chunk) {
                        return Some((Err(e), None));
                    }
                    let out = std::mem::take(enc.get_mut());
                    if !out.is_empty() {
                        return Some((Ok(Bytes::from(out)), Some((body, enc))));
                    }
                }
                Some(Err(e)) => return Some((Err(std::io::Error::other(e)), None)),
                None => {
                    return match enc.finish() {
                        Ok(rest) => Some((Ok(Bytes::from(rest)), None)),
                        Err(e) => Some((Err(e), None)),
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn accept(v: &str) -> Result<Encoding, String> {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT_ENCODING, HeaderValue::from_str(v).unwrap());
        response_encoding(&h)
    }

    #[test]
    fn the_download_encoding_follows_accept_encoding_as_envd_reads_it() {
        assert_eq!(response_encoding(&HeaderMap::new()), Ok(Encoding::Identity));
        assert_eq!(accept("gzip"), Ok(Encoding::Gzip));
        assert_eq!(accept("gzip, deflate"), Ok(Encoding::Gzip));
        assert_eq!(accept("br;q=1.0, gzip;q=0.8"), Ok(Encoding::Gzip));
        assert_eq!(accept("identity, gzip"), Ok(Encoding::Identity));
        assert_eq!(accept("identity;q=0.5, gzip;q=0.9"), Ok(Encoding::Gzip));
        assert_eq!(accept("*"), Ok(Encoding::Identity));
        assert_eq!(accept("identity;q=0, *"), Ok(Encoding::Gzip));
        assert_eq!(accept("gzip;q=0"), Ok(Encoding::Identity));
        assert!(accept("identity;q=0, br").unwrap_err().contains("no acceptable encoding"));
    }

    #[test]
    fn the_request_encoding_is_gzip_or_identity() {
        let mut h = HeaderMap::new();
        assert_eq!(request_encoding(&h), Ok(Encoding::Identity));
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("GZIP"));
        assert_eq!(request_encoding(&h), Ok(Encoding::Gzip));
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("br"));
        assert!(request_encoding(&h).unwrap_err().contains("unsupported Content-Encoding: br, supported: [gzip]"));
    }

    async fn run<S: Stream<Item = Result<Bytes, String>>>(s: S) -> Result<Vec<u8>, String> {
        let parts: Vec<Result<Bytes, String>> = s.collect().await;
        let mut out = Vec::new();
        for p in parts {
            out.extend_from_slice(&p?);
        }
        Ok(out)
    }

    fn pieces(data: Vec<u8>, size: usize) -> impl Stream<Item = Result<Bytes, String>> + Send + Unpin + 'static {
        let chunks: Vec<Result<Bytes, String>> = data.chunks(size).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
        futures_util::stream::iter(chunks)
    }

    #[tokio::test]
    async fn gzip_round_trips_in_pieces_and_broken_streams_are_errors() {
        let data: Vec<u8> = (0..300_000u32).flat_map(|i| (i % 251).to_le_bytes()).collect();
        let compressed = run(gzip(pieces(data.clone(), 7000)).map(|r| r.map_err(|e| e.to_string()))).await.unwrap();
        assert!(compressed.len() < data.len());
        assert_eq!(run(gunzip(pieces(compressed.clone(), 333))).await.unwrap(), data);
        // Two members, as `cat a.gz b.gz` makes.
        let mut two = compressed.clone();
        two.extend_from_slice(&compressed);
        assert_eq!(run(gunzip(pieces(two, 4096))).await.unwrap().len(), data.len() * 2);
        // Cut short, not gzip, empty: errors, never a silent short file.
        let cut = compressed[..compressed.len() - 5].to_vec();
        assert!(run(gunzip(pieces(cut, 1000))).await.is_err());
        assert!(run(gunzip(pieces(b"plain text, not gzip".to_vec(), 8))).await.is_err());
        assert!(run(gunzip(pieces(Vec::new(), 8))).await.unwrap_err().contains("EOF"));
    }
}
