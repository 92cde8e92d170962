//! A blocking [`Write`] that cuts bytes into bounded pieces for a channel:
//! the sending half of every streamed transfer, in the engine (downloads,
//! exports) and in the CLI (uploads, which use it from here: it has no HTTP in it). With [`CHUNK`]-sized pieces and a
//! channel of a few of them, a transfer holds about a MiB in flight whatever
//! its size; a slow receiver slows the writer down, a receiver that went away
//! makes the next write fail.

use std::io::{self, Read, Write};

use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc;

/// Size of the pieces a transfer moves.
pub const CHUNK: usize = 128 * 1024;

/// Writes into a bounded channel of pieces; for a thread of its own (it blocks).
pub struct ChunkWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: BytesMut,
    /// What a failed send says (who went away).
    gone: &'static str,
}

impl ChunkWriter {
    /// A writer into `tx`; `gone` is the message of the error a send gets once
    /// the receiving side is gone.
    pub fn new(tx: mpsc::Sender<io::Result<Bytes>>, gone: &'static str) -> Self {
        ChunkWriter { tx, buf: BytesMut::with_capacity(CHUNK), gone }
    }

    fn gone(&self) -> io::Error {
        io::Error::new(io::ErrorKind::BrokenPipe, self.gone)
    }

    /// Sends a piece as it is (for readers that fill whole pieces themselves).
    pub fn send(&mut self, piece: Bytes) -> io::Result<()> {
        self.flush()?;
        self.tx.blocking_send(Ok(piece)).map_err(|_| self.gone())
    }

    /// Ends the stream with an error: the receiver sees a broken transfer,
    /// never a silently shorter one.
    pub fn fail(mut self, e: io::Error) {
        let _ = self.flush();
        let _ = self.tx.blocking_send(Err(e));
    }

    /// Whether the receiving side went away.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Copies exactly `len` bytes of `r`, reading into fresh pieces (no extra
    /// copy). A reader that ends early is an error.
    pub fn copy_exact(&mut self, mut r: impl Read, len: u64) -> io::Result<()> {
        self.flush()?;
        let mut left = len;
        while left > 0 {
            let want = (left as usize).min(CHUNK);
            let mut piece = BytesMut::zeroed(want);
            let mut got = 0;
            while got < want {
                match r.read(&mut piece[got..]) {
                    Ok(0) => {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!(
                                "the file ended {} bytes short of its size when the transfer started",
                                left - got as u64
                            ),
                        ))
                    }
                    Ok(n) => got += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            left -= want as u64;
            self.send(piece.freeze())?;
        }
        Ok(())
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let piece = std::mem::replace(&mut self.buf, BytesMut::with_capacity(CHUNK)).freeze();
        self.tx.blocking_send(Ok(piece)).map_err(|_| self.gone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_arrive_in_bounded_pieces_and_a_gone_receiver_fails_the_writer() {
        let (tx, mut rx) = mpsc::channel(4);
        let mut w = ChunkWriter::new(tx, "the receiver went away");
        let data = vec![7u8; CHUNK + 10];
        w.write_all(&data).unwrap();
        w.flush().unwrap();
        let a = rx.blocking_recv().unwrap().unwrap();
        let b = rx.blocking_recv().unwrap().unwrap();
        assert_eq!((a.len(), b.len()), (CHUNK, 10));
        w.copy_exact(&b"abc"[..], 3).unwrap();
        assert_eq!(&rx.blocking_recv().unwrap().unwrap()[..], b"abc");
        assert_eq!(w.copy_exact(&b"ab"[..], 3).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        drop(rx);
        assert!(w.is_closed());
        assert_eq!(w.write_all(&data).unwrap_err().to_string(), "the receiver went away");
    }
}
