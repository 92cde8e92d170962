//! A private PostgreSQL server for tests (the store's own and the daemon's
//! integration tests): Debian's `postgresql` binaries, a cluster made with
//! `initdb` in a temporary directory, listening only on a free loopback port
//! with trust authentication, and gone with the process that started it.
//! Commits reach the write-ahead log before they return (a test that stops
//! the server loses nothing committed); nothing is fsynced.
//!
//! Not for production use: no password, no durability (`fsync=off`).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A running test server.
pub struct PgServer {
    port: u16,
    dir: PathBuf,
    /// The postmaster, when this value owns it (see [`PgServer::start`]).
    child: Option<Child>,
    /// The OS user it runs as (when started by root).
    user: Option<(u32, u32)>,
    bin: PathBuf,
}

/// Why no server can be started here, or `None` when one can.
pub fn unavailable() -> Option<String> {
    match bin_dir() {
        None => Some("no PostgreSQL server: /usr/lib/postgresql/*/bin/initdb is missing (scripts/setup-host.sh installs postgresql-15)".into()),
        Some(_) if is_root() && os_user("postgres").is_none() => {
            Some("no `postgres` user to run the PostgreSQL test server as (root cannot)".into())
        }
        Some(_) => None,
    }
}

/// The server shared by every test of this process, started on first use
/// (stopped when the process exits). `Err` says why there is none.
pub fn shared() -> Result<&'static PgServer, String> {
    static SERVER: OnceLock<Result<PgServer, String>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            // Started from a thread that lives as long as the process, so that
            // the server's parent-death signal fires when the process ends.
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                // Kept in a static, never dropped: the parent-death signal stops it.
                let _ = tx.send(PgServer::start());
                loop {
                    std::thread::park();
                }
            });
            rx.recv().unwrap_or_else(|_| Err("the PostgreSQL starter thread died".into()))
        })
        .as_ref()
        .map_err(Clone::clone)
}

impl PgServer {
    /// Starts a server owned by the returned value (stopped and removed on drop).
    pub fn start() -> Result<PgServer, String> {
        if let Some(why) = unavailable() {
            return Err(why);
        }
        let bin = bin_dir().expect("checked above");
        remove_stale_dirs();
        let dir = std::env::temp_dir().join(format!("strata-pg-{}-{}", std::process::id(), next_serial()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let user = if is_root() { os_user("postgres") } else { None };
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .map_err(|e| format!("chown {}: {e}", dir.display()))?;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("find a free port: {e}"))?
            .port();
        let mut server = PgServer { port, dir, child: None, user, bin };
        let out = server
            .command("initdb")
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C.UTF-8", "-D"])
            .arg(server.dir.join("data"))
            .output()
            .map_err(|e| format!("run initdb: {e}"))?;
        if !out.status.success() {
            return Err(format!("initdb failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        server.launch()?;
        Ok(server)
    }

    /// Starts the postmaster on its loopback port and waits until it answers.
    fn launch(&mut self) -> Result<(), String> {
        let log = std::fs::File::create(self.dir.join("server.log")).map_err(|e| format!("server log: {e}"))?;
        if let Some((uid, gid)) = self.user {
            let _ = std::os::unix::fs::chown(self.dir.join("server.log"), Some(uid), Some(gid));
        }
        let mut cmd = self.command("postgres");
        cmd.arg("-D").arg(self.dir.join("data")).arg("-p").arg(self.port.to_string());
        cmd.args(["-c", "listen_addresses=127.0.0.1", "-c"])
            .arg(format!("unix_socket_directories={}", self.dir.display()));
        cmd.args(["-c", "fsync=off", "-c", "full_page_writes=off"]);
        cmd.args(["-c", "max_connections=200", "-c", "shared_buffers=32MB"]);
        cmd.stdout(Stdio::null()).stderr(log);
        // SAFETY: the closure runs in the child between fork and exec and only
        // calls prctl(2), which is async-signal-safe; it allocates nothing.
        unsafe {
            cmd.pre_exec(|| {
                // The server stops (an immediate shutdown) when the thread that started it ends.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGQUIT) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        self.child = Some(cmd.spawn().map_err(|e| format!("start postgres: {e}"))?);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match postgres::Client::connect(&self.url("postgres"), postgres::NoTls) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
                    return Err(format!("postgres did not answer on port {}: {e}\n{log}", self.port));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid).gid(gid).current_dir(&self.dir);
        }
        cmd
    }

    /// The URL of database `db` on this server.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates a new, empty database and returns its URL.
    pub fn fresh_database(&self) -> String {
        let name = format!("strata_{}_{}", std::process::id(), next_serial());
        let mut c =
            postgres::Client::connect(&self.url("postgres"), postgres::NoTls).expect("connect to the test server");
        c.batch_execute(&format!("CREATE DATABASE {name}")).expect("create a test database");
        self.url(&name)
    }

    /// Stops the server (an owned one), as a crash or an operator would.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGQUIT: immediate shutdown; the server's backends end with it.
            // SAFETY: kill(2) on the pid of a child this value owns and has not reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGQUIT) };
            let _ = child.wait();
        }
    }

    /// Starts a stopped (owned) server again, on the same port.
    pub fn restart(&mut self) -> Result<(), String> {
        self.stop();
        self.launch()
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn next_serial() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn is_root() -> bool {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The newest `/usr/lib/postgresql/<version>/bin` with an initdb.
fn bin_dir() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, b)| b)
}

/// The uid and gid of an OS user, from /etc/passwd.
fn os_user(name: &str) -> Option<(u32, u32)> {
    std::fs::read_to_string("/etc/passwd").ok()?.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.first() == Some(&name) && f.len() > 3).then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))?
    })
}

/// Removes the directories of test servers whose process is gone.
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("strata-pg-")).and_then(|r| r.split('-').next())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}
