//! Directory watches: inotify marks the daemon sets on a running sandbox's
//! tree, reached through its root as every file call is ([`crate::files`]), so
//! each change the sandbox makes there is reported as it happens, in order.
//!
//! Nothing is dropped silently: a reader that falls so far behind that the
//! kernel's queue overflows, or a watched directory that goes away (removed,
//! or the sandbox stopped or went to standby: its root is unmounted), ends the
//! watch with an error that says so. Polling, which this replaces, could not
//! see a file created and removed between two looks.
//!
//! The daemon's own writes are shown as the sandbox sees their result: an
//! upload's temp file is not reported, and its rename into place is a create
//! and a write of the file.
//!
//! inotify over the daemon's view works on every tier whose root the daemon
//! opens on the host: the namespace tier's overlay (the sandbox writes through
//! the same mount) and the gVisor tier's gofer-backed root. A microVM's
//! writes are its guest kernel's, which the host's inotify never sees: its
//! pid 1 runs the watch in the guest ([`strata_init::guestwatch`], with the
//! same meaning of each event) and streams the events to the daemon, which
//! checks them as untrusted input.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent, WatchDescriptor};
use strata_api::{ErrorCode, FileKind, FsEvent, FsOp};
use strata_init::guestwatch::{join, mask, Changes, WatchOp};
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, oneshot};

use crate::error::{EngineError, EngineResult};
use crate::files;
use crate::sandboxfs::{FsError, SandboxFs};
use crate::state::Shared;

/// Most directories one recursive watch marks.
pub const MAX_WATCHED_DIRS: usize = strata_init::guestwatch::MAX_WATCHED_DIRS;
/// Events kept for a slow reader before the kernel's own queue takes over.
const BUFFER: usize = 1024;

/// The API's name of a change.
fn api_op(op: WatchOp) -> FsOp {
    match op {
        WatchOp::Create => FsOp::Create,
        WatchOp::Rename => FsOp::Rename,
        WatchOp::Chmod => FsOp::Chmod,
        WatchOp::Write => FsOp::Write,
        WatchOp::Remove => FsOp::Remove,
    }
}

/// A running watch: its events, in the order they happened. Dropping it ends it.
pub struct DirWatch {
    /// The watched directory (absolute, symlinks resolved).
    pub path: String,
    rx: mpsc::Receiver<EngineResult<FsEvent>>,
    syncs: mpsc::Sender<oneshot::Sender<()>>,
    /// The error that ended the watch, once [`DirWatch::take_ready`] met it.
    ended: Option<EngineError>,
    task: tokio::task::JoinHandle<()>,
}

impl DirWatch {
    /// The next event; an error ends the watch; `None` after that.
    pub async fn next(&mut self) -> Option<EngineResult<FsEvent>> {
        self.rx.recv().await
    }

    /// Every event of changes made before this call, taken without waiting
    /// for more: the kernel queues an event before the call that made the
    /// change returns, so a poll right after a write sees it. When the watch
    /// has ended, the events before its end come first and the error on the
    /// next call (`Err` only once no event is left).
    pub async fn take_ready(&mut self) -> EngineResult<Vec<FsEvent>> {
        let mut out = Vec::new();
        if self.ended.is_none() {
            let (ack, mut done) = oneshot::channel();
            if self.syncs.send(ack).await.is_ok() {
                // Taken while the watch catches up, so a full buffer cannot stall it.
                loop {
                    tokio::select! {
                        _ = &mut done => break,
                        ev = self.rx.recv() => match ev {
                            Some(ev) => self.keep(ev, &mut out),
                            None => break,
                        },
                    }
                }
            }
            while let Ok(ev) = self.rx.try_recv() {
                self.keep(ev, &mut out);
            }
        }
        match self.ended.take() {
            Some(e) if out.is_empty() => Err(e),
            ended => {
                self.ended = ended;
                Ok(out)
            }
        }
    }

    fn keep(&mut self, ev: EngineResult<FsEvent>, out: &mut Vec<FsEvent>) {
        match ev {
            Ok(ev) if self.ended.is_none() => out.push(ev),
            Ok(_) => {}
            Err(e) => self.ended = Some(e),
        }
    }
}

impl Drop for DirWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The inotify instance, shared by the reader and the marking of new directories.
#[derive(Clone)]
struct Marks(Arc<Inotify>);

impl AsRawFd for Marks {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// Marks directory `path` of `fs` (and, with `recursive`, every directory
/// under it, symlinks not followed): the resolved path and the marks, each
/// with its directory relative to `path`.
fn mark_tree(
    fs: &SandboxFs,
    marks: &Marks,
    path: &str,
    recursive: bool,
) -> Result<(String, Vec<(WatchDescriptor, String)>), FsError> {
    let (fd, abs) = fs.open_dir_path(path)?;
    let mut out = vec![(mark(marks, &fd, &abs)?, String::new())];
    let mut todo = if recursive { vec![String::new()] } else { Vec::new() };
    while let Some(rel) = todo.pop() {
        let dir = join(&abs, &rel);
        let entries = match fs.list(&dir) {
            Ok(e) => e,
            // Gone since it was seen: nothing to mark.
            Err(FsError::NotFound(_)) => continue,
            Err(e) => return Err(e),
        };
        for e in entries.into_iter().filter(|e| e.kind == FileKind::Dir) {
            if out.len() >= MAX_WATCHED_DIRS {
                return Err(FsError::TooLarge(format!(
                    "{abs}: more than {MAX_WATCHED_DIRS} directories, the most one recursive watch marks (watch a smaller tree)"
                )));
            }
            let sub = join(&rel, &e.name);
            match fs.open_dir_path(&e.path) {
                Ok((fd, _)) => out.push((mark(marks, &fd, &e.path)?, sub.clone())),
                Err(FsError::NotFound(_)) => continue,
                // A mount of a pseudo-filesystem, or a swapped-in symlink: not watched.
                Err(FsError::PseudoFs { .. } | FsError::Escape(_)) => continue,
                Err(e) => return Err(e),
            }
            todo.push(sub);
        }
    }
    Ok((abs, out))
}

fn mark(marks: &Marks, fd: &OwnedFd, path: &str) -> Result<WatchDescriptor, FsError> {
    // The descriptor's magic link names the very inode the resolver checked.
    let at = format!("/proc/self/fd/{}", fd.as_raw_fd());
    marks.0.add_watch(at.as_str(), mask()).map_err(|e| FsError::io(path, std::io::Error::from(e)))
}

/// Starts watching directory `path` of running sandbox `id`.
pub async fn watch(st: &Shared, id: &str, path: &str, recursive: bool) -> EngineResult<DirWatch> {
    let rec = crate::record::load(st, id)?;
    if crate::guest_layer::in_guest(st, &rec) {
        return in_guest::watch(st, &rec, path, recursive).await;
    }
    let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
        .map_err(|e| EngineError::internal("inotify_init", &std::io::Error::from(e)))?;
    let marks = Marks(Arc::new(ino));
    let (abs, first) = {
        let (marks, path) = (marks.clone(), path.to_string());
        files::with_fs(st, id, move |fs| mark_tree(&fs, &marks, &path, recursive)).await?
    };
    // SAFETY: `Marks` holds the inotify instance (an owned descriptor) for as
    // long as the AsyncFd lives, and always answers the same descriptor.
    let reader = unsafe { AsyncFd::register_with_interest(marks.clone(), tokio::io::Interest::READABLE) }
        .map_err(|e| EngineError::internal("watch the inotify descriptor", &std::io::Error::from(e)))?;
    let (tx, rx) = mpsc::channel(BUFFER);
    let (syncs, sync_rx) = mpsc::channel(4);
    let mut w = Watching {
        st: st.clone(),
        id: id.to_string(),
        abs: abs.clone(),
        recursive,
        marks,
        dirs: first.into_iter().collect(),
        changes: Changes::default(),
        tx,
    };
    // The watch goes on as its caller: directories it marks later are looked
    // up with the caller's access, as the first ones were.
    let caller = crate::caller::current()
        .ok_or_else(|| EngineError::new(ErrorCode::Internal, "a directory watch started outside any caller"))?;
    let task = tokio::spawn(crate::caller::run_as(caller, async move {
        if let Err(e) = w.run(reader, sync_rx).await {
            let _ = w.tx.send(Err(e)).await;
        }
    }));
    Ok(DirWatch { path: abs, rx, syncs, ended: None, task })
}

/// The state of a running watch.
struct Watching {
    st: Shared,
    id: String,
    /// The watched directory.
    abs: String,
    recursive: bool,
    marks: Marks,
    /// Marked directories, relative to `abs` (`""`: `abs` itself).
    dirs: HashMap<WatchDescriptor, String>,
    /// What each event means (the daemon's temp files left out).
    changes: Changes,
    tx: mpsc::Sender<EngineResult<FsEvent>>,
}

/// Why a watch ends on its own.
enum End {
    /// The reader went away.
    Closed,
    /// An error to report.
    Error(EngineError),
}

impl From<EngineError> for End {
    fn from(e: EngineError) -> Self {
        End::Error(e)
    }
}

impl Watching {
    /// Reads events until the reader goes away or the watch cannot go on;
    /// a sync request is answered once every event queued so far is passed on.
    async fn run(
        &mut self,
        reader: AsyncFd<Marks>,
        mut syncs: mpsc::Receiver<oneshot::Sender<()>>,
    ) -> EngineResult<()> {
        loop {
            let events = tokio::select! {
                ready = reader.readable() => {
                    let mut ready = ready.map_err(|e| EngineError::internal("wait for inotify events", &e))?;
                    match ready.try_io(|fd| fd.get_ref().0.read_events().map_err(std::io::Error::from)) {
                        Ok(Ok(events)) => events,
                        Ok(Err(e)) => return Err(EngineError::internal("read inotify events", &e)),
                        Err(_would_block) => continue,
                    }
                }
                ack = syncs.recv() => {
                    let Some(ack) = ack else { return Ok(()) };
                    // Everything queued now (the descriptor is non-blocking).
                    loop {
                        match self.marks.0.read_events() {
                            Ok(events) => {
                                for ev in events {
                                    if !self.pass_on(ev).await? {
                                        return Ok(());
                                    }
                                }
                            }
                            Err(nix::errno::Errno::EAGAIN) => break,
                            Err(e) => return Err(EngineError::internal("read inotify events", &std::io::Error::from(e))),
                        }
                    }
                    let _ = ack.send(());
                    continue;
                }
            };
            for ev in events {
                if !self.pass_on(ev).await? {
                    return Ok(());
                }
            }
        }
    }

    /// Passes one inotify event on; `false` when the reader went away.
    async fn pass_on(&mut self, ev: InotifyEvent) -> EngineResult<bool> {
        match self.event(ev).await {
            Ok(()) => Ok(true),
            Err(End::Closed) => Ok(false),
            Err(End::Error(e)) => Err(e),
        }
    }

    async fn event(&mut self, ev: InotifyEvent) -> Result<(), End> {
        let m = ev.mask;
        if m.contains(AddWatchFlags::IN_Q_OVERFLOW) {
            return Err(End::Error(EngineError::new(
                ErrorCode::TooLarge,
                format!("the watch of {} fell behind: the kernel's queue of its events overflowed and some were lost, so it ends (start a new one and re-read the directory)", self.abs),
            )));
        }
        let Some(dir) = self.dirs.get(&ev.wd).cloned() else { return Ok(()) };
        if m.contains(AddWatchFlags::IN_IGNORED) || m.contains(AddWatchFlags::IN_UNMOUNT) {
            self.dirs.remove(&ev.wd);
            if dir.is_empty() {
                return Err(End::Error(EngineError::new(
                    ErrorCode::FileNotFound,
                    format!(
                        "the watched directory {} is gone (removed, or the sandbox stopped or went to standby)",
                        self.abs
                    ),
                )));
            }
            return Ok(());
        }
        let name = match &ev.name {
            Some(n) => join(&dir, &n.to_string_lossy()),
            // A marked directory's own removal or move: its parent reports it,
            // except for the watched directory itself.
            None if dir.is_empty() => String::new(),
            None => return Ok(()),
        };
        let is_dir = m.contains(AddWatchFlags::IN_ISDIR);
        let file_name = ev.name.as_ref().map(|n| n.to_string_lossy().into_owned());
        let ops = self.changes.of(m, file_name.as_deref(), ev.cookie);
        for op in &ops {
            let ev = FsEvent { op: api_op(*op), name: name.clone(), path: join(&self.abs, &name), dir: is_dir };
            self.tx.send(Ok(ev)).await.map_err(|_| End::Closed)?;
        }
        if self.recursive && is_dir && ops.contains(&WatchOp::Create) {
            self.mark_new(&name).await?;
        }
        Ok(())
    }

    /// Marks a directory that appeared under a recursive watch (and what it holds).
    async fn mark_new(&mut self, rel: &str) -> Result<(), End> {
        let (marks, path) = (self.marks.clone(), join(&self.abs, rel));
        match files::with_fs(&self.st, &self.id, move |fs| mark_tree(&fs, &marks, &path, true)).await {
            Ok((_, new)) => {
                if self.dirs.len() + new.len() > MAX_WATCHED_DIRS {
                    return Err(End::Error(EngineError::new(
                        ErrorCode::TooLarge,
                        format!("the watch of {} grew past {MAX_WATCHED_DIRS} directories, the most one recursive watch marks", self.abs),
                    )));
                }
                self.dirs.extend(new.into_iter().map(|(wd, sub)| (wd, join(rel, &sub))));
                Ok(())
            }
            // Gone again before it could be marked: its removal is reported by its parent.
            Err(e) if e.code() == ErrorCode::FileNotFound => Ok(()),
            Err(e) => Err(End::Error(e)),
        }
    }
}

/// A watch run by a microVM guest's pid 1 ([`strata_init::guestwatch`]).
mod in_guest {
    use std::collections::HashMap;
    use std::time::Duration;

    use strata_api::{ErrorCode, FsEvent};
    use strata_init::channel::{Frame, FrameReader};
    use strata_init::guestwatch::{join, WatchEvent};
    use strata_store::db::SandboxRecord;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::{mpsc, oneshot};

    use super::{api_op, DirWatch, BUFFER};
    use crate::error::{EngineError, EngineResult};
    use crate::state::Shared;

    /// How long the guest may take to mark the tree and answer.
    const PATIENCE: Duration = Duration::from_secs(60);
    /// The most events one frame from the guest may carry.
    const MAX_EVENTS_PER_FRAME: usize = 4096;

    /// Asks the guest of `rec` to watch `path` and relays what it reports.
    pub(super) async fn watch(st: &Shared, rec: &SandboxRecord, path: &str, recursive: bool) -> EngineResult<DirWatch> {
        crate::files::guest::running(rec)?;
        let (rt, id) = (st.runtime_of(&rec.sandbox), rec.sandbox.id.clone());
        let req = strata_init::spawner::Request::Watch { path: path.to_string(), recursive };
        let opened = tokio::task::spawn_blocking(move || rt.pid1_stream(&id, &req, PATIENCE))
            .await
            .map_err(|e| EngineError::internal("watch task", &e))?;
        let (stream, abs) = match opened {
            Ok(x) => x,
            Err(strata_runtime::RuntimeError::Refused(why)) => return Err(refusal(&why)),
            Err(e) => return Err(EngineError::internal("a watch in the guest", &e)),
        };
        let abs = String::from_utf8(abs)
            .ok()
            .filter(|a| {
                a.starts_with('/') && crate::guest_layer::check_path(a.trim_start_matches('/')).is_ok() || a == "/"
            })
            .ok_or_else(|| {
                EngineError::new(ErrorCode::Internal, "the guest named its watched directory with an invalid path")
            })?;
        stream.set_nonblocking(true).map_err(|e| EngineError::internal("a watch in the guest", &e))?;
        let stream =
            tokio::net::UnixStream::from_std(stream).map_err(|e| EngineError::internal("a watch in the guest", &e))?;
        let (tx, rx) = mpsc::channel(BUFFER);
        let (syncs, sync_rx) = mpsc::channel(4);
        let (sandbox, watched) = (rec.sandbox.id.clone(), abs.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = relay(stream, &sandbox, &watched, &tx, sync_rx).await {
                let _ = tx.send(Err(e)).await;
            }
        });
        Ok(DirWatch { path: abs, rx, syncs, ended: None, task })
    }

    /// The guest's refusal (an [`strata_init::guestfs::FsFailure`] as JSON).
    fn refusal(why: &str) -> EngineError {
        match serde_json::from_str(why) {
            Ok(f) => crate::files::guest::error(f),
            Err(_) => EngineError::new(ErrorCode::Internal, format!("the guest refused the watch: {why}")),
        }
    }

    /// Passes the guest's events on and the reader's syncs to the guest until
    /// either side ends; `Ok` when the reader went away.
    async fn relay(
        mut stream: tokio::net::UnixStream,
        sandbox: &str,
        abs: &str,
        tx: &mpsc::Sender<EngineResult<FsEvent>>,
        mut syncs: mpsc::Receiver<oneshot::Sender<()>>,
    ) -> EngineResult<()> {
        let mut reader = FrameReader::default();
        let mut waiting: HashMap<u32, oneshot::Sender<()>> = HashMap::new();
        let mut next_sync = 0u32;
        let mut buf = vec![0u8; 64 << 10];
        let broken = |why: String| {
            EngineError::new(ErrorCode::Internal, format!("the watch of {abs} in microVM {sandbox}: {why}"))
        };
        loop {
            tokio::select! {
                n = stream.read(&mut buf) => {
                    let n = n.map_err(|e| broken(e.to_string()))?;
                    if n == 0 {
                        return Err(EngineError::new(
                            ErrorCode::FileNotFound,
                            format!("the watched directory {abs} is gone from reach: microVM {sandbox} stopped, or its guest was saved (standby, a warm checkpoint) or restored; watch it again once it runs"),
                        ));
                    }
                    reader.push(&buf[..n]);
                    while let Some((kind, payload)) = reader.next_frame().map_err(|e| broken(e.0))? {
                        match kind {
                            Frame::Stdout => {
                                let events: Vec<WatchEvent> = serde_json::from_slice(&payload)
                                    .map_err(|e| broken(format!("events that do not parse: {e}")))?;
                                if events.len() > MAX_EVENTS_PER_FRAME {
                                    return Err(broken(format!("{} events in one frame", events.len())));
                                }
                                for ev in events {
                                    if !ev.name.is_empty() {
                                        crate::guest_layer::check_path(&ev.name).map_err(broken)?;
                                    }
                                    let path = join(abs, &ev.name);
                                    let ev = FsEvent { op: api_op(ev.op), name: ev.name, path, dir: ev.dir };
                                    if tx.send(Ok(ev)).await.is_err() {
                                        return Ok(());
                                    }
                                }
                            }
                            Frame::Signaled => {
                                let n = payload.as_slice().try_into().map(u32::from_le_bytes).unwrap_or(u32::MAX);
                                if let Some(ack) = waiting.remove(&n) {
                                    let _ = ack.send(());
                                }
                            }
                            Frame::Failed => {
                                return Err(match serde_json::from_slice(&payload) {
                                    Ok(f) => crate::files::guest::error(f),
                                    Err(_) => broken(String::from_utf8_lossy(&payload).into_owned()),
                                });
                            }
                            other => return Err(broken(format!("an unexpected {other:?} frame"))),
                        }
                    }
                }
                ack = syncs.recv() => {
                    let Some(ack) = ack else { return Ok(()) };
                    next_sync = next_sync.wrapping_add(1);
                    let mut frame = Vec::new();
                    strata_init::channel::encode(&mut frame, Frame::Stdin, &next_sync.to_le_bytes());
                    stream.write_all(&frame).await.map_err(|e| broken(e.to_string()))?;
                    waiting.insert(next_sync, ack);
                }
            }
        }
    }
}
