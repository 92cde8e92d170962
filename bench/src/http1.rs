//! A minimal blocking HTTP/1.1 client over one kept-alive TCP connection: the
//! same client for two APIs of the daemon, so comparing them compares the
//! daemon's work, not two clients. Bodies are read whole (by `Content-Length`
//! or chunked), which is all the figures need.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;

use anyhow::{bail, Context, Result};

/// One connection to `addr`.
pub struct Conn {
    addr: String,
    reader: BufReader<TcpStream>,
}

/// A response: status and whole body.
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Conn {
    /// Connects to `addr` (`host:port`), no Nagle delay.
    pub fn open(addr: &str) -> Result<Conn> {
        let s = TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
        s.set_nodelay(true)?;
        Ok(Conn { addr: addr.to_string(), reader: BufReader::new(s) })
    }

    /// Sends one request and reads its whole response.
    pub fn request(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Result<Response> {
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n", self.addr, body.len());
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        let s = self.reader.get_mut();
        s.write_all(req.as_bytes())?;
        s.write_all(body)?;
        self.read_response().with_context(|| format!("{method} {path}"))
    }

    fn line(&mut self) -> Result<String> {
        let mut l = String::new();
        if self.reader.read_line(&mut l)? == 0 {
            bail!("connection closed");
        }
        Ok(l.trim_end().to_string())
    }

    fn read_response(&mut self) -> Result<Response> {
        let status_line = self.line()?;
        let status: u16 =
            status_line.split(' ').nth(1).and_then(|s| s.parse().ok()).context("malformed status line")?;
        let (mut len, mut chunked) = (None, false);
        loop {
            let h = self.line()?;
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap_or((&h, ""));
            match k.trim().to_ascii_lowercase().as_str() {
                "content-length" => len = v.trim().parse::<usize>().ok(),
                "transfer-encoding" => chunked = v.to_ascii_lowercase().contains("chunked"),
                _ => {}
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                let size = usize::from_str_radix(self.line()?.split(';').next().unwrap_or("").trim(), 16)
                    .context("malformed chunk size")?;
                if size == 0 {
                    self.line()?;
                    break;
                }
                let mut chunk = vec![0u8; size];
                self.reader.read_exact(&mut chunk)?;
                body.extend_from_slice(&chunk);
                self.line()?;
            }
        } else if let Some(n) = len {
            body.resize(n, 0);
            self.reader.read_exact(&mut body)?;
        }
        Ok(Response { status, body })
    }
}
