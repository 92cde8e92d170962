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
    #[serde(default)]
    include_entry: Option<bool>,
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

/// `filesystem.EntryInfo` in proto3 JSON (int64 as a string, enums by name),
/// as envd makes it: a symlink is described by where it leads (`type` and
/// `mode` of its target, `symlinkTarget` the resolved path; a dangling one has
/// type unspecified, mode 0 and its own path as target) and marked
/// `isSymlink`; `permissions` and `size` are the entry's own; `metadata` is
/// its `user.e2b.*` extended attributes (keys without the prefix).
pub(super) fn entry_info(f: &FileStat) -> Value {
    let (kind, mode, target) = match (f.kind, &f.link_resolved) {
        (FileKind::Symlink, Some(l)) if l.kind.is_some() => (l.kind, l.mode.unwrap_or(0), Some(l.path.as_str())),
        (FileKind::Symlink, _) => (None, 0, Some(f.path.as_str())),
        (k, _) => (Some(k), f.mode, None),
    };
    let kind = match kind {
        Some(FileKind::File) => "FILE_TYPE_FILE",
        Some(FileKind::Dir) => "FILE_TYPE_DIRECTORY",
        _ => "FILE_TYPE_UNSPECIFIED",
    };
    let mtime = std::time::UNIX_EPOCH + Duration::from_secs(f.mtime.max(0) as u64);
    let mut v = json!({
        "name": f.name,
        "type": kind,
        "path": f.path,
        "size": f.size.to_string(),
        "mode": mode & 0o777,
        "permissions": permissions(f.kind, f.mode),
        "owner": owner_name(f.uid),
        "group": owner_name(f.gid),
        "modifiedTime": humantime::format_rfc3339_seconds(mtime).to_string(),
        "isSymlink": f.kind == FileKind::Symlink,
    });
    if let Some(t) = target {
        v["symlinkTarget"] = json!(t);
    }
    let meta = file_metadata(f);
    if !meta.is_empty() {
        v["metadata"] = json!(meta);
    }
    v
}

/// A file's E2B metadata: its `user.e2b.*` extended attributes, keys without the prefix.
pub(super) fn file_metadata(f: &FileStat) -> BTreeMap<&str, &str> {
    f.xattrs.iter().filter_map(|(k, v)| k.strip_prefix(METADATA_XATTR).map(|k| (k, v.as_str()))).collect()
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
    let (f, c, limit) = match connect_call(&e, &who, &headers) {
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
        let keepalive = keepalive_of(&headers);
        return match stream_message(&body).and_then(|m| parse::<FsRequest>(&m, "filesystem.WatchDirRequest")) {
            Ok(req) => watch_dir(c, req, limit, keepalive).await.unwrap_or_else(|err| stream_error(&err)),
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
    let call = async {
        match method.as_str() {
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
        }
    };
    match within(limit, call).await {
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

/// Lists `path` down to `depth` levels (0 is 1) in envd's order, that of Go's
/// `filepath.WalkDir`: depth first, each directory's entries by name, the
/// directory itself left out, symlinks listed but not followed; at most
/// [`MAX_WALK`] entries. A subdirectory on a kernel pseudo-filesystem (which
/// the file API does not serve) or removed meanwhile is listed, not entered.
async fn walk(c: &Ctx, path: &str, depth: u32) -> Result<Vec<FileStat>, ConnectError> {
    let depth = depth.max(1);
    let first = c.client.list_dir(&c.sandbox, path).await.map_err(native)?;
    let mut out = Vec::new();
    let mut open: Vec<(std::vec::IntoIter<FileStat>, u32)> = vec![(first.into_iter(), 1)];
    while let Some((entries, level)) = open.last_mut() {
        let level = *level;
        let Some(entry) = entries.next() else {
            open.pop();
            continue;
        };
        let enter = (entry.kind == FileKind::Dir && level < depth).then(|| entry.path.clone());
        out.push(entry);
        if out.len() >= MAX_WALK {
            break;
        }
        if let Some(dir) = enter {
            match c.client.list_dir(&c.sandbox, &dir).await {
                Ok(sub) => open.push((sub.into_iter(), level + 1)),
                Err(e) if matches!(e.code(), ErrorCode::FileNotFound | ErrorCode::PseudoFilesystem) => {}
                Err(e) => return Err(native(e)),
            }
        }
    }
    Ok(out)
}

/// Whether `st` is a directory, or a symlink to one.
fn is_dir(st: &FileStat) -> bool {
    st.kind == FileKind::Dir || st.link_resolved.as_ref().is_some_and(|l| l.kind == Some(FileKind::Dir))
}

async fn fs_list(c: &Ctx, req: &FsRequest) -> Result<Value, ConnectError> {
    let path = c.path(need(&req.path, "path")?);
    let st = c.client.stat(&c.sandbox, &path).await.map_err(|e| match e.code() {
        ErrorCode::FileNotFound => ConnectError::new(Code::NotFound, format!("path not found: {path}")),
        _ => native(e),
    })?;
    if !is_dir(&st) {
        return Err(ConnectError::new(Code::InvalidArgument, format!("path is not a directory: {path}")));
    }
    let entries = walk(c, &path, req.depth.unwrap_or(1)).await?;
    Ok(json!({"entries": entries.iter().map(entry_info).collect::<Vec<_>>()}))
}

// ---------------------------------------------------------------- watches

/// Starts strata's watch of directory `path` (inotify, see
/// [`strata_engine::dirwatch`]) for a caller.
async fn start_watch(c: &Ctx, path: &str, recursive: bool) -> Result<strata_engine::dirwatch::DirWatch, ConnectError> {
    let st = c.client.stat(&c.sandbox, path).await.map_err(native)?;
    if !is_dir(&st) {
        return Err(ConnectError::new(Code::InvalidArgument, format!("path {path} is not a directory")));
    }
    c.client.watch_dir(&c.sandbox, path, recursive).await.map_err(native)
}

/// A `filesystem.FilesystemEvent` (names relative to the watched directory;
/// with `include_entry`, creates, writes and changes of metadata carry the
/// entry as it is when the event is read, when it still exists).
async fn event_json(c: &Ctx, ev: &FsEvent, include_entry: bool) -> Value {
    let kind = match ev.op {
        FsOp::Create => "EVENT_TYPE_CREATE",
        FsOp::Write => "EVENT_TYPE_WRITE",
        FsOp::Remove => "EVENT_TYPE_REMOVE",
        FsOp::Rename => "EVENT_TYPE_RENAME",
        FsOp::Chmod => "EVENT_TYPE_CHMOD",
    };
    // Go's filepath.Rel of the directory itself.
    let name = if ev.name.is_empty() { "." } else { ev.name.as_str() };
    let mut v = json!({"name": name, "type": kind});
    if include_entry && matches!(ev.op, FsOp::Create | FsOp::Write | FsOp::Chmod) {
        if let Ok(st) = c.client.stat(&c.sandbox, &ev.path).await {
            v["entry"] = entry_info(&st);
        }
    }
    v
}

/// A directory watcher of `CreateWatcher`: strata's watch of the directory;
/// each `GetWatcherEvents` takes what happened since the last one (events
/// wait in the watch and the kernel's queue: one that overflows ends the
/// watcher with an error, never silently).
#[derive(Clone)]
pub struct Watcher {
    sandbox: String,
    token: String,
    include_entry: bool,
    watch: Arc<tokio::sync::Mutex<strata_engine::dirwatch::DirWatch>>,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher").field("sandbox", &self.sandbox).finish_non_exhaustive()
    }
}

impl Watcher {
    /// The watched sandbox.
    pub fn sandbox(&self) -> &str {
        &self.sandbox
    }
}

async fn create_watcher(e: &SharedE2b, c: &Ctx, req: &FsRequest) -> Result<Value, ConnectError> {
    let path = c.path(need(&req.path, "path")?);
    let watch = start_watch(c, &path, req.recursive.unwrap_or(false)).await?;
    let id = format!("w{:016x}", rand::random::<u64>());
    let w = Watcher {
        sandbox: c.sandbox.clone(),
        token: c.token.clone(),
        include_entry: req.include_entry.unwrap_or(false),
        watch: Arc::new(tokio::sync::Mutex::new(watch)),
    };
    e.lock().watchers.insert(id.clone(), w);
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
        .ok_or_else(|| ConnectError::new(Code::NotFound, format!("watcher with id {id} not found")))
}

/// `GetWatcherEvents`: every event since the last call, in order (changes
/// made before this call included); once the watch has ended (its directory
/// removed, the sandbox stopped), its last events and then the reason, and
/// the watcher is gone.
async fn watcher_events(e: &SharedE2b, c: &Ctx, req: &FsRequest) -> Result<Value, ConnectError> {
    let id = need(&req.watcher_id, "watcherId")?.to_string();
    let w = own_watcher(e, c, &id)?;
    let taken = w.watch.lock().await.take_ready().await;
    let taken = taken.map_err(|err| {
        e.lock().watchers.remove(&id);
        native(err)
    })?;
    let mut events = Vec::with_capacity(taken.len());
    for ev in &taken {
        events.push(event_json(c, ev, w.include_entry).await);
    }
    Ok(json!({"events": events}))
}

fn remove_watcher(e: &SharedE2b, c: &Ctx, req: &FsRequest) -> Result<Value, ConnectError> {
    let id = need(&req.watcher_id, "watcherId")?;
    own_watcher(e, c, id)?;
    e.lock().watchers.remove(id);
    Ok(json!({}))
}

/// `filesystem.Filesystem/WatchDir`: strata's watch of the directory, streamed
/// (keepalives at the client's `Keepalive-Ping-Interval`; the stream ends with
/// `deadline_exceeded` at its `Connect-Timeout-Ms`, as envd's).
async fn watch_dir(
    c: Ctx,
    req: FsRequest,
    limit: Option<Duration>,
    keepalive: Option<Duration>,
) -> Result<Response, ConnectError> {
    let path = c.path(need(&req.path, "path")?);
    let mut watch = start_watch(&c, &path, req.recursive.unwrap_or(false)).await?;
    let include_entry = req.include_entry.unwrap_or(false);
    let deadline = limit.map(|d| tokio::time::Instant::now() + d);
    let (tx, rx) = mpsc::channel::<Result<Value, ConnectError>>(64);
    tokio::spawn(async move {
        if tx.send(Ok(json!({"start": {}}))).await.is_err() {
            return;
        }
        let tick = keepalive.unwrap_or(Duration::from_secs(3600));
        loop {
            let next = tokio::select! {
                n = watch.next() => n,
                _ = tx.closed() => return,
                _ = until(deadline) => {
                    let _ = tx.send(Err(deadline_exceeded(limit.unwrap_or_default()))).await;
                    return;
                }
                _ = tokio::time::sleep(tick) => {
                    if tx.send(Ok(json!({"keepalive": {}}))).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            let msg = match next {
                Some(Ok(ev)) => Ok(json!({"filesystem": event_json(&c, &ev, include_entry).await})),
                Some(Err(err)) => Err(native(err)),
                None => return,
            };
            let end = msg.is_err();
            if tx.send(msg).await.is_err() || end {
                return;
            }
        }
    });
    Ok(stream_response(rx))
}
