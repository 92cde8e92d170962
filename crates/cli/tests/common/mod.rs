//! Shared harness of the integration tests: a private daemon per test, test
//! images, and explicit skips (printed as `skipped: <reason>`) where the host
//! cannot run a test. In CI (CI=true, root, images built) nothing is skipped:
//! a missing prerequisite there is a failure.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use strata_client::Client;

/// Path of the strata binary under test.
pub fn strata_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_strata"))
}

/// Directory holding the images made by scripts/build-test-images.sh.
pub fn images_dir() -> PathBuf {
    PathBuf::from(std::env::var("STRATA_TEST_IMAGES").unwrap_or_else(|_| "/var/cache/strata/images".into()))
}

/// An OCI layout (in `dir/oci-<greeting>`) of the busybox test image made by
/// strata's own writer, whose config sets `GREETING=<greeting>`.
pub fn busybox_layout(dir: &Path, greeting: &str) -> PathBuf {
    let cfg = strata_api::ImageConfig {
        env: vec!["PATH=/bin:/sbin".into(), format!("GREETING={greeting}")],
        cmd: vec!["sh".into()],
        ..Default::default()
    };
    let out = dir.join(format!("oci-{greeting}"));
    strata_image::write_oci_layout(&images_dir().join("busybox-rootfs.tar"), &out, &cfg).unwrap();
    out
}

/// Returns Some(reason) when integration tests cannot run here.
pub fn missing_prerequisite() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (namespaces, mounts, cgroups)".into());
    }
    let tar = images_dir().join("busybox-rootfs.tar");
    if !tar.exists() {
        return Some(format!("test image {} missing (run scripts/build-test-images.sh)", tar.display()));
    }
    None
}

/// Skips the calling test (returning from it) when prerequisites are missing,
/// printing the reason; in CI a missing prerequisite fails the test instead.
#[macro_export]
macro_rules! require_host {
    () => {
        if let Some(reason) = common::missing_prerequisite() {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("CI must be able to run this test, but: {reason}");
            }
            println!("skipped: {reason}");
            return;
        }
    };
}

/// Like [`require_host!`], and also skips (or, in CI, fails) when process
/// checkpointing (CRIU >= 4) is unavailable.
#[macro_export]
macro_rules! require_criu {
    () => {
        $crate::require_host!();
        if let Some(reason) = strata_runtime::namespace::criu::unsupported() {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("CI must be able to run this test, but: {reason}");
            }
            println!("skipped: {reason}");
            return;
        }
    };
}

/// Like [`require_host!`], and also skips (or, in CI, fails) when the gVisor
/// tier cannot run here (runsc missing or too old).
#[macro_export]
macro_rules! require_gvisor {
    () => {
        $crate::require_host!();
        if let Some(reason) = strata_runtime::gvisor::probe().unavailable() {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("CI must be able to run this test, but: {reason}");
            }
            println!("skipped: {reason}");
            return;
        }
    };
}

/// Skips (with the reason) a test of the microvm tier on a host that cannot
/// run it; in CI that is a failure.
#[macro_export]
macro_rules! require_microvm {
    () => {
        $crate::require_host!();
        if let Some(reason) = strata_runtime::microvm::probe().unavailable() {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("CI must be able to run this test, but: {reason}");
            }
            println!("skipped: {reason}");
            return;
        }
    };
}

/// A daemon with its own state directory and socket, stopped on drop.
pub struct TestDaemon {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    child: Option<Child>,
    pub listen: Option<String>,
    pub env: Vec<(String, String)>,
}

/// A network pool of its own for each daemon of a test binary: daemons that
/// share a pool share its nftables table and veth names, and each one's start
/// removes what it does not know there (the other's sandboxes' plumbing). The
/// network tests name theirs (10.220-10.252); these stay below.
fn own_network_pool() -> (String, String) {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 50;
    ("STRATA_NETWORK_POOL".to_string(), format!("10.{}.0.0/24", 160 + n))
}

/// `env` with a network pool of its own unless it names one.
fn with_own_pool(mut env: Vec<(String, String)>) -> Vec<(String, String)> {
    if !env.iter().any(|(k, _)| k == "STRATA_NETWORK_POOL") {
        env.push(own_network_pool());
    }
    env
}

impl TestDaemon {
    pub fn start() -> TestDaemon {
        Self::start_with(None)
    }

    pub fn start_with(listen: Option<&str>) -> TestDaemon {
        let dir = tempfile::Builder::new().prefix("strata-it-").tempdir_in("/var/tmp").expect("tempdir");
        let socket = dir.path().join("strata.sock");
        let state_dir = dir.path().join("state");
        let mut d = TestDaemon {
            dir,
            socket,
            state_dir,
            child: None,
            listen: listen.map(str::to_string),
            env: with_own_pool(Vec::new()),
        };
        d.spawn();
        d
    }

    /// A daemon started with extra environment (e.g. failpoints).
    pub fn start_with_env(env: &[(&str, &str)]) -> TestDaemon {
        let dir = tempfile::Builder::new().prefix("strata-it-").tempdir_in("/var/tmp").expect("tempdir");
        let socket = dir.path().join("strata.sock");
        let state_dir = dir.path().join("state");
        let env = with_own_pool(env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        let mut d = TestDaemon { dir, socket, state_dir, child: None, listen: None, env };
        d.spawn();
        d
    }

    fn spawn(&mut self) {
        // As a production state directory is: closed to every other id (a
        // sandbox's ids in its user namespace included), so that nothing that
        // runs as a sandbox's root may depend on reaching it.
        {
            use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
            let _ = std::fs::DirBuilder::new().mode(0o700).create(&self.state_dir);
            std::fs::set_permissions(&self.state_dir, std::fs::Permissions::from_mode(0o700)).expect("chmod state");
        }
        let mut cmd = Command::new(strata_bin());
        cmd.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd.arg("daemon").arg("--state-dir").arg(&self.state_dir).arg("--socket").arg(&self.socket);
        if let Some(l) = &self.listen {
            cmd.arg("--listen").arg(l);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("daemon.log"))
            .expect("log");
        let child =
            cmd.stdin(Stdio::null()).stdout(log.try_clone().unwrap()).stderr(log).spawn().expect("spawn daemon");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(&self.socket).is_err() {
            assert!(Instant::now() < deadline, "daemon did not come up; log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        // The daemon binds its TCP listener after the socket: wait for that too.
        if let Some(addr) = &self.listen {
            while std::net::TcpStream::connect(addr.as_str()).is_err() {
                assert!(Instant::now() < deadline, "daemon did not listen on {addr}; log:\n{}", self.log());
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }

    /// Kills the daemon with SIGKILL (sandboxes keep running) and starts it again.
    pub fn kill9_and_restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.spawn();
    }

    pub fn client(&self) -> Client {
        Client::unix(&self.socket)
    }

    /// The daemon's host pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("daemon running").id()
    }

    /// Runs the CLI against this daemon.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(strata_bin())
            .args(args)
            .env("STRATA_SOCKET", &self.socket)
            .stdin(Stdio::null())
            .output()
            .expect("run strata")
    }

    /// Runs the CLI with bytes on stdin.
    pub fn cli_stdin(&self, args: &[&str], input: &[u8]) -> Output {
        use std::io::Write;
        let mut child = Command::new(strata_bin())
            .args(args)
            .env("STRATA_SOCKET", &self.socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run strata");
        child.stdin.take().unwrap().write_all(input).unwrap();
        child.wait_with_output().unwrap()
    }

    /// Runs the CLI and asserts success, returning stdout.
    pub fn cli_ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "strata {args:?} failed ({:?}):\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Imports the busybox test image as `busybox`.
    pub fn import_busybox(&self) {
        let tar = images_dir().join("busybox-rootfs.tar");
        self.cli_ok(&["image", "import", tar.to_str().unwrap(), "--name", "busybox"]);
    }

    /// Creates a running busybox sandbox with extra CLI flags; returns its id.
    pub fn create(&self, extra: &[&str]) -> String {
        let mut args = vec!["create", "busybox"];
        args.extend_from_slice(extra);
        self.cli_ok(&args).trim().to_string()
    }

    /// Path of a file in the state directory.
    pub fn state(&self, rel: &str) -> PathBuf {
        self.state_dir.join(rel)
    }

    /// Host path of `rel` in a sandbox's writable layer (on its own disk when it has one).
    pub fn upper(&self, id: &str, rel: &str) -> PathBuf {
        let dir = self.state_dir.join("sandboxes").join(id);
        let upper = if dir.join("disk.img").exists() { dir.join("disk/upper") } else { dir.join("upper") };
        upper.join(rel)
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        // Destroy every sandbox so no namespaces, cgroups or processes outlive the test.
        let listing =
            serde_json::from_slice::<Vec<serde_json::Value>>(&self.cli(&["ps", "--json"]).stdout).unwrap_or_default();
        let ids: Vec<String> = listing.iter().filter_map(|s| s["id"].as_str().map(str::to_string)).collect();
        for id in ids {
            let _ = self.cli(&["rm", "-f", &id]);
        }
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill on our child's pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && !matches!(c.try_wait(), Ok(Some(_))) {
                std::thread::sleep(Duration::from_millis(20));
            }
            if !matches!(c.try_wait(), Ok(Some(_))) {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        // Tenancy fails closed: a check made by a task with no caller is a daemon
        // bug (background work must run as the daemon), logged; no test may cause one.
        let log = self.log();
        let no_caller: Vec<&str> = log.lines().filter(|l| l.contains(NO_CALLER_LOG)).collect();
        if !no_caller.is_empty() && !std::thread::panicking() {
            panic!("the daemon made tenancy checks with no caller:\n{}", no_caller.join("\n"));
        }
    }
}

/// What the daemon logs when a task with no caller makes a tenancy check.
const NO_CALLER_LOG: &str = "tenancy check outside any caller";

/// A tokio runtime for tests that use the async client.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// Stdout of a CLI run as a string.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Stderr of a CLI run as a string.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Waits until `f` holds or `secs` pass.
pub fn wait_until(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

/// Builds a tar archive in memory from (path, bytes) regular files.
pub fn tar_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (p, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        b.append_data(&mut h, p, *data).unwrap();
    }
    b.into_inner().unwrap()
}

/// A tar archive with one entry whose raw name is `name` (bypassing the tar
/// crate's own path checks, to build hostile archives).
pub fn raw_tar(name: &[u8], kind: tar::EntryType, link: Option<&[u8]>, data: &[u8]) -> Vec<u8> {
    let mut h = tar::Header::new_old();
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    if let Some(l) = link {
        h.as_old_mut().linkname[..l.len()].copy_from_slice(l);
    }
    h.set_entry_type(kind);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(data.len() as u64);
    h.set_cksum();
    let mut b = tar::Builder::new(Vec::new());
    b.append(&h, data).unwrap();
    b.into_inner().unwrap()
}

/// Concatenates tar archives (their entries, one end marker).
pub fn concat_tars(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(&p[..p.len() - 1024]);
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// Writes bytes to a file in `dir` and returns its path.
pub fn write_file(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p
}

/// A workload (busybox sh) holding `raw` random bytes as base64 text in a
/// shell variable (anonymous memory); on SIGUSR1 it writes the md5 of what it
/// holds to /root/sum. Started through the API in sandbox `id`.
pub fn start_held(d: &TestDaemon, id: &str, raw: u64) -> Held {
    let script = format!(
        "x=$(head -c {raw} /dev/urandom | base64)\n\
         trap 'echo \"$x\" | md5sum > /root/sum.tmp && mv /root/sum.tmp /root/sum' USR1\n\
         echo \"$x\" | md5sum > /root/sum0.tmp && mv /root/sum0.tmp /root/sum0\n\
         sleep 2147483647 & s=$!\n\
         while kill -0 $s 2>/dev/null; do wait $s; done\n"
    );
    let p = rt()
        .block_on(d.client().start_process(
            id,
            &strata_api::ExecRequest { cmd: vec!["sh".into(), "-c".into(), script], ..Default::default() },
        ))
        .unwrap();
    let sum0 = d.upper(id, "root/sum0");
    assert!(wait_until(60, || sum0.exists()), "the workload holds its text\n{}", d.log());
    let pid = rt().block_on(d.client().get_process(id, p.id)).unwrap().pid.expect("a pid inside");
    Held { pid, sum: std::fs::read_to_string(sum0).unwrap() }
}

/// The workload of [`start_held`]: its pid inside, and the md5 of what it held at the start.
pub struct Held {
    pub pid: i32,
    pub sum: String,
}

/// Asks the workload for the md5 of what it holds now (through an exec, so
/// it works whether or not the API still tracks the process) and compares.
pub fn assert_intact(d: &TestDaemon, id: &str, held: &Held, when: &str) {
    let sum = d.upper(id, "root/sum");
    let _ = std::fs::remove_file(&sum);
    d.cli_ok(&["exec", id, "--", "kill", "-USR1", &held.pid.to_string()]);
    assert!(wait_until(60, || sum.exists()), "{when}: the workload answers\n{}", d.log());
    assert_eq!(std::fs::read_to_string(&sum).unwrap(), held.sum, "{when}: every byte the workload held is back");
}
