//! `strata _vm_keep`: the parent of one microVM on the host.
//!
//! It joins the sandbox's cgroup, starts QEMU (which dies with it:
//! `PR_SET_PDEATHSIG`), connects to the VM's agent port (QEMU's chardev
//! socket), sends the channel token and waits for the guest's
//! [`Kind::Ready`]; then it reports to the daemon on its stdout and serves
//! the sandbox's control socket until QEMU exits, with QEMU's status:
//!
//! * [`strata_init::channel::TAKE`]: a new stream of the line
//!   ([`strata_init::mux`]), handed over as one end of a socketpair: the
//!   exec helper (`strata-init _runsc_exec`) talks to the guest's pid 1 over
//!   it exactly as to a gVisor sandbox's.
//! * [`STOP`] + grace (u32 LE seconds): the guest stops its processes
//!   within the grace and powers off.
//! * [`STREAMS`]: how many streams are open (a standby waits for none).
//!
//! The daemon watches the keeper as a namespace sandbox's init.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use strata_init::mux::{Event, GuestInfo, Kind, Mux};

use crate::gvisor::keeper::report;

/// Environment variable carrying the [`KeepConfig`] JSON.
pub const CONFIG_ENV: &str = "STRATA_VM_KEEP";

/// Control command: stop the guest (followed by the grace, u32 LE seconds).
pub const STOP: u8 = b's';
/// Control command: how many streams are open (answered with a u32 LE).
pub const STREAMS: u8 = b'n';

/// Asks the keeper at `control` how many of the line's streams are open.
pub fn open_streams(control: &Path) -> std::io::Result<u32> {
    let mut s = UnixStream::connect(control)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(&[STREAMS])?;
    let mut n = [0u8; 4];
    s.read_exact(&mut n)?;
    Ok(u32::from_le_bytes(n))
}

/// What the keeper runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeepConfig {
    /// The QEMU command line.
    pub qemu: Vec<String>,
    /// QEMU's agent chardev socket (QEMU listens).
    pub agent_socket: PathBuf,
    /// The control socket the keeper listens on (mode 0600).
    pub control_socket: PathBuf,
    /// The file holding the channel token.
    pub token: PathBuf,
    /// Where QEMU writes the guest's console (its tail explains a failed boot).
    pub console_log: PathBuf,
    /// Where the keeper writes QEMU's pid.
    pub qemu_pid_file: PathBuf,
    /// How long the guest may take to serve.
    pub boot_timeout_ms: u64,
    /// Files the keeper writes "0" to before QEMU starts (the sandbox's cgroup).
    pub cgroup_join: Vec<PathBuf>,
    /// QEMU's QMP socket.
    pub qmp_socket: PathBuf,
    /// QEMU loads a saved VM (`-incoming`): the keeper lets it run once
    /// loaded, and says hello to its pid 1 until it answers.
    #[serde(default)]
    pub incoming: bool,
    /// The sandbox's network namespace (egress): QEMU runs in it, where its
    /// tap ([`strata_net::link::GUEST_TAP`]) is.
    #[serde(default)]
    pub netns: Option<PathBuf>,
    /// The sandbox's disk, opened here (read-write and read-only, as
    /// [`DISK_FD_RW`] and [`DISK_FD_RO`]) for a QEMU that drops its
    /// privileges and could not open it itself.
    #[serde(default)]
    pub disk: Option<PathBuf>,
    /// The guest's RAM is a memfd the keeper makes and holds at [`RAM_FD`]
    /// (QEMU maps it shared): a warm checkpoint reads it from the keeper.
    #[serde(default)]
    pub ram_memfd: bool,
    /// A saved VM that QEMU waits for (`-incoming defer`): the keeper opens
    /// the file, hands it over QMP and has QEMU load it, with
    /// `x-ignore-shared` when `ignore_shared` (the RAM is not in the file:
    /// QEMU maps a warm checkpoint's RAM file instead).
    #[serde(default)]
    pub incoming_file: Option<PathBuf>,
    /// See `incoming_file`.
    #[serde(default)]
    pub ignore_shared: bool,
}

/// The descriptor number of the guest's RAM (a memfd) in the keeper and in QEMU.
pub const RAM_FD: i32 = 102;

/// The QEMU fd set a deferred incoming file is handed over in.
const INCOMING_FDSET: u32 = 9;

/// The descriptor number QEMU finds the sandbox's disk at, read-write.
pub const DISK_FD_RW: i32 = 100;
/// The same disk, read-only.
pub const DISK_FD_RO: i32 = 101;

/// The keeper's one line to the daemon on its stdout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KeepReport {
    /// The guest serves.
    Ready {
        /// QEMU's host pid.
        qemu_pid: i32,
        /// What the guest said.
        guest: GuestInfo,
        /// Milliseconds from QEMU's start to the guest serving.
        ready_ms: u64,
    },
    /// The boot failed.
    Failed {
        /// Why (with the console's last lines).
        message: String,
    },
}

/// Reads the keeper's report from its stdout.
pub fn read_report(stdout: impl Read) -> Option<KeepReport> {
    crate::gvisor::keeper::read_report(stdout)
}

/// The last lines of the guest's console (what it said before failing).
pub fn console_tail(path: &Path) -> String {
    use std::io::{Seek, SeekFrom};
    // Only its end is read: the guest writes the console, and may make it large.
    let mut text = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        if f.seek(SeekFrom::End(-4096)).is_err() {
            let _ = f.rewind();
        }
        let _ = f.take(4096).read_to_end(&mut text);
    }
    let text = String::from_utf8_lossy(&text).into_owned();
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    lines[lines.len().saturating_sub(6)..].join(" | ")
}

/// The most a guest's console file takes on the host: past it, the file
/// starts again from its last [`CONSOLE_KEEP`] bytes.
const CONSOLE_MAX: u64 = 1 << 20;
/// What is kept of the console when it is cut.
const CONSOLE_KEEP: usize = 64 << 10;

/// Copies the guest's console (QEMU's stdout) into `path`, which never grows
/// past [`CONSOLE_MAX`]: the guest writes it, and may write without end.
fn keep_console(mut from: impl Read, path: &Path) {
    let open = |truncate: bool| {
        std::fs::OpenOptions::new().create(true).append(!truncate).write(true).truncate(truncate).open(path)
    };
    let Ok(mut file) = open(false) else { return };
    let mut written = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut recent: std::collections::VecDeque<u8> = std::collections::VecDeque::with_capacity(CONSOLE_KEEP);
    let mut buf = [0u8; 8192];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        recent.extend(&buf[..n]);
        let over = recent.len().saturating_sub(CONSOLE_KEEP);
        recent.drain(..over);
        if written + n as u64 > CONSOLE_MAX {
            let Ok(f) = open(true) else { return };
            file = f;
            let (a, b) = recent.as_slices();
            let _ = file.write_all(a).and_then(|()| file.write_all(b));
            written = recent.len() as u64;
        } else {
            let _ = file.write_all(&buf[..n]);
            written += n as u64;
        }
    }
}

/// Says when the console's copy ended (QEMU's stdout closed).
static CONSOLE_COPIED: std::sync::OnceLock<std::sync::Mutex<std::sync::mpsc::Receiver<()>>> =
    std::sync::OnceLock::new();

fn fail(cfg: Option<&KeepConfig>, message: String) -> ! {
    // QEMU is gone (or killed) here: what it wrote last reaches the file first.
    if let Some(copied) = CONSOLE_COPIED.get() {
        let _ = copied.lock().map(|r| r.recv_timeout(Duration::from_secs(1)));
    }
    let tail = cfg.map(|c| console_tail(&c.console_log)).filter(|t| !t.is_empty());
    let message = match tail {
        Some(t) => format!("{message}; the guest's console ends with: {t}"),
        None => message,
    };
    eprintln!("strata vm keeper: {message}");
    report(&KeepReport::Failed { message });
    std::process::exit(1)
}

fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes integers and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the descriptor is new and ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn exited(child: &mut std::process::Child) -> Option<i32> {
    child.try_wait().ok().flatten().map(|s| s.code().unwrap_or(128 + 9))
}

/// Entry point of `strata _vm_keep`. Never returns.
pub fn main() -> ! {
    let raw = std::env::var(CONFIG_ENV).unwrap_or_else(|_| fail(None, format!("{CONFIG_ENV} is not set")));
    let cfg: KeepConfig = serde_json::from_str(&raw).unwrap_or_else(|e| fail(None, format!("parse config: {e}")));
    for f in &cfg.cgroup_join {
        if let Err(e) = std::fs::write(f, "0") {
            fail(Some(&cfg), format!("join the sandbox's cgroup ({}): {e}", f.display()));
        }
    }
    let token = std::fs::read(&cfg.token).unwrap_or_else(|e| fail(Some(&cfg), format!("the channel token: {e}")));
    if cfg.ram_memfd {
        if let Err(e) = ram_memfd() {
            fail(Some(&cfg), format!("the guest's RAM (a memfd at {RAM_FD}): {e}"));
        }
    }
    let t0 = Instant::now();
    let mut cmd = Command::new(&cfg.qemu[0]);
    // The guest's console is QEMU's stdout (`-chardev stdio`): kept bounded here.
    cmd.args(&cfg.qemu[1..]).stdin(Stdio::null()).stdout(Stdio::piped());
    let netns = cfg.netns.as_ref().map(|p| {
        std::fs::File::open(p)
            .unwrap_or_else(|e| fail(Some(&cfg), format!("the network namespace {}: {e}", p.display())))
    });
    let netns_fd = netns.as_ref().map(|f| f.as_raw_fd());
    let disk = cfg.disk.as_ref().map(|p| {
        let open = |write: bool| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(write)
                .open(p)
                .unwrap_or_else(|e| fail(Some(&cfg), format!("the disk {}: {e}", p.display())))
        };
        (open(true), open(false))
    });
    let disk_fds = disk.as_ref().map(|(rw, ro)| [(rw.as_raw_fd(), DISK_FD_RW), (ro.as_raw_fd(), DISK_FD_RO)]);
    // SAFETY: the hook only calls prctl, setns and dup2, which are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(fd) = netns_fd {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            // dup2 leaves the copies open across exec (the originals are close-on-exec).
            for (from, to) in disk_fds.into_iter().flatten() {
                if libc::dup2(from, to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut qemu = cmd.spawn().unwrap_or_else(|e| fail(Some(&cfg), format!("start {}: {e}", cfg.qemu[0])));
    let qemu_pid = qemu.id() as i32;
    let _ = std::fs::write(&cfg.qemu_pid_file, format!("{qemu_pid}\n"));
    if let Some(out) = qemu.stdout.take() {
        let path = cfg.console_log.clone();
        let (done, copied) = std::sync::mpsc::channel();
        let _ = CONSOLE_COPIED.set(std::sync::Mutex::new(copied));
        std::thread::spawn(move || {
            keep_console(out, &path);
            let _ = done.send(());
        });
    }
    let deadline = t0 + Duration::from_millis(cfg.boot_timeout_ms);
    let line = loop {
        if let Some(code) = exited(&mut qemu) {
            fail(Some(&cfg), format!("QEMU exited with status {code} before its agent port opened"));
        }
        match UnixStream::connect(&cfg.agent_socket) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => {
                let _ = qemu.kill();
                fail(Some(&cfg), format!("QEMU's agent socket {}: {e}", cfg.agent_socket.display()))
            }
        }
    };
    let _ = line.set_nonblocking(true);
    let pidfd = pidfd_open(qemu_pid).unwrap_or_else(|e| fail(Some(&cfg), format!("pidfd_open: {e}")));
    if cfg.incoming {
        if let Err(e) = run_loaded(&cfg, deadline) {
            let _ = qemu.kill();
            fail(Some(&cfg), e)
        }
    }
    let mut mux = Mux::new(line);
    let hello = |mux: &mut Mux<UnixStream>| {
        mux.send_control(Kind::Token, &token);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        mux.send_control(Kind::Clock, &(now.as_nanos() as u64).to_le_bytes());
    };
    hello(&mut mux);
    let mut said_hello = Instant::now();
    let guest = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let _ = qemu.kill();
            fail(Some(&cfg), format!("the guest did not answer its agent within {} ms", cfg.boot_timeout_ms));
        }
        let ready = mux.step(&[pidfd.as_fd()], left.as_millis().min(100) as i32);
        if ready[0] {
            let code = qemu.wait().map(|s| s.code().unwrap_or(128 + 9)).unwrap_or(-1);
            fail(Some(&cfg), format!("QEMU exited with status {code} while the guest booted"));
        }
        let ready_event = mux.take_events().into_iter().find_map(|e| match e {
            Event::Ready(info) => Some(info),
            _ => None,
        });
        if let Some(info) = ready_event {
            break info;
        }
        // A restored guest may drop what came while its port had no host: say it again.
        if cfg.incoming && said_hello.elapsed() > Duration::from_millis(250) {
            hello(&mut mux);
            said_hello = Instant::now();
        }
    };
    let control = strata_init::channel::bind_listener(&cfg.control_socket, 0o600).unwrap_or_else(|e| {
        let _ = qemu.kill();
        fail(Some(&cfg), format!("listen on {}: {e}", cfg.control_socket.display()))
    });
    report(&KeepReport::Ready { qemu_pid, guest, ready_ms: t0.elapsed().as_millis() as u64 });
    serve(mux, &control, &pidfd, qemu)
}

/// Makes the guest's RAM, a memfd at [`RAM_FD`] that QEMU inherits (and
/// sizes): the keeper holds it as long as it lives.
fn ram_memfd() -> std::io::Result<()> {
    // SAFETY: the name is a NUL-terminated literal.
    let fd = unsafe { libc::memfd_create(c"strata-vm-ram".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is ours; dup2 onto RAM_FD (a number the keeper has not opened
    // yet: it runs first thing) leaves a copy without close-on-exec, for QEMU.
    let r = unsafe { libc::dup2(fd, RAM_FD) };
    // SAFETY: the original is ours and no longer needed.
    unsafe { libc::close(fd) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Waits for QEMU to load the saved VM, then lets it run.
fn run_loaded(cfg: &KeepConfig, deadline: Instant) -> Result<(), String> {
    let patience = deadline.saturating_duration_since(Instant::now());
    let mut qmp = super::qmp::Qmp::connect(&cfg.qmp_socket, patience)?;
    if let Some(path) = &cfg.incoming_file {
        // QEMU waits (`-incoming defer`) in its empty root: the file comes over QMP.
        let file = std::fs::File::open(path).map_err(|e| format!("the saved VM {}: {e}", path.display()))?;
        super::qmp::set_ignore_shared(&mut qmp, cfg.ignore_shared)?;
        qmp.add_fd(INCOMING_FDSET, file.as_fd())?;
        qmp.execute("migrate-incoming", serde_json::json!({ "uri": format!("file:/dev/fdset/{INCOMING_FDSET}") }))?;
    }
    loop {
        match qmp.status()?.as_str() {
            "inmigrate" if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            "inmigrate" => return Err("QEMU did not load the saved VM in time".into()),
            "running" => return Ok(()),
            "paused" | "postmigrate" | "prelaunch" => return qmp.execute("cont", serde_json::Value::Null).map(drop),
            other => return Err(format!("QEMU could not load the saved VM (its state: {other})")),
        }
    }
}

/// The keeper's life once the guest serves: streams for whoever takes
/// them, stops asked for, until QEMU exits (the keeper exits with its code).
fn serve(mut mux: Mux<UnixStream>, control: &UnixListener, pidfd: &OwnedFd, mut qemu: std::process::Child) -> ! {
    let mut next_stream: u32 = 1;
    loop {
        let ready = mux.step(&[control.as_fd(), pidfd.as_fd()], -1);
        if ready[1] {
            let code = qemu.wait().map(|s| s.code().unwrap_or(128 + 9)).unwrap_or(0);
            std::process::exit(code)
        }
        // The line ended: QEMU is exiting (its pidfd says when).
        let _ = mux.take_events();
        if !ready[0] {
            continue;
        }
        while let Ok((c, _)) = control.accept() {
            let _ = c.set_nonblocking(false);
            let _ = c.set_read_timeout(Some(Duration::from_secs(1)));
            let mut cmd = [0u8; 1];
            if (&c).read_exact(&mut cmd).is_err() {
                continue;
            }
            match cmd[0] {
                strata_init::channel::TAKE if mux.line_closed() => {
                    strata_init::channel::refuse(&c, "the microVM is shutting down")
                }
                strata_init::channel::TAKE => match UnixStream::pair() {
                    Ok((mine, theirs)) => {
                        mux.add(next_stream, mine, true);
                        next_stream = next_stream.wrapping_add(1).max(1);
                        let _ = strata_init::channel::hand_over(&c, theirs.as_fd());
                    }
                    Err(e) => strata_init::channel::refuse(&c, &format!("socketpair: {e}")),
                },
                STREAMS => {
                    let _ = (&c).write_all(&(mux.streams() as u32).to_le_bytes());
                }
                STOP => {
                    let mut grace = [0u8; 4];
                    let _ = (&c).read_exact(&mut grace);
                    mux.send_control(Kind::Stop, &grace);
                    let _ = strata_init::channel::answer_done(&c);
                }
                _ => strata_init::channel::refuse(&c, "unknown command"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_console_that_never_stops_keeps_a_bounded_file_ending_with_its_last_words() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("console.log");
        // 3 MiB of numbered lines, then the last words.
        let mut text: Vec<u8> = (0..200_000u32).flat_map(|i| format!("line {i:08}\n").into_bytes()).collect();
        text.extend_from_slice(b"last words\n");
        keep_console(&text[..], &path);
        let kept = std::fs::read(&path).unwrap();
        assert!(kept.len() as u64 <= CONSOLE_MAX, "{} bytes kept", kept.len());
        assert!(kept.ends_with(b"line 00199999\nlast words\n"));
        assert_eq!(console_tail(&path).rsplit(" | ").next(), Some("last words"));
    }
}
