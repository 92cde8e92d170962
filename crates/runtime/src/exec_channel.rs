//! The host's side of the exec channel to a sandbox's pid 1, shared by the
//! tiers whose processes pid 1 starts (gVisor, microvm: see
//! [`strata_init::channel`] and [`strata_init::spawner`]): the command of the
//! exec helper (`strata-init _runsc_exec`) and the short requests the daemon
//! makes itself (signals, terminal sizes, a microVM's disk freeze).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use strata_init::channel::Frame;
use strata_init::runsc::{Job, RunscExec};
use strata_init::spawner::Request;
use tracing::debug;

use crate::RuntimeError;

/// The channel token of a sandbox: a new one at a cold start, or the one
/// saved (in `saved`) with the process image it resumes from, which its pid 1
/// already holds.
pub fn token(saved: Option<&Path>) -> Result<Vec<u8>, RuntimeError> {
    match saved {
        None => Ok(strata_init::channel::random_bytes()
            .map_err(|e| RuntimeError::sys("make the sandbox's channel token", e))?
            .to_vec()),
        Some(path) => std::fs::read(path).map_err(|e| {
            RuntimeError::Incompatible(format!("its saved image has no channel token ({}: {e})", path.display()))
        }),
    }
}

/// Writes a token to `path`, readable by root only (mode 0600).
pub fn write_token(path: &Path, token: &[u8]) -> Result<(), RuntimeError> {
    use std::os::unix::fs::OpenOptionsExt;
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
        std::io::Write::write_all(&mut f, token)
    };
    write().map_err(|e| RuntimeError::sys(format!("write {}", path.display()), e))
}

/// Takes the exec lock at `path` exclusive (every exec client holds it
/// shared until its process runs), waiting up to `patience`: while the
/// returned file is open no process starts in the sandbox.
pub fn lock_execs(path: &Path, patience: Duration) -> Result<std::fs::File, RuntimeError> {
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| RuntimeError::sys(format!("open {}", path.display()), e))?;
    let deadline = std::time::Instant::now() + patience;
    loop {
        // SAFETY: flock on our own descriptor.
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(lock);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(RuntimeError::sys(format!("lock {}", path.display()), e));
        }
        if std::time::Instant::now() > deadline {
            return Err(RuntimeError::Setup(format!(
                "a process started in the sandbox has not begun running after {patience:?}; try again"
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Why [`Pid1Channel::open_stream`] opened nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamRefused {
    /// Pid 1 refused the request: its reason (a file operation's as JSON).
    Refused(String),
    /// The channel failed (pid 1 unreachable, its answer malformed or late).
    Channel(String),
}

/// Where one sandbox's channel is reached from the host.
#[derive(Debug, Clone)]
pub struct Pid1Channel {
    /// The control socket that hands out connections to pid 1 (a gVisor
    /// sandbox's broker, a microVM's keeper).
    pub control: PathBuf,
    /// The file holding the token pid 1 proves (host-only).
    pub token: PathBuf,
}

impl Pid1Channel {
    /// Sends one short request to pid 1 and returns the number it answers
    /// ([`Frame::Signaled`]); its reason when it refuses.
    pub fn ask(&self, req: &Request, timeout: Duration) -> Result<u32, String> {
        let (mut conn, mut reader) = strata_init::runsc::connect(&self.control, &self.token)?;
        let bytes = serde_json::to_vec(req).expect("serializes");
        strata_init::channel::write_frame(&mut conn, Frame::Request, &bytes).map_err(|e| e.to_string())?;
        conn.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
        match reader.read_from(&mut conn).map_err(|e| e.to_string())? {
            Some((Frame::Signaled, n)) => Ok(n.as_slice().try_into().map(u32::from_le_bytes).unwrap_or(0)),
            Some((Frame::Failed, why)) => Err(String::from_utf8_lossy(&why).into_owned()),
            other => Err(format!("unexpected answer {:?}", other.map(|f| f.0))),
        }
    }

    /// Sends a request whose answer is long ([`Request::LayerManifest`],
    /// [`Request::LayerTar`], [`Request::Flush`]) and copies the answer's
    /// bytes to `out` until pid 1 says it ended: how many. More than `limit`
    /// bytes, a pause of `idle` between two frames, or an end without
    /// [`Frame::Ended`] is an error (pid 1 is the guest's: what it sends is
    /// untrusted).
    pub fn fetch(
        &self,
        req: &Request,
        out: &mut dyn std::io::Write,
        limit: u64,
        idle: Duration,
    ) -> Result<u64, String> {
        self.exchange(req, None, out, limit, idle)
    }

    /// [`Pid1Channel::fetch`], sending `input` after the request first (as
    /// [`Frame::Stdin`] frames, then [`Frame::StdinEof`]). Pid 1 may refuse
    /// before it has read it all: its answer is read anyway.
    pub fn exchange(
        &self,
        req: &Request,
        input: Option<&mut dyn std::io::Read>,
        out: &mut dyn std::io::Write,
        limit: u64,
        idle: Duration,
    ) -> Result<u64, String> {
        let (mut conn, mut reader) = strata_init::runsc::connect(&self.control, &self.token)?;
        let bytes = serde_json::to_vec(req).expect("serializes");
        strata_init::channel::write_frame(&mut conn, Frame::Request, &bytes).map_err(|e| format!("ask pid 1: {e}"))?;
        if let Some(input) = input {
            let mut buf = vec![0u8; 64 << 10];
            let sent = loop {
                let n = match input.read(&mut buf) {
                    Ok(0) => break strata_init::channel::write_frame(&mut conn, Frame::StdinEof, &[]),
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(format!("reading what goes to pid 1: {e}")),
                };
                if let Err(e) = strata_init::channel::write_frame(&mut conn, Frame::Stdin, &buf[..n]) {
                    break Err(e);
                }
            };
            // A write that fails means pid 1 answered early (a refusal): its answer says why.
            if let Err(e) = sent {
                debug!(error = %e, "pid 1 stopped taking the input before its end");
            }
        }
        conn.set_read_timeout(Some(idle)).map_err(|e| e.to_string())?;
        let mut got = 0u64;
        loop {
            match reader.read_from(&mut conn).map_err(|e| format!("pid 1's answer after {got} bytes: {e}"))? {
                Some((Frame::Stdout, data)) => {
                    got += data.len() as u64;
                    if got > limit {
                        return Err(format!("pid 1's answer is longer than {limit} bytes"));
                    }
                    out.write_all(&data).map_err(|e| format!("taking pid 1's answer: {e}"))?;
                }
                Some((Frame::Ended, _)) => return Ok(got),
                Some((Frame::Failed, why)) => return Err(String::from_utf8_lossy(&why).into_owned()),
                Some((other, _)) => return Err(format!("unexpected {other:?} frame in pid 1's answer")),
                None => return Err(format!("pid 1 closed the channel after {got} bytes, before the end")),
            }
        }
    }

    /// Opens a stream to pid 1 for a request whose stream goes on after the
    /// answer ([`Request::Connect`], [`Request::Watch`]): sends `req` and
    /// reads pid 1's first answer (within `patience`), and not a byte after
    /// it. The stream is returned blocking, without timeouts, with the
    /// answer's payload ([`Frame::Started`] or [`Frame::Signaled`]).
    pub fn open_stream(
        &self,
        req: &Request,
        patience: Duration,
    ) -> Result<(std::os::unix::net::UnixStream, Vec<u8>), StreamRefused> {
        let channel = |e: String| StreamRefused::Channel(e);
        let (mut conn, reader) = strata_init::runsc::connect(&self.control, &self.token).map_err(channel)?;
        // Pid 1 says nothing after its proof until it has a request: nothing is held back.
        if !reader.is_empty() {
            return Err(channel("pid 1 sent more than its proof".into()));
        }
        let bytes = serde_json::to_vec(req).expect("serializes");
        strata_init::channel::write_frame(&mut conn, Frame::Request, &bytes).map_err(|e| channel(e.to_string()))?;
        conn.set_read_timeout(Some(patience)).map_err(|e| channel(e.to_string()))?;
        let answer = strata_init::channel::read_one_frame(&mut conn, 64 << 10)
            .map_err(|e| channel(format!("pid 1's answer: {e}")))?;
        conn.set_read_timeout(None).map_err(|e| channel(e.to_string()))?;
        match answer {
            Some((Frame::Started | Frame::Signaled, payload)) => Ok((conn, payload)),
            Some((Frame::Failed, why)) => Err(StreamRefused::Refused(String::from_utf8_lossy(&why).into_owned())),
            Some((other, _)) => Err(channel(format!("unexpected {other:?} frame as pid 1's answer"))),
            None => Err(channel("pid 1 closed the channel without an answer".into())),
        }
    }

    /// [`Pid1Channel::open_stream`] as [`crate::Runtime::pid1_stream`] answers:
    /// pid 1's refusal is [`RuntimeError::Refused`]; `what` names the sandbox
    /// in a channel failure.
    pub fn runtime_stream(
        &self,
        what: &str,
        req: &Request,
        patience: Duration,
    ) -> Result<(std::os::unix::net::UnixStream, Vec<u8>), RuntimeError> {
        self.open_stream(req, patience).map_err(|e| match e {
            StreamRefused::Refused(why) => RuntimeError::Refused(why),
            StreamRefused::Channel(why) => RuntimeError::Setup(format!("the channel to {what}'s init: {why}")),
        })
    }

    /// Has pid 1 let go of every other connection (each gets [`Frame::LetGo`]
    /// after what it had queued; the processes' further output waits in
    /// their pipes) and returns how many relayed a process.
    pub fn detach(&self, timeout: Duration) -> Result<u32, String> {
        let (mut conn, mut reader) = strata_init::runsc::connect(&self.control, &self.token)?;
        let req = serde_json::to_vec(&Request::Detach).expect("serializes");
        strata_init::channel::write_frame(&mut conn, Frame::Request, &req).map_err(|e| format!("ask pid 1: {e}"))?;
        conn.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
        loop {
            match reader.read_from(&mut conn).map_err(|e| format!("pid 1's answer: {e}"))? {
                Some((Frame::Detached, n)) => return Ok(n.as_slice().try_into().map(u32::from_le_bytes).unwrap_or(0)),
                Some(_) => continue,
                None => return Err("pid 1 closed the channel without an answer".into()),
            }
        }
    }

    /// [`crate::Runtime::signal`] through pid 1: how many processes got it.
    pub fn signal(&self, sandbox_id: &str, ns_pid: i32, signal: i32, group: bool) -> usize {
        if ns_pid <= 1 {
            return 0; // pid 1 is strata's; never a process of the caller's
        }
        let req = Request::Signal { pid: ns_pid, signal, group };
        self.ask(&req, Duration::from_secs(10)).map(|n| n as usize).unwrap_or_else(|e| {
            debug!(sandbox = sandbox_id, error = %e, "signal through the exec channel");
            0
        })
    }

    /// [`crate::Runtime::resize_tty`] through pid 1, which holds the terminal's master.
    pub fn resize(&self, sandbox_id: &str, ns_pid: i32, size: crate::spec::TtySize) -> Result<(), RuntimeError> {
        match self.ask(&Request::Resize { pid: ns_pid, size }, Duration::from_secs(10)) {
            Ok(1) => Ok(()),
            Ok(_) => Err(RuntimeError::Setup(format!("process {ns_pid} of {sandbox_id} has no terminal"))),
            Err(e) => Err(RuntimeError::Setup(format!("resize the terminal of process {ns_pid}: {e}"))),
        }
    }

    /// `init_binary _runsc_exec` doing `job`: resolved against `root` on the
    /// host (gVisor), or by pid 1 in its own root (`None`: microvm); `lock` is
    /// held shared until the process runs.
    pub fn helper_command(
        &self,
        init_binary: &Path,
        root: Option<PathBuf>,
        hostname: &str,
        lock: PathBuf,
        job: Job,
    ) -> Command {
        let cfg = RunscExec {
            root,
            hostname: hostname.trim().to_string(),
            lock,
            broker: self.control.clone(),
            token: self.token.clone(),
            job,
        };
        let mut cmd = Command::new(init_binary);
        cmd.arg("_runsc_exec")
            .env_clear()
            .env(strata_init::runsc::CONFIG_ENV, serde_json::to_string(&cfg).expect("RunscExec serializes"));
        cmd
    }
}
