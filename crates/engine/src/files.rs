//! File transfer and file-system operations inside running sandboxes.
//!
//! Every operation runs on a thread of its own with the sandbox root's
//! capabilities ([`crate::privileges`]) over the confined root of
//! [`crate::sandboxfs`]. Transfers stream through bounded buffers
//! ([`crate::transfer`]): downloads are read as they are sent, uploads are
//! written as they arrive (into a temp file renamed into place at the end,
//! or, for tar, applied entry by entry and rolled back if refused), so no
//! transfer ever sits whole in the daemon's memory.
//!
//! A microVM's files are its guest's (the host never mounts its disk): the
//! same operations are done by its pid 1 ([`strata_init::guestfs`]), with the
//! same rules (no secrets, no pseudo-filesystems or special files) and the
//! same error codes; see [`guest`].

use strata_api::{DownloadQuery, ErrorCode, SandboxState, UploadQuery};
use strata_store::db::SandboxRecord;
use tokio::sync::oneshot;

use crate::error::{EngineError, EngineResult};
use crate::privileges::SandboxRootCaps;
use crate::record::load;
use crate::sandboxfs::{FsError, SandboxFs};
use crate::state::Shared;
use crate::transfer::{self, FeedError};

/// Largest upload accepted in one request (counted while it streams).
pub const MAX_UPLOAD_BYTES: u64 = 4 << 30;
/// Where a sandbox's secrets are mounted (never served, left out of tar downloads).
pub const SECRETS_DIR: &str = "/run/secrets";

impl From<FsError> for EngineError {
    fn from(e: FsError) -> Self {
        match &e {
            FsError::Escape(_) => EngineError::new(ErrorCode::PathEscape, e.to_string()),
            FsError::Invalid(_) | FsError::Loop(_) | FsError::CutOff(_) => EngineError::bad_request(e.to_string()),
            FsError::NotFound(_) => EngineError::new(ErrorCode::FileNotFound, e.to_string()),
            FsError::PseudoFs { .. } => EngineError::new(ErrorCode::PseudoFilesystem, e.to_string()),
            FsError::Special { .. } => EngineError::new(ErrorCode::SpecialFile, e.to_string()),
            FsError::MountPoint(_) => EngineError::new(ErrorCode::MountPoint, e.to_string()),
            FsError::Archive { .. } => EngineError::new(ErrorCode::InvalidArchive, e.to_string()),
            FsError::TooLarge(_) => EngineError::new(ErrorCode::TooLarge, e.to_string()),
            FsError::Privileges(_) => EngineError::internal("file operation", &e),
            FsError::Io { source, path } => match source.raw_os_error() {
                // Our own errors (a directory where a file was asked for, a move across filesystems).
                None => EngineError::bad_request(format!("{path}: {source}")),
                Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG) => EngineError::new(
                    ErrorCode::TooLarge,
                    format!("{}: the sandbox's disk has no room for it", crate::error::chain(&e)),
                ),
                Some(
                    libc::ENOTDIR
                    | libc::EISDIR
                    | libc::EEXIST
                    | libc::ENOTEMPTY
                    | libc::EINVAL
                    | libc::EROFS
                    | libc::EACCES
                    | libc::EPERM
                    | libc::EBUSY
                    | libc::ENAMETOOLONG
                    | libc::EMLINK
                    | libc::ETXTBSY
                    | libc::ENXIO
                    | libc::EOPNOTSUPP,
                ) => EngineError::bad_request(crate::error::chain(&e)),
                _ => EngineError::internal("file operation", &e),
            },
        }
    }
}

/// The host pid of a running sandbox's init: its files are reachable only then.
pub fn init_pid(rec: &SandboxRecord) -> EngineResult<i32> {
    match (rec.sandbox.state, rec.sandbox.init_pid) {
        (SandboxState::Running | SandboxState::Paused, Some(pid)) => Ok(pid),
        (s, _) => Err(EngineError::invalid_state(
            s,
            format!("files of sandbox {} are reachable while it runs; it is {s}", rec.sandbox.id),
        )),
    }
}

/// Where a running sandbox's root is found: its tier's runtime and its init.
pub struct FsRoot {
    rt: std::sync::Arc<dyn strata_runtime::Runtime>,
    id: String,
    handle: strata_runtime::SandboxHandle,
    userns: Option<strata_api::UserNamespace>,
}

/// The root of a running sandbox (409 when it is not running).
pub fn fs_root(st: &Shared, rec: &SandboxRecord) -> EngineResult<FsRoot> {
    // A microVM's files are its guest's: every caller asks it instead ([`guest`]).
    crate::state::tiers::refuse_microvm(&rec.sandbox, "file access from the host")?;
    let pid = init_pid(rec)?;
    let handle = crate::record::handle_of(rec).ok_or_else(|| {
        EngineError::new(ErrorCode::Internal, format!("sandbox {} runs without an init", rec.sandbox.id))
    })?;
    debug_assert_eq!(handle.init_pid, pid);
    Ok(FsRoot { rt: st.runtime_of(&rec.sandbox), id: rec.sandbox.id.clone(), handle, userns: rec.sandbox.userns })
}

/// Opens the sandbox's root through its tier (with the daemon's privileges:
/// `/proc/<init>/root` of a non-dumpable init takes CAP_SYS_PTRACE), then
/// lowers the calling thread to the sandbox root's capabilities (and, in a
/// user namespace, its ids) for as long as the guard lives.
fn enter(root: &FsRoot) -> Result<(SandboxFs, SandboxRootCaps), FsError> {
    let fd = root.rt.open_root(&root.id, &root.handle).map_err(|e| FsError::Io { path: "/".into(), source: e })?;
    let fs = SandboxFs::from_root(fd).with_userns(root.userns);
    let caps = SandboxRootCaps::lower_as(root.userns.map(|u| u.host_base))?;
    Ok((fs, caps))
}

/// Runs `f` on the confined root of a running sandbox, off the async threads,
/// with the sandbox root's capabilities.
pub async fn with_fs<T: Send + 'static>(
    st: &Shared,
    id: &str,
    f: impl FnOnce(SandboxFs) -> Result<T, FsError> + Send + 'static,
) -> EngineResult<T> {
    let root = fs_root(st, &load(st, id)?)?;
    tokio::task::spawn_blocking(move || {
        let (fs, _caps) = enter(&root)?;
        f(fs)
    })
    .await
    .map_err(|e| EngineError::internal("file task", &e))?
    .map_err(EngineError::from)
}

/// Refuses paths under the secrets mount (when the sandbox has secrets).
pub fn refuse_secrets(fs: &SandboxFs, path: &str) -> Result<(), FsError> {
    let comps = fs.resolve(path, true)?;
    if comps.len() >= 2 && comps[0] == "run" && comps[1] == "secrets" {
        return Err(FsError::Invalid(format!(
            "{path} (the secrets under {SECRETS_DIR} are not served by the file API)"
        )));
    }
    Ok(())
}

/// The answer to an upload body that could not be taken.
pub fn feed_error(e: FeedError) -> EngineError {
    match e {
        FeedError::TooLarge(limit) => EngineError::new(
            ErrorCode::TooLarge,
            format!("the upload is larger than {limit} bytes, the most one upload may be; nothing was kept"),
        ),
        FeedError::Body(e) => EngineError::bad_request(format!("reading the upload: {e}; nothing was kept")),
    }
}

/// A download under way: its length (a file; `None` for a tar stream) and its bytes.
pub struct Download {
    /// The file's length, announced before its bytes (`None`: a tar stream).
    pub len: Option<u64>,
    /// The bytes, read on a transfer thread of their own as they are taken.
    pub stream: transfer::ByteStream,
}

/// Starts a download of a file, or with `tar` of a tar stream of a file or
/// directory, from inside the sandbox (its root's credentials, confined to its
/// root; secrets refused and left out of tars). Answers once the transfer is
/// under way, so a refusal is an error here rather than a broken stream.
pub async fn download(st: &Shared, id: &str, q: DownloadQuery) -> EngineResult<Download> {
    let rec = load(st, id)?;
    if crate::guest_layer::in_guest(st, &rec) {
        return Box::pin(guest::download(st, &rec, q)).await;
    }
    let root = fs_root(st, &rec)?;
    let has_secrets = !st.secrets.get(&rec.sandbox.id)?.is_empty();
    let sandbox = rec.sandbox.id.clone();
    // Ok(Some(len)) for a file, Ok(None) for a tar stream, once the transfer is under way.
    let (ready_tx, ready_rx) = oneshot::channel::<Result<Option<u64>, FsError>>();
    let (mut out, stream) = transfer::download_channel();
    transfer::spawn(move || {
        let (fs, _caps) = match enter(&root) {
            Ok(x) => x,
            Err(e) => {
                let _ = ready_tx.send(Err(e));
                return;
            }
        };
        let res = if q.tar {
            let root = (|| {
                if has_secrets {
                    refuse_secrets(&fs, &q.path)?;
                }
                fs.tar_root(&q.path)
            })();
            let root = match root {
                Ok(r) => r,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(None));
            // Secrets are never echoed back: a tar of a directory above them leaves them out.
            let exclude: &[&str] = if has_secrets { &[SECRETS_DIR] } else { &[] };
            fs.write_tar(root, &mut out, exclude)
                .map_err(|e| std::io::Error::other(e.to_string()))
                .and_then(|_| std::io::Write::flush(&mut out))
        } else {
            let opened = (|| {
                if has_secrets {
                    refuse_secrets(&fs, &q.path)?;
                }
                fs.open_read(&q.path)
            })();
            let (file, len) = match opened {
                Ok(x) => x,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(Some(len)));
            out.copy_exact(file, len)
        };
        if let Err(e) = res {
            if !out.is_closed() {
                tracing::warn!(sandbox = %sandbox, path = %q.path, error = %e, "file download cut short");
            }
            out.fail(e);
        }
    })
    .map_err(|e| EngineError::internal("file transfer thread", &e))?;
    let len = match ready_rx.await {
        Ok(Ok(len)) => len,
        Ok(Err(e)) => return Err(e.into()),
        Err(_) => {
            return Err(EngineError::new(
                ErrorCode::Internal,
                "file transfer: the transfer thread ended without an answer",
            ))
        }
    };
    Ok(Download { len, stream })
}

/// Uploads `body` to a file (streamed into a temp file, renamed into place once
/// complete), or with `tar` extracts it under a directory (applied as it
/// streams, rolled back if any entry is refused). At most [`MAX_UPLOAD_BYTES`].
pub async fn upload<S, E>(st: &Shared, id: &str, q: UploadQuery, body: S) -> EngineResult<()>
where
    S: futures_util::Stream<Item = Result<transfer::Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let rec = load(st, id)?;
    if crate::guest_layer::in_guest(st, &rec) {
        return Box::pin(guest::upload(st, &rec, q, body)).await;
    }
    let root = fs_root(st, &rec)?;
    let mode = q.mode.unwrap_or(0o644) & 0o7777 & !0o6000;
    let (tx, mut reader) = transfer::upload_channel();
    let (done_tx, done_rx) = oneshot::channel::<Result<(), FsError>>();
    transfer::spawn(move || {
        let res = enter(&root).and_then(|(fs, _caps)| {
            if q.tar {
                let n = fs.untar_from(&q.path, &mut reader)?;
                // The archive is complete (and applied): what follows its end marker is padding.
                let _ = reader.drain();
                tracing::debug!(path = %q.path, entries = n, "tar upload applied");
                Ok(())
            } else {
                fs.write_from(&q.path, &mut reader, mode).map(drop)
            }
        });
        let _ = done_tx.send(res);
    })
    .map_err(|e| EngineError::internal("file transfer thread", &e))?;
    match transfer::feed_upload(body, tx, MAX_UPLOAD_BYTES, done_rx).await {
        Ok(Some(Ok(()))) => Ok(()),
        Ok(Some(Err(e))) => Err(e.into()),
        Ok(None) => {
            Err(EngineError::new(ErrorCode::Internal, "file transfer: the transfer thread ended without an answer"))
        }
        Err(e) => Err(feed_error(e)),
    }
}

/// The file API of a microVM, done by its guest's pid 1.
pub(crate) mod guest {
    use strata_api::{DownloadQuery, ErrorCode, FileKind, FileStat, SandboxState, UploadQuery};
    use strata_init::guestfs::{FsFailure, FsOp, Stat};
    use strata_store::db::SandboxRecord;
    use tokio::sync::oneshot;

    use super::{init_pid, Download, MAX_UPLOAD_BYTES};
    use crate::error::{EngineError, EngineResult};
    use crate::sandboxfs::FsError;
    use crate::state::Shared;
    use crate::transfer;

    /// The most a guest's answer to a stat, a listing or an operation may
    /// take (it is held whole in the daemon's memory; a listing has at most
    /// [`strata_init::guestfs::MAX_LIST`] entries).
    const MAX_ANSWER_BYTES: u64 = 64 << 20;

    /// The guest's refusal as the file API's error (the codes of the other tiers).
    pub(crate) fn error(f: FsFailure) -> EngineError {
        match (f.rule.as_deref(), f.errno) {
            (Some("special"), _) => EngineError::new(ErrorCode::SpecialFile, f.message),
            (Some("too_large"), _) => EngineError::new(ErrorCode::TooLarge, f.message),
            (Some("gone"), _) => EngineError::new(ErrorCode::FileNotFound, f.message),
            (Some("pseudo_fs"), _) => EngineError::new(ErrorCode::PseudoFilesystem, f.message),
            (Some("archive"), _) => EngineError::new(ErrorCode::InvalidArchive, f.message),
            (Some(_), _) => EngineError::bad_request(f.message),
            (None, libc::ENOENT) => FsError::NotFound(f.path).into(),
            (None, errno) if !f.path.is_empty() => {
                FsError::Io { path: f.path, source: std::io::Error::from_raw_os_error(errno) }.into()
            }
            (None, _) => EngineError::new(ErrorCode::Internal, f.message),
        }
    }

    /// A running (not paused: its guest would not answer) microVM.
    pub(crate) fn running(rec: &SandboxRecord) -> EngineResult<()> {
        init_pid(rec)?;
        if rec.sandbox.state == SandboxState::Paused {
            return Err(EngineError::invalid_state(
                SandboxState::Paused,
                format!("the files of microVM {} are served by its guest, which is paused", rec.sandbox.id),
            ));
        }
        Ok(())
    }

    fn file_stat(s: Stat) -> FileStat {
        let kind = match s.kind.as_str() {
            "file" => FileKind::File,
            "dir" => FileKind::Dir,
            "symlink" => FileKind::Symlink,
            _ => FileKind::Other,
        };
        FileStat {
            path: s.path,
            name: s.name,
            kind,
            size: s.size,
            mode: s.mode,
            uid: s.uid,
            gid: s.gid,
            mtime: s.mtime,
            link_target: s.link_target,
            link_resolved: None,
            xattrs: s.xattrs,
        }
    }

    /// Runs `op` in the guest of `rec` (off the async workers); its answer's bytes.
    async fn run(st: &Shared, rec: &SandboxRecord, op: FsOp) -> EngineResult<Vec<u8>> {
        run_with(st, rec, op, None).await
    }

    /// [`run`], with `input` sent to pid 1 after the request (what a write takes).
    async fn run_with(
        st: &Shared,
        rec: &SandboxRecord,
        op: FsOp,
        mut input: Option<Box<dyn std::io::Read + Send>>,
    ) -> EngineResult<Vec<u8>> {
        running(rec)?;
        let (rt, id) = (st.runtime_of(&rec.sandbox), rec.sandbox.id.clone());
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            let input = input.as_mut().map(|r| &mut **r as &mut dyn std::io::Read);
            rt.guest_fs(&id, &op, input, &mut out, MAX_ANSWER_BYTES).map(|()| out)
        })
        .await
        .map_err(|e| EngineError::internal("file task", &e))?
        .map_err(error)
    }

    fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> EngineResult<T> {
        serde_json::from_slice(bytes)
            .map_err(|e| EngineError::new(ErrorCode::Internal, format!("the guest's answer does not parse: {e}")))
    }

    /// A path's metadata.
    pub(crate) async fn stat(st: &Shared, rec: &SandboxRecord, path: String) -> EngineResult<FileStat> {
        Ok(file_stat(parse(&run(st, rec, FsOp::Stat { path }).await?)?))
    }

    /// A directory's entries.
    pub(crate) async fn list(st: &Shared, rec: &SandboxRecord, path: String) -> EngineResult<Vec<FileStat>> {
        let list: Vec<Stat> = parse(&run(st, rec, FsOp::List { path }).await?)?;
        Ok(list.into_iter().map(file_stat).collect())
    }

    /// An operation without an answer (mkdir, remove, rename).
    pub(crate) async fn act(st: &Shared, rec: &SandboxRecord, op: FsOp) -> EngineResult<()> {
        run(st, rec, op).await.map(drop)
    }

    /// A write ([`FsOp::Write`], [`FsOp::WriteTar`]) of what `reader` gives,
    /// a reader the engine holds (a template's COPY), not a request body.
    pub(crate) async fn write_from(
        st: &Shared,
        rec: &SandboxRecord,
        op: FsOp,
        reader: Box<dyn std::io::Read + Send>,
    ) -> EngineResult<()> {
        run_with(st, rec, op, Some(reader)).await.map(drop)
    }

    /// What a download's bytes are written through: a file's length (its
    /// first 8 bytes) or, for a tar, its first byte says the transfer is
    /// under way; the rest goes to the client.
    struct Answer {
        ready: Option<oneshot::Sender<Result<Option<u64>, EngineError>>>,
        tar: bool,
        head: Vec<u8>,
        out: transfer::ChunkSender,
    }

    impl std::io::Write for Answer {
        fn write(&mut self, mut data: &[u8]) -> std::io::Result<usize> {
            let n = data.len();
            if self.ready.is_some() {
                if self.tar {
                    let _ = self.ready.take().expect("checked").send(Ok(None));
                } else {
                    let take = (8 - self.head.len()).min(data.len());
                    self.head.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if self.head.len() < 8 {
                        return Ok(n);
                    }
                    let len = u64::from_le_bytes(self.head[..8].try_into().expect("8 bytes"));
                    let _ = self.ready.take().expect("checked").send(Ok(Some(len)));
                }
            }
            self.out.write_all(data)?;
            Ok(n)
        }

        fn flush(&mut self) -> std::io::Result<()> {
            self.out.flush()
        }
    }

    /// A file (its length first) or a tar stream, from the guest.
    pub(crate) async fn download(st: &Shared, rec: &SandboxRecord, q: DownloadQuery) -> EngineResult<Download> {
        running(rec)?;
        let (ready_tx, ready_rx) = oneshot::channel();
        let (out, stream) = transfer::download_channel();
        let (rt, id) = (st.runtime_of(&rec.sandbox), rec.sandbox.id.clone());
        let op = if q.tar { FsOp::ReadTar { path: q.path.clone() } } else { FsOp::Read { path: q.path.clone() } };
        transfer::spawn(move || {
            let mut answer = Answer { ready: Some(ready_tx), tar: q.tar, head: Vec::new(), out };
            // A download streams through bounded buffers to its client: no bound on its length.
            let r = rt.guest_fs(&id, &op, None, &mut answer, u64::MAX);
            // An empty tar or file still says it is under way (and an answer that ends early is an error).
            if r.is_ok() {
                if let Some(ready) = answer.ready.take() {
                    let _ = ready.send(if q.tar {
                        Ok(None)
                    } else {
                        Err(EngineError::new(ErrorCode::Internal, "the guest's answer ended before the file's length"))
                    });
                }
            }
            match r {
                Ok(()) => {
                    let _ = std::io::Write::flush(&mut answer.out);
                }
                Err(f) => match answer.ready.take() {
                    Some(ready) => {
                        let _ = ready.send(Err(error(f)));
                    }
                    None => {
                        tracing::warn!(sandbox = %id, path = %q.path, error = %f.message, "file download cut short");
                        answer.out.fail(std::io::Error::other(f.message));
                    }
                },
            }
        })
        .map_err(|e| EngineError::internal("file transfer thread", &e))?;
        match ready_rx.await {
            Ok(Ok(len)) => Ok(Download { len, stream }),
            Ok(Err(e)) => Err(e),
            Err(_) => {
                Err(EngineError::new(ErrorCode::Internal, "file transfer: the transfer thread ended without an answer"))
            }
        }
    }

    /// A file (replaced whole once complete) or a tar extracted under a directory, into the guest.
    pub(crate) async fn upload<S, E>(st: &Shared, rec: &SandboxRecord, q: UploadQuery, body: S) -> EngineResult<()>
    where
        S: futures_util::Stream<Item = Result<transfer::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        running(rec)?;
        let mode = q.mode.unwrap_or(0o644) & 0o7777 & !0o6000;
        let op =
            if q.tar { FsOp::WriteTar { path: q.path.clone() } } else { FsOp::Write { path: q.path.clone(), mode } };
        let (tx, mut reader) = transfer::upload_channel();
        let (done_tx, done_rx) = oneshot::channel::<Result<(), FsFailure>>();
        let (rt, id) = (st.runtime_of(&rec.sandbox), rec.sandbox.id.clone());
        transfer::spawn(move || {
            let r = rt.guest_fs(&id, &op, Some(&mut reader), &mut std::io::sink(), 0);
            let _ = reader.drain();
            let _ = done_tx.send(r);
        })
        .map_err(|e| EngineError::internal("file transfer thread", &e))?;
        match transfer::feed_upload(body, tx, MAX_UPLOAD_BYTES, done_rx).await {
            Ok(Some(Ok(()))) => Ok(()),
            Ok(Some(Err(f))) => Err(error(f)),
            Ok(None) => {
                Err(EngineError::new(ErrorCode::Internal, "file transfer: the transfer thread ended without an answer"))
            }
            Err(e) => Err(super::feed_error(e)),
        }
    }
}
