//! Host plumbing of an egress sandbox (privileged): a network namespace kept
//! open by a bind mount, and a veth pair between it and the host, set up with
//! iproute2 (`ip -batch`), the tool every Linux host has and whose behaviour
//! administrators know; `nsenter` runs it inside the namespace.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::pool::{Link, LINK_PREFIX};
use crate::NetError;

/// Name of the interface inside the sandbox.
pub const INNER_IFNAME: &str = "eth0";

fn run_batch(cmd: &mut Command, script: &str, what: &'static str) -> Result<(), NetError> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| NetError::Spawn { what, source })?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(script.as_bytes())
        .map_err(|source| NetError::Spawn { what, source })?;
    let out = child.wait_with_output().map_err(|source| NetError::Spawn { what, source })?;
    if !out.status.success() {
        return Err(NetError::Command { what, detail: String::from_utf8_lossy(&out.stderr).trim().to_string() });
    }
    Ok(())
}

/// Makes a new network namespace (loopback up) and keeps it open by
/// bind-mounting it on `path` (created). Runs on a short-lived thread, since
/// `unshare(CLONE_NEWNET)` changes only the calling thread.
pub fn create_netns(path: &Path) -> Result<(), NetError> {
    netns_file(path)?;
    let p = path.to_path_buf();
    let res = std::thread::spawn(move || -> Result<(), String> {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("unshare network namespace: {e}"))?;
        let tid = nix::unistd::gettid();
        let me = format!("/proc/self/task/{tid}/ns/net");
        nix::mount::mount(Some(me.as_str()), &p, None::<&str>, nix::mount::MsFlags::MS_BIND, None::<&str>)
            .map_err(|e| format!("bind {me} on {}: {e}", p.display()))?;
        Ok(())
    })
    .join()
    .map_err(|_| NetError::Setup("netns thread panicked".into()))?;
    if let Err(e) = res {
        let _ = std::fs::remove_file(path);
        return Err(NetError::Setup(e));
    }
    Ok(())
}

/// Whether `path` is a bind-mounted network namespace.
pub fn netns_exists(path: &Path) -> bool {
    use nix::sys::statfs::statfs;
    // nsfs magic.
    statfs(path).is_ok_and(|s| s.filesystem_type().0 == 0x6e736673)
}

/// Removes a namespace made by [`create_netns`] (the namespace itself goes
/// when its last process and mount are gone).
pub fn remove_netns(path: &Path) {
    let _ = nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH);
    let _ = std::fs::remove_file(path);
}

/// The empty file a namespace is bind-mounted on (and its directory).
fn netns_file(path: &Path) -> Result<(), NetError> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(|e| NetError::Io {
            what: "create netns directory",
            path: d.to_path_buf(),
            source: e,
        })?;
    }
    std::fs::File::create(path).map_err(|e| NetError::Io {
        what: "create netns file",
        path: path.to_path_buf(),
        source: e,
    })?;
    Ok(())
}

/// Names the network namespace of the running process `pid` at `path` (a bind
/// mount of `/proc/<pid>/ns/net`, as [`create_netns`] leaves it), so that
/// sandbox's own namespace is the one the plumbing attaches to.
pub fn adopt_netns(pid: i32, path: &Path) -> Result<(), NetError> {
    netns_file(path)?;
    let src = format!("/proc/{pid}/ns/net");
    nix::mount::mount(Some(src.as_str()), path, None::<&str>, nix::mount::MsFlags::MS_BIND, None::<&str>)
        .map_err(|e| NetError::Setup(format!("bind {src}: {e}")))
}

/// Whether a host interface exists.
pub fn link_exists(ifname: &str) -> bool {
    Path::new("/sys/class/net").join(ifname).exists()
}

/// Creates the veth pair `ifname` (host, gateway address) <-> `eth0` (in
/// the namespace at `netns`, sandbox address, default route via the gateway).
pub fn attach(netns: &Path, ifname: &str, link: &Link) -> Result<(), NetError> {
    let host = format!(
        "link add {ifname} type veth peer name {INNER_IFNAME} netns {ns}\naddr add {gw}/{LINK_PREFIX} dev {ifname}\nlink set {ifname} up\n",
        ns = netns.display(),
        gw = link.gateway
    );
    run_batch(Command::new("ip").args(["-batch", "-"]).env_clear().env("PATH", crate::PATH), &host, "ip (host side)")?;
    let inner = format!(
        "link set lo up\naddr add {a}/{LINK_PREFIX} dev {INNER_IFNAME}\nlink set {INNER_IFNAME} up\nroute add default via {gw}\n",
        a = link.address,
        gw = link.gateway
    );
    let ns_arg = format!("--net={}", netns.display());
    let r = run_batch(
        Command::new("nsenter").arg(ns_arg).args(["ip", "-batch", "-"]).env_clear().env("PATH", crate::PATH),
        &inner,
        "ip (sandbox side)",
    );
    if r.is_err() {
        detach(ifname);
    }
    r
}

/// Gives the sandbox side of an existing link its address and default route
/// again (idempotent). gVisor's netstack takes `eth0` over and removes its
/// address from the namespace; once that sandbox has exited, the next start
/// (or restore) needs it back.
pub fn readdress(netns: &Path, link: &Link) -> Result<(), NetError> {
    let inner = format!(
        "link set lo up\naddr replace {a}/{LINK_PREFIX} dev {INNER_IFNAME}\nlink set {INNER_IFNAME} up\nroute replace default via {gw}\n",
        a = link.address,
        gw = link.gateway
    );
    let ns_arg = format!("--net={}", netns.display());
    run_batch(
        Command::new("nsenter").arg(ns_arg).args(["ip", "-batch", "-"]).env_clear().env("PATH", crate::PATH),
        &inner,
        "ip (sandbox side)",
    )
}

/// The bridge, inside a sandbox's namespace, between its `eth0` and a guest's tap.
pub const GUEST_BRIDGE: &str = "strata-br";
/// The tap a microVM's QEMU opens (by name, from inside the namespace).
pub const GUEST_TAP: &str = "strata-tap";

/// Makes the namespace at `netns` hand its link to a guest (the microvm
/// tier): `eth0` loses its address (the guest takes it: two holders would
/// answer each other's ARP) and joins a bridge with a fresh tap, [`GUEST_TAP`],
/// that the guest's QEMU opens. The host side (veth, address, nftables
/// rules) is untouched, so the same rules filter the guest's traffic.
/// Idempotent: a bridge and tap of an earlier run are made again.
pub fn bridge_for_guest(netns: &Path) -> Result<(), NetError> {
    let ns_arg = format!("--net={}", netns.display());
    let ip = |force: bool| {
        let mut c = Command::new("nsenter");
        c.arg(&ns_arg).arg("ip");
        if force {
            c.arg("-force");
        }
        c.args(["-batch", "-"]).env_clear().env("PATH", crate::PATH);
        c
    };
    // What an earlier run left (absent is fine: -force goes on past errors).
    let _ = run_batch(
        &mut ip(true),
        &format!("link del {GUEST_TAP}\nlink del {GUEST_BRIDGE}\n"),
        "ip (the guest's old bridge)",
    );
    let script = format!(
        "link add {GUEST_BRIDGE} type bridge\ntuntap add dev {GUEST_TAP} mode tap\naddr flush dev {INNER_IFNAME}\n\
         link set {INNER_IFNAME} master {GUEST_BRIDGE}\nlink set {GUEST_TAP} master {GUEST_BRIDGE}\n\
         link set {GUEST_BRIDGE} up\nlink set {INNER_IFNAME} up\nlink set {GUEST_TAP} up\n"
    );
    run_batch(&mut ip(false), &script, "ip (the guest's bridge)")
}

/// Deletes the host side of a veth pair (the peer goes with it); absent is fine.
pub fn detach(ifname: &str) {
    if link_exists(ifname) {
        let _ = Command::new("ip")
            .args(["link", "del", ifname])
            .env_clear()
            .env("PATH", crate::PATH)
            .stderr(Stdio::null())
            .status();
    }
}

/// Host veths with a name starting with `prefix` whose (first) IPv4 address lies in `pool`.
pub fn veths_in(prefix: &str, pool: &crate::rules::Cidr) -> Vec<String> {
    let Ok(out) = Command::new("ip")
        .args(["-j", "-4", "addr", "show", "type", "veth"])
        .env_clear()
        .env("PATH", crate::PATH)
        .output()
    else {
        return Vec::new();
    };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else { return Vec::new() };
    let mut names = Vec::new();
    for l in v.as_array().cloned().unwrap_or_default() {
        let Some(name) = l.get("ifname").and_then(|n| n.as_str()) else { continue };
        if !name.starts_with(prefix) {
            continue;
        }
        let in_pool = l.get("addr_info").and_then(|a| a.as_array()).is_some_and(|a| {
            a.iter()
                .filter_map(|i| i.get("local").and_then(|x| x.as_str()))
                .filter_map(|s| s.parse::<Ipv4Addr>().ok())
                .any(|ip| pool.contains(ip))
        });
        if in_pool {
            names.push(name.to_string());
        }
    }
    names
}

/// Turns on IPv4 forwarding (host-wide; needed to route sandbox traffic).
pub fn enable_forwarding() -> Result<(), NetError> {
    let p = Path::new("/proc/sys/net/ipv4/ip_forward");
    if std::fs::read_to_string(p).is_ok_and(|s| s.trim() == "1") {
        return Ok(());
    }
    std::fs::write(p, "1").map_err(|e| NetError::Io {
        what: "enable IPv4 forwarding",
        path: p.to_path_buf(),
        source: e,
    })
}
