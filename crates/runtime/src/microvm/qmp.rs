//! A small client of QEMU's machine protocol (QMP): JSON lines over the
//! VM's unix socket. Enough for standby: `stop`, `add-fd` (a descriptor
//! passed with the command: QEMU runs unprivileged in an empty root and
//! opens no file itself), `migrate` to it, `query-migrate`, `query-status`,
//! `cont`, `quit`. Events QEMU sends between answers are skipped.

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
        self.execute_with_fd(command, arguments, None)
    }

    /// Hands QEMU `fd` in fd set `set` (QMP `add-fd`; the descriptor travels
    /// with the command, `SCM_RIGHTS`), for a later `/dev/fdset/SET` path.
    pub fn add_fd(&mut self, set: u32, fd: std::os::fd::BorrowedFd<'_>) -> Result<(), String> {
        self.execute_with_fd("add-fd", json!({ "fdset-id": set }), Some(fd)).map(drop)
    }

    fn execute_with_fd(
        &mut self,
        command: &str,
        arguments: Value,
        fd: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<Value, String> {
        use std::os::fd::AsRawFd;
        let mut msg = json!({ "execute": command });
        if !arguments.is_null() {
            msg["arguments"] = arguments;
        }
        let mut bytes = serde_json::to_vec(&msg).expect("serializes");
        bytes.push(b'\n');
        match fd {
            None => self.writer.write_all(&bytes).map_err(|e| format!("QMP {command}: {e}"))?,
            Some(fd) => {
                let fds = [fd.as_raw_fd()];
                let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
                let iov = [std::io::IoSlice::new(&bytes)];
                let sent = nix::sys::socket::sendmsg::<()>(
                    self.writer.as_raw_fd(),
                    &iov,
                    &cmsg,
                    nix::sys::socket::MsgFlags::empty(),
                    None,
                )
                .map_err(|e| format!("QMP {command}: {e}"))?;
                if sent != bytes.len() {
                    return Err(format!("QMP {command}: a short write ({sent} of {} bytes)", bytes.len()));
                }
            }
        }
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

/// Turns QEMU's `x-ignore-shared` migration capability on or off: with it,
/// RAM in a shared named file (a warm checkpoint's own, or the one a copy
/// maps) stays out of the migration stream.
pub fn set_ignore_shared(qmp: &mut Qmp, on: bool) -> Result<(), String> {
    qmp.execute(
        "migrate-set-capabilities",
        serde_json::json!({ "capabilities": [{ "capability": "x-ignore-shared", "state": on }] }),
    )
    .map(drop)
}
