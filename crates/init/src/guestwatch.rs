//! Directory watches: what an inotify event means to a watch's reader
//! ([`Changes`], shared with the host's watches of the other tiers), and
//! the watch a microVM guest's pid 1 runs in its own root
//! ([`crate::spawner::Request::Watch`]), since the host never mounts a
//! microVM's disk and its kernel sees none of the guest's writes.
//!
//! A guest watch's stream, after pid 1's first answer ([`Frame::Started`]
//! with the watched directory, symlinks resolved, or [`Frame::Failed`] with a
//! [`FsFailure`] as JSON):
//!
//! * pid 1 -> host: [`Frame::Stdout`], a JSON array of [`WatchEvent`]s, as
//!   they happen; [`Frame::Signaled`] `n` (u32 LE) once every event queued
//!   before the host's sync `n` was sent; [`Frame::Failed`] (a
//!   [`FsFailure`]: `too_large` when the kernel's queue overflowed, `gone`
//!   when the watched directory went away) ends it.
//! * host -> pid 1: [`Frame::Stdin`] `n` (u32 LE), a sync; the end of the
//!   stream ends the watch.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent, WatchDescriptor};
use serde::{Deserialize, Serialize};

use crate::channel::{self, Frame, FrameReader};
use crate::guestfs::{FsFailure, SECRETS_DIR};

/// Most directories one recursive watch marks.
pub const MAX_WATCHED_DIRS: usize = 8192;

/// The changes a watch reports, as inotify marks.
pub fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_ONLYDIR
}

/// Whether `name` is a temporary file of the file API (`.strata-<what>-<16
/// hex digits>`): an upload in progress, which watches do not report.
pub fn is_temp_name(name: &str) -> bool {
    name.strip_prefix(".strata-")
        .and_then(|rest| rest.rsplit_once('-'))
        .is_some_and(|(what, hex)| !what.is_empty() && hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// What happened to an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchOp {
    /// Created, or moved in.
    Create,
    /// Moved away.
    Rename,
    /// Its metadata changed.
    Chmod,
    /// Written.
    Write,
    /// Removed.
    Remove,
}

/// One change a guest's watch reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    /// What happened.
    pub op: WatchOp,
    /// The entry, relative to the watched directory (`""`: the directory itself).
    pub name: String,
    /// Whether it is a directory.
    pub dir: bool,
}

/// Turns inotify events into the changes a reader sees. The file API's own
/// temporary files are not shown; an upload put in place by a rename shows
/// as the sandbox sees its result: the file created and written.
#[derive(Debug, Default)]
pub struct Changes {
    /// Cookies of temporary files moved away (an upload put in place).
    temp_moves: HashSet<u32>,
}

impl Changes {
    /// The changes one event reports for its entry named `file_name`.
    pub fn of(&mut self, mask: AddWatchFlags, file_name: Option<&str>, cookie: u32) -> Vec<WatchOp> {
        if file_name.is_some_and(is_temp_name) {
            if mask.contains(AddWatchFlags::IN_MOVED_FROM) {
                self.temp_moves.insert(cookie);
            }
            return Vec::new();
        }
        let is_dir = mask.contains(AddWatchFlags::IN_ISDIR);
        if mask.contains(AddWatchFlags::IN_MOVED_TO) && self.temp_moves.remove(&cookie) && !is_dir {
            return vec![WatchOp::Create, WatchOp::Write];
        }
        let ops = [
            (AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO, WatchOp::Create),
            (AddWatchFlags::IN_MOVED_FROM | AddWatchFlags::IN_MOVE_SELF, WatchOp::Rename),
            (AddWatchFlags::IN_ATTRIB, WatchOp::Chmod),
            (AddWatchFlags::IN_MODIFY, WatchOp::Write),
            (AddWatchFlags::IN_DELETE | AddWatchFlags::IN_DELETE_SELF, WatchOp::Remove),
        ];
        ops.into_iter().filter(|(bits, _)| mask.intersects(*bits)).map(|(_, op)| op).collect()
    }
}

/// `rel` under `base` (either may be empty).
pub fn join(base: &str, rel: &str) -> String {
    match (base, rel) {
        (b, "") => b.to_string(),
        ("", r) => r.to_string(),
        ("/", r) => format!("/{r}"),
        (b, r) => format!("{b}/{r}"),
    }
}

/// A watch in the guest: its inotify instance and the directories it marks.
struct GuestWatch {
    ino: Inotify,
    /// The watched directory (absolute, symlinks resolved).
    abs: PathBuf,
    recursive: bool,
    /// Marked directories, relative to `abs` (`""`: `abs` itself).
    dirs: HashMap<WatchDescriptor, String>,
    changes: Changes,
}

impl GuestWatch {
    fn start(path: &str, recursive: bool) -> Result<GuestWatch, FsFailure> {
        let asked = crate::guestfs::check(path)?;
        let abs = std::fs::canonicalize(&asked).map_err(|e| FsFailure::io(path, e))?;
        // A symlink may lead where a path may not be named.
        let abs = crate::guestfs::check(&abs.to_string_lossy())?;
        if let Some(fs) = crate::guestfs::pseudo_fs(&abs) {
            return Err(crate::guestfs::pseudo(path, fs));
        }
        let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| FsFailure::io(path, std::io::Error::from(e)))?;
        let mut w = GuestWatch { ino, abs, recursive, dirs: HashMap::new(), changes: Changes::default() };
        let wd = w.mark(&w.abs.clone()).map_err(|e| FsFailure::io(path, e))?;
        w.dirs.insert(wd, String::new());
        if recursive {
            w.mark_below("")?;
        }
        Ok(w)
    }

    fn mark(&self, dir: &Path) -> std::io::Result<WatchDescriptor> {
        self.ino.add_watch(dir, mask() | AddWatchFlags::IN_DONT_FOLLOW).map_err(std::io::Error::from)
    }

    /// Marks every directory under `rel` (symlinks, pseudo-filesystems and
    /// the secrets not followed).
    fn mark_below(&mut self, rel: &str) -> Result<(), FsFailure> {
        let mut todo = vec![rel.to_string()];
        while let Some(rel) = todo.pop() {
            let dir = self.abs.join(&rel);
            let Ok(entries) = std::fs::read_dir(&dir) else { continue }; // gone since: its removal is reported
            for e in entries.flatten() {
                if !e.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let path = e.path();
                if path.starts_with(SECRETS_DIR) || crate::guestfs::pseudo_fs(&path).is_some() {
                    continue;
                }
                if self.dirs.len() >= MAX_WATCHED_DIRS {
                    return Err(FsFailure::rule(
                        "too_large",
                        format!(
                            "{}: more than {MAX_WATCHED_DIRS} directories, the most one recursive watch marks (watch a smaller tree)",
                            self.abs.display()
                        ),
                    ));
                }
                let sub = join(&rel, &e.file_name().to_string_lossy());
                match self.mark(&path) {
                    Ok(wd) => {
                        self.dirs.insert(wd, sub.clone());
                    }
                    // Gone or replaced by a symlink since it was listed.
                    Err(_) => continue,
                }
                todo.push(sub);
            }
        }
        Ok(())
    }

    /// Every event queued now, as changes (appended to `out`).
    fn take(&mut self, out: &mut Vec<WatchEvent>) -> Result<(), FsFailure> {
        loop {
            match self.ino.read_events() {
                Ok(events) => {
                    for ev in events {
                        self.event(ev, out)?;
                    }
                }
                Err(nix::errno::Errno::EAGAIN) => return Ok(()),
                Err(e) => return Err(FsFailure::io(&self.abs.to_string_lossy(), e.into())),
            }
        }
    }

    fn event(&mut self, ev: InotifyEvent, out: &mut Vec<WatchEvent>) -> Result<(), FsFailure> {
        let m = ev.mask;
        let shown = self.abs.display().to_string();
        if m.contains(AddWatchFlags::IN_Q_OVERFLOW) {
            return Err(FsFailure::rule(
                "too_large",
                format!("the watch of {shown} fell behind: the kernel's queue of its events overflowed and some were lost, so it ends (start a new one and re-read the directory)"),
            ));
        }
        let Some(dir) = self.dirs.get(&ev.wd).cloned() else { return Ok(()) };
        if m.contains(AddWatchFlags::IN_IGNORED) || m.contains(AddWatchFlags::IN_UNMOUNT) {
            self.dirs.remove(&ev.wd);
            if dir.is_empty() {
                return Err(FsFailure::rule("gone", format!("the watched directory {shown} is gone (removed)")));
            }
            return Ok(());
        }
        let file_name = ev.name.as_ref().map(|n| n.to_string_lossy().into_owned());
        let name = match &file_name {
            Some(n) => join(&dir, n),
            // A marked directory's own removal or move: its parent reports it,
            // except for the watched directory itself.
            None if dir.is_empty() => String::new(),
            None => return Ok(()),
        };
        let is_dir = m.contains(AddWatchFlags::IN_ISDIR);
        for op in self.changes.of(m, file_name.as_deref(), ev.cookie) {
            out.push(WatchEvent { op, name: name.clone(), dir: is_dir });
        }
        let appeared = m.intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO);
        if self.recursive && is_dir && appeared && !file_name.as_deref().is_some_and(is_temp_name) {
            let path = self.abs.join(&name);
            if !path.starts_with(SECRETS_DIR) && crate::guestfs::pseudo_fs(&path).is_none() {
                if self.dirs.len() >= MAX_WATCHED_DIRS {
                    return Err(FsFailure::rule(
                        "too_large",
                        format!("the watch of {shown} grew past {MAX_WATCHED_DIRS} directories, the most one recursive watch marks"),
                    ));
                }
                if let Ok(wd) = self.mark(&path) {
                    self.dirs.insert(wd, name.clone());
                    self.mark_below(&name)?;
                }
            }
        }
        Ok(())
    }
}

fn send_events(stream: &mut UnixStream, events: &mut Vec<WatchEvent>) -> std::io::Result<()> {
    // At most ~1 MiB per frame: a few thousand events each.
    for chunk in events.chunks(2048) {
        let json = serde_json::to_vec(chunk).expect("events serialize");
        channel::write_frame(stream, Frame::Stdout, &json)?;
    }
    events.clear();
    Ok(())
}

/// Serves [`crate::spawner::Request::Watch`] of `path` on `stream` (blocking,
/// in a thread of its own) until the host closes it or the watch cannot go
/// on; `reader` holds what the host sent after its request.
pub fn serve(stream: UnixStream, reader: FrameReader, path: &str, recursive: bool, cuts: &crate::guestport::Cuts) {
    // Registered before the tree is marked (which may take a while): a cut ends it at any step.
    let held = cuts.register(&[stream.as_fd()]);
    start_and_run(stream, reader, path, recursive);
    // The stream and the marks are closed (by the call above) before the registry lets go of them.
    drop(held);
}

/// [`serve`]'s work; consumes (and so closes) the stream before it returns.
fn start_and_run(mut stream: UnixStream, reader: FrameReader, path: &str, recursive: bool) {
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    let w = match GuestWatch::start(path, recursive) {
        Ok(w) => w,
        Err(f) => return fail(&mut stream, &f),
    };
    if channel::write_frame(&mut stream, Frame::Started, w.abs.to_string_lossy().as_bytes()).is_ok() {
        run(stream, reader, w);
    }
}

/// Ends a watch with `f` (as JSON).
fn fail(stream: &mut UnixStream, f: &FsFailure) {
    let _ = channel::write_frame(stream, Frame::Failed, &serde_json::to_vec(f).expect("serializes"));
}

/// A started watch's loop (see [`serve`]); ends with the stream closed.
fn run(mut stream: UnixStream, mut reader: FrameReader, mut w: GuestWatch) {
    let mut events = Vec::new();
    let mut chunk = vec![0u8; 4096];
    loop {
        // Syncs first: what the host sent with its request, then what arrives.
        loop {
            match reader.next_frame() {
                Ok(Some((Frame::Stdin, sync))) => {
                    if let Err(f) = w.take(&mut events) {
                        let _ = send_events(&mut stream, &mut events);
                        return fail(&mut stream, &f);
                    }
                    if send_events(&mut stream, &mut events).is_err()
                        || channel::write_frame(&mut stream, Frame::Signaled, &sync).is_err()
                    {
                        return;
                    }
                }
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => break,
            }
        }
        let (host_ready, ino_ready) = {
            let mut fds =
                [PollFd::new(stream.as_fd(), PollFlags::POLLIN), PollFd::new(w.ino.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return,
            }
            let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
            (ready(&fds[0]), ready(&fds[1]))
        };
        if ino_ready {
            if let Err(f) = w.take(&mut events) {
                let _ = send_events(&mut stream, &mut events);
                return fail(&mut stream, &f);
            }
            if send_events(&mut stream, &mut events).is_err() {
                return;
            }
        }
        if host_ready {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return, // the host ended the watch
                Ok(n) => reader.push(&chunk[..n]),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_api_s_temp_files_are_told_apart() {
        assert!(is_temp_name(".strata-upload-0123456789abcdef"));
        assert!(!is_temp_name(".strata-upload-0123"));
        assert!(!is_temp_name("strata-upload-0123456789abcdef"));
        assert!(!is_temp_name(".strata--0123456789abcdef"));
        assert!(!is_temp_name("notes.txt"));
    }

    #[test]
    fn names_join_under_the_watched_directory() {
        assert_eq!(join("/home/user", ""), "/home/user");
        assert_eq!(join("/home/user", "a/b"), "/home/user/a/b");
        assert_eq!(join("/", "etc"), "/etc");
        assert_eq!(join("", "x"), "x");
        assert_eq!(join("sub", "f.txt"), "sub/f.txt");
    }

    #[test]
    fn an_upload_put_in_place_is_a_create_and_a_write() {
        let mut c = Changes::default();
        let tmp = ".strata-upload-0123456789abcdef";
        assert!(c.of(AddWatchFlags::IN_CREATE, Some(tmp), 0).is_empty());
        assert!(c.of(AddWatchFlags::IN_MOVED_FROM, Some(tmp), 7).is_empty());
        assert_eq!(c.of(AddWatchFlags::IN_MOVED_TO, Some("f.txt"), 7), [WatchOp::Create, WatchOp::Write]);
        assert_eq!(c.of(AddWatchFlags::IN_MOVED_TO, Some("g.txt"), 8), [WatchOp::Create]);
        assert_eq!(c.of(AddWatchFlags::IN_DELETE | AddWatchFlags::IN_ISDIR, Some("d"), 0), [WatchOp::Remove]);
    }

    fn next(host: &mut UnixStream) -> (Frame, Vec<u8>) {
        channel::read_one_frame(host, channel::MAX_FRAME).unwrap().expect("a frame")
    }

    /// Events until the answer to sync `n`.
    fn sync(host: &mut UnixStream, n: u32) -> Vec<WatchEvent> {
        channel::write_frame(host, Frame::Stdin, &n.to_le_bytes()).unwrap();
        let mut got = Vec::new();
        loop {
            match next(host) {
                (Frame::Stdout, json) => got.extend(serde_json::from_slice::<Vec<WatchEvent>>(&json).unwrap()),
                (Frame::Signaled, m) => {
                    assert_eq!(m, n.to_le_bytes());
                    return got;
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_recursive_watch_reports_changes_new_directories_included_and_ends_when_its_directory_goes() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("w");
        std::fs::create_dir_all(root.join("old")).unwrap();
        let (mut host, guest) = UnixStream::pair().unwrap();
        let cuts = crate::guestport::Cuts::default();
        let (path, c2) = (root.to_string_lossy().into_owned(), cuts.clone());
        let t = std::thread::spawn(move || serve(guest, FrameReader::default(), &path, true, &c2));
        let (kind, abs) = next(&mut host);
        assert_eq!(
            (kind, abs),
            (Frame::Started, std::fs::canonicalize(&root).unwrap().to_string_lossy().as_bytes().to_vec())
        );
        std::fs::write(root.join("old/a.txt"), b"x").unwrap();
        std::fs::create_dir(root.join("new")).unwrap();
        let got = sync(&mut host, 1);
        let ev = |op, name: &str, dir| WatchEvent { op, name: name.into(), dir };
        assert_eq!(
            got,
            [
                ev(WatchOp::Create, "old/a.txt", false),
                ev(WatchOp::Write, "old/a.txt", false),
                ev(WatchOp::Create, "new", true)
            ]
        );
        // The new directory is marked: what happens in it is seen.
        std::fs::write(root.join("new/b"), b"").unwrap();
        std::fs::write(root.join(".strata-upload-0123456789abcdef"), b"tmp").unwrap();
        std::fs::rename(root.join(".strata-upload-0123456789abcdef"), root.join("up.txt")).unwrap();
        assert_eq!(
            sync(&mut host, 2),
            [
                ev(WatchOp::Create, "new/b", false),
                ev(WatchOp::Create, "up.txt", false),
                ev(WatchOp::Write, "up.txt", false)
            ]
        );
        assert_eq!(cuts.len(), 1);
        std::fs::remove_dir_all(&root).unwrap();
        // Removes reported, then the end with its reason.
        let mut removed = Vec::new();
        let failure = loop {
            match next(&mut host) {
                (Frame::Stdout, json) => removed.extend(serde_json::from_slice::<Vec<WatchEvent>>(&json).unwrap()),
                (Frame::Failed, f) => break serde_json::from_slice::<FsFailure>(&f).unwrap(),
                other => panic!("{other:?}"),
            }
        };
        assert!(removed.contains(&ev(WatchOp::Remove, "up.txt", false)), "{removed:?}");
        assert_eq!(failure.rule.as_deref(), Some("gone"), "{failure:?}");
        t.join().unwrap();
        assert!(cuts.is_empty());
    }

    #[test]
    fn a_watch_of_what_is_not_a_directory_is_refused_and_the_host_s_close_ends_one() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), b"").unwrap();
        let cuts = crate::guestport::Cuts::default();
        for (path, errno) in [(d.path().join("f"), libc::ENOTDIR), (d.path().join("missing"), libc::ENOENT)] {
            let (mut host, guest) = UnixStream::pair().unwrap();
            serve(guest, FrameReader::default(), &path.to_string_lossy(), false, &cuts);
            let (kind, f) = next(&mut host);
            assert_eq!(kind, Frame::Failed);
            assert_eq!(serde_json::from_slice::<FsFailure>(&f).unwrap().errno, errno);
        }
        let (mut host, guest) = UnixStream::pair().unwrap();
        assert_eq!(
            {
                serve(guest, FrameReader::default(), "relative/path", false, &cuts);
                next(&mut host).0
            },
            Frame::Failed
        );
        let (mut host, guest) = UnixStream::pair().unwrap();
        let (path, c2) = (d.path().to_string_lossy().into_owned(), cuts.clone());
        let t = std::thread::spawn(move || serve(guest, FrameReader::default(), &path, false, &c2));
        assert_eq!(next(&mut host).0, Frame::Started);
        drop(host);
        t.join().unwrap();
        assert!(cuts.is_empty());
    }
}
