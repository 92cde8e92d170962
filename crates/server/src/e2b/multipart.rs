//! A streaming `multipart/form-data` reader for envd's `POST /files`: parts
//! are found as the body arrives and each part's data is handed on in pieces,
//! so an upload never sits whole in memory. Part headers are bounded
//! ([`MAX_PART_HEAD`]); what is held besides them is at most one body frame
//! and the few bytes that could be the start of a boundary.

use std::fmt::Display;

use bytes::{Buf, Bytes, BytesMut};
use futures_util::{Stream, StreamExt};

/// Largest header block of one part.
pub const MAX_PART_HEAD: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the first boundary.
    Preamble,
    /// Right after a boundary line's `--boundary`.
    AfterBoundary,
    /// Inside a part's data.
    Data,
    /// After the closing boundary.
    Done,
}

/// A `multipart/form-data` body read part by part.
pub struct Multipart<S> {
    body: S,
    /// `\r\n--boundary`: what ends a part's data.
    delim: Vec<u8>,
    buf: BytesMut,
    state: State,
    body_ended: bool,
}

/// The boundary of a `multipart/form-data` content type.
fn boundary(content_type: &str) -> Result<String, String> {
    content_type
        .split(';')
        .map(str::trim)
        .find_map(|p| p.strip_prefix("boundary="))
        .map(|b| b.trim_matches('"').to_string())
        .filter(|b| !b.is_empty() && b.len() <= 70)
        .ok_or_else(|| "multipart body without a boundary".to_string())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The file name of a part, from its `Content-Disposition` header.
fn filename(head: &str) -> Option<String> {
    head.lines().find(|l| l.to_ascii_lowercase().starts_with("content-disposition")).and_then(|l| {
        let i = l.find("filename=")?;
        let rest = &l[i + 9..];
        Some(match rest.strip_prefix('"') {
            Some(r) => r.split('"').next().unwrap_or("").to_string(),
            None => rest.split(';').next().unwrap_or("").trim().to_string(),
        })
    })
}

impl<S, E> Multipart<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: Display,
{
    /// A reader of `body`, whose content type is `content_type`.
    pub fn new(content_type: &str, body: S) -> Result<Self, String> {
        let delim = format!("\r\n--{}", boundary(content_type)?).into_bytes();
        // The first boundary has no CRLF before it: pretend it had.
        let mut buf = BytesMut::with_capacity(64 * 1024);
        buf.extend_from_slice(b"\r\n");
        Ok(Multipart { body, delim, buf, state: State::Preamble, body_ended: false })
    }

    /// Reads one more frame of the body; `false` at its end.
    async fn fill(&mut self) -> Result<bool, String> {
        if self.body_ended {
            return Ok(false);
        }
        match self.body.next().await {
            Some(Ok(b)) => {
                self.buf.extend_from_slice(&b);
                Ok(true)
            }
            Some(Err(e)) => Err(format!("reading the body: {e}")),
            None => {
                self.body_ended = true;
                Ok(false)
            }
        }
    }

    /// Goes to the next part and returns its file name (`Some(None)` for a
    /// part without one), or `None` after the closing boundary. The rest of
    /// the current part's data, if any, is skipped.
    pub async fn next_part(&mut self) -> Result<Option<Option<String>>, String> {
        loop {
            match self.state {
                State::Done => return Ok(None),
                State::Data => while self.next_data().await?.is_some() {},
                State::Preamble => match find(&self.buf, &self.delim) {
                    Some(i) => {
                        self.buf.advance(i + self.delim.len());
                        self.state = State::AfterBoundary;
                    }
                    None => {
                        let keep = self.delim.len() - 1;
                        if self.buf.len() > keep {
                            let drop = self.buf.len() - keep;
                            self.buf.advance(drop);
                        }
                        if !self.fill().await? {
                            return Err("multipart body without its boundary".into());
                        }
                    }
                },
                State::AfterBoundary => {
                    while self.buf.len() < 2 {
                        if !self.fill().await? {
                            return Err("multipart body ends after a boundary".into());
                        }
                    }
                    if self.buf.starts_with(b"--") {
                        self.state = State::Done;
                        return Ok(None);
                    }
                    let head_end = loop {
                        if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                            break i;
                        }
                        if self.buf.len() > MAX_PART_HEAD {
                            return Err(format!("multipart part headers longer than {MAX_PART_HEAD} bytes"));
                        }
                        if !self.fill().await? {
                            return Err("multipart part without headers".into());
                        }
                    };
                    if head_end > MAX_PART_HEAD {
                        return Err(format!("multipart part headers longer than {MAX_PART_HEAD} bytes"));
                    }
                    // Headers start after the CRLF ending the boundary line.
                    let head = String::from_utf8_lossy(&self.buf[..head_end]).to_string();
                    self.buf.advance(head_end + 4);
                    self.state = State::Data;
                    return Ok(Some(filename(&head)));
                }
            }
        }
    }

    /// Reads and drops the rest of the body for a little while (see [`strata_engine::transfer::linger`]).
    pub async fn linger(&mut self) {
        self.buf.clear();
        if !self.body_ended {
            strata_engine::transfer::linger(&mut self.body).await;
        }
    }

    /// The next piece of the current part's data, or `None` at its end.
    pub async fn next_data(&mut self) -> Result<Option<Bytes>, String> {
        if self.state != State::Data {
            return Ok(None);
        }
        loop {
            if let Some(i) = find(&self.buf, &self.delim) {
                if i > 0 {
                    return Ok(Some(self.buf.split_to(i).freeze()));
                }
                self.buf.advance(self.delim.len());
                self.state = State::AfterBoundary;
                return Ok(None);
            }
            // Everything but what could be the start of the delimiter is data.
            let keep = self.delim.len() - 1;
            if self.buf.len() > keep {
                let n = self.buf.len() - keep;
                return Ok(Some(self.buf.split_to(n).freeze()));
            }
            if !self.fill().await? {
                return Err("multipart part without a closing boundary".into());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn parts(body: &[u8], frame: usize) -> Result<Vec<(Option<String>, Vec<u8>)>, String> {
        let frames: Vec<Result<Bytes, std::io::Error>> =
            body.chunks(frame).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
        let mut mp = Multipart::new("multipart/form-data; boundary=XX", futures_util::stream::iter(frames))?;
        let mut out = Vec::new();
        while let Some(name) = mp.next_part().await? {
            let mut data = Vec::new();
            while let Some(d) = mp.next_data().await? {
                data.extend_from_slice(&d);
            }
            out.push((name, data));
        }
        Ok(out)
    }

    #[tokio::test]
    async fn parts_are_found_whatever_the_frames_and_garbage_is_refused() {
        let body = b"preamble\r\n--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/tmp/a.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n\x00\x01\r\n\x02\r\n-X\r\n--XX\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nsecond\r\n--XX--\r\n";
        for frame in [1, 2, 3, 7, 64, body.len()] {
            let p = parts(body, frame).await.unwrap();
            assert_eq!(p.len(), 2, "frames of {frame}");
            assert_eq!(p[0], (Some("/tmp/a.bin".to_string()), b"\x00\x01\r\n\x02\r\n-X".to_vec()), "frames of {frame}");
            assert_eq!(p[1], (None, b"second".to_vec()), "frames of {frame}");
        }
        assert!(Multipart::new(
            "multipart/form-data",
            futures_util::stream::iter(Vec::<Result<Bytes, std::io::Error>>::new())
        )
        .is_err());
        assert!(parts(b"garbage", 3).await.is_err());
        assert!(parts(b"--XX\r\nno headers end", 3).await.is_err());
        assert!(parts(b"--XX\r\nContent-Disposition: form-data\r\n\r\nno closing boundary", 3).await.is_err());
        let huge_head = [b"--XX\r\nX: ".to_vec(), vec![b'a'; MAX_PART_HEAD + 10]].concat();
        assert!(parts(&huge_head, 4096).await.unwrap_err().contains("longer than"));
    }
}
