//! Preview URLs: the daemon's reverse proxy to ports bound on a sandbox's
//! loopback. Path-based and host-based routing, GET and POST with bodies,
//! tokens by header, signed URL and cookie (never passed upstream), 401 for
//! missing, wrong, expired and revoked tokens, public previews, 404/409/502,
//! tenants, a WebSocket-style upgrade round trip, a preview connection keeping
//! an idle sandbox awake, a request resuming a sandbox in standby, and pooled
//! keep-alive connections to the sandbox's server.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{rt, TestDaemon};
use strata_api::{CreatePreviewRequest, CreateSandboxRequest, ErrorCode, Lifecycle, SandboxState};
use strata_client::{Client, ClientError, Endpoint};

/// A daemon with a TCP listener; its address.
fn daemon() -> (TestDaemon, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let d = TestDaemon::start_with(Some(&addr));
    (d, addr)
}

/// A CGI script that prints the method, what the server saw, and the body.
const ECHO_CGI: &str = "#!/bin/sh\necho Content-Type: text/plain\necho\necho \"method=$REQUEST_METHOD query=$QUERY_STRING cookie=$HTTP_COOKIE tokhdr=$HTTP_X_STRATA_PREVIEW_TOKEN prefix=$HTTP_X_FORWARDED_PREFIX fwdhost=$HTTP_X_FORWARDED_HOST\"\n[ -n \"$CONTENT_LENGTH\" ] && head -c \"$CONTENT_LENGTH\"\nexit 0\n";

/// An upgrade echo server for `nc -e`: reads the request head, answers 101, then echoes bytes.
const UPGRADE_ECHO: &str = "#!/bin/sh\nwhile IFS= read -r line; do [ ${#line} -le 1 ] && break; done\nprintf 'HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\n\\r\\n'\nexec cat\n";

/// A busybox sandbox (extra `create` flags) serving /www on 127.0.0.1:`port` inside, with /cgi-bin/echo.
fn web_sandbox(d: &TestDaemon, extra: &[&str], port: u16) -> String {
    let id = d.create(extra);
    serve(d, &id, port, "hello-preview");
    id
}

fn serve(d: &TestDaemon, id: &str, port: u16, index: &str) {
    let dir = format!("/www{port}");
    let setup = format!("mkdir -p {dir}/cgi-bin && echo {index} > {dir}/index.html && cat > {dir}/cgi-bin/echo && chmod +x {dir}/cgi-bin/echo");
    let out = d.cli_stdin(&["exec", "-i", id, "--", "sh", "-c", &setup], ECHO_CGI.as_bytes());
    assert!(out.status.success(), "{}", common::stderr(&out));
    d.cli_ok(&["exec", "-d", id, "--", "httpd", "-f", "-p", &format!("127.0.0.1:{port}"), "-h", &dir]);
    let probe = format!("http://127.0.0.1:{port}/index.html");
    assert!(
        common::wait_until(10, || common::stdout(&d.cli(&["exec", id, "--", "wget", "-qO-", &probe])).trim() == index),
        "httpd serves on {port}"
    );
}

/// `strata preview create ... --json`.
fn preview(d: &TestDaemon, id: &str, port: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["preview", "create", id, port, "--json"];
    args.extend_from_slice(extra);
    serde_json::from_str(&d.cli_ok(&args)).unwrap()
}

fn token(p: &serde_json::Value) -> String {
    p["token"].as_str().unwrap().to_string()
}

/// A response: status, lowercase headers, body.
#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }

    /// The error code of a JSON error body.
    fn code(&self) -> String {
        self.json()["code"].as_str().unwrap_or_default().to_string()
    }
}

/// Reads a chunked body.
fn dechunk(mut r: impl BufRead) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap() == 0 {
            return out;
        }
        let n = usize::from_str_radix(line.trim().split(';').next().unwrap_or("0"), 16).unwrap_or(0);
        if n == 0 {
            return out;
        }
        let mut buf = vec![0; n + 2];
        r.read_exact(&mut buf).unwrap();
        out.extend_from_slice(&buf[..n]);
    }
}

/// Reads a response head from `r`.
fn read_head(r: &mut impl BufRead) -> (u16, Vec<(String, String)>) {
    let mut status_line = String::new();
    r.read_line(&mut status_line).unwrap();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        let l = l.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    (status, headers)
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`).
fn http(addr: &str, method: &str, target: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!("{method} {target} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut r = BufReader::new(s);
    let (status, headers) = read_head(&mut r);
    let chunked = headers.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(r)
    } else {
        let mut b = Vec::new();
        r.read_to_end(&mut b).unwrap();
        b
    };
    Resp { status, headers, body: String::from_utf8_lossy(&body).into_owned() }
}

fn get(addr: &str, target: &str, headers: &[(&str, &str)]) -> Resp {
    http(addr, "GET", target, headers, b"")
}

fn tok_header(t: &str) -> (&'static str, &str) {
    ("X-Strata-Preview-Token", t)
}

#[test]
fn previews_route_by_path_and_host_and_check_their_tokens() {
    require_host!();
    let (d, addr) = daemon();
    d.import_busybox();
    let id = web_sandbox(&d, &[], 8000);
    let p = preview(&d, &id, "8000", &[]);
    let t = token(&p);
    let path = format!("/preview/{id}/8000/");
    assert_eq!(p["port"], 8000);
    assert_eq!(p["public"], false);
    assert!(p["url_path"].as_str().unwrap().ends_with(&path), "{p}");
    assert!(p["url_host"].as_str().unwrap().starts_with(&format!("http://8000-{id}.preview.localhost:")), "{p}");
    assert!(p["signed_url"].as_str().unwrap().ends_with(&format!("{path}?strata_token={t}")), "{p}");

    // No token, a wrong one, a token of this sandbox for another port: 401 JSON.
    let r = get(&addr, &path, &[]);
    assert_eq!((r.status, r.code().as_str()), (401, "unauthorized"), "{r:?}");
    let r = get(&addr, &path, &[tok_header("stp_0000")]);
    assert_eq!((r.status, r.code().as_str()), (401, "unauthorized"), "{r:?}");
    let r = get(&addr, &format!("/preview/{id}/8001/"), &[tok_header(&t)]);
    assert_eq!(r.status, 401, "a port-8000 token does not open port 8001: {r:?}");
    // The API's bearer token is not a preview token.
    let api_token = std::fs::read_to_string(d.state("api-token")).unwrap();
    let r = get(&addr, &path, &[("Authorization", &format!("Bearer {}", api_token.trim()))]);
    assert_eq!(r.status, 401, "{r:?}");

    // Path-based with the header token: GET and POST with a body; the prefix is stripped.
    let r = get(&addr, &path, &[tok_header(&t)]);
    assert_eq!((r.status, r.body.as_str()), (200, "hello-preview\n"), "{r:?}");
    let body = "line one\nline two: the body goes through unchanged\n".repeat(100);
    let r = http(
        &addr,
        "POST",
        &format!("{path}cgi-bin/echo?x=1"),
        &[tok_header(&t), ("Content-Type", "text/plain")],
        body.as_bytes(),
    );
    assert_eq!(r.status, 200, "{r:?}");
    let (head, echoed) = r.body.split_once('\n').unwrap();
    assert!(
        head.starts_with("method=POST query=x=1 cookie= tokhdr= "),
        "the token header is not passed upstream: {head}"
    );
    assert!(head.contains(&format!("prefix=/preview/{id}/8000 ")), "{head}");
    assert_eq!(echoed, body);
    // Without the trailing slash: redirected to the preview's root.
    let r = get(&addr, &format!("/preview/{id}/8000"), &[tok_header(&t)]);
    assert_eq!((r.status, r.header("location")), (308, Some(path.as_str())), "{r:?}");

    // Host-based, on the same TCP listener (the API's bearer token is not needed).
    let host = format!("8000-{id}.preview.localhost");
    let r = get(&addr, "/index.html", &[("Host", &host), tok_header(&t)]);
    assert_eq!((r.status, r.body.as_str()), (200, "hello-preview\n"), "{r:?}");
    let r = http(&addr, "POST", "/cgi-bin/echo", &[("Host", &format!("{host}:1234")), tok_header(&t)], b"by-host");
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        r.body.starts_with("method=POST")
            && r.body.contains(&format!("fwdhost={host}:1234"))
            && r.body.ends_with("\nby-host"),
        "{r:?}"
    );
    let r = get(&addr, "/", &[("Host", &host)]);
    assert_eq!(r.status, 401, "host-based needs the token too: {r:?}");
    // Over the Unix socket the same paths work (the operator's socket; the preview still needs its token).
    // Not tested here: the harness's client speaks the API only.

    // Signed URL: the query token is stripped and sets a cookie scoped to the preview.
    let r = get(&addr, &format!("{path}cgi-bin/echo?a=b&strata_token={t}"), &[("Cookie", "app=1")]);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        r.body.starts_with("method=GET query=a=b cookie=app=1 tokhdr= "),
        "the token stays out of the upstream query and cookies: {}",
        r.body
    );
    let cookie = r.header("set-cookie").expect("the signed URL sets a cookie");
    assert!(
        cookie.starts_with(&format!("strata_preview={t};"))
            && cookie.contains(&format!("Path={path};"))
            && cookie.contains("HttpOnly"),
        "{cookie}"
    );
    // The page's own requests then carry only the cookie.
    let r = get(&addr, &format!("{path}cgi-bin/echo"), &[("Cookie", &format!("app=2; strata_preview={t}"))]);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.starts_with("method=GET query= cookie=app=2 tokhdr= "), "{}", r.body);
    let r = get(&addr, &path, &[("Cookie", "strata_preview=stp_bogus")]);
    assert_eq!(r.status, 401, "{r:?}");

    // Unknown sandbox: 404; nothing on the port: 502; both JSON.
    let r = get(&addr, "/preview/nosuchsandbox/8000/", &[tok_header(&t)]);
    assert_eq!((r.status, r.code().as_str()), (404, "sandbox_not_found"), "{r:?}");
    let r = get(&addr, "/", &[("Host", "8000-nosuchsandbox.preview.localhost")]);
    assert_eq!((r.status, r.code().as_str()), (404, "sandbox_not_found"), "{r:?}");
    let all = preview(&d, &id, "all", &[]);
    assert!(all["port"].is_null(), "{all}");
    let r = get(&addr, &format!("/preview/{id}/8001/"), &[tok_header(&token(&all))]);
    assert_eq!((r.status, r.code().as_str()), (502, "upstream_unavailable"), "{r:?}");
    assert!(r.json()["message"].as_str().unwrap().contains("127.0.0.1:8001"), "{r:?}");
    let r = get(&addr, &path, &[tok_header(&token(&all))]);
    assert_eq!((r.status, r.body.as_str()), (200, "hello-preview\n"), "an every-port preview opens 8000 too");

    // Listing (no tokens), revocation: 401 from the next request on.
    let list: serde_json::Value = serde_json::from_str(&d.cli_ok(&["preview", "ls", &id, "--json"])).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 2, "{list}");
    assert!(!list.to_string().contains(&t), "listings never show tokens");
    let pid = p["id"].as_str().unwrap();
    d.cli_ok(&["preview", "revoke", &id, pid]);
    let r = get(&addr, &path, &[tok_header(&t)]);
    assert_eq!((r.status, r.code().as_str()), (401, "unauthorized"), "{r:?}");
    assert!(r.json()["message"].as_str().unwrap().contains("revoked"), "{r:?}");
    let r = get(&addr, &path, &[("Cookie", &format!("strata_preview={t}"))]);
    assert_eq!(r.status, 401, "the cookie of a revoked preview is refused too: {r:?}");
    let list: serde_json::Value = serde_json::from_str(&d.cli_ok(&["preview", "ls", &id, "--json"])).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1, "revoked previews are listed only with --all: {list}");
    let list: serde_json::Value = serde_json::from_str(&d.cli_ok(&["preview", "ls", &id, "--all", "--json"])).unwrap();
    assert!(list.as_array().unwrap().iter().any(|p| p["id"] == pid && p["revoked_at"].is_string()), "{list}");
    let out = d.cli(&["preview", "revoke", &id, "nosuchpreview"]);
    assert!(!out.status.success() && common::stderr(&out).contains("preview_not_found"), "{}", common::stderr(&out));

    // Expiry: refused once the lifetime is over.
    let short = preview(&d, &id, "8000", &["--ttl", "1s"]);
    let r = get(&addr, &path, &[tok_header(&token(&short))]);
    assert_eq!(r.status, 200, "{r:?}");
    std::thread::sleep(Duration::from_millis(1500));
    let r = get(&addr, &path, &[tok_header(&token(&short))]);
    assert_eq!((r.status, r.code().as_str()), (401, "unauthorized"), "{r:?}");
    assert!(r.json()["message"].as_str().unwrap().contains("expired"), "{r:?}");

    // Bad input to the API.
    let c = d.client();
    for bad in [
        CreatePreviewRequest { port: Some(0), ..Default::default() },
        CreatePreviewRequest { port: Some(80), ttl_secs: Some(0), ..Default::default() },
        CreatePreviewRequest { port: Some(80), ttl_secs: Some(365 * 86_400), ..Default::default() },
    ] {
        match rt().block_on(c.create_preview(&id, &bad)) {
            Err(ClientError::Api { status, body }) => assert_eq!((status, body.code), (400, ErrorCode::BadRequest)),
            r => panic!("{bad:?}: {r:?}"),
        }
    }
    match rt()
        .block_on(c.create_preview("nosuchsandbox", &CreatePreviewRequest { port: Some(80), ..Default::default() }))
    {
        Err(ClientError::Api { status, .. }) => assert_eq!(status, 404),
        r => panic!("{r:?}"),
    }

    // Traffic is counted in metrics; creating and revoking is in the audit log, proxied requests are not.
    let metrics = rt().block_on(c.metrics()).unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("strata_preview_requests_total{outcome=\"proxied\"}") && !l.ends_with(" 0")),
        "{metrics}"
    );
    assert!(
        metrics.lines().any(|l| l.starts_with("strata_preview_requests_total{outcome=\"unauthorized\"}")),
        "{metrics}"
    );
    assert!(
        metrics.lines().any(|l| l.starts_with("strata_preview_bytes_total{direction=\"to_sandbox\"}")),
        "{metrics}"
    );
    let audit: Vec<serde_json::Value> =
        serde_json::from_str(&d.cli_ok(&["audit", "--json", "--limit", "1000"])).unwrap();
    let routes: Vec<(String, String)> = audit
        .iter()
        .filter(|e| e["target"] == id.as_str())
        .map(|e| (e["method"].as_str().unwrap().to_string(), e["route"].as_str().unwrap().to_string()))
        .collect();
    assert!(
        routes.contains(&("POST".into(), "/v1/sandboxes/{id}/previews".into())),
        "preview creation is audited: {routes:?}"
    );
    assert!(
        routes.contains(&("DELETE".into(), "/v1/sandboxes/{id}/previews/{preview}".into())),
        "revocation is audited: {routes:?}"
    );
    assert!(
        !audit.iter().any(|e| e["route"].as_str().unwrap_or_default().starts_with("/preview")),
        "proxied requests are not in the audit log"
    );

    // A stopped sandbox: 409 with its state.
    d.cli_ok(&["stop", &id]);
    let r = get(&addr, &format!("/preview/{id}/8001/"), &[tok_header(&token(&all))]);
    assert_eq!((r.status, r.code().as_str()), (409, "invalid_state"), "{r:?}");
    assert_eq!(r.json()["current_state"], "stopped", "{r:?}");
    // Destroyed: its previews go with it.
    d.cli_ok(&["rm", "-f", &id]);
    let r = get(&addr, &format!("/preview/{id}/8000/"), &[tok_header(&token(&all))]);
    assert_eq!(r.status, 404, "{r:?}");
}

#[test]
fn public_previews_need_no_token_and_open_only_their_port() {
    require_host!();
    let (d, addr) = daemon();
    d.import_busybox();
    let id = web_sandbox(&d, &[], 8000);
    serve(&d, &id, 8002, "public-page");
    let p = preview(&d, &id, "8002", &["--public"]);
    assert_eq!(p["public"], true);
    let r = get(&addr, &format!("/preview/{id}/8002/"), &[]);
    assert_eq!((r.status, r.body.as_str()), (200, "public-page\n"), "{r:?}");
    assert!(r.header("set-cookie").is_none());
    let r = get(&addr, "/index.html", &[("Host", &format!("8002-{id}.preview.localhost"))]);
    assert_eq!((r.status, r.body.as_str()), (200, "public-page\n"), "{r:?}");
    let r = get(&addr, &format!("/preview/{id}/8000/"), &[]);
    assert_eq!(r.status, 401, "a public preview of 8002 leaves 8000 closed: {r:?}");
    d.cli_ok(&["preview", "revoke", &id, p["id"].as_str().unwrap()]);
    let r = get(&addr, &format!("/preview/{id}/8002/"), &[]);
    assert_eq!(r.status, 401, "a revoked public preview is closed: {r:?}");
}

#[test]
fn tenants_cannot_preview_each_others_sandboxes() {
    require_host!();
    let (d, addr) = daemon();
    d.import_busybox();
    let tok = |name: &str, tenant: &str| -> String {
        let v: serde_json::Value =
            serde_json::from_str(&d.cli_ok(&["token", "create", "--name", name, "--tenant", tenant, "--json"]))
                .unwrap();
        v["secret"].as_str().unwrap().to_string()
    };
    let a = Client::new(Endpoint::Tcp { addr: addr.clone(), token: Some(tok("a", "acme")) });
    let b = Client::new(Endpoint::Tcp { addr: addr.clone(), token: Some(tok("b", "globex")) });
    let mk = |c: &Client, name: &str| {
        rt().block_on(c.create_sandbox(&CreateSandboxRequest {
            source: "busybox".into(),
            name: Some(name.into()),
            lifecycle: Lifecycle::Persistent,
            ..Default::default()
        }))
        .unwrap()
        .id
    };
    let sa = mk(&a, "a-web");
    let sb = mk(&b, "b-web");
    serve(&d, &sa, 8000, "acme-page");
    serve(&d, &sb, 8000, "globex-page");
    let req = CreatePreviewRequest { port: Some(8000), ..Default::default() };
    let pa = rt().block_on(a.create_preview(&sa, &req)).unwrap();
    assert_eq!(pa.preview.tenant, "acme");
    let status = |r: Result<_, ClientError>| match r {
        Err(ClientError::Api { status, body }) => (status, body.code),
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => panic!("{e}"),
    };
    // Another tenant's sandbox is 404 for every preview route, exactly like an unknown one.
    assert_eq!(status(rt().block_on(b.create_preview(&sa, &req)).map(|_| ())), (404, ErrorCode::SandboxNotFound));
    assert_eq!(status(rt().block_on(b.list_previews(&sa, true)).map(|_| ())), (404, ErrorCode::SandboxNotFound));
    assert_eq!(
        status(rt().block_on(b.revoke_preview(&sa, &pa.preview.id)).map(|_| ())),
        (404, ErrorCode::SandboxNotFound)
    );
    assert_eq!(
        status(rt().block_on(b.revoke_preview(&sb, &pa.preview.id)).map(|_| ())),
        (404, ErrorCode::PreviewNotFound),
        "a preview id of another sandbox is unknown"
    );
    assert_eq!(rt().block_on(b.list_previews(&sb, true)).unwrap().len(), 0);
    // acme's preview token opens acme's sandbox only.
    let r = get(&addr, &format!("/preview/{sa}/8000/"), &[tok_header(&pa.token)]);
    assert_eq!((r.status, r.body.as_str()), (200, "acme-page\n"), "{r:?}");
    let r = get(&addr, &format!("/preview/{sb}/8000/"), &[tok_header(&pa.token)]);
    assert_eq!(r.status, 401, "{r:?}");
    // Only full ids: a name (or prefix) is unknown, so anonymous callers learn nothing about names.
    for key in ["a-web", &sa[..8]] {
        let r = get(&addr, &format!("/preview/{key}/8000/"), &[tok_header(&pa.token)]);
        assert_eq!((r.status, r.code().as_str()), (404, "sandbox_not_found"), "{key}: {r:?}");
    }
    // The API tokens are not preview tokens.
    let r = get(&addr, &format!("/preview/{sb}/8000/"), &[tok_header(&tok("b2", "globex"))]);
    assert_eq!(r.status, 401, "{r:?}");
}

/// Opens an upgraded connection through the proxy and returns it after the 101.
fn upgrade(addr: &str, target: &str, token: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let req = format!(
        "GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nX-Strata-Preview-Token: {token}\r\n\r\n"
    );
    s.write_all(req.as_bytes()).unwrap();
    // Read the head byte by byte so nothing after it is buffered away.
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            s.read(&mut b).unwrap(),
            1,
            "connection closed in the response head: {:?}",
            String::from_utf8_lossy(&head)
        );
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    s
}

/// Sends a masked WebSocket text frame and reads `len` echoed bytes.
fn round_trip(s: &mut TcpStream, msg: &str) -> Vec<u8> {
    let mask = [0x12u8, 0x34, 0x56, 0x78];
    let mut frame = vec![0x81, 0x80 | msg.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(msg.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    s.write_all(&frame).unwrap();
    let mut back = vec![0u8; frame.len()];
    s.read_exact(&mut back).unwrap();
    assert_eq!(back, frame, "the frame came back byte for byte");
    back[6..].iter().enumerate().map(|(i, b)| b ^ mask[i % 4]).collect()
}

#[test]
fn upgraded_connections_pass_through_and_keep_an_idle_sandbox_awake() {
    require_host!();
    let (d, addr) = daemon();
    d.import_busybox();
    // Stopped after 2 s without activity (`stop` needs no process checkpointing).
    let id = d.create(&["--on-idle", "stop", "--idle-timeout", "2s"]);
    let out =
        d.cli_stdin(&["exec", "-i", &id, "--", "sh", "-c", "cat > /ws.sh && chmod +x /ws.sh"], UPGRADE_ECHO.as_bytes());
    assert!(out.status.success(), "{}", common::stderr(&out));
    // Started by an exec that ends (a running API process would keep the sandbox awake by itself).
    d.cli_ok(&["exec", &id, "--", "sh", "-c", "nc -ll -p 9000 -e /ws.sh >/dev/null 2>&1 &"]);
    let p = preview(&d, &id, "9000", &[]);
    let t = token(&p);
    let mut ws = None;
    assert!(common::wait_until(10, || {
        let r = std::panic::catch_unwind(|| upgrade(&addr, &format!("/preview/{id}/9000/echo"), &t));
        ws = r.ok();
        ws.is_some()
    }));
    let mut ws = ws.unwrap();
    assert_eq!(round_trip(&mut ws, "hello through the proxy"), b"hello through the proxy");
    // Held open (and idle) for well past the idle timeout: the sandbox stays up.
    std::thread::sleep(Duration::from_secs(6));
    let sb = rt().block_on(d.client().get_sandbox(&id)).unwrap();
    assert_eq!(sb.state, SandboxState::Running, "an open preview connection keeps the sandbox awake\n{}", d.log());
    assert_eq!(round_trip(&mut ws, "still there"), b"still there");
    // Host-based upgrades work too.
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(format!("GET / HTTP/1.1\r\nHost: 9000-{id}.preview.localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nX-Strata-Preview-Token: {t}\r\n\r\n").as_bytes()).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let (status, _) = read_head(&mut r);
    assert_eq!(status, 101);
    s.write_all(b"raw bytes\n").unwrap();
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert_eq!(line, "raw bytes\n");
    drop((r, s));
    // Once closed, the idle policy applies again.
    drop(ws);
    assert!(
        common::wait_until(30, || rt().block_on(d.client().get_sandbox(&id)).unwrap().state == SandboxState::Stopped),
        "stopped once the connection closed\n{}",
        d.log()
    );
    let evs = rt().block_on(d.client().events(Some(&id), 0)).unwrap();
    assert!(evs.iter().any(|e| e.to == SandboxState::Stopped && e.reason == "idle_timeout"), "{evs:?}");
}

#[test]
fn a_preview_request_resumes_a_sandbox_in_standby() {
    require_criu!();
    let (d, addr) = daemon();
    d.import_busybox();
    let id = web_sandbox(&d, &[], 8000);
    d.cli_ok(&["exec", &id, "--", "sh", "-c", "echo state-before-standby > /www8000/state.txt"]);
    let t = token(&preview(&d, &id, "8000", &[]));
    // Served while running: the proxy remembers this admission (token, init)...
    let r = get(&addr, &format!("/preview/{id}/8000/state.txt"), &[tok_header(&t)]);
    assert_eq!((r.status, r.body.as_str()), (200, "state-before-standby\n"), "{r:?}");
    d.cli_ok(&["standby", &id]);
    assert_eq!(rt().block_on(d.client().get_sandbox(&id)).unwrap().state, SandboxState::Standby);
    // An unauthenticated request does not wake it.
    let r = get(&addr, &format!("/preview/{id}/8000/state.txt"), &[]);
    assert_eq!(r.status, 401);
    assert_eq!(
        rt().block_on(d.client().get_sandbox(&id)).unwrap().state,
        SandboxState::Standby,
        "a refused request leaves it in standby"
    );
    // ...which the standby made stale: this request resumes the sandbox.
    let r = get(&addr, &format!("/preview/{id}/8000/state.txt"), &[tok_header(&t)]);
    assert_eq!((r.status, r.body.as_str()), (200, "state-before-standby\n"), "{r:?}");
    assert_eq!(r.header("strata-resumed-from"), Some("standby"), "{r:?}");
    let sb = rt().block_on(d.client().get_sandbox(&id)).unwrap();
    assert_eq!(sb.state, SandboxState::Running);
    let evs = rt().block_on(d.client().events(Some(&id), 0)).unwrap();
    assert!(evs.iter().any(|e| e.from == Some(SandboxState::Standby) && e.reason == "resume_on_access"), "{evs:?}");
    // The same server (restored, not restarted) answers the next request.
    let r = get(&addr, &format!("/preview/{id}/8000/"), &[tok_header(&t)]);
    assert_eq!((r.status, r.body.as_str()), (200, "hello-preview\n"), "{r:?}");
}

/// A keep-alive HTTP/1.1 server for `nc -e`: answers every request on its
/// connection with `<shell pid>-<request number on this connection>`.
const KEEPALIVE: &str = "#!/bin/sh\nn=0\nwhile :; do\n  while :; do IFS= read -r line || exit 0; [ ${#line} -le 1 ] && break; done\n  n=$((n+1)); body=\"$$-$n\"\n  printf 'HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\n\\r\\n%s' ${#body} \"$body\"\ndone\n";

#[test]
fn keep_alive_upstream_connections_are_reused() {
    require_host!();
    let (d, addr) = daemon();
    d.import_busybox();
    let id = d.create(&[]);
    let out =
        d.cli_stdin(&["exec", "-i", &id, "--", "sh", "-c", "cat > /ka.sh && chmod +x /ka.sh"], KEEPALIVE.as_bytes());
    assert!(out.status.success(), "{}", common::stderr(&out));
    d.cli_ok(&["exec", &id, "--", "sh", "-c", "nc -ll -p 9100 -e /ka.sh >/dev/null 2>&1 &"]);
    let t = token(&preview(&d, &id, "9100", &[]));
    let mut first = None;
    assert!(
        common::wait_until(10, || {
            let r = get(&addr, &format!("/preview/{id}/9100/"), &[tok_header(&t)]);
            let ok = r.status == 200;
            first = Some(r);
            ok
        }),
        "{first:?}"
    );
    let first = first.unwrap().body;
    let (conn, n) = first.split_once('-').unwrap();
    assert_eq!(n, "1", "{first}");
    // Two more client connections: served on the same, pooled upstream connection.
    for want in ["2", "3"] {
        let r = get(&addr, &format!("/preview/{id}/9100/"), &[tok_header(&t)]);
        assert_eq!((r.status, r.body.clone()), (200, format!("{conn}-{want}")), "the upstream connection is reused");
    }
}

/// A keep-alive server on port 9100 in sandbox `id` (its ports relayed by
/// its pid 1) answers two requests through the preview on one pooled
/// upstream connection.
fn relayed_keep_alive_is_reused(d: &TestDaemon, addr: &str, id: &str, t: &str) {
    let out =
        d.cli_stdin(&["exec", "-i", id, "--", "sh", "-c", "cat > /ka.sh && chmod +x /ka.sh"], KEEPALIVE.as_bytes());
    assert!(out.status.success(), "{}", common::stderr(&out));
    d.cli_ok(&["exec", id, "--", "sh", "-c", "nc -ll -p 9100 -e /ka.sh >/dev/null 2>&1 &"]);
    let mut first = None;
    assert!(
        common::wait_until(30, || {
            let r = get(addr, &format!("/preview/{id}/9100/"), &[tok_header(t)]);
            let ok = r.status == 200;
            first = Some(r);
            ok
        }),
        "{first:?}"
    );
    let first = first.unwrap().body;
    let (conn, _) = first.split_once('-').unwrap();
    let r = get(addr, &format!("/preview/{id}/9100/"), &[tok_header(t)]);
    assert!(r.body.starts_with(&format!("{conn}-")) && r.body != first, "the relayed connection is reused: {r:?}");
}

#[test]
fn previews_reach_servers_inside_a_microvm_guest_through_its_pid_1() {
    require_microvm!();
    let (d, addr) = daemon();
    d.import_busybox();
    // No network at all: the guest's loopback is reached through its pid 1, not a link.
    let id = web_sandbox(&d, &["--isolation", "microvm", "--network", "none"], 8000);
    let t = token(&preview(&d, &id, "all", &[]));
    let path = format!("/preview/{id}/8000/");
    let r = get(&addr, &path, &[tok_header(&t)]);
    assert_eq!((r.status, r.body.as_str()), (200, "hello-preview\n"), "{r:?}");
    let body = "a body that crosses the line to the guest and back\n".repeat(2000);
    let r = http(&addr, "POST", &format!("{path}cgi-bin/echo?vm=1"), &[tok_header(&t)], body.as_bytes());
    assert_eq!(r.status, 200, "{r:?}");
    let (head, echoed) = r.body.split_once('\n').unwrap();
    assert!(head.starts_with("method=POST query=vm=1 "), "{head}");
    assert_eq!(echoed, body, "100 KB through the relay unchanged");

    // Nothing on a port: 502 naming it, as on the other tiers.
    let r = get(&addr, &format!("/preview/{id}/8001/"), &[tok_header(&t)]);
    assert_eq!((r.status, r.code().as_str()), (502, "upstream_unavailable"), "{r:?}");
    assert!(r.json()["message"].as_str().unwrap().contains("8001"), "{r:?}");

    // Keep-alive: the relayed upstream connection is pooled and reused.
    relayed_keep_alive_is_reused(&d, &addr, &id, &t);

    // An upgraded connection: bytes both ways, as long as it stays open.
    let out =
        d.cli_stdin(&["exec", "-i", &id, "--", "sh", "-c", "cat > /ws.sh && chmod +x /ws.sh"], UPGRADE_ECHO.as_bytes());
    assert!(out.status.success(), "{}", common::stderr(&out));
    d.cli_ok(&["exec", &id, "--", "sh", "-c", "nc -ll -p 9000 -e /ws.sh >/dev/null 2>&1 &"]);
    let mut ws = None;
    assert!(common::wait_until(30, || {
        ws = std::panic::catch_unwind(|| upgrade(&addr, &format!("/preview/{id}/9000/echo"), &t)).ok();
        ws.is_some()
    }));
    let mut ws = ws.unwrap();
    assert_eq!(round_trip(&mut ws, "into the guest and back"), b"into the guest and back");
    drop(ws);

    // Standby cuts the relays (a VM is saved with no stream open) and saves
    // the VM; a request resumes it, and the same server answers.
    d.cli_ok(&["exec", &id, "--", "sh", "-c", "echo saved-with-the-vm > /www8000/state.txt"]);
    d.cli_ok(&["standby", &id]);
    let r = get(&addr, &format!("{path}state.txt"), &[tok_header(&t)]);
    assert_eq!((r.status, r.body.as_str()), (200, "saved-with-the-vm\n"), "{r:?}");
    assert_eq!(r.header("strata-resumed-from"), Some("standby"), "{r:?}");
    let r = get(&addr, &format!("/preview/{id}/9100/"), &[tok_header(&t)]);
    assert_eq!(r.status, 200, "a new relay after the resume: {r:?}");
    let evs = rt().block_on(d.client().events(Some(&id), 0)).unwrap();
    assert!(evs.iter().any(|e| e.from == Some(SandboxState::Standby) && e.reason == "resume_on_access"), "{evs:?}");
    d.cli_ok(&["rm", "-f", &id]);
}

#[test]
fn previews_reach_servers_inside_a_gvisor_sandbox_through_its_pid_1() {
    require_gvisor!();
    let (d, addr) = daemon();
    d.import_busybox();
    // The sentry's network stack is its own: its loopback is reached through pid 1.
    let id = web_sandbox(&d, &["--isolation", "gvisor"], 8000);
    let t = token(&preview(&d, &id, "all", &[]));
    let path = format!("/preview/{id}/8000/");
    let r = get(&addr, &path, &[tok_header(&t)]);
    assert_eq!((r.status, r.body.as_str()), (200, "hello-preview\n"), "{r:?}");
    let r = http(&addr, "POST", &format!("{path}cgi-bin/echo"), &[tok_header(&t)], b"through the sentry");
    assert!(r.status == 200 && r.body.ends_with("\nthrough the sentry"), "{r:?}");
    let r = get(&addr, &format!("/preview/{id}/8001/"), &[tok_header(&t)]);
    assert_eq!((r.status, r.code().as_str()), (502, "upstream_unavailable"), "{r:?}");

    // A pooled keep-alive connection is open when the sandbox goes to standby:
    // pid 1 ends it first (a checkpoint refuses open host sockets), and a
    // request resumes the sandbox and is served by the same server.
    relayed_keep_alive_is_reused(&d, &addr, &id, &t);
    d.cli_ok(&["exec", &id, "--", "sh", "-c", "echo saved > /www8000/state.txt"]);
    d.cli_ok(&["standby", &id]);
    // (busybox `nc -ll`, whose connection the standby ended, does not come back
    // from runsc's restore; httpd, which had none open, does.)
    let r = get(&addr, &format!("{path}state.txt"), &[tok_header(&t)]);
    assert_eq!((r.status, r.body.as_str()), (200, "saved\n"), "{r:?}");
    assert_eq!(r.header("strata-resumed-from"), Some("standby"), "{r:?}");
    let r = get(&addr, &path, &[tok_header(&t)]);
    assert_eq!((r.status, r.body.as_str()), (200, "hello-preview\n"), "a new relay after the resume: {r:?}");
    d.cli_ok(&["rm", "-f", &id]);
}
