//! Streaming sha256 and byte counting.

use std::cell::Cell;
use std::io::{self, Read, Write};
use std::rc::Rc;

use sha2::{Digest as _, Sha256};

/// `sha256:<hex>` of `bytes`.
pub(crate) fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A reader that hashes (sha256) and counts everything read through it.
pub(crate) struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> HashingReader<R> {
    pub(crate) fn new(inner: R) -> Self {
        HashingReader { inner, hasher: Sha256::new(), count: 0 }
    }

    /// Bytes read so far.
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// Reads the rest of the stream (hashing it). Returns the number of bytes
    /// drained, or `None` as soon as more than `limit` bytes arrived.
    pub(crate) fn drain(&mut self, limit: u64) -> io::Result<Option<u64>> {
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0u64;
        loop {
            let n = self.read(&mut buf)?;
            if n == 0 {
                return Ok(Some(total));
            }
            total += n as u64;
            if total > limit {
                return Ok(None);
            }
        }
    }

    /// `sha256:<hex>` of everything read, and the byte count.
    pub(crate) fn finish(self) -> (String, u64) {
        (format!("sha256:{}", hex::encode(self.hasher.finalize())), self.count)
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

/// A writer that hashes (sha256) and counts everything written through it.
pub(crate) struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    count: u64,
}

impl<W: Write> HashingWriter<W> {
    pub(crate) fn new(inner: W) -> Self {
        HashingWriter { inner, hasher: Sha256::new(), count: 0 }
    }

    /// `sha256:<hex>` and size of everything written, and the inner writer.
    pub(crate) fn finish(self) -> (String, u64, W) {
        (format!("sha256:{}", hex::encode(self.hasher.finalize())), self.count, self.inner)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that publishes the number of bytes read through it in a shared
/// counter (read by the progress reporting while a parser owns the reader).
pub(crate) struct CountingReader<R> {
    inner: R,
    count: Rc<Cell<u64>>,
}

impl<R: Read> CountingReader<R> {
    pub(crate) fn new(inner: R) -> (Self, Rc<Cell<u64>>) {
        let count = Rc::new(Cell::new(0));
        (CountingReader { inner, count: Rc::clone(&count) }, count)
    }
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.set(self.count.get() + n as u64);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashing_reader_matches_one_shot_digest() {
        let data = b"hello world".repeat(1000);
        let mut r = HashingReader::new(&data[..]);
        let mut first = [0u8; 10];
        r.read_exact(&mut first).unwrap();
        assert_eq!(r.drain(u64::MAX).unwrap(), Some(data.len() as u64 - 10));
        let (digest, n) = r.finish();
        assert_eq!(n, data.len() as u64);
        assert_eq!(digest, sha256_digest(&data));
        let mut r = HashingReader::new(&data[..]);
        assert_eq!(r.drain(100).unwrap(), None);
    }
}
