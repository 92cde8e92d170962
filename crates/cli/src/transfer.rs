//! Moving file bytes between local files and the daemon in bounded pieces:
//! `strata cp` and `strata export` never hold a whole transfer in memory.

use std::io::{self, Read, Write};
use std::path::Path;

use anyhow::{Context, Result};
use bytes::{Bytes, BytesMut};
use futures_util::Stream;
use strata_client::ByteStream;
use tokio::sync::mpsc;

use strata_engine::chunks::{ChunkWriter, CHUNK};
/// Pieces in flight between a thread and the connection.
const DEPTH: usize = 8;

/// A local file as a stream of pieces.
pub fn file_chunks(file: tokio::fs::File) -> impl Stream<Item = io::Result<Bytes>> + Send + 'static {
    futures_util::stream::unfold(Some(file), |file| async move {
        use tokio::io::AsyncReadExt;
        let mut file = file?;
        let mut buf = BytesMut::with_capacity(CHUNK);
        match file.read_buf(&mut buf).await {
            Ok(0) => None,
            Ok(_) => Some((Ok(buf.freeze()), Some(file))),
            Err(e) => Some((Err(e), None)),
        }
    })
}

/// Runs `make` on a thread of its own, writing into a stream of pieces as
/// they are sent. A failure of `make` ends the stream with an error (the
/// daemon then keeps nothing of the upload) and is the thread's result.
pub fn produce(
    make: impl FnOnce(&mut dyn Write) -> io::Result<()> + Send + 'static,
) -> (impl Stream<Item = io::Result<Bytes>> + Send + 'static, tokio::task::JoinHandle<io::Result<()>>) {
    let (tx, rx) = mpsc::channel(DEPTH);
    let done = tokio::task::spawn_blocking(move || {
        let mut w = ChunkWriter::new(tx.clone(), "the upload stopped");
        let res = make(&mut w).and_then(|_| w.flush());
        if let Err(e) = &res {
            let _ = tx.blocking_send(Err(io::Error::new(e.kind(), e.to_string())));
        }
        res
    });
    (futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) }), done)
}

struct ChannelReader {
    rx: mpsc::Receiver<Bytes>,
    cur: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(b) => self.cur = b,
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.cur.len());
        out[..n].copy_from_slice(&self.cur[..n]);
        let _ = self.cur.split_to(n);
        Ok(n)
    }
}

/// Feeds a download to `use_it` on a thread of its own, as a [`Read`].
/// A broken download is an error even if `use_it` accepted what came.
pub async fn consume<T: Send + 'static>(
    mut s: ByteStream,
    use_it: impl FnOnce(&mut dyn Read) -> io::Result<T> + Send + 'static,
) -> Result<T> {
    let (tx, rx) = mpsc::channel(DEPTH);
    let worker = tokio::task::spawn_blocking(move || use_it(&mut ChannelReader { rx, cur: Bytes::new() }));
    let mut fed = Ok(());
    loop {
        match s.chunk().await {
            Ok(Some(piece)) => {
                if tx.send(piece).await.is_err() {
                    break; // the reader stopped (it failed): its error follows
                }
            }
            Ok(None) => break,
            Err(e) => {
                fed = Err(e);
                break;
            }
        }
    }
    drop(tx);
    let used = worker.await.context("transfer thread")?;
    fed.context("the download broke off")?;
    Ok(used?)
}

/// Writes a download into `target` through a temp file next to it, renamed
/// into place once complete (a broken download leaves `target` as it was).
/// A new file gets `mode` (masked by the umask).
pub async fn download_to(mut s: ByteStream, target: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = target.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.strata-{}", std::process::id()));
    let res = async {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
            .with_context(|| format!("writing {}", tmp.display()))?;
        while let Some(piece) = s.chunk().await? {
            f.write_all(&piece).with_context(|| format!("writing {}", tmp.display()))?;
        }
        f.sync_all().with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, target).with_context(|| format!("writing {}", target.display()))
    }
    .await;
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}
