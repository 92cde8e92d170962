//! A small client of QEMU's machine protocol (QMP): JSON lines over the
//! VM's unix socket. Enough for standby: `stop`, `migrate` to a file,
//! `query-migrate`, `query-status`, `cont`, `quit`. Events QEMU sends
//! between answers are skipped.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// An open QMP session.
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    /// Connects to `socket` (waiting up to `patience` for QEMU to listen) and
    /// leaves capabilities negotiation.
    pub fn connect(socket: &Path, patience: Duration) -> Result<Qmp, String> {
        let deadline = Instant::now() + patience;
        let stream = loop {
            match UnixStream::connect(socket) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => return Err(format!("QMP socket {}: {e}", socket.display())),
            }
        };
        stream.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
        let writer = stream.try_clone().map_err(|e| e.to_string())?;
        let mut q = Qmp { reader: BufReader::new(stream), writer };
        let greeting = q.read()?;
        if greeting.get("QMP").is_none() {
            return Err(format!("not a QMP greeting: {greeting}"));
        }
        q.execute("qmp_capabilities", Value::Null)?;
        Ok(q)
    }

    fn read(&mut self) -> Result<Value, String> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err("QEMU closed its QMP socket".into()),
            Ok(_) => serde_json::from_str(&line).map_err(|e| format!("QMP sent {line:?}: {e}")),
            Err(e) => Err(format!("reading QMP: {e}")),
        }
    }

    /// Runs `command` with `arguments` (`Null`: none) and returns its `return`.
    pub fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, String> {
        let mut msg = json!({ "execute": command });
        if !arguments.is_null() {
            msg["arguments"] = arguments;
        }
        let mut bytes = serde_json::to_vec(&msg).expect("serializes");
        bytes.push(b'\n');
        self.writer.write_all(&bytes).map_err(|e| format!("QMP {command}: {e}"))?;
        loop {
            let v = self.read()?;
            if v.get("event").is_some() {
                continue;
            }
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                return Err(format!(
                    "QMP {command}: {}",
                    e.get("desc").and_then(Value::as_str).unwrap_or("an error without a description")
                ));
            }
        }
    }

    /// The VM's run state (`running`, `paused`, `inmigrate`, `postmigrate`, ...).
    pub fn status(&mut self) -> Result<String, String> {
        let r = self.execute("query-status", Value::Null)?;
        Ok(r.get("status").and_then(Value::as_str).unwrap_or("unknown").to_string())
    }

    /// Polls `query-migrate` until the migration ends: `Ok` when completed,
    /// `Err` with QEMU's reason when it failed, or after `timeout`.
    pub fn wait_migration(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            let r = self.execute("query-migrate", Value::Null)?;
            match r.get("status").and_then(Value::as_str).unwrap_or("") {
                "completed" => return Ok(()),
                "failed" | "cancelled" => {
                    let why = r.get("error-desc").and_then(Value::as_str).unwrap_or("no reason given");
                    return Err(format!("the VM's state could not be saved: {why}"));
                }
                _ if Instant::now() > deadline => return Err(format!("saving the VM's state took over {timeout:?}")),
                _ => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }
}
