//! An in-process pipe of large chunks between a producer thread and a consumer
//! thread of the same process (e.g. a layer tar written by one thread and
//! unpacked by another).
//!
//! An OS pipe moves 64 KiB per wake-up and copies every byte into the kernel
//! and out again; for a checkpoint of a few hundred MiB its wake-ups alone
//! were a quarter of the daemon's CPU time (measured with `perf`). Here the
//! writer fills a 1 MiB buffer and hands it over whole through a bounded
//! channel, so memory stays bounded (`depth` chunks in flight) and the
//! consumer is woken once per chunk.
//!
//! Semantics follow a pipe's: dropping the writer is the end of the stream
//! (the reader then returns `Ok(0)`, after the last chunk); a write after the
//! reader was dropped fails with [`io::ErrorKind::BrokenPipe`].

use std::io::{self, BufRead, Read, Write};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

/// Size of each chunk handed over.
pub const CHUNK: usize = 1 << 20;
/// Chunks that may wait in the channel (besides the one being filled and the one being read).
pub const DEPTH: usize = 4;

/// The writing end: a [`Write`] that sends full chunks.
pub struct ChunkWriter {
    buf: Vec<u8>,
    tx: Option<SyncSender<Vec<u8>>>,
    /// Emptied chunks coming back from the reader, to be filled again.
    recycled: Receiver<Vec<u8>>,
}

/// The reading end: a [`Read`] + [`BufRead`] over the chunks received.
pub struct ChunkReader {
    chunk: Vec<u8>,
    pos: usize,
    rx: Receiver<Vec<u8>>,
    recycle: SyncSender<Vec<u8>>,
}

/// A pipe of [`CHUNK`]-sized buffers, at most [`DEPTH`] of them queued.
pub fn chunk_pipe() -> (ChunkReader, ChunkWriter) {
    let (tx, rx) = sync_channel(DEPTH);
    let (recycle, recycled) = sync_channel(DEPTH + 2);
    (
        ChunkReader { chunk: Vec::new(), pos: 0, rx, recycle },
        ChunkWriter { buf: Vec::with_capacity(CHUNK), tx: Some(tx), recycled },
    )
}

impl ChunkWriter {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let next = self.recycled.try_recv().map(|mut v| {
            v.clear();
            v
        });
        let full = std::mem::replace(&mut self.buf, next.unwrap_or_else(|_| Vec::with_capacity(CHUNK)));
        let tx = self.tx.as_ref().ok_or_else(|| io::Error::from(io::ErrorKind::BrokenPipe))?;
        tx.send(full).map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the reading end is gone"))
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        if self.buf.len() == CHUNK {
            self.send()?;
        }
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        Ok(n)
    }

    /// Hands over what is buffered (a partial chunk) now.
    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

impl Drop for ChunkWriter {
    fn drop(&mut self) {
        // The tail; a reader that is gone needs no more.
        let _ = self.send();
    }
}

impl BufRead for ChunkReader {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.pos == self.chunk.len() {
            match self.rx.recv() {
                Ok(next) => {
                    let done = std::mem::replace(&mut self.chunk, next);
                    self.pos = 0;
                    // Hand the emptied buffer back; if the writer keeps enough, drop it.
                    let _ = self.recycle.try_send(done);
                }
                // The writer is gone: end of stream.
                Err(_) => return Ok(&[]),
            }
        }
        Ok(&self.chunk[self.pos..])
    }

    fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.chunk.len());
    }
}

impl Read for ChunkReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let avail = self.fill_buf()?;
        let n = avail.len().min(out.len());
        out[..n].copy_from_slice(&avail[..n]);
        self.consume(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_arrive_in_order_across_chunks_and_end_at_the_writer_drop() {
        let (mut r, mut w) = chunk_pipe();
        let data: Vec<u8> = (0..(3 * CHUNK + 12345)).map(|i| (i * 31 % 251) as u8).collect();
        let sent = data.clone();
        let producer = std::thread::spawn(move || {
            // Uneven writes, as tar's headers and file bodies are.
            for piece in sent.chunks(70_001) {
                w.write_all(piece).unwrap();
            }
        });
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap();
        producer.join().unwrap();
        assert_eq!(got.len(), data.len());
        assert!(got == data, "bytes differ");
        assert_eq!(r.read(&mut [0u8; 8]).unwrap(), 0, "end of stream stays the end");
    }

    #[test]
    fn writing_after_the_reader_is_gone_is_a_broken_pipe() {
        let (r, mut w) = chunk_pipe();
        drop(r);
        let err = (0..DEPTH + 3).find_map(|_| w.write_all(&vec![0u8; CHUNK]).err()).expect("a write fails");
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }

    #[test]
    fn flush_hands_over_a_partial_chunk() {
        let (mut r, mut w) = chunk_pipe();
        w.write_all(b"hello").unwrap();
        w.flush().unwrap();
        assert_eq!(r.fill_buf().unwrap(), b"hello");
        r.consume(5);
        drop(w);
        assert!(r.fill_buf().unwrap().is_empty());
    }
}
