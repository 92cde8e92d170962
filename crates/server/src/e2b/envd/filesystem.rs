//! `filesystem.Filesystem`: metadata, listings, moves, removals and directory watches.

use super::*;

/// Requests of `filesystem.Filesystem` (one struct: every field optional).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FsRequest {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    destination: Option<String>,
    #[serde(default)]
    depth: Option<u32>,
    #[serde(default)]
    recursive: Option<bool>,
    #[serde(default)]
    watcher_id: Option<String>,
}

fn owner_name(id: u32) -> String {
    match id {
        0 => "root".into(),
        1000 => DEFAULT_USER.into(),
        n => n.to_string(),
    }
}

pub(super) fn permissions(kind: FileKind, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'L',
        _ => '-',
    });
    for shift in [6u32, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// `filesystem.EntryInfo` in proto3 JSON (int64 as a string, enums by name).
fn entry_info(f: &FileStat) -> Value {
    let kind = match f.kind {
        FileKind::File => "FILE_TYPE_FILE",
        FileKind::Dir => "FILE_TYPE_DIRECTORY",
        FileKind::Symlink => "FILE_TYPE_SYMLINK",
        FileKind::Other => "FILE_TYPE_UNSPECIFIED",
    };
    let mtime = std::time::UNIX_EPOCH + Duration::from_secs(f.mtime.max(0) as u64);
    let mut v = json!({
        "name": f.name,
        "type": kind,
        "path": f.path,
        "size": f.size.to_string(),
        "mode": f.mode & 0o7777,
        "permissions": permissions(f.kind, f.mode),
        "owner": owner_name(f.uid),
        "group": owner_name(f.gid),
        "modifiedTime": humantime::format_rfc3339_seconds(mtime).to_string(),
        "isSymlink": f.kind == FileKind::Symlink,
    });
    if let Some(t) = &f.link_target {
        v["symlinkTarget"] = json!(t);
    }
    v
}

fn need<'a>(v: &'a Option<String>, what: &str) -> Result<&'a str, ConnectError> {
    v.as_deref().ok_or_else(|| ConnectError::new(Code::InvalidArgument, format!("{what} missing")))
}

/// The `filesystem.Filesystem` service: one Connect call.
pub(super) async fn service(
    State(e): State<SharedE2b>,
    who: Who,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (f, c) = match connect_call(&e, &who, &headers) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    if method == "WatchDir" {
        if f != Framing::Stream {
            return error_response(
                f,
                ConnectError::new(
                    Code::InvalidArgument,
                    "filesystem.WatchDir is server streaming: use application/connect+json",
                ),
            );
        }
        return match stream_message(&body).and_then(|m| parse::<FsRequest>(&m, "filesystem.WatchDirRequest")) {
            Ok(req) => watch_dir(c, req).await.unwrap_or_else(|err| stream_error(&err)),
            Err(err) => stream_error(&err),
        };
    }
    if f != Framing::Unary {
        return error_response(
            f,
            ConnectError::new(Code::InvalidArgument, format!("filesystem.{method} is unary: use application/json")),
        );
    }
    let req: FsRequest = match parse(&body, &format!("filesystem.{method} request")) {
        Ok(r) => r,
        Err(err) => return error_response(f, err),
    };
    let res = match method.as_str() {
        "Stat" => fs_stat(&c, &req).await,
        "MakeDir" => fs_mkdir(&c, &req).await,
        "Move" => fs_move(&c, &req).await,
        "ListDir" => fs_list(&c, &req).await,
        "Remove" => fs_remove(&c, &req).await,
        "CreateWatcher" => create_watcher(&e, &c, &req).await,
        "GetWatcherEvents" => watcher_events(&e, &c, &req).await,
        "RemoveWatcher" => remove_watcher(&e, &c, &req),
        _ => Err(ConnectError::new(
            Code::Unimplemented,
            format!("filesystem.{method} is not a method of filesystem.Filesystem"),
        )),
    };
    match res {
        Ok(v) => unary_ok(v),
        Err(err) => error_response(f, err),
    }
}

async fn fs_stat(c: &Ctx, req: &FsRequest) -> Result<Value, ConnectError> {
    let path = c.path(need(&req.path, "path")?);
    let st = c.client.stat(&c.sandbox, &path).await.map_err(native)?;
    Ok(json!({"entry": entry_info(&st)}))
}

async fn fs_mkdir(c: &Ctx, req: &FsRequest) -> Result<Value, ConnectError> {
    let path = c.path(need(&req.path, "path")?);
    if let Ok(st) = c.client.stat(&c.sandbox, &path).await {
        let what = if st.kind == FileKind::Dir { "directory" } else { "file" };
        return Err(ConnectError::new(Code::AlreadyExists, format!("{what} {path} already exists")));
    }
    run_as(c, &["mkdir", "-p", "--", &path]).await?;
    let st = c.client.stat(&c.sandbox, &path).await.map_err(native)?;
    Ok(json!({"entry": entry_info(&st)}))
}

async fn fs_move(c: &Ctx, req: &FsRequest) -> Result<Value, ConnectError> {
    let from = c.path(need(&req.source, "source")?);
    let to = c.path(need(&req.destination, "destination")?);
    c.client.move_path(&c.sandbox, &from, &to).await.map_err(native)?;
    let st = c.client.stat(&c.sandbox, &to).await.map_err(native)?;
    Ok(json!({"entry": entry_info(&st)}))
}

/// `filesystem.Filesystem/Remove`: recursive; a path that does not exist is
/// already removed (envd's `os.RemoveAll`: no error).
async fn fs_remove(c: &Ctx, req: &FsRequest) -> Result<Value, ConnectError> {
    let path = c.path(need(&req.path, "path")?);
    match c.client.stat(&c.sandbox, &path).await {
        Err(e) if e.code() == strata_api::ErrorCode::FileNotFound => return Ok(json!({})),
        other => other.map_err(native)?,
    };
    c.client.remove_path(&c.sandbox, &path, true).await.map_err(native)?;
    Ok(json!({}))
}

/// Lists `path` down to `depth` levels (breadth first, at most [`MAX_WALK`] entries).
async fn walk(c: &Ctx, path: &str, depth: u32) -> Result<Vec<FileStat>, ConnectError> {
    let mut out = Vec::new();
    let mut level = vec![path.to_string()];
    for _ in 0..depth.max(1) {
        let mut next = Vec::new();
        for dir in level {
            let entries = c.client.list_dir(&c.sandbox, &dir).await.map_err(native)?;
            for en in entries {
                if en.kind == FileKind::Dir {
                    next.push(en.path.clone());
                }
                out.push(en);
                if out.len() >= MAX_WALK {
                    return Ok(out);
                }
            }
        }
        level = next;
    }
    Ok(out)
}

async fn fs_list(c: &Ctx, req: &FsRequest) -> Result<Value, ConnectError> {
    let path = c.path(need(&req.path, "path")?);
    let st = c.client.stat(&c.sandbox, &path).await.map_err(native)?;
    if st.kind != FileKind::Dir {
        return Err(ConnectError::new(Code::InvalidArgument, format!("path {path} is not a directory")));
    }
    let entries = walk(c, &path, req.depth.unwrap_or(1)).await?;
    Ok(json!({"entries": entries.iter().map(entry_info).collect::<Vec<_>>()}))
}

/// A snapshot of a watched tree: path -> (kind, size, mtime).
async fn snapshot(c: &Ctx, path: &str, recursive: bool) -> Result<HashMap<String, (FileKind, u64, i64)>, ConnectError> {
    let entries = walk(c, path, if recursive { 64 } else { 1 }).await?;
    Ok(entries.into_iter().map(|f| (f.path.clone(), (f.kind, f.size, f.mtime))).collect())
}

/// The `filesystem.FilesystemEvent`s between two snapshots (names relative to `root`).
fn diff(
    root: &str,
    old: &HashMap<String, (FileKind, u64, i64)>,
    new: &HashMap<String, (FileKind, u64, i64)>,
) -> Vec<Value> {
    let rel = |p: &str| p.strip_prefix(root).unwrap_or(p).trim_start_matches('/').to_string();
    let mut out = Vec::new();
    let mut created: Vec<&String> = new.keys().filter(|k| !old.contains_key(*k)).collect();
    created.sort();
    for p in created {
        out.push(json!({"name": rel(p), "type": "EVENT_TYPE_CREATE"}));
        if new[p].0 == FileKind::File && new[p].1 > 0 {
            out.push(json!({"name": rel(p), "type": "EVENT_TYPE_WRITE"}));
        }
    }
    let mut changed: Vec<&String> = new
        .keys()
        .filter(|k| old.get(*k).is_some_and(|o| o.0 == FileKind::File && (o.1, o.2) != (new[*k].1, new[*k].2)))
        .collect();
    changed.sort();
    for p in changed {
        out.push(json!({"name": rel(p), "type": "EVENT_TYPE_WRITE"}));
    }
    let mut removed: Vec<&String> = old.keys().filter(|k| !new.contains_key(*k)).collect();
    removed.sort();
    for p in removed {
        out.push(json!({"name": rel(p), "type": "EVENT_TYPE_REMOVE"}));
    }
    out
}

async fn create_watcher(e: &SharedE2b, c: &Ctx, req: &FsRequest) -> Result<Value, ConnectError> {
    let path = c.path(need(&req.path, "path")?);
    let st = c.client.stat(&c.sandbox, &path).await.map_err(native)?;
    if st.kind != FileKind::Dir {
        return Err(ConnectError::new(Code::InvalidArgument, format!("path {path} is not a directory")));
    }
    let recursive = req.recursive.unwrap_or(false);
    let seen = snapshot(c, &path, recursive).await?;
    let id = format!("w{:016x}", rand::random::<u64>());
    e.lock()
        .watchers
        .insert(id.clone(), Watcher { sandbox: c.sandbox.clone(), token: c.token.clone(), path, recursive, seen });
    Ok(json!({"watcherId": id}))
}

/// The watcher `id` if the caller made it (same key, same sandbox); anyone
/// else gets the answer of an unknown id.
fn own_watcher(e: &SharedE2b, c: &Ctx, id: &str) -> Result<Watcher, ConnectError> {
    e.lock()
        .watchers
        .get(id)
        .filter(|w| w.token == c.token && w.sandbox == c.sandbox)
        .cloned()
        .ok_or_else(|| ConnectError::new(Code::NotFound, format!("watcher {id} not found")))
}

async fn watcher_events(e: &SharedE2b, c: &Ctx, req: &FsRequest) -> Result<Value, ConnectError> {
    let id = need(&req.watcher_id, "watcherId")?.to_string();
    let w = own_watcher(e, c, &id)?;
    let now = snapshot(c, &w.path, w.recursive).await?;
    let events = diff(&w.path, &w.seen, &now);
    if let Some(w) = e.lock().watchers.get_mut(&id) {
        w.seen = now;
    }
    Ok(json!({"events": events}))
}

fn remove_watcher(e: &SharedE2b, c: &Ctx, req: &FsRequest) -> Result<Value, ConnectError> {
    let id = need(&req.watcher_id, "watcherId")?;
    own_watcher(e, c, id)?;
    e.lock().watchers.remove(id);
    Ok(json!({}))
}

/// `filesystem.Filesystem/WatchDir`: a polling watch, streamed.
async fn watch_dir(c: Ctx, req: FsRequest) -> Result<Response, ConnectError> {
    let path = c.path(need(&req.path, "path")?);
    let st = c.client.stat(&c.sandbox, &path).await.map_err(native)?;
    if st.kind != FileKind::Dir {
        return Err(ConnectError::new(Code::InvalidArgument, format!("path {path} is not a directory")));
    }
    let recursive = req.recursive.unwrap_or(false);
    let mut seen = snapshot(&c, &path, recursive).await?;
    let (tx, rx) = mpsc::channel::<Result<Value, ConnectError>>(64);
    tokio::spawn(async move {
        if tx.send(Ok(json!({"start": {}}))).await.is_err() {
            return;
        }
        loop {
            tokio::select! {
                _ = tokio::time::sleep(WATCH_POLL) => {}
                _ = tx.closed() => return,
            }
            let now = match snapshot(&c, &path, recursive).await {
                Ok(n) => n,
                Err(err) => {
                    let _ = tx.send(Err(err)).await;
                    return;
                }
            };
            for ev in diff(&path, &seen, &now) {
                if tx.send(Ok(json!({"filesystem": ev}))).await.is_err() {
                    return;
                }
            }
            seen = now;
        }
    });
    Ok(stream_response(rx))
}
