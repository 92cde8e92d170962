//! Files inside a sandbox: metadata, listings, directories, removal, moves,
//! downloads and uploads (each brings a parked sandbox back first).

use bytes::Bytes;
use strata_api::{DownloadQuery, FileStat, UploadQuery};
use strata_init::guestfs::FsOp;

use super::{holding, Download, Engine};
use crate::access::Use;
use crate::error::EngineResult;
use crate::files;

impl Engine {
    /// A path's metadata.
    pub async fn stat(&self, key: &str, path: &str) -> EngineResult<FileStat> {
        let path = path.to_string();
        let (sb, guest) = self.fs_target(key).await?;
        match guest {
            Some(rec) => Box::pin(self.run(files::guest::stat(&self.st, &rec, path))).await,
            None => self.run(files::with_fs(&self.st, &sb.id, move |fs| fs.stat(&path))).await,
        }
    }

    /// A directory's entries.
    pub async fn list_dir(&self, key: &str, path: &str) -> EngineResult<Vec<FileStat>> {
        let path = path.to_string();
        let (sb, guest) = self.fs_target(key).await?;
        match guest {
            Some(rec) => Box::pin(self.run(files::guest::list(&self.st, &rec, path))).await,
            None => self.run(files::with_fs(&self.st, &sb.id, move |fs| fs.list(&path))).await,
        }
    }

    /// Makes the `user.` extended attributes of a file or directory under
    /// `prefix` exactly `values` (keys without the prefix).
    pub async fn set_xattrs(
        &self,
        key: &str,
        path: &str,
        prefix: &str,
        values: std::collections::BTreeMap<String, String>,
    ) -> EngineResult<()> {
        let (path, prefix) = (path.to_string(), prefix.to_string());
        let (sb, guest) = self.fs_target(key).await?;
        match guest {
            Some(rec) => {
                let op = FsOp::SetXattrs { path, prefix, values };
                Box::pin(self.run(files::guest::act(&self.st, &rec, op))).await
            }
            None => self.run(files::with_fs(&self.st, &sb.id, move |fs| fs.set_xattrs(&path, &prefix, &values))).await,
        }
    }

    /// Watches a directory (and with `recursive` every directory under it):
    /// its changes as they happen, until the watch is dropped or ends with an error.
    pub async fn watch_dir(&self, key: &str, path: &str, recursive: bool) -> EngineResult<crate::dirwatch::DirWatch> {
        let sb = self.enter(key, Use::Running).await?;
        self.run(crate::dirwatch::watch(&self.st, &sb.id, path, recursive)).await
    }

    /// Creates a directory (and its missing parents with `parents`).
    pub async fn mkdir(&self, key: &str, path: &str, parents: bool) -> EngineResult<()> {
        let path = path.to_string();
        let (sb, guest) = self.fs_target(key).await?;
        match guest {
            Some(rec) => Box::pin(self.run(files::guest::act(&self.st, &rec, FsOp::Mkdir { path, parents }))).await,
            None => self.run(files::with_fs(&self.st, &sb.id, move |fs| fs.mkdir(&path, parents, 0o755))).await,
        }
    }

    /// Removes a path (a directory with `recursive`).
    pub async fn remove_path(&self, key: &str, path: &str, recursive: bool) -> EngineResult<()> {
        let path = path.to_string();
        let (sb, guest) = self.fs_target(key).await?;
        match guest {
            Some(rec) => Box::pin(self.run(files::guest::act(&self.st, &rec, FsOp::Remove { path, recursive }))).await,
            None => self.run(files::with_fs(&self.st, &sb.id, move |fs| fs.remove(&path, recursive))).await,
        }
    }

    /// Renames a path.
    pub async fn move_path(&self, key: &str, from: &str, to: &str) -> EngineResult<()> {
        let (from, to) = (from.to_string(), to.to_string());
        let (sb, guest) = self.fs_target(key).await?;
        match guest {
            Some(rec) => Box::pin(self.run(files::guest::act(&self.st, &rec, FsOp::Rename { from, to }))).await,
            None => self.run(files::with_fs(&self.st, &sb.id, move |fs| fs.rename(&from, &to))).await,
        }
    }

    /// A file's bytes (or with `q.tar` a tar stream of a file or directory), streamed as they are read.
    pub async fn download(&self, key: &str, q: DownloadQuery) -> EngineResult<Download> {
        let sb = self.enter(key, Use::Running).await?;
        let d = self.run(files::download(&self.st, &sb.id, q)).await?;
        Ok(Download { len: d.len, stream: holding(d.stream, sb.hold) })
    }

    /// Writes a file from `chunks` (replaced whole once complete), or with
    /// `q.tar` extracts a tar stream under a directory. `announced` is the
    /// length the client declared, if any: one over the limit is refused
    /// before any of the body is read.
    pub async fn upload<S, E>(&self, key: &str, q: UploadQuery, announced: Option<u64>, chunks: S) -> EngineResult<()>
    where
        S: futures_util::Stream<Item = Result<Bytes, E>> + Send + 'static,
        E: std::fmt::Display,
    {
        let sb = self.enter(key, Use::Running).await?;
        if announced.is_some_and(|n| n > files::MAX_UPLOAD_BYTES) {
            // An unknown or stopped sandbox answers first.
            files::init_pid(&*self.record_of(&sb).await?)?;
            return Err(files::feed_error(crate::transfer::FeedError::TooLarge(files::MAX_UPLOAD_BYTES)));
        }
        self.run(files::upload(&self.st, &sb.id, q, Box::pin(chunks))).await
    }

    /// The sandbox `key` names, entered for a call that needs it running (held
    /// awake while the target is kept), with its record when its files are
    /// its guest's (a microVM: the file API goes through [`files::guest`]).
    async fn fs_target(&self, key: &str) -> EngineResult<(super::Target, Option<strata_store::db::SandboxRecord>)> {
        let sb = self.enter(key, Use::Running).await?;
        let guest = match &sb.record {
            Some(rec) if crate::guest_layer::in_guest(&self.st, rec) => Some(rec.clone()),
            _ => None,
        };
        Ok((sb, guest))
    }
}
