//! Per-sandbox networks: `none` (loopback only) and `egress` with host-enforced
//! allow rules, DNS pinning, live rule changes, counters, and the plumbing
//! surviving standby/resume and stop/start.
//!
//! There is no internet here: each test builds its own "outside world" — a
//! network namespace with TEST-NET addresses (198.51.100.0/24) reached from the
//! host over a veth, running HTTP servers (python3) — and a fake upstream DNS
//! server on the host's loopback that the daemon is pointed at
//! (`STRATA_DNS_UPSTREAM`). Every daemon gets its own address pool
//! (`STRATA_NETWORK_POOL`), so tests run in parallel without sharing rules.

mod common;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{rt, stderr, stdout, wait_until, TestDaemon};
use strata_api::{CreateSandboxRequest, NetworkInfo, NetworkMode, NetworkSpec};
use strata_client::ClientError;

/// A fake outside world: namespace `ns` reachable at `.2` and `.3` of a /29 of
/// 198.51.100.0/24 (the host side is `.1`), serving HTTP on 8080 and 8081.
struct World {
    ns: String,
    host_if: String,
    host_addr: String,
    cidr: String,
    addr: String,
    addr2: String,
    servers: Vec<Child>,
    dns: Option<Child>,
    dns_port: u16,
    _dir: tempfile::TempDir,
}

fn sh(cmd: &str) -> std::process::Output {
    Command::new("sh").arg("-c").arg(cmd).output().expect("sh")
}

fn must(cmd: &str) {
    let o = sh(cmd);
    assert!(o.status.success(), "{cmd}: {}", String::from_utf8_lossy(&o.stderr));
}

/// The fake upstream: answers `allowed.test` and `api.allowed.test` with the
/// world's first address, `other.test` with its second and `meta.test` with
/// 169.254.169.254 (TTL 60); NXDOMAIN otherwise.
const FAKE_DNS: &str = r#"
import socket, struct, sys
answers = {b"allowed.test": sys.argv[2], b"api.allowed.test": sys.argv[2], b"other.test": sys.argv[3], b"meta.test": "169.254.169.254"}
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1], flush=True)
while True:
    q, peer = s.recvfrom(2048)
    qid, flags, qd = struct.unpack(">HHH", q[:6])
    i, labels = 12, []
    while q[i]:
        labels.append(q[i + 1:i + 1 + q[i]]); i += 1 + q[i]
    question = q[12:i + 5]
    qtype = struct.unpack(">H", q[i + 1:i + 3])[0]
    name = b".".join(labels).lower()
    ip = answers.get(name)
    if ip is None:
        s.sendto(struct.pack(">HHHHHH", qid, 0x8183, 1, 0, 0, 0) + question, peer)
    elif qtype != 1:
        s.sendto(struct.pack(">HHHHHH", qid, 0x8180, 1, 0, 0, 0) + question, peer)
    else:
        rr = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + socket.inet_aton(ip)
        s.sendto(struct.pack(">HHHHHH", qid, 0x8180, 1, 1, 0, 0) + question + rr, peer)
"#;

impl World {
    /// World number `k` (0..31) uses 198.51.100.8k/29.
    fn new(k: u8) -> World {
        let tag = format!("{}{k}", std::process::id() % 10000);
        let ns = format!("stw{tag}");
        let host_if = format!("stwh{tag}");
        let base = 8 * k as u32;
        let (host_addr, addr, addr2) = (
            format!("198.51.100.{}", base + 1),
            format!("198.51.100.{}", base + 2),
            format!("198.51.100.{}", base + 3),
        );
        let _ = sh(&format!("ip netns del {ns} 2>/dev/null; ip link del {host_if} 2>/dev/null"));
        must(&format!("ip netns add {ns}"));
        must(&format!("ip link add {host_if} type veth peer name eth0 netns {ns}"));
        must(&format!("ip addr add {host_addr}/29 dev {host_if} && ip link set {host_if} up"));
        must(&format!("ip -n {ns} addr add {addr}/29 dev eth0 && ip -n {ns} addr add {addr2}/29 dev eth0 && ip -n {ns} link set eth0 up && ip -n {ns} link set lo up && ip -n {ns} route add default via {host_addr}"));
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("hello"), "hello from the world\n").unwrap();
        let mut servers = Vec::new();
        for port in ["8080", "8081"] {
            let child = Command::new("ip")
                .args(["netns", "exec", &ns, "python3", "-m", "http.server", port, "--bind", "0.0.0.0", "--directory"])
                .arg(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("python3 http.server");
            servers.push(child);
        }
        let script = dir.path().join("dns.py");
        std::fs::write(&script, FAKE_DNS).unwrap();
        let mut dns = Command::new("python3")
            .arg(&script)
            .arg("x")
            .arg(&addr)
            .arg(&addr2)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 dns");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(dns.stdout.take().unwrap()), &mut line).unwrap();
        let dns_port: u16 = line.trim().parse().expect("dns port");
        let cidr = format!("198.51.100.{base}/29");
        let w = World { ns, host_if, host_addr, cidr, addr, addr2, servers, dns: Some(dns), dns_port, _dir: dir };
        // The servers are up when the host can fetch from them.
        for port in [8080, 8081] {
            assert!(
                wait_until(15, || std::net::TcpStream::connect_timeout(
                    &format!("{}:{port}", w.addr).parse().unwrap(),
                    Duration::from_millis(200)
                )
                .is_ok()),
                "world server on {port} did not come up"
            );
        }
        w
    }

    /// A daemon for this world, with pool 10.{220+k}.0.0/24.
    fn daemon(&self, k: u8) -> TestDaemon {
        let pool = format!("10.{}.0.0/24", 220 + k as u32);
        let up = format!("127.0.0.1:{}", self.dns_port);
        let d = TestDaemon::start_with_env(&[("STRATA_NETWORK_POOL", &pool), ("STRATA_DNS_UPSTREAM", &up)]);
        d.import_busybox();
        d
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for c in self.servers.iter_mut().chain(self.dns.as_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = sh(&format!("ip netns del {}; ip link del {} 2>/dev/null", self.ns, self.host_if));
    }
}

/// Runs `sh -c cmd` in a sandbox; (exit code, stdout+stderr).
fn run_in(d: &TestDaemon, id: &str, cmd: &str) -> (i32, String) {
    let o = d.cli(&["exec", id, "--", "sh", "-c", cmd]);
    (o.status.code().unwrap_or(-1), format!("{}{}", stdout(&o), stderr(&o)))
}

/// Whether the sandbox fetches `http://HOST:PORT/hello` (HTTP/1.0 over busybox
/// nc, 3 s timeout; the image's static busybox wget crashes in its resolver).
fn fetches(d: &TestDaemon, id: &str, url: &str) -> bool {
    let hostport = url.trim_start_matches("http://").trim_end_matches("/hello");
    let (host, port) = hostport.rsplit_once(':').expect("host:port");
    let (_, out) = run_in(d, id, &format!("printf 'GET /hello HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {host} {port}"));
    out.contains("hello from the world")
}

fn resolves(d: &TestDaemon, id: &str, name: &str) -> bool {
    run_in(d, id, &format!("nslookup {name}")).0 == 0
}

fn net(d: &TestDaemon, id: &str) -> NetworkInfo {
    serde_json::from_str(&d.cli_ok(&["network", "show", id, "--json"])).unwrap()
}

fn err_of<T: std::fmt::Debug>(r: Result<T, ClientError>) -> (u16, strata_api::ApiErrorBody) {
    match r.expect_err("expected an API error") {
        ClientError::Api { status, body } => (status, body),
        e => panic!("unexpected error {e}"),
    }
}

#[test]
fn none_is_loopback_only_and_egress_allows_only_what_the_rules_say() {
    require_host!();
    let w = World::new(1);
    let d = w.daemon(1);
    // none (the default): no route, nothing but loopback.
    let none = d.create(&[]);
    let (_, routes) = run_in(&d, &none, "ip route; ip -o link");
    assert!(!routes.contains("default") && !routes.contains("eth0"), "a none sandbox has a route or link:\n{routes}");
    assert!(!fetches(&d, &none, &format!("http://{}:8080/hello", w.addr)));
    assert_eq!(net(&d, &none).spec.mode, NetworkMode::None);

    // egress with one address and port.
    let id = d.create(&["--network", "egress", "--allow-cidr", &format!("{}/32:8080", w.addr)]);
    let info = net(&d, &id);
    assert_eq!(info.spec.allow, vec![format!("{}:8080", w.addr)]);
    assert!(info.attached && info.address.as_deref().unwrap().starts_with("10.221.0."));
    let inspect: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", &id, "--json"])).unwrap();
    assert_eq!(inspect["network"]["mode"], "egress");
    assert!(fetches(&d, &id, &format!("http://{}:8080/hello", w.addr)), "the allowed address:port is unreachable");
    assert!(!fetches(&d, &id, &format!("http://{}:8081/hello", w.addr)), "another port is reachable");
    assert!(!fetches(&d, &id, &format!("http://{}:8080/hello", w.addr2)), "another address is reachable");

    // Never reachable: the host (also with a rule covering one of its addresses),
    // metadata, private ranges, another sandbox.
    let host_listener = TcpListener::bind("0.0.0.0:0").unwrap();
    let host_port = host_listener.local_addr().unwrap().port();
    d.cli_ok(&["network", "set", &id, "--allow-cidr", &w.cidr]);
    assert!(fetches(&d, &id, &format!("http://{}:8081/hello", w.addr)), "the /29 rule does not allow the world");
    let gw = info.gateway.clone().unwrap();
    for target in [
        format!("{}:{host_port}", w.host_addr),
        format!("{gw}:{host_port}"),
        "169.254.169.254:80".to_string(),
        "10.0.0.1:80".into(),
        "192.168.1.1:80".into(),
    ] {
        let (code, _) = run_in(&d, &id, &format!("echo x | nc -w 2 {}", target.replace(':', " ")));
        assert_ne!(code, 0, "{target} is reachable from an egress sandbox");
    }
    let other = d.create(&["--network", "egress", "--allow-cidr", "0.0.0.0/0"]);
    let other_addr = net(&d, &other).address.unwrap();
    d.cli_ok(&["exec", "-d", &other, "--", "sh", "-c", "while true; do echo hi | nc -l -p 9000; done"]);
    let (code, _) = run_in(&d, &id, &format!("echo x | nc -w 2 {other_addr} 9000"));
    assert_ne!(code, 0, "another sandbox is reachable");
    // 0.0.0.0/0 does not open reserved ranges either.
    let (code, _) = run_in(&d, &other, "echo x | nc -w 2 169.254.169.254 80");
    assert_ne!(code, 0);
    assert!(
        net(&d, &other).recent_denied.iter().any(|x| x == "169.254.169.254 tcp/80"),
        "0.0.0.0/0 opened the metadata address"
    );
    // Counted and recorded.
    let info = net(&d, &id);
    assert!(info.allowed.packets > 0 && info.received.packets > 0, "{info:?}");
    assert!(info.denied.packets > 0, "{info:?}");
    for dst in ["169.254.169.254 tcp/80", "10.0.0.1 tcp/80", &format!("{other_addr} tcp/9000")] {
        assert!(info.recent_denied.iter().any(|x| x == dst), "{dst} missing from {:?}", info.recent_denied);
    }
    drop(host_listener);
    // Denials are logged by the daemon (rate-limited) and recorded as events.
    assert!(
        wait_until(10, || d.cli_ok(&["events", &id]).contains("network_denied")),
        "no network_denied event:\n{}",
        d.cli_ok(&["events", &id])
    );
    // Destroy removes the plumbing.
    let ifname = format!("sx{}", &id[..13]);
    assert!(std::path::Path::new("/sys/class/net").join(&ifname).exists());
    d.cli_ok(&["rm", "-f", &id]);
    assert!(
        wait_until(10, || !std::path::Path::new("/sys/class/net").join(&ifname).exists()),
        "veth left after destroy"
    );
    assert!(wait_until(10, || !d.state(&format!("network/{id}.json")).exists()), "network entry left after destroy");
}

#[test]
fn domain_rules_resolve_pin_and_hold_against_dns_tricks() {
    require_host!();
    let w = World::new(2);
    let d = w.daemon(2);
    let id = d.create(&["--allow-host", "allowed.test:8080", "--allow-host", "meta.test"]);
    let resolv = run_in(&d, &id, "cat /etc/resolv.conf").1;
    assert!(resolv.contains(&format!("nameserver {}", net(&d, &id).gateway.unwrap())), "{resolv}");
    // An allowed name resolves and connects (on its port only).
    assert!(resolves(&d, &id, "allowed.test"));
    assert!(fetches(&d, &id, "http://allowed.test:8080/hello"));
    assert!(!fetches(&d, &id, &format!("http://{}:8081/hello", w.addr)), "the host rule's port is not enforced");
    // Subdomains need a wildcard rule.
    assert!(!resolves(&d, &id, "api.allowed.test"));
    // A name without a rule does not resolve, and its address stays blocked by IP.
    assert!(!resolves(&d, &id, "other.test"));
    assert!(
        !fetches(&d, &id, &format!("http://{}:8080/hello", w.addr2)),
        "connecting by IP to a non-allowed name's address works"
    );
    // Asking another resolver directly (there is none at that address) ends up
    // at strata's filter: allowed names resolve, others do not.
    assert!(
        resolves(&d, &id, &format!("allowed.test {}", w.addr2)),
        "port-53 traffic to another address is not redirected to the filter"
    );
    assert!(!resolves(&d, &id, &format!("other.test {}", w.addr2)), "a query to another resolver escaped the filter");
    // A name that points at the metadata address resolves but stays unreachable.
    let (code, _) = run_in(&d, &id, "echo x | nc -w 2 meta.test 80");
    assert_ne!(code, 0);
    assert!(
        net(&d, &id).recent_denied.iter().any(|x| x == "169.254.169.254 tcp/80"),
        "{:?}",
        net(&d, &id).recent_denied
    );
    let info = net(&d, &id);
    assert!(info.dns_answered >= 2 && info.dns_refused >= 2, "{info:?}");

    // Live changes, both ways: a wildcard rule opens subdomains, dropping the
    // name closes it (for new lookups and connections).
    d.cli_ok(&["network", "set", &id, "--allow-host", "*.allowed.test:8080"]);
    assert!(resolves(&d, &id, "api.allowed.test"));
    assert!(fetches(&d, &id, "http://api.allowed.test:8080/hello"));
    assert!(!resolves(&d, &id, "allowed.test"), "the removed rule still resolves");
    d.cli_ok(&["network", "set", &id, "--network", "egress"]);
    assert!(
        !fetches(&d, &id, &format!("http://{}:8080/hello", w.addr)),
        "an emptied rule list still lets traffic through"
    );
    d.cli_ok(&["network", "set", &id, "--network", "none"]);
    let (_, routes) = run_in(&d, &id, "ip route; ip -o link");
    assert!(!routes.contains("eth0"), "switching to none left the link:\n{routes}");
    d.cli_ok(&["network", "set", &id, "--allow-cidr", &format!("{}:8080", w.addr)]);
    assert!(fetches(&d, &id, &format!("http://{}:8080/hello", w.addr)), "switching a running none sandbox to egress");

    // A fork inherits the network.
    let out = d.cli_ok(&["fork", &id, "-n", "1"]);
    let child = out.lines().last().unwrap().trim().to_string();
    let cn = net(&d, &child);
    assert_eq!(cn.spec, net(&d, &id).spec);
    assert_ne!(cn.address, net(&d, &id).address);
    assert!(fetches(&d, &child, &format!("http://{}:8080/hello", w.addr)));
}

#[test]
fn rules_survive_stop_start_standby_resume_and_daemon_restart() {
    require_host!();
    let w = World::new(3);
    let mut d = w.daemon(3);
    let url = format!("http://{}:8080/hello", w.addr);
    let id = d.create(&["--network", "egress", "--allow-cidr", &format!("{}:8080", w.addr)]);
    let addr = net(&d, &id).address;
    assert!(fetches(&d, &id, &url));
    d.cli_ok(&["stop", &id]);
    let info = net(&d, &id);
    assert!(!info.attached, "a stopped sandbox keeps its veth");
    d.cli_ok(&["start", &id]);
    assert!(fetches(&d, &id, &url), "after stop/start");
    assert_eq!(net(&d, &id).address, addr, "the address changed across stop/start");
    assert!(!fetches(&d, &id, &format!("http://{}:8080/hello", w.addr2)), "rules lost across stop/start");
    // Daemon restart: rules re-applied, the sandbox stays connected.
    d.kill9_and_restart();
    assert!(fetches(&d, &id, &url), "after a daemon restart");
    assert!(!fetches(&d, &id, &format!("http://{}:8081/hello", w.addr)), "rules lost across a daemon restart");
    if strata_runtime::namespace::criu::unsupported().is_none() {
        d.cli_ok(&["standby", &id]);
        assert!(net(&d, &id).attached, "standby keeps the plumbing");
        d.cli_ok(&["resume", &id]);
        assert!(fetches(&d, &id, &url), "after standby/resume");
        assert!(!fetches(&d, &id, &format!("http://{}:8081/hello", w.addr)), "rules lost across standby/resume");
        assert_eq!(net(&d, &id).address, addr);
    } else if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI must be able to run the standby part, but CRIU is unavailable");
    } else {
        println!("skipped (standby part): CRIU unavailable");
    }
}

#[test]
fn malformed_rules_are_400_naming_the_rule_and_create_nothing() {
    require_host!();
    let d = TestDaemon::start_with_env(&[("STRATA_NETWORK_POOL", "10.229.0.0/24")]);
    d.import_busybox();
    let c = d.client();
    rt().block_on(async {
        for (allow, mode) in [
            ("10.0.0.1/8", NetworkMode::Egress),
            ("pypi.org:0", NetworkMode::Egress),
            ("2001:db8::/32", NetworkMode::Egress),
            ("*.com", NetworkMode::Egress),
            ("pypi.org", NetworkMode::None),
        ] {
            let req = CreateSandboxRequest {
                source: "busybox".into(),
                network: Some(NetworkSpec { mode, allow: vec!["198.51.100.1".into(), allow.into()], deny: vec![] }),
                ..Default::default()
            };
            let (status, body) = err_of(c.create_sandbox(&req).await);
            assert_eq!(status, 400, "{allow}: {body:?}");
            assert!(body.message.contains(&format!("{allow:?}")), "{allow}: {}", body.message);
        }
        assert!(c.list_sandboxes().await.unwrap().is_empty(), "a rejected create left a sandbox");
        let ok = c
            .create_sandbox(&CreateSandboxRequest {
                source: "busybox".into(),
                network: Some(NetworkSpec { mode: NetworkMode::Egress, allow: vec!["pypi.org".into()], deny: vec![] }),
                ..Default::default()
            })
            .await
            .unwrap();
        let (status, body) = err_of(
            c.set_network(
                &ok.id,
                &NetworkSpec { mode: NetworkMode::Egress, allow: vec!["10.0.0.0/33".into()], deny: vec![] },
            )
            .await,
        );
        assert_eq!(status, 400);
        assert!(body.message.contains("\"10.0.0.0/33\""), "{}", body.message);
        assert_eq!(
            c.get_network(&ok.id).await.unwrap().spec.allow,
            vec!["pypi.org".to_string()],
            "a rejected update changed the rules"
        );
        let (status, _) = err_of(c.get_network("no-such-sandbox").await);
        assert_eq!(status, 404);
    });
    // The CLI reports the same.
    let o = d.cli(&["create", "busybox", "--allow-cidr", "10.0.0.0/8:99999"]);
    assert!(!o.status.success() && stderr(&o).contains("10.0.0.0/8:99999"), "{}", stderr(&o));
}

/// What a sandbox created with `--allow-cidr ADDR/32:8080 --allow-host
/// allowed.test:8080` in world `w` reaches: that address and port, DNS for
/// the allowed name only, not the host (its gateway), metadata or a private range.
fn assert_only_the_rules_reach(w: &World, d: &TestDaemon, id: &str) {
    assert!(fetches(d, id, &format!("http://{}:8080/hello", w.addr)), "the allowed address:port is unreachable");
    assert!(!fetches(d, id, &format!("http://{}:8081/hello", w.addr)), "another port is reachable");
    assert!(!fetches(d, id, &format!("http://{}:8080/hello", w.addr2)), "another address is reachable");
    // DNS goes through strata's filter: the allowed name resolves, another does not.
    assert!(resolves(d, id, "allowed.test"));
    assert!(!resolves(d, id, "other.test"));
    let gw = net(d, id).gateway.unwrap();
    for target in [format!("{gw} 22"), "169.254.169.254 80".into(), "10.0.0.1 80".into()] {
        let (code, _) = run_in(d, id, &format!("echo x | nc -w 2 {target}"));
        assert_ne!(code, 0, "{target} is reachable from an egress sandbox");
    }
}

#[test]
fn egress_on_the_gvisor_tier_is_the_same_host_side_enforcement() {
    require_gvisor!();
    let w = World::new(4);
    let d = w.daemon(4);
    let id = d.create(&[
        "--isolation",
        "gvisor",
        "--allow-cidr",
        &format!("{}/32:8080", w.addr),
        "--allow-host",
        "allowed.test:8080",
    ]);
    assert_only_the_rules_reach(&w, &d, &id);
    // gVisor's netstack takes the link's address; a stopped sandbox starts with it again.
    d.cli_ok(&["stop", &id]);
    d.cli_ok(&["start", &id]);
    assert!(fetches(&d, &id, &format!("http://{}:8080/hello", w.addr)), "no network after a restart");
    // Standby saves the netstack with the sentry; after resume it is on the same link, under the same rules.
    d.cli_ok(&["standby", &id]);
    d.cli_ok(&["resume", &id]);
    assert!(fetches(&d, &id, &format!("http://{}:8080/hello", w.addr)), "no network after resume");
    assert!(!fetches(&d, &id, &format!("http://{}:8081/hello", w.addr)), "another port is reachable after resume");
    // A running gvisor sandbox cannot switch from none to egress (its netstack is fixed at start).
    let none = d.create(&["--isolation", "gvisor"]);
    let out = d.cli(&["network", "set", &none, "--allow-cidr", &format!("{}:8080", w.addr)]);
    assert!(!out.status.success() && stderr(&out).contains("stop it"), "{}", stderr(&out));
    d.cli_ok(&["stop", &none]);
    d.cli_ok(&["network", "set", &none, "--allow-cidr", &format!("{}:8080", w.addr)]);
    d.cli_ok(&["start", &none]);
    assert!(fetches(&d, &none, &format!("http://{}:8080/hello", w.addr)), "the network set while stopped");
}

#[test]
fn egress_on_the_microvm_tier_is_the_same_host_side_enforcement() {
    require_microvm!();
    let w = World::new(6);
    let d = w.daemon(6);
    let id = d.create(&[
        "--isolation",
        "microvm",
        "--allow-cidr",
        &format!("{}/32:8080", w.addr),
        "--allow-host",
        "allowed.test:8080",
    ]);
    // The guest has the link's address on its own network device; the namespace's eth0 has none.
    let address = net(&d, &id).address.unwrap();
    let (_, ip) = run_in(&d, &id, "ip addr show eth0; cat /etc/resolv.conf");
    assert!(ip.contains(&format!("inet {address}/30")), "the guest's address: {ip}");
    assert!(ip.contains(&format!("nameserver {}", net(&d, &id).gateway.unwrap())), "{ip}");
    assert_only_the_rules_reach(&w, &d, &id);
    assert!(net(&d, &id).denied.packets > 0, "the guest's denied packets are counted on the host");
    // A warm fork of the VM is on a link of its own: its guest takes that link's
    // address (the saved one was its source's), under the same rules.
    let warm = d.cli_ok(&["checkpoint", &id, "--processes"]).trim().to_string();
    let kid = d.cli_ok(&["fork", &warm, "-n", "1"]).trim().to_string();
    let kid_net = net(&d, &kid);
    assert_ne!(kid_net.address, Some(address.clone()), "the fork shares its source's link");
    let (_, ip) = run_in(&d, &kid, "ip addr show eth0; ip route; cat /etc/resolv.conf");
    assert!(ip.contains(&format!("inet {}/30", kid_net.address.clone().unwrap())), "the fork's address: {ip}");
    assert!(ip.contains(&format!("default via {}", kid_net.gateway.clone().unwrap())), "the fork's route: {ip}");
    assert!(ip.contains(&format!("nameserver {}", kid_net.gateway.unwrap())), "{ip}");
    assert!(fetches(&d, &kid, &format!("http://{}:8080/hello", w.addr)), "the fork has no network");
    assert!(!fetches(&d, &kid, &format!("http://{}:8081/hello", w.addr)), "another port is reachable from the fork");
    assert!(fetches(&d, &id, &format!("http://{}:8080/hello", w.addr)), "the source lost its network");
    d.cli_ok(&["rm", "-f", &kid]);
    // Standby keeps the link: the resumed guest is on it, under the same rules.
    d.cli_ok(&["standby", &id]);
    assert!(fetches(&d, &id, &format!("http://{}:8080/hello", w.addr)), "no network after resume");
    assert!(!fetches(&d, &id, &format!("http://{}:8081/hello", w.addr)), "another port is reachable after resume");
    // A stopped microVM starts on its link again.
    d.cli_ok(&["stop", &id]);
    d.cli_ok(&["start", &id]);
    assert!(fetches(&d, &id, &format!("http://{}:8080/hello", w.addr)), "no network after a restart");
    d.cli_ok(&["rm", "-f", &id]);
}

#[test]
fn open_egress_reaches_public_addresses_never_the_host_private_ranges_or_metadata() {
    require_host!();
    let w = World::new(5);
    let d = w.daemon(5);
    // Every public address, every name, but the denied address.
    let id = d.create(&["--allow-cidr", "0.0.0.0/0", "--deny-cidr", &format!("{}/32", w.addr2)]);
    assert_eq!(net(&d, &id).spec.deny, vec![w.addr2.clone()]);
    assert!(fetches(&d, &id, &format!("http://{}:8080/hello", w.addr)), "a public address is unreachable");
    assert!(fetches(&d, &id, &format!("http://{}:8081/hello", w.addr)), "another port of it is unreachable");
    assert!(!fetches(&d, &id, &format!("http://{}:8080/hello", w.addr2)), "the denied address is reachable");
    assert!(resolves(&d, &id, "other.test") && resolves(&d, &id, "allowed.test"), "names do not resolve");
    // Never the host, the metadata address or a private range.
    let gw = net(&d, &id).gateway.unwrap();
    assert_ne!(run_in(&d, &id, &format!("echo x | nc -w 2 {gw} 22")).0, 0, "the host is reachable");
    assert_ne!(run_in(&d, &id, &format!("echo x | nc -w 2 {} 22", w.host_addr)).0, 0, "the host is reachable");
    assert_ne!(run_in(&d, &id, "echo x | nc -w 2 169.254.169.254 80").0, 0, "cloud metadata is reachable");
    assert!(!fetches(&d, &id, "http://meta.test:80/hello"), "a name pointing at metadata is reachable");
    // A narrower allow rule wins over a deny (E2B's precedence).
    let wins = d.create(&[
        "--allow-cidr",
        "0.0.0.0/0",
        "--allow-cidr",
        &format!("{}:8080", w.addr2),
        "--deny-cidr",
        &format!("{}/32", w.addr2),
    ]);
    assert!(fetches(&d, &wins, &format!("http://{}:8080/hello", w.addr2)), "the allow rule lost to the deny");
    assert!(!fetches(&d, &wins, &format!("http://{}:8081/hello", w.addr2)), "the deny does not hold");
    // Bad input: a name cannot be denied; deny rules need egress.
    let out = d.cli(&["create", "busybox", "--deny-cidr", "evil.example"]);
    assert!(!out.status.success() && stderr(&out).contains("evil.example"), "{}", stderr(&out));
    let out = d.cli(&["create", "busybox", "--network", "none", "--deny-cidr", "203.0.113.0/24"]);
    assert!(!out.status.success() && stderr(&out).contains("egress"), "{}", stderr(&out));
}
