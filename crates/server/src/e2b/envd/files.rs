//! `/files`: uploads and downloads over HTTP.

use super::*;

/// Query of `/files`.
#[derive(Debug, Deserialize)]
pub(super) struct FilesQuery {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    username: Option<String>,
    /// A signed URL's signature ([`crate::e2b::access`]).
    #[serde(default)]
    signature: Option<String>,
    /// A signed URL's expiry, Unix seconds.
    #[serde(default)]
    signature_expiration: Option<i64>,
}

/// The caller of a `/files` request: its key (an API key or the sandbox's
/// envd access token), or without one a signed URL's signature, checked as
/// envd checks it (401 `missing signature query parameter`, `invalid
/// signature`, `signature is already expired`); a signed request acts as the
/// sandbox's tenant.
fn files_ctx(
    e: &SharedE2b,
    who: &Who,
    headers: &HeaderMap,
    q: &FilesQuery,
    op: crate::e2b::access::Operation,
) -> Result<Ctx, Box<Response>> {
    use crate::e2b::access;
    if who.0.is_some() || request_token(headers).is_some() {
        return ctx(e, who, headers, q.username.as_deref())
            .map_err(|err| Box::new(http_error(err.code.http_status(), err.message)));
    }
    let sandbox = headers.get("e2b-sandbox-id").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let token = access::envd_token(&e.operator_token, &sandbox);
    let signed = access::Signed {
        path: q.path.as_deref().unwrap_or(""),
        username: q.username.as_deref().unwrap_or(""),
        signature: q.signature.as_deref(),
        expiration: q.signature_expiration,
    };
    access::check_signature(&signed, op, &token, access::unix_now() as i64)
        .map_err(|why| http_error(StatusCode::UNAUTHORIZED, why.to_string()))?;
    let caller = e
        .envd_token_caller(&sandbox, &token)
        .ok_or_else(|| Box::new(http_error(StatusCode::NOT_FOUND, format!("sandbox {sandbox} not found"))))?;
    Ok(Ctx { client: Engine::new(e.st.clone(), caller), token, sandbox, user: user_of(headers, q.username.as_deref()) })
}

/// An envd HTTP error (`{"code": status, "message"}`).
fn http_error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"code": status.as_u16(), "message": message.into()}))).into_response()
}

fn http_native(e: EngineError) -> Response {
    if e.body.code == ErrorCode::TooLarge {
        return http_error(StatusCode::PAYLOAD_TOO_LARGE, e.body.message);
    }
    let err = native(e);
    http_error(err.code.http_status(), err.message)
}

/// `GET /files?path=&username=`: the file's bytes.
pub(super) async fn download(
    State(e): State<SharedE2b>,
    who: Who,
    headers: HeaderMap,
    Query(q): Query<FilesQuery>,
) -> Response {
    let c = match files_ctx(&e, &who, &headers, &q, crate::e2b::access::Operation::Read) {
        Ok(c) => c,
        Err(resp) => return *resp,
    };
    let Some(p) = q.path.as_deref() else { return http_error(StatusCode::BAD_REQUEST, "path query parameter missing") };
    let path = c.path(p);
    match c.client.stat(&c.sandbox, &path).await {
        Ok(st) if st.kind == FileKind::Dir => {
            return http_error(StatusCode::BAD_REQUEST, format!("path {path} is a directory"))
        }
        Ok(_) => {}
        Err(err) => return http_native(err),
    }
    let encoding = match gzip::response_encoding(&headers) {
        Ok(enc) => enc,
        Err(msg) => return http_error(StatusCode::BAD_REQUEST, msg),
    };
    // Streamed through: the bytes are passed on as the native download sends them.
    // The sandbox is in use until the last byte is taken (the stream holds it).
    match c.client.download(&c.sandbox, strata_api::DownloadQuery { path: path.clone(), tar: false }).await {
        Ok(data) => {
            let len = data.len;
            let mut resp = match encoding {
                gzip::Encoding::Gzip => Response::new(Body::from_stream(gzip::gzip(data.stream))),
                gzip::Encoding::Identity => Response::new(Body::from_stream(data.stream)),
            };
            let h = resp.headers_mut();
            h.insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/octet-stream"));
            h.insert(header::VARY, header::HeaderValue::from_static("Accept-Encoding"));
            match (encoding, len) {
                (gzip::Encoding::Gzip, _) => {
                    h.insert(header::CONTENT_ENCODING, header::HeaderValue::from_static("gzip"));
                }
                (gzip::Encoding::Identity, Some(len)) => {
                    h.insert(header::CONTENT_LENGTH, len.into());
                }
                (gzip::Encoding::Identity, None) => {}
            }
            resp
        }
        Err(err) => http_native(err),
    }
}

/// Why an upload's body could not be passed on.
enum BodyError {
    /// More than [`MAX_UPLOAD`] bytes.
    TooLarge,
    /// A malformed or broken body.
    Malformed(String),
}

impl BodyError {
    fn response(self) -> Response {
        match self {
            BodyError::TooLarge => http_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("upload larger than {MAX_UPLOAD} bytes, the most one /files upload may be; nothing was kept"),
            ),
            BodyError::Malformed(m) => http_error(StatusCode::BAD_REQUEST, m),
        }
    }
}

/// Uploads one file of the caller's: its parent is made (as the caller's
/// user) when missing, the bytes `pieces` yields are streamed into a native
/// upload, and a new file is given to the caller's user. `total` counts the
/// bytes of the whole request against [`MAX_UPLOAD`].
async fn upload_one<F>(
    c: &Ctx,
    path: &str,
    metadata: &BTreeMap<String, String>,
    total: &mut u64,
    mut pieces: F,
) -> Result<Value, Response>
where
    F: AsyncPieces,
{
    if let Some((parent, _)) = path.rsplit_once('/').filter(|(d, _)| !d.is_empty()) {
        if c.client.stat(&c.sandbox, parent).await.is_err() {
            run_as(c, &["mkdir", "-p", "--", parent])
                .await
                .map_err(|err| http_error(err.code.http_status(), err.message))?;
        }
    }
    let existed = c.client.stat(&c.sandbox, path).await.is_ok();
    let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(strata_engine::transfer::DEPTH);
    let chunks = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    let q = strata_api::UploadQuery { path: path.to_string(), mode: None, tar: false };
    let upload = c.client.upload(&c.sandbox, q, None, chunks);
    let feed = async {
        let tx = tx;
        loop {
            match pieces.next_piece().await {
                Ok(Some(b)) => {
                    *total += b.len() as u64;
                    if *total > MAX_UPLOAD {
                        let _ = tx.send(Err(std::io::Error::other("over the upload limit"))).await;
                        pieces.linger().await;
                        return Err(BodyError::TooLarge);
                    }
                    if tx.send(Ok(b)).await.is_err() {
                        // The native upload stopped reading: its answer says why.
                        return Ok(());
                    }
                }
                Ok(None) => return Ok(()),
                Err(m) => {
                    let _ = tx.send(Err(std::io::Error::other(m.clone()))).await;
                    return Err(BodyError::Malformed(m));
                }
            }
        }
    };
    let (uploaded, fed) = tokio::join!(upload, feed);
    fed.map_err(BodyError::response)?;
    uploaded.map_err(http_native)?;
    if !existed {
        chown_to_user(c, path).await.map_err(|err| http_error(err.code.http_status(), err.message))?;
    }
    let name = path.rsplit('/').next().unwrap_or("").to_string();
    let mut info = json!({"name": name, "type": "file", "path": path});
    // The file is new (written aside, renamed into place): it has no
    // metadata but this upload's, as envd replaces it on every write.
    if !metadata.is_empty() {
        match c.client.set_xattrs(&c.sandbox, path, METADATA_XATTR, metadata.clone()).await {
            Ok(()) => info["metadata"] = json!(metadata),
            // A filesystem without user xattrs: the file is kept without them, as envd keeps it.
            Err(err) if err.body.message.contains("not supported") => {
                debug!(path, error = %err.body.message, "file metadata not kept: no user xattrs here");
            }
            Err(err) if err.body.message.contains("No space left") || err.body.message.contains("quota") => {
                return Err(http_error(
                    StatusCode::INSUFFICIENT_STORAGE,
                    format!("not enough space for file metadata: {}", err.body.message),
                ));
            }
            Err(err) => {
                return Err(http_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("error writing file metadata: {}", err.body.message),
                ))
            }
        }
    }
    Ok(info)
}

/// A source of upload pieces (a whole body, or one multipart part).
trait AsyncPieces {
    /// The next piece, `None` at the end.
    async fn next_piece(&mut self) -> Result<Option<Bytes>, String>;
    /// Reads and drops the rest of the request for a little while (it is refused).
    async fn linger(&mut self);
}

/// A whole request body.
struct BodyPieces(axum::body::BodyDataStream);

impl AsyncPieces for BodyPieces {
    async fn next_piece(&mut self) -> Result<Option<Bytes>, String> {
        use futures_util::StreamExt;
        self.0.next().await.transpose().map_err(|e| format!("reading the upload: {e}"))
    }

    async fn linger(&mut self) {
        strata_engine::transfer::linger(&mut self.0).await;
    }
}

/// The current part of a multipart body.
struct PartPieces<'a>(&'a mut Multipart<axum::body::BodyDataStream>);

impl AsyncPieces for PartPieces<'_> {
    async fn next_piece(&mut self) -> Result<Option<Bytes>, String> {
        self.0.next_data().await.map_err(|m| format!("malformed multipart body: {m}"))
    }

    async fn linger(&mut self) {
        self.0.linger().await;
    }
}

/// `POST /files?path=&username=`: upload (octet-stream, or multipart with one
/// or more `file` parts named by their file name); the `WriteInfo` list. The
/// body is streamed into the sandbox as it arrives: a part is written while
/// it is read (into a temp file renamed into place once complete).
pub(super) async fn upload(
    State(e): State<SharedE2b>,
    who: Who,
    headers: HeaderMap,
    Query(q): Query<FilesQuery>,
    body: Body,
) -> Response {
    let c = match files_ctx(&e, &who, &headers, &q, crate::e2b::access::Operation::Write) {
        Ok(c) => c,
        Err(resp) => return *resp,
    };
    let metadata = match upload_metadata(&headers) {
        Ok(m) => m,
        Err(msg) => return http_error(StatusCode::BAD_REQUEST, format!("invalid metadata: {msg}")),
    };
    let body = match gzip::request_encoding(&headers) {
        Ok(gzip::Encoding::Identity) => body,
        // Decompressed as it streams in: the limit counts the decompressed bytes.
        Ok(gzip::Encoding::Gzip) => Body::from_stream(gzip::gunzip(body.into_data_stream())),
        Err(msg) => return http_error(StatusCode::BAD_REQUEST, msg),
    };
    if crate::native::transfer::announced_over(&headers, MAX_UPLOAD) {
        return BodyError::TooLarge.response();
    }
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let mut total = 0u64;
    let mut infos = Vec::new();
    if ct.to_ascii_lowercase().starts_with("multipart/form-data") {
        let mut mp = match Multipart::new(&ct, body.into_data_stream()) {
            Ok(m) => m,
            Err(msg) => return http_error(StatusCode::BAD_REQUEST, format!("malformed multipart body: {msg}")),
        };
        // The first part goes to `path` when the query names one (a single-file
        // write); every other part to its own file name.
        let mut first = true;
        loop {
            let name = match mp.next_part().await {
                Ok(Some(n)) => n,
                Ok(None) => break,
                Err(msg) => return http_error(StatusCode::BAD_REQUEST, format!("malformed multipart body: {msg}")),
            };
            let p = match (first, q.path.as_deref(), name) {
                (true, Some(p), _) => p.to_string(),
                (_, _, Some(n)) if !n.is_empty() => n,
                _ => {
                    return http_error(
                        StatusCode::BAD_REQUEST,
                        "multipart part without a file name and no path query parameter",
                    )
                }
            };
            first = false;
            let path = c.path(&p);
            match upload_one(&c, &path, &metadata, &mut total, PartPieces(&mut mp)).await {
                Ok(info) => infos.push(info),
                Err(resp) => return resp,
            }
        }
    } else {
        let Some(p) = q.path.as_deref() else {
            return http_error(StatusCode::BAD_REQUEST, "path query parameter missing");
        };
        let path = c.path(p);
        match upload_one(&c, &path, &metadata, &mut total, BodyPieces(body.into_data_stream())).await {
            Ok(info) => infos.push(info),
            Err(resp) => return resp,
        }
    }
    Json(infos).into_response()
}

/// The longest metadata key: the kernel's 255-byte xattr name less the prefix.
const MAX_METADATA_KEY: usize = 255 - METADATA_XATTR.len();
/// The most metadata one file takes (names with the prefix, and values):
/// what ext4 keeps in one block.
const MAX_METADATA_TOTAL: usize = 4096;

/// An upload's metadata, from its `X-Metadata-<key>` headers (keys
/// lowercased, the first of repeated headers wins, an empty key is dropped),
/// checked as envd checks it: printable US-ASCII, keys of at most
/// [`MAX_METADATA_KEY`] bytes, [`MAX_METADATA_TOTAL`] bytes in all.
fn upload_metadata(headers: &HeaderMap) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix("x-metadata-") else { continue };
        if key.is_empty() || out.contains_key(key) {
            continue;
        }
        if key.len() > MAX_METADATA_KEY {
            return Err(format!("metadata key {key:?} exceeds {MAX_METADATA_KEY} bytes"));
        }
        let bytes = value.as_bytes();
        if let Some(at) = bytes.iter().position(|b| !(0x20..=0x7e).contains(b)) {
            return Err(format!(
                "metadata value for key {key:?} contains non-printable-ASCII byte 0x{:02x} at offset {at}",
                bytes[at]
            ));
        }
        out.insert(key.to_string(), String::from_utf8_lossy(bytes).into_owned());
    }
    let total: usize = out.iter().map(|(k, v)| METADATA_XATTR.len() + k.len() + v.len()).sum();
    if total > MAX_METADATA_TOTAL {
        return Err(format!("total metadata size {total} exceeds {MAX_METADATA_TOTAL} bytes"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn upload_metadata_is_read_from_x_metadata_headers_and_checked() {
        let mut h = HeaderMap::new();
        h.insert("X-Metadata-Owner", HeaderValue::from_static("team-a"));
        h.append("x-metadata-owner", HeaderValue::from_static("ignored"));
        h.insert("x-metadata-Build", HeaderValue::from_static("42"));
        h.insert("content-type", HeaderValue::from_static("application/octet-stream"));
        let m = upload_metadata(&h).unwrap();
        assert_eq!(m, BTreeMap::from([("build".into(), "42".into()), ("owner".into(), "team-a".into())]));
        let mut bad = HeaderMap::new();
        bad.insert("x-metadata-k", HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap());
        assert!(upload_metadata(&bad).unwrap_err().contains("non-printable-ASCII byte 0xc3 at offset 3"));
        let mut big = HeaderMap::new();
        big.insert("x-metadata-a", HeaderValue::from_str(&"v".repeat(4090)).unwrap());
        assert!(upload_metadata(&big).unwrap_err().contains("exceeds 4096 bytes"));
    }
}
