//! E2B compatibility: the official `e2b` Python SDK (pinned to 2.63.0 and
//! installed into a venv by scripts/setup-host.sh) runs
//! crates/cli/tests/e2b/suite.py against a private daemon's TCP listener with
//! `E2B_API_URL`/`E2B_SANDBOX_URL` pointing at it and a tenant token as
//! `E2B_API_KEY`: sandboxes (create, info, list with filters and pages,
//! connect, kill, timeouts), commands (foreground, background, stdin,
//! timeouts, kill, list, reconnect, stream input), PTY (create, input, resize,
//! exit code), files (text and binary, multipart and
//! octet-stream, list, exists, rename, remove, make_dir, get_info, watch),
//! pause -> resume with a running process, fork, snapshots, metrics, logs,
//! network rules, and the
//! errors of bad keys, unknown ids, another tenant's key, unsupported calls and malformed frames.
//! The official JavaScript SDK (`e2b` on npm, an old 2.45 and a current
//! version, pinned in tests/e2b/js/package.json and its lockfile, installed by
//! setup-host with `npm ci`) runs tests/e2b/js/suite.mjs the same way, each
//! version unmodified and with its default options (no key-check opt-out).
//! The E2B template `base` is the Debian test image imported as `e2b-base`.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::TestDaemon;

/// The venv holding the pinned `e2b` package (see scripts/setup-host.sh).
fn venv_python() -> Option<PathBuf> {
    let venv = std::env::var("STRATA_E2B_VENV").unwrap_or_else(|_| "/var/cache/strata/venv-e2b".into());
    let py = PathBuf::from(venv).join("bin/python");
    let ok = Command::new(&py).args(["-c", "import e2b"]).output().is_ok_and(|o| o.status.success());
    ok.then_some(py)
}

/// Skips (outside CI) or fails (in CI) for a missing prerequisite.
fn missing(reason: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI must be able to run this test, but: {reason}");
    }
    println!("skipped: {reason}");
}

/// A daemon with a TCP listener for the SDKs, the `base` template imported,
/// and a tenant key in E2B's key form.
struct E2bDaemon {
    d: TestDaemon,
    url: String,
    key: String,
}

impl E2bDaemon {
    /// Starts it, or says why not (skipped outside CI, a failure in CI).
    fn start() -> Option<E2bDaemon> {
        if let Some(reason) = common::missing_prerequisite() {
            missing(&reason);
            return None;
        }
        let base = common::images_dir().join("debian-python.tar.gz");
        if !base.exists() {
            missing(&format!("{} is missing (run scripts/build-test-images.sh --debian)", base.display()));
            return None;
        }
        if let Some(reason) = strata_runtime::namespace::criu::unsupported() {
            missing(&format!("pause/resume with processes needs CRIU: {reason}"));
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let d = TestDaemon::start_with(Some(&format!("127.0.0.1:{port}")));
        d.cli_ok(&["image", "import", base.to_str().unwrap(), "--name", "e2b-base", "--trusted"]);
        // A tenant's key, as `strata token create --e2b` prints it for E2B_API_KEY:
        // in E2B's key form, which SDKs up to 2.45 require (`e2b_` + hex).
        let key = d.cli_ok(&["token", "create", "--name", "e2b-suite", "--tenant", "e2b", "--e2b"]);
        let key = key.lines().next().unwrap_or_default().trim().to_string();
        let key_form = key
            .strip_prefix("e2b_")
            .is_some_and(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert!(key_form, "not in E2B's key form: {key}");
        Some(E2bDaemon { d, url: format!("http://127.0.0.1:{port}"), key })
    }

    /// Everything the tenant made is gone or still its own: nothing leaked to the operator's view.
    fn assert_nothing_leaked(&self) {
        let ls = self.d.cli_ok(&["ps", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&ls).unwrap();
        for s in v.as_array().unwrap() {
            assert_eq!(s["tenant"], "e2b", "sandbox outside the key's tenant: {s}");
        }
    }
}

#[test]
fn e2b_sdk_suite_passes_against_a_live_daemon() {
    let Some(py) = venv_python() else {
        return missing("the e2b SDK venv is missing (run scripts/setup-host.sh)");
    };
    let Some(e) = E2bDaemon::start() else { return };
    let other = e.d.cli_ok(&["token", "create", "--name", "e2b-other", "--tenant", "other"]);
    let other = other.trim().to_string();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2b/suite.py");
    let out = Command::new(&py)
        .arg(&script)
        .env("E2B_API_URL", &e.url)
        .env("E2B_SANDBOX_URL", &e.url)
        .env("E2B_API_KEY", &e.key)
        .env("E2B_OTHER_KEY", &other)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run the e2b suite");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}\n{stderr}");
    assert!(out.status.success(), "e2b suite failed ({:?}); daemon log:\n{}", out.status, e.d.log());
    assert!(stderr.contains("\nOK"), "unittest did not report OK:\n{stderr}");
    assert!(!stderr.contains("skipped"), "a test of the suite was skipped:\n{stderr}");
    e.assert_nothing_leaked();
}

/// The pinned npm SDKs (see scripts/setup-host.sh and tests/e2b/js/package.json):
/// the directory `npm ci` installed them into, with each package and its version.
fn js_sdks() -> Result<(PathBuf, Vec<(String, String)>), String> {
    let dir = PathBuf::from(std::env::var("STRATA_E2B_JS").unwrap_or_else(|_| "/var/cache/strata/e2b-js".into()));
    let pinned: serde_json::Value = serde_json::from_slice(
        &std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2b/js/package.json")).unwrap(),
    )
    .unwrap();
    let mut sdks = Vec::new();
    for (name, spec) in pinned["dependencies"].as_object().unwrap() {
        let version = spec.as_str().unwrap().rsplit('@').next().unwrap().to_string();
        let installed = std::fs::read(dir.join("node_modules").join(name).join("package.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["version"].as_str().map(str::to_string));
        if installed.as_deref() != Some(version.as_str()) {
            return Err(format!(
                "{name} {version} is not installed in {} (found {installed:?}; run scripts/setup-host.sh)",
                dir.display()
            ));
        }
        sdks.push((name.clone(), version));
    }
    Ok((dir, sdks))
}

/// The official JavaScript SDK, an old (2.45) and a current version, each
/// unmodified and with its default options, runs tests/e2b/js/suite.mjs
/// (node's test runner) against one daemon.
#[test]
fn e2b_js_sdk_suite_passes_with_an_old_and_a_current_sdk() {
    let (installed, sdks) = match js_sdks() {
        Ok(found) => found,
        Err(reason) => return missing(&reason),
    };
    let Some(e) = E2bDaemon::start() else { return };
    // Node resolves the packages from the script's directory: the suite goes into a
    // directory of the test's own, beside a link to the installed node_modules.
    let work = e.d.dir.path().join("e2b-js");
    std::fs::create_dir_all(&work).unwrap();
    std::os::unix::fs::symlink(installed.join("node_modules"), work.join("node_modules")).unwrap();
    let script = work.join("suite.mjs");
    std::fs::copy(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2b/js/suite.mjs"), &script).unwrap();
    assert!(sdks.len() >= 2, "an old and a current SDK are pinned: {sdks:?}");
    for (sdk, version) in &sdks {
        let out = Command::new("node")
            .args(["--test-reporter=tap", script.to_str().unwrap()])
            .current_dir(&work)
            .env("E2B_API_URL", &e.url)
            .env("E2B_SANDBOX_URL", &e.url)
            .env("E2B_API_KEY", &e.key)
            .env("E2B_JS_SDK", sdk)
            .env("E2B_JS_VERSION", version)
            .env_remove("E2B_VALIDATE_API_KEY")
            .env_remove("E2B_DEBUG")
            .output()
            .expect("run node");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        println!("--- {sdk} {version}\n{stdout}\n{stderr}");
        let count = |what: &str| -> u64 {
            stdout
                .lines()
                .find_map(|l| l.strip_prefix(&format!("# {what} ")))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or_else(|| panic!("{sdk} {version}: no '# {what}' line in the suite's output"))
        };
        assert!(
            out.status.success(),
            "JS suite with {sdk} {version} failed ({:?}); daemon log:\n{}",
            out.status,
            e.d.log()
        );
        assert!(count("pass") >= 15, "{sdk} {version}: too few tests ran");
        assert_eq!((count("fail"), count("skipped"), count("cancelled")), (0, 0, 0), "{sdk} {version}");
    }
    e.assert_nothing_leaked();
}

/// One HTTP/1.1 request on a fresh connection: (status, body). With `first_bytes`,
/// reads only that much of the body (a streamed answer) and hangs up.
fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    first_bytes: Option<usize>,
) -> (u16, Vec<u8>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).unwrap_or(0);
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if let (Some(want), Some(end)) = (first_bytes, got.windows(4).position(|w| w == b"\r\n\r\n")) {
            if got.len() >= end + 4 + want {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&got).to_string();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let end = got.windows(4).position(|w| w == b"\r\n\r\n").map_or(got.len(), |e| e + 4);
    let mut body = got[end..].to_vec();
    if text[..end.min(text.len())].to_ascii_lowercase().contains("transfer-encoding: chunked") {
        // De-chunk (enough for these small answers).
        let mut out = Vec::new();
        let mut rest = &body[..];
        while let Some(nl) = rest.windows(2).position(|w| w == b"\r\n") {
            let len = usize::from_str_radix(String::from_utf8_lossy(&rest[..nl]).trim(), 16).unwrap_or(0);
            if len == 0 || rest.len() < nl + 2 + len {
                out.extend_from_slice(&rest[nl + 2..]);
                break;
            }
            out.extend_from_slice(&rest[nl + 2..nl + 2 + len]);
            rest = &rest[nl + 2 + len + 2..];
        }
        body = out;
    }
    (status, body)
}

/// What the E2B layer keeps itself (port previews, process tags) is keyed by
/// full sandbox ids and checked per request: a sandbox named by its name in
/// `E2b-Sandbox-Id` reaches the same sandbox, a revoked key stops reaching a
/// port at once (not when the preview it made ends), and another tenant's key
/// learns nothing about a process tag (the answer of an unknown tag).
/// Raw HTTP, no SDK: runs wherever sandboxes run.
#[test]
fn the_e2b_layer_keys_its_state_by_full_ids_and_checks_every_request() {
    require_host!();
    use base64::Engine;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let d = TestDaemon::start_with(Some(&addr));
    d.import_busybox();
    let key = |name: &str, tenant: &str| {
        let v: serde_json::Value =
            serde_json::from_str(&d.cli_ok(&["token", "create", "--name", name, "--tenant", tenant, "--json"]))
                .unwrap();
        (v["id"].as_str().unwrap().to_string(), v["secret"].as_str().unwrap().to_string())
    };
    let (_, acme) = key("acme-main", "acme");
    let (short_id, short) = key("acme-short", "acme");
    let (_, globex) = key("globex", "globex");
    let rt = common::rt();
    let c = strata_client::Client::new(strata_client::Endpoint::Tcp { addr: addr.clone(), token: Some(acme.clone()) });
    let sb = rt
        .block_on(c.create_sandbox(&strata_api::CreateSandboxRequest {
            source: "busybox".into(),
            name: Some("web-box".into()),
            lifecycle: strata_api::Lifecycle::Persistent,
            ..Default::default()
        }))
        .unwrap()
        .id;
    let sh =
        |cmd: &str| strata_api::ExecRequest { cmd: vec!["sh".into(), "-c".into(), cmd.into()], ..Default::default() };
    rt.block_on(c.exec(&sb, &sh("mkdir -p /srv && echo hello > /srv/hello.txt"))).unwrap();
    rt.block_on(c.start_process(&sb, &sh("exec busybox httpd -f -p 127.0.0.1:8000 -h /srv"))).unwrap();

    // Port routing, by id and by name, with the key that will be revoked.
    let get = |sandbox: &str, k: &str| {
        http(
            &addr,
            "GET",
            "/hello.txt",
            &[("E2b-Sandbox-Id", sandbox), ("E2b-Sandbox-Port", "8000"), ("X-API-Key", k)],
            b"",
            None,
        )
    };
    assert!(
        common::wait_until(20, || get(&sb, &short).0 == 200),
        "the port is reachable by id: {:?}",
        get(&sb, &short)
    );
    assert_eq!(get(&sb, &short), (200, b"hello\n".to_vec()));
    assert_eq!(
        get("web-box", &short),
        (200, b"hello\n".to_vec()),
        "a name in E2b-Sandbox-Id reaches the sandbox it names"
    );
    d.cli_ok(&["token", "revoke", &short_id]);
    for sandbox in [sb.as_str(), "web-box"] {
        let (status, body) = get(sandbox, &short);
        assert_eq!(
            status,
            401,
            "a revoked key is refused from the next request on ({sandbox}): {}",
            String::from_utf8_lossy(&body)
        );
    }
    assert_eq!(get(&sb, &acme).0, 200, "the other key of the tenant still works");
    assert_eq!(get(&sb, &globex).0, 404, "another tenant's key: unknown sandbox");

    // A tagged process started through envd (as root: busybox has no `user`).
    let envelope = |json: serde_json::Value| {
        let p = json.to_string().into_bytes();
        let mut b = vec![0u8];
        b.extend_from_slice(&(p.len() as u32).to_be_bytes());
        b.extend_from_slice(&p);
        b
    };
    let root = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("root:"));
    let envd = |k: &str, ct: &str| {
        vec![
            ("E2b-Sandbox-Id".to_string(), sb.clone()),
            ("E2b-Sandbox-Port".into(), "49983".into()),
            ("X-Access-Token".into(), k.to_string()),
            ("Authorization".into(), root.clone()),
            ("Content-Type".into(), ct.to_string()),
        ]
    };
    let h = envd(&acme, "application/connect+json");
    let h: Vec<(&str, &str)> = h.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    let start = envelope(serde_json::json!({"process": {"cmd": "sleep", "args": ["120"]}, "tag": "secret-tag"}));
    let (status, _) = http(&addr, "POST", "/process.Process/Start", &h, &start, Some(5));
    assert_eq!(status, 200);
    assert!(common::wait_until(10, || rt
        .block_on(c.list_processes(&sb))
        .unwrap()
        .iter()
        .any(|p| p.cmd == ["sleep", "120"] && p.status == strata_api::ProcessStatus::Running)));
    // globex names acme's sandbox by its full id and the tag: exactly the answer of an unknown tag.
    let hg = envd(&globex, "application/json");
    let hg: Vec<(&str, &str)> = hg.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    let signal = |tag: &str| {
        http(
            &addr,
            "POST",
            "/process.Process/SendSignal",
            &hg,
            serde_json::json!({"process": {"tag": tag}, "signal": "SIGNAL_SIGKILL"}).to_string().as_bytes(),
            None,
        )
    };
    let (s1, b1) = signal("secret-tag");
    let (s2, b2) = signal("no-such-tag");
    let (b1, b2) = (
        String::from_utf8_lossy(&b1).replace("secret-tag", "TAG"),
        String::from_utf8_lossy(&b2).replace("no-such-tag", "TAG"),
    );
    assert_eq!((s1, &b1), (s2, &b2), "another tenant's key cannot tell a tag exists");
    assert_eq!(s1, 404, "{b1}");
    // acme's process is untouched, and acme's own key still finds it by tag.
    assert!(rt
        .block_on(c.list_processes(&sb))
        .unwrap()
        .iter()
        .any(|p| p.cmd == ["sleep", "120"] && p.status == strata_api::ProcessStatus::Running));
    let ha = envd(&acme, "application/json");
    let ha: Vec<(&str, &str)> = ha.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    let (status, body) = http(
        &addr,
        "POST",
        "/process.Process/SendSignal",
        &ha,
        br#"{"process": {"tag": "secret-tag"}, "signal": "SIGNAL_SIGKILL"}"#,
        None,
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));

    // An E2B create names its sandbox only in its answer: the audit entry takes it from there.
    let (status, body) = http(
        &addr,
        "POST",
        "/sandboxes",
        &[("X-API-Key", acme.as_str()), ("Content-Type", "application/json")],
        br#"{"templateID": "busybox", "timeout": 60}"#,
        None,
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let made: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let made = made["sandboxID"].as_str().expect("sandboxID").to_string();

    // The E2B layer calls the engine in-process: what its requests changed is
    // in the audit log under their E2B routes, with the caller and its tenant.
    let audit: Vec<serde_json::Value> =
        serde_json::from_str(&d.cli_ok(&["audit", "--json", "--limit", "1000"])).unwrap();
    let find = |route: &str, actor_tenant: &str| {
        audit.iter().find(|e| e["route"] == route && e["tenant"] == actor_tenant).cloned()
    };
    let started = find("e2b:/process.Process/Start", "acme").expect("the envd Start is audited");
    assert_eq!(started["target"], sb.as_str(), "{started}");
    assert_eq!(started["status"], 200, "{started}");
    let refused = find("e2b:/process.Process/SendSignal", "globex").expect("another tenant's attempt is audited");
    assert_eq!(refused["status"], 404, "{refused}");
    assert!(
        find("e2b:(port routing) /v1/sandboxes/{id}/previews", "acme").is_some(),
        "the preview port routing made is audited"
    );
    let created = find("e2b:/sandboxes", "acme").expect("the E2B create is audited");
    assert_eq!((created["target"].as_str(), created["status"].as_u64()), (Some(made.as_str()), Some(201)), "{created}");
}
