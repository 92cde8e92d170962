//! Escape suite: from inside a sandbox, try to reach the host filesystem, host
//! processes, another sandbox, the daemon's socket and state directory, raw
//! sockets, mounts, kernel modules, ptrace, /proc and /sys write paths, the
//! cgroup tree, device nodes and the privileged syscalls. Every attempt is a
//! real command whose failure is checked for the *right reason* (the errno or
//! message the isolation layer produces, never "not found"), and at the end
//! the host (a marker file, a host process, the host's hostname and clock) and
//! a canary sandbox (a counter loop and a file) are checked to be untouched.
//! Fork and memory bombs are in isolation.rs; filling the disk in disk.rs.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{stderr, stdout, TestDaemon};

/// Runs `script` with sh in `id`; returns (exit code, stdout + stderr).
fn run(d: &TestDaemon, id: &str, script: &str) -> (i32, String) {
    let out = d.cli(&["exec", "--timeout", "30s", id, "--", "sh", "-c", script]);
    (out.status.code().unwrap_or(-1), format!("{}{}", stdout(&out), stderr(&out)))
}

/// Asserts that `script` fails inside `id` with output naming one of `why`.
#[track_caller]
fn refused(d: &TestDaemon, id: &str, script: &str, why: &[&str]) {
    let (code, out) = run(d, id, script);
    assert_ne!(code, 0, "escape attempt succeeded: {script}\n{out}");
    assert!(
        !out.contains("not found") && !out.contains("applet"),
        "attempt did not run (missing tool?): {script}\n{out}"
    );
    assert!(why.iter().any(|w| out.contains(w)), "{script}: failed, but not for the expected reason {why:?}:\n{out}");
}

/// The canary: a second sandbox with a running counter and a file, checked at the end.
struct Canary {
    id: String,
}

impl Canary {
    fn start(d: &TestDaemon, extra: &[&str]) -> Canary {
        let id = d.create(extra);
        d.cli_ok(&["exec", &id, "--", "sh", "-c", "echo canary-data > /canary-file"]);
        d.cli_ok(&[
            "exec",
            "-d",
            &id,
            "--",
            "sh",
            "-c",
            "i=0; while true; do i=$((i+1)); echo $i > /counter; sleep 0.1; done",
        ]);
        assert!(
            common::wait_until(10, || d.cli(&["exec", &id, "--", "cat", "/counter"]).status.success()),
            "canary counter never started"
        );
        Canary { id }
    }

    fn assert_alive(&self, d: &TestDaemon) {
        let read = || d.cli_ok(&["exec", &self.id, "--", "cat", "/counter"]).trim().parse::<u64>().unwrap();
        let a = read();
        std::thread::sleep(Duration::from_millis(600));
        let b = read();
        assert!(b > a, "canary counter stopped: {a} then {b}");
        assert_eq!(d.cli_ok(&["exec", &self.id, "--", "cat", "/canary-file"]), "canary-data\n");
        let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", &self.id, "--json"])).unwrap();
        assert_eq!(info["state"], "running", "{info}");
    }

    fn init_pid(&self, d: &TestDaemon) -> i64 {
        let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", &self.id, "--json"])).unwrap();
        info["init_pid"].as_i64().expect("canary init pid")
    }
}

/// A file on the host (under /work or /var/tmp) with random content, and a host process.
struct Host {
    marker: std::path::PathBuf,
    content: String,
    sleeper: Child,
    hostname: String,
}

impl Host {
    fn new(tag: &str) -> Host {
        let base = if std::path::Path::new("/work").is_dir() { "/work" } else { "/var/tmp" };
        let content = format!(
            "host-marker-{}-{}",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
        );
        let marker = std::path::PathBuf::from(format!("{base}/strata-escape-marker-{}-{tag}", std::process::id()));
        std::fs::write(&marker, &content).unwrap();
        let sleeper = Command::new("sleep").arg("600").stdin(Stdio::null()).spawn().unwrap();
        Host { marker, content, sleeper, hostname: std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap() }
    }

    fn assert_untouched(&mut self) {
        assert_eq!(std::fs::read_to_string(&self.marker).unwrap(), self.content, "host marker file changed");
        assert!(self.sleeper.try_wait().unwrap().is_none(), "host process was killed");
        assert_eq!(
            std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap(),
            self.hostname,
            "host hostname changed"
        );
        assert_ne!(std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap().trim(), "|/bin/evil");
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.sleeper.kill();
        let _ = self.sleeper.wait();
        let _ = std::fs::remove_file(&self.marker);
    }
}

const ENOENT: &[&str] = &["No such file", "nonexistent directory"];
const EPERM: &[&str] = &["Operation not permitted", "Permission denied", "permission denied"];
const EROFS: &[&str] = &["Read-only file system"];

#[test]
fn host_filesystem_processes_daemon_and_other_sandboxes_are_out_of_reach() {
    require_host!();
    let mut host = Host::new("fs");
    let d = TestDaemon::start_with_env(&[("STRATA_NETWORK_POOL", "10.252.0.0/24")]);
    d.import_busybox();
    let canary = Canary::start(&d, &["--network", "egress", "--allow-cidr", "0.0.0.0/0"]);
    let id = d.create(&["--name", "attacker", "--network", "egress", "--allow-cidr", "0.0.0.0/0"]);
    let marker = host.marker.display().to_string();
    let marker_dir = host.marker.parent().unwrap().display().to_string();

    // --- The host filesystem: absolute paths, /proc/<pid>/root, cwd, symlinks and `..`.
    refused(&d, &id, &format!("cat {marker}"), ENOENT);
    refused(&d, &id, &format!("echo pwned > {marker}"), ENOENT);
    refused(&d, &id, &format!("cat /proc/self/root{marker}"), ENOENT);
    refused(&d, &id, &format!("cat /proc/1/root{marker}"), &["Permission denied", "No such file"]);
    refused(&d, &id, "ls /proc/1/root/", EPERM);
    refused(&d, &id, "ls /proc/1/cwd/", EPERM);
    refused(&d, &id, &format!("cd /; cat ../../../../../..{marker}"), ENOENT);
    refused(&d, &id, &format!("ln -s {marker} /tmp/l && cat /tmp/l"), ENOENT);
    refused(&d, &id, &format!("ln -s ../../../../..{marker_dir} /tmp/d && ls /tmp/d/"), ENOENT);
    refused(&d, &id, &format!("ln {marker} /tmp/h"), ENOENT);
    // Every process the sandbox can see has its root and cwd inside the sandbox.
    let (_, out) = run(&d, &id, &format!("for p in /proc/[0-9]*; do ls $p/root{marker_dir} $p/cwd/..{marker_dir} 2>&1 | grep -c strata-escape-marker; done"));
    assert!(out.lines().all(|l| l.trim() == "0"), "a visible process has the host as root or cwd:\n{out}");
    // The host's /etc/shadow is not the one the sandbox reads.
    if let Ok(host_shadow) = std::fs::read_to_string("/etc/shadow") {
        let (_, inside) = run(&d, &id, "cat /etc/shadow");
        assert_ne!(inside, host_shadow, "the sandbox reads the host's /etc/shadow");
    }
    // Nothing of the host's big trees is visible.
    refused(&d, &id, "ls /var/lib/strata /var/cache/strata", ENOENT);
    refused(&d, &id, &format!("ls {}", d.state_dir.display()), ENOENT);

    // --- The daemon: its socket and state directory are not in the sandbox; no unix socket file at all.
    refused(&d, &id, &format!("ls {}", d.socket.display()), ENOENT);
    refused(&d, &id, &format!("ls {}", d.state(&format!("sandboxes/{}/upper", canary.id)).display()), ENOENT);
    let (_, sockets) = run(&d, &id, "find / -xdev -type s 2>/dev/null; find /run /tmp /dev /var -type s 2>/dev/null");
    assert!(sockets.trim().is_empty(), "unix sockets visible inside: {sockets}");
    let (_, mounts) = run(&d, &id, "cat /proc/self/mountinfo");
    // (No host path appears in mountinfo at all: kernel_information_and_host_paths_are_masked.)
    for l in mounts.lines() {
        let mount_point = l.split(' ').nth(4).unwrap();
        assert!(
            !mount_point.starts_with("/work") && !mount_point.starts_with("/var/tmp"),
            "host path mounted inside: {l}"
        );
    }

    // --- Host processes and the canary's: invisible and unkillable.
    let host_pid = host.sleeper.id();
    let canary_pid = canary.init_pid(&d);
    refused(&d, &id, &format!("kill -9 {host_pid}"), &["No such process"]);
    refused(&d, &id, &format!("kill -9 {canary_pid}"), &["No such process"]);
    refused(&d, &id, &format!("ls /proc/{host_pid}/"), ENOENT);
    let (_, pids) = run(&d, &id, "ls /proc | grep -E '^[0-9]+$'");
    assert!(pids.lines().count() <= 6, "more processes than the sandbox's own: {pids}");
    assert!(!pids.lines().any(|p| p == host_pid.to_string() || p == canary_pid.to_string()), "{pids}");
    let (_, ps) = run(&d, &id, "ps -o pid,args");
    assert!(!ps.contains("sleep 600") && !ps.contains("counter"), "host or canary processes visible:\n{ps}");

    // --- The canary's files and network.
    let (_, found) = run(&d, &id, "find / -xdev -name canary-file 2>/dev/null; find / -xdev -name counter 2>/dev/null");
    assert!(found.trim().is_empty(), "canary files visible: {found}");
    let canary_addr = serde_json::from_str::<serde_json::Value>(&d.cli_ok(&["network", "show", &canary.id, "--json"]))
        .ok()
        .and_then(|v| v["address"].as_str().map(str::to_string));
    let canary_addr = canary_addr.expect("canary has an address");
    d.cli_ok(&["exec", "-d", &canary.id, "--", "sh", "-c", "while true; do echo secret | nc -l -p 9000; done"]);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        d.cli_ok(&["exec", &canary.id, "--", "sh", "-c", "nc -w 2 127.0.0.1 9000 </dev/null"]).trim(),
        "secret",
        "the canary's listener works locally"
    );
    let (code, out) = run(&d, &id, &format!("nc -w 2 {canary_addr} 9000 </dev/null"));
    assert!(code != 0 || !out.contains("secret"), "the attacker reached the canary's port: {out}");

    // --- Raw sockets, mounts, namespaces.
    refused(
        &d,
        &id,
        "ping -c 1 -W 1 127.0.0.1",
        &["permission denied", "Operation not permitted", "Permission denied"],
    );
    refused(&d, &id, "mount -t tmpfs none /mnt", EPERM);
    refused(&d, &id, "mount -t proc proc /mnt", EPERM);
    refused(&d, &id, "mount -t cgroup -o memory cgroup /mnt", EPERM);
    refused(&d, &id, "mount -o remount,rw /proc/sys", EPERM);
    refused(&d, &id, "umount /proc/sys", EPERM);
    refused(&d, &id, "umount -l /proc", EPERM);
    refused(&d, &id, "mount --bind / /mnt", EPERM);

    // --- /proc and /sys write paths, module loading, the cgroup tree.
    // Read-only where the host kernel has the file; where it lacks it (this CI
    // kernel has no modules, sysrq or kcore), it must not appear inside either.
    for (path, value) in [
        ("/proc/sys/kernel/core_pattern", "|/bin/evil"),
        ("/proc/sys/kernel/modprobe", "/tmp/evil"),
        ("/proc/sys/vm/drop_caches", "1"),
        ("/proc/sys/kernel/sysrq", "1"),
        ("/proc/sys/kernel/hostname", "evil"),
        ("/proc/sysrq-trigger", "b"),
        ("/sys/kernel/uevent_helper", "/tmp/evil"),
        ("/sys/kernel/mm/transparent_hugepage/enabled", "never"),
        ("/sys/power/state", "mem"),
    ] {
        let why: &[&str] = if std::path::Path::new(path).exists() {
            EROFS
        } else {
            &["No such file", "nonexistent directory", "Read-only file system"]
        };
        refused(&d, &id, &format!("echo '{value}' > {path}"), why);
    }
    // No cgroup filesystem inside (sysfs is read-only and /sys/fs/cgroup is empty or absent).
    refused(&d, &id, "mkdir /sys/fs/cgroup/evil", &["Read-only file system", "No such file"]);
    refused(
        &d,
        &id,
        "echo $$ > /sys/fs/cgroup/cgroup.procs",
        &["Read-only file system", "nonexistent directory", "No such file"],
    );
    refused(
        &d,
        &id,
        "echo /evil > /sys/fs/cgroup/release_agent",
        &["Read-only file system", "nonexistent directory", "No such file"],
    );
    let (_, cg) = run(&d, &id, "cat /proc/self/cgroup");
    assert!(cg.lines().all(|l| l.ends_with(":/")), "cgroup paths leak the host tree (no cgroup namespace): {cg}");
    if std::path::Path::new("/proc/kcore").exists() {
        let (_, kcore) = run(&d, &id, "wc -c < /proc/kcore");
        assert_eq!(kcore.trim(), "0", "/proc/kcore is masked");
    }
    refused(&d, &id, "cat /proc/1/environ", EPERM);
    refused(&d, &id, "cat /proc/1/mem", EPERM);

    // --- Device nodes.
    for dev in [
        "/dev/mem",
        "/dev/kmem",
        "/dev/port",
        "/dev/sda",
        "/dev/vda",
        "/dev/nvme0n1",
        "/dev/loop0",
        "/dev/loop-control",
        "/dev/kvm",
        "/dev/fuse",
        "/dev/net/tun",
    ] {
        refused(&d, &id, &format!("head -c 1 {dev}"), ENOENT);
    }
    refused(&d, &id, "mknod /tmp/sda b 8 0", EPERM);
    refused(&d, &id, "mknod /tmp/mem c 1 1", EPERM);
    let (_, devs) = run(&d, &id, "ls /dev");
    assert_eq!(
        devs.split_whitespace().collect::<Vec<_>>(),
        [
            "fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout", "tty",
            "urandom", "zero"
        ],
        "/dev holds more than the safe nodes"
    );

    // --- Clock, hostname, reboot.
    // (busybox date exits 0 even when settimeofday fails: check the message and the clock.)
    let (_, out) = run(&d, &id, "date -s '2001-01-01 00:00'");
    assert!(out.contains("can't set date: Operation not permitted"), "{out}");
    assert!(d.cli_ok(&["exec", &id, "--", "date", "+%Y"]).trim().parse::<u32>().unwrap() > 2020, "the clock was set");
    refused(&d, &id, "hostname evil", EPERM);
    assert_eq!(d.cli_ok(&["exec", &id, "--", "hostname"]), "attacker\n");

    // --- Killing everything the sandbox can see leaves the host and the canary alone.
    let _ = run(&d, &id, "kill -9 -1; sleep 1");
    host.assert_untouched();
    canary.assert_alive(&d);
    // The attacker sandbox itself is still usable (its init survives kill -1).
    assert_eq!(d.cli_ok(&["exec", &id, "--", "echo", "ok"]), "ok\n");
}

/// Each privileged syscall, made directly through libc (python ctypes): the
/// result and errno, as `name rc errno` lines.
const SYSCALLS: &str = r#"
import ctypes, errno, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
host_pid = int(sys.argv[1])
# Descriptors inherited from outside: none but stdio, and none naming a host file.
for fd in sorted(os.listdir("/proc/self/fd"), key=int):
    try:
        print("fd_" + fd, 0, os.readlink("/proc/self/fd/" + fd).replace(" ", "_"), flush=True)
    except OSError:
        pass
def sc(name, nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    e = ctypes.get_errno()
    print(name, r, errno.errorcode.get(e, e) if r == -1 else "OK", flush=True)
b = lambda s: ctypes.c_char_p(s.encode())
os.makedirs("/tmp/m", exist_ok=True)
sc("mount", 165, b("none"), b("/tmp/m"), b("tmpfs"), 0, 0)
sc("umount2", 166, b("/proc"), 2)
sc("pivot_root", 155, b("/tmp"), b("/tmp/m"))
sc("unshare_user", 272, 0x10000000)
sc("unshare_mnt", 272, 0x00020000)
sc("unshare_net", 272, 0x40000000)
sc("clone_newuser", 56, 0x10000000 | 17, 0, 0, 0, 0)
fd = os.open("/proc/self/ns/net", os.O_RDONLY)
sc("setns", 308, fd, 0)
sc("init_module", 175, 0, 0, b(""))
mfd = os.open("/bin/sh", os.O_RDONLY)
sc("finit_module", 313, mfd, b(""), 0)
sc("delete_module", 176, b("ext4"), 0)
sc("kexec_load", 246, 0, 0, 0, 0)
sc("kexec_file_load", 320, mfd, mfd, 0, b(""), 0)
sc("reboot", 169, 0xfee1dead, 672274793, 0x4321fedc, 0)
sc("bpf", 321, 0, 0, 0)
attr = ctypes.create_string_buffer(128)
sc("perf_event_open", 298, attr, 0, -1, -1, 0)
sc("keyctl", 250, 0, -3, 0)
sc("add_key", 248, b("user"), b("k"), b("v"), 1, -3)
sc("request_key", 249, b("user"), b("k"), 0, 0)
sc("userfaultfd", 323, 0)
ts = (ctypes.c_long * 2)(0, 0)
sc("clock_settime", 227, 0, ts)
sc("settimeofday", 164, ts, 0)
tx = ctypes.create_string_buffer(256)
ctypes.memmove(tx, (ctypes.c_uint * 1)(0x0001), 4)
sc("adjtimex", 159, tx)
sc("sethostname", 170, b("evil"), 4)
sc("setdomainname", 171, b("evil"), 4)
sc("ptrace_attach_init", 101, 16, 1, 0, 0)
sc("ptrace_attach_host", 101, 16, host_pid, 0, 0)
buf = ctypes.create_string_buffer(8)
liov = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 8)
riov = (ctypes.c_void_p * 2)(0x400000, 8)
sc("process_vm_readv_init", 310, 1, liov, 1, riov, 1, 0)
sc("swapon", 167, b("/tmp/m"), 0)
sc("acct", 163, b("/tmp/acct"))
sc("quotactl", 179, 0x800007, b("/"), 0, 0)
sc("open_by_handle_at", 304, -100, attr, 0)
sc("name_to_handle_at", 303, -100, b("/"), attr, attr, 0)
sc("io_uring_setup", 425, 1, attr)
sc("syslog", 103, 3, attr, 10)
sc("iopl", 172, 3)
sc("ioperm", 173, 0x80, 1, 1)
sc("fsopen", 430, b("tmpfs"), 0)
sc("open_tree", 428, -100, b("/"), 1)
sc("mknod_block", 133, b("/tmp/sda"), 0o60600, (8 << 8) | 0)
sc("mknod_mem", 133, b("/tmp/mem"), 0o20600, (1 << 8) | 1)
sc("chroot_escape", 161, b("/tmp/m"))
for name, fam, kind, proto in [("af_packet", 17, socket.SOCK_RAW, 0x0300), ("inet_raw", socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP), ("inet6_raw", socket.AF_INET6, socket.SOCK_RAW, 58)]:
    try:
        s = socket.socket(fam, kind, proto); print("socket_" + name, 0, "OK", flush=True); s.close()
    except OSError as e:
        print("socket_" + name, -1, errno.errorcode.get(e.errno, e.errno), flush=True)
# Socket families: those that are not network-namespaced (vsock shares the
# host's port space) or that a sandbox has no use for are refused whatever the
# kernel supports; the usual ones work.
for name, fam in [("vsock", 40), ("alg", 38), ("bluetooth", 31), ("tipc", 30), ("rds", 21), ("key", 15), ("xdp", 44), ("can", 29), ("qipcrtr", 42), ("smc", 43), ("llc", 26), ("nfc", 39), ("mctp", 45), ("ax25", 3), ("x25", 9), ("atmpvc", 8), ("phonet", 35), ("ieee802154", 36)]:
    outcome = None
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET, socket.SOCK_RAW):
        try:
            s = socket.socket(fam, kind, 0); s.close(); outcome = (0, "OK"); break
        except OSError as e:
            outcome = (-1, errno.errorcode.get(e.errno, e.errno))
    print("family_" + name, *outcome, flush=True)
for name, fam, kind in [("unix", socket.AF_UNIX, socket.SOCK_STREAM), ("inet", socket.AF_INET, socket.SOCK_STREAM), ("inet6", socket.AF_INET6, socket.SOCK_DGRAM), ("netlink", 16, socket.SOCK_RAW)]:
    try:
        s = socket.socket(fam, kind, 0); s.close(); print("usable_" + name, 0, "OK", flush=True)
    except OSError as e:
        print("usable_" + name, -1, errno.errorcode.get(e.errno, e.errno), flush=True)
try:
    a, b_ = socket.socketpair(40, socket.SOCK_STREAM); print("socketpair_vsock", 0, "OK", flush=True)
except OSError as e:
    print("socketpair_vsock", -1, errno.errorcode.get(e.errno, e.errno), flush=True)
# The host's abstract unix sockets (network-namespaced) and its loopback TCP ports.
for name, addr in [("abstract_connect", "\0" + sys.argv[2])]:
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(addr); print(name, 0, "OK", flush=True)
    except OSError as e:
        print(name, -1, errno.errorcode.get(e.errno, e.errno), flush=True)
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[3])), timeout=2); print("host_loopback_tcp", 0, "OK", flush=True)
except OSError as e:
    print("host_loopback_tcp", -1, errno.errorcode.get(e.errno, e.errno) if e.errno else "ETIMEDOUT", flush=True)
for path in ["/dev/mem", "/dev/kmem", "/dev/port", "/proc/kcore", "/dev/sda", "/sys/kernel/uevent_helper", "/proc/sys/kernel/modprobe", "/proc/sysrq-trigger"]:
    try:
        fd = os.open(path, os.O_RDWR); print("open_" + path, 0, "OK", flush=True); os.close(fd)
    except OSError as e:
        print("open_" + path, -1, errno.errorcode.get(e.errno, e.errno), flush=True)
"#;

/// A chroot-based break-out attempt (chroot into a subdirectory, then `..` past
/// it, then chroot "."): must land on the sandbox's own root, not the host's.
const CHROOT_BREAK: &str = r#"
import os, sys
os.makedirs("/tmp/jail", exist_ok=True)
fd = os.open("/", os.O_RDONLY)
try:
    os.chroot("/tmp/jail")
except OSError as e:
    print("chroot", e.errno); sys.exit(0)
os.fchdir(fd)
for _ in range(64):
    os.chdir("..")
os.chroot(".")
print("root", sorted(os.listdir("/")))
print("marker", os.path.exists(sys.argv[1]))
"#;

#[cfg(target_arch = "x86_64")]
#[test]
fn privileged_syscalls_fail_with_eperm_or_the_right_errno() {
    require_host!();
    let mut host = Host::new("sys");
    let d = TestDaemon::start();
    d.import_busybox();
    let canary = Canary::start(&d, &[]);
    d.cli_ok(&[
        "image",
        "import",
        common::images_dir().join("debian-python.tar.gz").to_str().unwrap(),
        "--name",
        "debian-python",
    ]);
    let id = d.cli_ok(&["create", "debian-python", "--name", "pyattacker"]).trim().to_string();
    // A host service on an abstract unix socket (the containerd-shim CVE-2020-15257
    // pattern) and one on the host's loopback.
    use std::os::linux::net::SocketAddrExt;
    let abstract_name = format!("strata-escape-{}", std::process::id());
    let _abstract = std::os::unix::net::UnixListener::bind_addr(
        &std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap(),
    )
    .unwrap();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port().to_string();
    let out = d.cli(&[
        "exec",
        "--timeout",
        "60s",
        &id,
        "--",
        "python3",
        "-c",
        SYSCALLS,
        &host.sleeper.id().to_string(),
        &abstract_name,
        &port,
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    let results: std::collections::BTreeMap<&str, (&str, &str)> = text
        .lines()
        .map(|l| {
            let mut w = l.split_whitespace();
            (w.next().unwrap(), (w.next().unwrap(), w.next().unwrap()))
        })
        .collect();
    let expect = |name: &str, errnos: &[&str]| {
        let (rc, e) = results.get(name).unwrap_or_else(|| panic!("{name} not attempted:\n{text}"));
        assert_eq!(*rc, "-1", "{name} succeeded inside the sandbox:\n{text}");
        assert!(errnos.contains(e), "{name} failed with {e}, expected one of {errnos:?}:\n{text}");
    };
    // The seccomp deny-list: EPERM.
    for name in [
        "mount",
        "umount2",
        "pivot_root",
        "unshare_user",
        "unshare_mnt",
        "unshare_net",
        "clone_newuser",
        "setns",
        "init_module",
        "finit_module",
        "delete_module",
        "kexec_load",
        "kexec_file_load",
        "reboot",
        "bpf",
        "perf_event_open",
        "keyctl",
        "add_key",
        "request_key",
        "userfaultfd",
        "clock_settime",
        "settimeofday",
        "adjtimex",
        "swapon",
        "acct",
        "quotactl",
        "open_by_handle_at",
        "name_to_handle_at",
        "io_uring_setup",
        "syslog",
        "iopl",
        "ioperm",
        "fsopen",
        "open_tree",
    ] {
        expect(name, &["EPERM"]);
    }
    // Capabilities that are not held: EPERM.
    for name in [
        "sethostname",
        "setdomainname",
        "mknod_block",
        "mknod_mem",
        "socket_af_packet",
        "socket_inet_raw",
        "socket_inet6_raw",
        "ptrace_attach_init",
    ] {
        expect(name, &["EPERM"]);
    }
    // Things outside the namespaces do not exist.
    expect("ptrace_attach_host", &["ESRCH"]);
    expect("process_vm_readv_init", &["EPERM", "EFAULT"]);
    for dev in ["/dev/mem", "/dev/kmem", "/dev/port", "/dev/sda"] {
        expect(&format!("open_{dev}"), &["ENOENT"]);
    }
    for fam in [
        "vsock",
        "alg",
        "bluetooth",
        "tipc",
        "rds",
        "key",
        "xdp",
        "can",
        "qipcrtr",
        "smc",
        "llc",
        "nfc",
        "mctp",
        "ax25",
        "x25",
        "atmpvc",
        "phonet",
        "ieee802154",
    ] {
        expect(&format!("family_{fam}"), &["EAFNOSUPPORT"]);
    }
    expect("socketpair_vsock", &["EAFNOSUPPORT"]);
    for fam in ["unix", "inet", "inet6", "netlink"] {
        assert_eq!(
            results.get(format!("usable_{fam}").as_str()).map(|r| r.1),
            Some("OK"),
            "AF_{fam} must stay usable:\n{text}"
        );
    }
    expect("abstract_connect", &["ECONNREFUSED"]);
    expect("host_loopback_tcp", &["ECONNREFUSED"]);
    let fds: Vec<(&str, &str)> =
        results.iter().filter(|(k, _)| k.starts_with("fd_")).map(|(k, (_, target))| (*k, *target)).collect();
    assert!(fds.len() <= 3, "descriptors beyond stdio: {fds:?}");
    for (fd, target) in &fds {
        assert!(
            target.starts_with("pipe:")
                || target.starts_with("socket:")
                || target.starts_with("/dev/")
                || target.starts_with("/proc/"),
            "{fd} -> {target}: a descriptor from outside the sandbox"
        );
    }
    for (path, present) in [
        ("/sys/kernel/uevent_helper", "EROFS"),
        ("/proc/sys/kernel/modprobe", "EROFS"),
        ("/proc/sysrq-trigger", "EROFS"),
        ("/proc/kcore", "EACCES"),
    ] {
        // Absent from this host's kernel: then absent inside too.
        let want = if std::path::Path::new(path).exists() { present } else { "ENOENT" };
        expect(&format!("open_{path}"), &[want, "EPERM"]);
    }
    // chroot is not held either; if it ever were, `..` must stay inside the sandbox.
    let out = d.cli_ok(&["exec", &id, "--", "python3", "-c", CHROOT_BREAK, &host.marker.display().to_string()]);
    assert!(out.starts_with("chroot 1\n") || out.contains("marker False"), "{out}");

    host.assert_untouched();
    canary.assert_alive(&d);
    assert_eq!(d.cli_ok(&["exec", &id, "--", "echo", "ok"]), "ok\n");
}

/// A script that, run by the exec helper as host root, would prove it: it
/// records its capabilities and tries to make the host's disk.
const PLANTED_HELPER: &str =
    "#!/bin/sh\ngrep Cap /proc/self/status > /pwned\nmknod /pwned-disk b 8 0 2>> /pwned\nexit 0\n";

/// Whether `path` exists in sandbox `id`, asked through the file API (a
/// planted helper would hijack an exec asking the same).
fn exists_via_file_api(d: &TestDaemon, id: &str, path: &str) -> bool {
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("f");
    d.cli(&["cp", &format!("{id}:{path}"), dest.to_str().unwrap()]).status.success()
}

/// Issue 14.1: the exec helper joins the sandbox with every host privilege;
/// it used to execute `/run/strata/init` by path inside the sandbox, so a
/// sandbox that moved /run away and planted its own file there got host root
/// on its next exec (or template build step). The helper now executes the
/// binary pid 1 runs, from a descriptor opened on the host.
#[test]
fn a_helper_planted_at_run_strata_init_is_never_executed() {
    require_host!();
    let mut host = Host::new("plant");
    let d = TestDaemon::start();
    d.import_busybox();
    // The attack needs a /run that lies wholly in the writable layer (overlayfs
    // refuses to rename a directory of the image): an image without /run.
    let tar = d.dir.path().join("busybox-without-run.tar");
    std::fs::copy(common::images_dir().join("busybox-rootfs.tar"), &tar).unwrap();
    let del = std::process::Command::new("tar").arg("--delete").arg("-f").arg(&tar).arg("./run/").status().unwrap();
    assert!(del.success(), "tar --delete ./run/");
    d.cli_ok(&["image", "import", tar.to_str().unwrap(), "--name", "no-run"]);
    let id = d.cli_ok(&["create", "no-run", "--name", "planter"]).trim().to_string();
    let plant = format!("mv /run /run.old && mkdir -p /run/strata && printf '%s' '{PLANTED_HELPER}' > /run/strata/init && chmod 755 /run/strata/init && ls -l /run/strata/init");
    d.cli_ok(&["exec", &id, "--", "sh", "-c", &plant]);
    // The next exec runs the real helper: the command runs and reports its own status.
    let out = d.cli(&["exec", &id, "--", "sh", "-c", "echo from-the-command; exit 7"]);
    assert_eq!(out.status.code(), Some(7), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(stdout(&out), "from-the-command\n");
    let out = d.cli(&["exec", "-u", "1000", &id, "--", "id", "-u"]);
    assert_eq!(stdout(&out), "1000\n", "{}", stderr(&out));
    assert!(!exists_via_file_api(&d, &id, "/pwned"), "the planted helper ran as host root");
    assert!(!exists_via_file_api(&d, &id, "/pwned-disk"));
    // Replacing the helper's bind mount itself is refused (it is read-only and a mount point).
    refused(
        &d,
        &id,
        "cp /bin/busybox /run.old/strata/init",
        &["Read-only file system", "Text file busy", "Permission denied"],
    );
    refused(&d, &id, "rm /run.old/strata/init", &["Read-only file system", "resource busy", "Permission denied"]);

    // The same through a template build: one step plants, the next would trigger it.
    let ctx = tempfile::tempdir().unwrap();
    let file = ctx.path().join("Stratafile");
    let escaped = PLANTED_HELPER.replace('\n', "\\n");
    std::fs::write(&file, format!("FROM no-run\nRUN mv /run /run.old && mkdir -p /run/strata && printf '{escaped}' > /run/strata/init && chmod 755 /run/strata/init\nRUN echo second > /second\n")).unwrap();
    let out = d.cli(&["template", "build", "planted", "-f", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let built = d.cli_ok(&["create", "planted"]).trim().to_string();
    assert!(exists_via_file_api(&d, &built, "/second"), "the second step did not run");
    assert!(!exists_via_file_api(&d, &built, "/pwned"), "the planted helper ran during the template build");
    host.assert_untouched();
}

/// Issue 14.2: a process inside could open the report pipe of an exec that
/// was starting (through /proc/<pid>/fd, while the process being started was
/// still dumpable) and write the daemon a status of its choice. The attacker
/// here scans every descriptor of every visible process and writes a forged
/// "exited 0" into each pipe it can open, while commands whose start is made
/// slow on purpose (a PATH of 1500 directories whose `prog` is a script with
/// a missing interpreter: each exec attempt fails with ENOENT and the next is
/// tried) exit with 7.
#[test]
fn a_sandbox_cannot_reach_the_report_channel_of_an_exec() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&["--name", "forger"]);
    let setup = "for i in $(seq 1 1500); do mkdir -p /w/d$i && printf '#!/nonexistent/interpreter\\n' > /w/d$i/prog && chmod 755 /w/d$i/prog; done; \
                 mkdir -p /w/real && printf '#!/bin/sh\\nexit 7\\n' > /w/real/prog && chmod 755 /w/real/prog";
    d.cli_ok(&["exec", "--timeout", "120s", &id, "--", "sh", "-c", setup]);
    let path: String = (1..=1500).map(|i| format!("/w/d{i}:")).collect::<String>() + "/w/real";
    let attacker = r#"while :; do for f in /proc/[0-9]*/fd/*; do case "$f" in */fd/0|*/fd/1|*/fd/2|/proc/$$/*) continue;; esac; [ -p "$f" ] || continue; if echo '{"type":"exited","code":0}' 2>/dev/null > "$f"; then echo "$f" >> /tmp/hits; fi; done 2>/dev/null; done"#;
    let attacker_proc = d.cli_ok(&["exec", "-d", &id, "--", "sh", "-c", attacker]).trim().to_string();
    let mut codes = Vec::new();
    for _ in 0..15 {
        let out = d.cli(&["exec", "-e", &format!("PATH={path}"), &id, "--", "prog"]);
        codes.push(out.status.code());
    }
    d.cli_ok(&["proc", "kill", &id, &attacker_proc, "--signal", "KILL"]);
    let _ = d.cli(&["proc", "wait", &id, &attacker_proc]);
    let hits = d.cli_ok(&["exec", &id, "--", "sh", "-c", "cat /tmp/hits 2>/dev/null | wc -l; for f in $(sort -u /tmp/hits 2>/dev/null | head -5); do echo $f $(readlink $f) $(cat ${f%/fd/*}/cmdline | tr '\\0' ' '); done"]);
    assert!(codes.iter().all(|c| *c == Some(7)), "forged exit statuses: {codes:?} (attacker writes: {})", hits.trim());
    assert_eq!(hits.lines().next().map(str::trim), Some("0"), "the attacker opened pipes of other processes: {hits}");
}

/// Issue 14.9: kernel information the sandbox has no use for is masked, and
/// no host path of the daemon's state directory appears in the sandbox's view
/// of its mounts.
#[test]
fn kernel_information_and_host_paths_are_masked() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&["--name", "looker"]);
    for path in [
        "/sys/kernel/vmcoreinfo",
        "/proc/slabinfo",
        "/proc/key-users",
        "/proc/vmallocinfo",
        "/proc/pagetypeinfo",
        "/proc/timer_list",
        "/proc/sched_debug",
        "/proc/keys",
        "/proc/kcore",
        "/sys/kernel/notes",
    ] {
        if !std::path::Path::new(path).exists() {
            continue;
        }
        let (_, out) = run(&d, &id, &format!("wc -c < {path}"));
        assert!(
            out.trim() == "0" || out.contains("Permission denied") || out.contains("No such file"),
            "{path} is readable inside: {out}"
        );
    }
    let (code, out) = run(&d, &id, "ls /sys/devices/virtual/powercap 2>&1; ls /sys/firmware 2>&1");
    assert!(code == 0 || !out.is_empty(), "{out}");
    assert!(!out.contains("intel-rapl"), "power counters are visible: {out}");
    let (_, mounts) = run(&d, &id, "cat /proc/self/mountinfo /proc/1/mountinfo /proc/self/mounts");
    let state = d.state_dir.display().to_string();
    let tmp = d.dir.path().display().to_string();
    for l in mounts.lines() {
        assert!(
            !l.contains(&state) && !l.contains(&tmp) && !l.contains("/var/tmp") && !l.contains("strata-init-"),
            "a host path in the sandbox's mount table: {l}"
        );
    }
}
