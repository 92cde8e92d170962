//! `/files`: uploads and downloads over HTTP.

use super::*;

/// Query of `/files`.
#[derive(Debug, Deserialize)]
pub(super) struct FilesQuery {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    username: Option<String>,
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
    let c = match ctx(&e, &who, &headers, q.username.as_deref()) {
        Ok(c) => c,
        Err(err) => return http_error(err.code.http_status(), err.message),
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
    // Streamed through: the bytes are passed on as the native download sends them.
    // The sandbox is in use until the last byte is taken (the stream holds it).
    match c.client.download(&c.sandbox, strata_api::DownloadQuery { path: path.clone(), tar: false }).await {
        Ok(data) => {
            let len = data.len;
            let mut resp = Response::new(Body::from_stream(data.stream));
            resp.headers_mut()
                .insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/octet-stream"));
            if let Some(len) = len {
                resp.headers_mut().insert(header::CONTENT_LENGTH, len.into());
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
async fn upload_one<F>(c: &Ctx, path: &str, total: &mut u64, mut pieces: F) -> Result<Value, Response>
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
    Ok(json!({"name": name, "type": "file", "path": path}))
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
    let c = match ctx(&e, &who, &headers, q.username.as_deref()) {
        Ok(c) => c,
        Err(err) => return http_error(err.code.http_status(), err.message),
    };
    if headers.get(header::CONTENT_ENCODING).is_some_and(|v| v.as_bytes() != b"identity") {
        return http_error(
            StatusCode::NOT_IMPLEMENTED,
            "compressed uploads (Content-Encoding) are not supported by strata's envd: upload without gzip",
        );
    }
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
            match upload_one(&c, &path, &mut total, PartPieces(&mut mp)).await {
                Ok(info) => infos.push(info),
                Err(resp) => return resp,
            }
        }
    } else {
        let Some(p) = q.path.as_deref() else {
            return http_error(StatusCode::BAD_REQUEST, "path query parameter missing");
        };
        let path = c.path(p);
        match upload_one(&c, &path, &mut total, BodyPieces(body.into_data_stream())).await {
            Ok(info) => infos.push(info),
            Err(resp) => return resp,
        }
    }
    Json(infos).into_response()
}
