//! Moving file bytes between a front end's body stream and a blocking thread through
//! bounded buffers, so no transfer ever sits whole in the daemon's memory.
//!
//! * Downloads (and exports): the thread writes into a [`ChunkSender`], which
//!   cuts the bytes into [`CHUNK`]-sized pieces and hands them to the response
//!   body through a channel of [`DEPTH`] pieces; a slow client slows the
//!   thread down (the channel is full), a client that goes away ends it (the
//!   next send fails).
//! * Uploads: [`feed_upload`] reads the request body frame by frame into a
//!   channel of [`DEPTH`] frames, counting bytes against a limit; the thread
//!   reads them through an [`UploadReader`]. The body's end is sent
//!   explicitly ([`UploadChunk::End`]), so a thread whose channel closes
//!   without it knows the upload was cut off (the client went away, the body
//!   broke, the limit was hit) and removes what it wrote.
//!
//! Each transfer runs on a thread of its own named [`THREAD_NAME`], which ends
//! with its transfer: no pool thread is parked behind a slow client.

use std::io::{self, Read};

pub use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot};

/// Size of the pieces moved through a channel.
pub const CHUNK: usize = crate::chunks::CHUNK;
/// Pieces a channel holds: with [`CHUNK`], at most about 1 MiB in flight per transfer.
pub const DEPTH: usize = 8;
/// Name of the threads that carry transfers (visible in `/proc/<pid>/task/*/comm`).
pub const THREAD_NAME: &str = "strata-xfer";

/// Starts `f` on a transfer thread of its own.
pub fn spawn(f: impl FnOnce() + Send + 'static) -> io::Result<()> {
    std::thread::Builder::new().name(THREAD_NAME.into()).spawn(f).map(drop)
}

/// The sending half of a download: a [`std::io::Write`] whose bytes reach the
/// response body in [`CHUNK`]-sized pieces.
pub type ChunkSender = crate::chunks::ChunkWriter;

/// The bytes of a download as they are produced: what a front end turns into
/// its response body.
pub type ByteStream = std::pin::Pin<Box<dyn futures_util::Stream<Item = io::Result<Bytes>> + Send>>;

/// A download stream fed by a [`ChunkSender`] on another thread.
pub fn download_channel() -> (ChunkSender, ByteStream) {
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(DEPTH);
    let body = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    (ChunkSender::new(tx, "the client went away"), Box::pin(body))
}

/// What the request side hands to an upload thread.
pub enum UploadChunk {
    /// Body bytes.
    Data(Bytes),
    /// The body ended normally: everything was sent.
    End,
}

/// The receiving half of an upload: a [`Read`] over the request body. A
/// channel closed before [`UploadChunk::End`] reads as an error.
pub struct UploadReader {
    rx: mpsc::Receiver<UploadChunk>,
    cur: Bytes,
    ended: bool,
}

impl Read for UploadReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.cur.is_empty() {
            if self.ended {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(UploadChunk::Data(b)) => self.cur = b,
                Some(UploadChunk::End) => self.ended = true,
                None => {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "the upload was cut off before its end",
                    ))
                }
            }
        }
        let n = out.len().min(self.cur.len());
        out[..n].copy_from_slice(&self.cur[..n]);
        let _ = self.cur.split_to(n);
        Ok(n)
    }
}

impl UploadReader {
    /// Reads and drops whatever is left of the body (a tar's padding after
    /// its end marker), so the client can finish sending before the answer.
    pub fn drain(&mut self) -> io::Result<()> {
        io::copy(self, &mut io::sink()).map(drop)
    }
}

/// The channel between an upload body and its thread.
pub fn upload_channel() -> (mpsc::Sender<UploadChunk>, UploadReader) {
    let (tx, rx) = mpsc::channel(DEPTH);
    (tx, UploadReader { rx, cur: Bytes::new(), ended: false })
}

/// How much of a refused body is still read (and dropped) before the answer.
pub const LINGER_BYTES: u64 = 64 << 20;
/// How long a refused body is still read before the answer.
pub const LINGER_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// Reads and drops the rest of a refused body for a little while (at most
/// [`LINGER_BYTES`] or [`LINGER_TIME`]): a connection closed with unread
/// data in it is reset, and the client would lose the answer saying why.
pub async fn linger<S, E>(body: &mut S)
where
    S: futures_util::Stream<Item = Result<Bytes, E>> + Unpin,
{
    let mut read = 0u64;
    let _ = tokio::time::timeout(LINGER_TIME, async {
        while let Some(Ok(b)) = body.next().await {
            read += b.len() as u64;
            if read > LINGER_BYTES {
                break;
            }
        }
    })
    .await;
}

/// Why feeding an upload stopped before its thread finished.
#[derive(Debug)]
pub enum FeedError {
    /// The body is larger than the limit.
    TooLarge(u64),
    /// The body could not be read (the client went away, bad framing).
    Body(String),
}

/// Feeds `body` into `tx` (at most `limit` bytes) and then waits for the
/// thread's answer on `done`. The thread may answer before the body ends (it
/// refused the upload): then the rest of the body is not read. When the limit
/// is passed or the body breaks, `tx` is dropped without [`UploadChunk::End`]
/// (the thread then undoes its work) and the reason is returned.
pub async fn feed_upload<T, S, E>(
    mut stream: S,
    tx: mpsc::Sender<UploadChunk>,
    limit: u64,
    mut done: oneshot::Receiver<T>,
) -> Result<Option<T>, FeedError>
where
    S: futures_util::Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let mut total = 0u64;
    loop {
        tokio::select! {
            biased;
            r = &mut done => return Ok(r.ok()),
            frame = stream.next() => match frame {
                Some(Ok(bytes)) => {
                    total += bytes.len() as u64;
                    if total > limit {
                        drop(tx);
                        linger(&mut stream).await;
                        let _ = done.await;
                        return Err(FeedError::TooLarge(limit));
                    }
                    if tx.send(UploadChunk::Data(bytes)).await.is_err() {
                        // The thread stopped reading: its answer follows.
                        return Ok(done.await.ok());
                    }
                }
                Some(Err(e)) => {
                    drop(tx);
                    let _ = done.await;
                    return Err(FeedError::Body(e.to_string()));
                }
                None => {
                    let _ = tx.send(UploadChunk::End).await;
                    return Ok(done.await.ok());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[tokio::test]
    async fn downloads_arrive_whole_and_in_bounded_pieces() {
        let (mut tx, body) = download_channel();
        let t = std::thread::spawn(move || {
            tx.write_all(&[1u8; 10]).unwrap();
            tx.copy_exact(&[2u8; 3 * CHUNK + 5][..], (3 * CHUNK + 5) as u64).unwrap();
            tx.write_all(&[3u8; CHUNK + 1]).unwrap();
            tx.flush().unwrap();
        });
        let mut s = body;
        let mut all = Vec::new();
        while let Some(c) = s.next().await {
            let c = c.unwrap();
            assert!(c.len() <= CHUNK);
            all.extend_from_slice(&c);
        }
        t.join().unwrap();
        assert_eq!(all.len(), 10 + 3 * CHUNK + 5 + CHUNK + 1);
        assert!(
            all[..10].iter().all(|b| *b == 1)
                && all[10..10 + 3 * CHUNK + 5].iter().all(|b| *b == 2)
                && all[10 + 3 * CHUNK + 5..].iter().all(|b| *b == 3)
        );
    }

    #[tokio::test]
    async fn a_short_file_or_a_gone_client_ends_the_thread_with_an_error() {
        let (mut tx, body) = download_channel();
        let short = std::thread::spawn(move || tx.copy_exact(&[0u8; 100][..], 200).unwrap_err().kind());
        let mut s = body;
        while s.next().await.is_some() {}
        assert_eq!(short.join().unwrap(), io::ErrorKind::UnexpectedEof);
        let (mut tx, body) = download_channel();
        drop(body);
        let gone = std::thread::spawn(move || tx.copy_exact(io::repeat(0), 1 << 30).unwrap_err().kind());
        assert_eq!(gone.join().unwrap(), io::ErrorKind::BrokenPipe);
    }

    #[tokio::test]
    async fn an_upload_cut_off_reads_as_an_error_and_a_limit_is_enforced_while_streaming() {
        // Whole body.
        let (tx, mut reader) = upload_channel();
        let (done_tx, done_rx) = oneshot::channel();
        let t = std::thread::spawn(move || {
            let mut v = Vec::new();
            let r = reader.read_to_end(&mut v).map(|_| v.len());
            let _ = done_tx.send(r.map_err(|e| e.kind()));
        });
        let body = futures_util::stream::iter((0..4).map(|_| Ok::<_, io::Error>(Bytes::from(vec![0u8; 1000]))));
        assert_eq!(feed_upload(body, tx, 4000, done_rx).await.unwrap(), Some(Ok(4000)));
        t.join().unwrap();
        // Over the limit: the thread sees the upload cut off.
        let (tx, mut reader) = upload_channel();
        let (done_tx, done_rx) = oneshot::channel();
        let t = std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = done_tx.send(reader.read_to_end(&mut v).map_err(|e| e.kind()));
        });
        let body = futures_util::stream::iter((0..4).map(|_| Ok::<_, io::Error>(Bytes::from(vec![0u8; 1000]))));
        assert!(matches!(feed_upload(body, tx, 3999, done_rx).await, Err(FeedError::TooLarge(3999))));
        t.join().unwrap();
        // A broken body: the same.
        let (tx, mut reader) = upload_channel();
        let (done_tx, done_rx) = oneshot::channel();
        let t = std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = done_tx.send(reader.read_to_end(&mut v).map_err(|e| e.kind()));
        });
        let body = futures_util::stream::iter([Ok(Bytes::from_static(b"abc")), Err(io::Error::other("client gone"))]);
        assert!(matches!(feed_upload(body, tx, 100, done_rx).await, Err(FeedError::Body(_))));
        t.join().unwrap();
    }
}
