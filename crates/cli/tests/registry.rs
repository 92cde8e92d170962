//! Registry pull (`strata image pull`) against a private registry on loopback:
//! Debian's `docker-registry`, fed with `skopeo` from OCI layouts made by
//! strata's own writer. No network beyond 127.0.0.1.

mod common;

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::TestDaemon;
use strata_api::{ErrorCode, PullImageRequest};

const REGISTRY_BINS: &[&str] = &["/usr/bin/docker-registry", "/usr/bin/registry"];

/// The first of `candidates` that exists, else `name` found in PATH.
fn find_tool(name: &str, candidates: &[&str]) -> Option<PathBuf> {
    if let Some(p) = candidates.iter().map(PathBuf::from).find(|p| p.is_file()) {
        return Some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// The registry and skopeo binaries, or why this host cannot run the test.
fn tools() -> Result<(PathBuf, PathBuf), String> {
    let registry = find_tool("docker-registry", REGISTRY_BINS)
        .ok_or("docker-registry not installed (Debian package docker-registry; scripts/setup-host.sh installs it)")?;
    let skopeo = find_tool("skopeo", &["/usr/bin/skopeo"])
        .ok_or("skopeo not installed (Debian package skopeo; scripts/setup-host.sh installs it)")?;
    Ok((registry, skopeo))
}

/// Like `require_host!`, for the registry tools: evaluates to them, or skips
/// the test (printing `skipped: <reason>`); in CI a missing tool fails it.
macro_rules! require_tools {
    () => {
        match tools() {
            Ok(t) => t,
            Err(reason) => {
                if std::env::var("CI").is_ok_and(|v| v == "true") {
                    panic!("CI must be able to run this test, but: {reason}");
                }
                println!("skipped: {reason}");
                return;
            }
        }
    };
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A `docker-registry` on a free loopback port with its storage in a temp
/// dir; killed on drop.
struct Registry {
    child: Child,
    addr: String,
    dir: tempfile::TempDir,
}

impl Registry {
    /// Starts a registry; `extra` is appended to its config (e.g. an `auth:` section).
    fn start(bin: &Path, extra: &str) -> Registry {
        let dir = tempfile::Builder::new().prefix("strata-registry-").tempdir_in("/var/tmp").unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n  secret: strata-test\n{extra}",
            dir.path().join("data").display()
        );
        let config_path = common::write_file(dir.path(), "config.yml", config.as_bytes());
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new(bin)
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn docker-registry");
        let mut r = Registry { child, addr, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(&r.addr).is_err() {
            if let Ok(Some(status)) = r.child.try_wait() {
                panic!("docker-registry exited ({status}); log:\n{}", r.log());
            }
            assert!(Instant::now() < deadline, "docker-registry did not come up; log:\n{}", r.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        r
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `skopeo copy` of an OCI layout (its image `latest`) to `dest` (`host:port/repo:tag`) over plain HTTP.
fn push(skopeo: &Path, layout: &Path, dest: &str, all: bool) {
    let mut cmd = Command::new(skopeo);
    cmd.args(["--insecure-policy", "copy", "--dest-tls-verify=false"]);
    if all {
        cmd.arg("--all");
    }
    let out = cmd
        .arg(format!("oci:{}:latest", layout.display()))
        .arg(format!("docker://{dest}"))
        .output()
        .expect("run skopeo");
    assert!(out.status.success(), "skopeo copy to {dest} failed:\n{}", String::from_utf8_lossy(&out.stderr));
}

fn pull_json(d: &TestDaemon, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["image", "pull"];
    all.extend_from_slice(args);
    all.push("--json");
    serde_json::from_str(&d.cli_ok(&all)).unwrap()
}

/// The API error of a failed pull.
fn pull_err(d: &TestDaemon, reference: &str, insecure: bool) -> (u16, ErrorCode, String) {
    let req = PullImageRequest { reference: reference.into(), name: Some("failed".into()), insecure };
    match common::rt().block_on(d.client().pull_image(&req)) {
        Err(strata_client::ClientError::Api { status, body }) => (status, body.code, body.message),
        other => panic!("pull of {reference} should fail with an API error: {other:?}"),
    }
}

fn sha256_file(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().split_whitespace().next().unwrap().to_string()
}

/// Writes `bytes` as a blob of the layout at `layout`; returns its descriptor.
fn add_blob(layout: &Path, media_type: &str, bytes: &[u8]) -> serde_json::Value {
    let tmp = common::write_file(layout, "blob.tmp", bytes);
    let hex = sha256_file(&tmp);
    std::fs::rename(&tmp, layout.join("blobs/sha256").join(&hex)).unwrap();
    serde_json::json!({"mediaType": media_type, "digest": format!("sha256:{hex}"), "size": bytes.len()})
}

fn read_blob(layout: &Path, digest: &str) -> serde_json::Value {
    let hex = digest.trim_start_matches("sha256:");
    serde_json::from_slice(&std::fs::read(layout.join("blobs/sha256").join(hex)).unwrap()).unwrap()
}

/// Turns a single-image layout into one whose `latest` is an image index
/// listing a foreign-architecture image first (config env GREETING=foreign)
/// and the original (host architecture) second.
fn make_multi_arch(layout: &Path) {
    let index_path = layout.join("index.json");
    let mut index: serde_json::Value = serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    let host_desc = index["manifests"][0].clone();
    let host_arch = host_desc["platform"]["architecture"].as_str().unwrap().to_string();
    let foreign_arch = if host_arch == "s390x" { "ppc64le" } else { "s390x" };
    let mut manifest = read_blob(layout, host_desc["digest"].as_str().unwrap());
    let mut config = read_blob(layout, manifest["config"]["digest"].as_str().unwrap());
    config["architecture"] = foreign_arch.into();
    config["config"]["Env"] = serde_json::json!(["PATH=/bin:/sbin", "GREETING=foreign"]);
    manifest["config"] =
        add_blob(layout, "application/vnd.oci.image.config.v1+json", &serde_json::to_vec(&config).unwrap());
    let mut foreign_desc =
        add_blob(layout, "application/vnd.oci.image.manifest.v1+json", &serde_json::to_vec(&manifest).unwrap());
    foreign_desc["platform"] = serde_json::json!({"architecture": foreign_arch, "os": "linux"});
    let mut host_entry = host_desc.clone();
    host_entry.as_object_mut().unwrap().remove("annotations");
    let nested = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [foreign_desc, host_entry],
    });
    let mut nested_desc =
        add_blob(layout, "application/vnd.oci.image.index.v1+json", &serde_json::to_vec(&nested).unwrap());
    nested_desc["annotations"] = serde_json::json!({"org.opencontainers.image.ref.name": "latest"});
    index["manifests"] = serde_json::json!([nested_desc]);
    let mut f = std::fs::File::create(&index_path).unwrap();
    f.write_all(&serde_json::to_vec(&index).unwrap()).unwrap();
}

#[test]
fn pull_from_a_loopback_registry_runs_and_a_repull_stores_nothing() {
    require_host!();
    let (registry_bin, skopeo) = require_tools!();
    let reg = Registry::start(&registry_bin, "");
    let work = tempfile::tempdir().unwrap();
    let layout = common::busybox_layout(work.path(), "hi");
    let reference = format!("{}/busybox:latest", reg.addr);
    push(&skopeo, &layout, &reference, false);

    let d = TestDaemon::start();
    let r = pull_json(&d, &[&reference, "--insecure", "--name", "bb"]);
    assert_eq!(r["image"]["source_kind"], "registry", "{r}");
    assert_eq!(r["image"]["name"], "bb");
    let source = r["image"]["source"].as_str().unwrap();
    assert!(source.starts_with(&format!("{reference}@sha256:")), "source pins the manifest digest: {source}");
    assert_eq!(r["layers_new"], 1);
    assert!(r["bytes_stored"].as_u64().unwrap() > 1_000_000, "{r}");
    assert_eq!(r["image"]["config"]["env"][1], "GREETING=hi");
    let image_id = r["image"]["id"].clone();

    // It runs.
    let id = d.cli_ok(&["create", "bb"]).trim().to_string();
    assert_eq!(d.cli_ok(&["exec", &id, "--", "echo", "ok"]), "ok\n");
    assert_eq!(d.cli_ok(&["exec", &id, "--", "sh", "-c", "echo $GREETING"]), "hi\n");

    // Pulling again (same name: an update) stores nothing new.
    let again = pull_json(&d, &[&reference, "--insecure", "--name", "bb"]);
    assert_eq!(again["bytes_stored"], 0, "{again}");
    assert_eq!(again["layers_new"], 0);
    assert_eq!(again["layers_reused"], 1);
    assert_eq!(again["image"]["id"], image_id);
    // The default name is the reference.
    let unnamed = pull_json(&d, &[&reference, "--insecure"]);
    assert_eq!(unnamed["image"]["name"], reference.as_str());
    assert_eq!(unnamed["bytes_stored"], 0);
    let ls: Vec<serde_json::Value> = serde_json::from_str(&d.cli_ok(&["image", "ls", "--json"])).unwrap();
    assert_eq!(ls.len(), 2, "{ls:?}");

    // An unknown tag or repository: 404 image_not_found with the registry's word.
    let out = d.cli(&["image", "pull", &format!("{}/busybox:nope", reg.addr), "--insecure", "--name", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    let err = common::stderr(&out);
    assert!(err.contains("image_not_found") && err.contains("MANIFEST_UNKNOWN") && err.contains(&reg.addr), "{err}");
    let (status, code, msg) = pull_err(&d, &format!("{}/nosuchrepo:latest", reg.addr), true);
    assert_eq!((status, code), (404, ErrorCode::ImageNotFound), "{msg}");

    // Bad references: 400 bad_request, before any network access.
    for bad in
        [format!("{}/BusyBox:latest", reg.addr), format!("http://{}/busybox", reg.addr), "a b".into(), String::new()]
    {
        let (status, code, msg) = pull_err(&d, &bad, true);
        assert_eq!((status, code), (400, ErrorCode::BadRequest), "{bad:?}: {msg}");
    }
    // HTTPS against a plain-HTTP registry: the message says what to do.
    let (status, code, msg) = pull_err(&d, &reference, false);
    assert_eq!((status, code), (502, ErrorCode::RegistryError), "{msg}");
    assert!(msg.contains(&reg.addr) && msg.contains("--insecure"), "{msg}");
    // Nothing listening: names the registry.
    let dead = format!("127.0.0.1:{}", free_port());
    let (status, _, msg) = pull_err(&d, &format!("{dead}/busybox:latest"), true);
    assert_eq!(status, 502, "{msg}");
    assert!(msg.contains(&format!("registry {dead} is unreachable")), "{msg}");

    // A locally imported image's name is not taken over.
    d.import_busybox();
    let req = PullImageRequest { reference: reference.clone(), name: Some("busybox".into()), insecure: true };
    match common::rt().block_on(d.client().pull_image(&req)) {
        Err(strata_client::ClientError::Api { status: 409, body }) => assert_eq!(body.code, ErrorCode::NameConflict),
        other => panic!("expected 409: {other:?}"),
    }
    assert!(common::rt().block_on(d.client().get_image("failed")).is_err(), "failed pulls register nothing");
    assert_eq!(std::fs::read_dir(d.state("layers/staging")).unwrap().count(), 0, "no download left in staging");
}

#[test]
fn pull_resolves_an_index_to_the_host_platform_and_streams_progress() {
    require_host!();
    let (registry_bin, skopeo) = require_tools!();
    let reg = Registry::start(&registry_bin, "");
    let work = tempfile::tempdir().unwrap();
    let layout = common::busybox_layout(work.path(), "host");
    make_multi_arch(&layout);
    let reference = format!("{}/multi:latest", reg.addr);
    push(&skopeo, &layout, &reference, true);

    let d = TestDaemon::start();
    let req = PullImageRequest { reference: reference.clone(), name: Some("multi".into()), insecure: true };
    let rt = common::rt();
    let mut events = rt.block_on(d.client().pull_image_stream(&req)).unwrap();
    let mut phases = Vec::new();
    let report = loop {
        match rt.block_on(events.next()).unwrap().expect("stream ends with done or failed") {
            strata_api::ImportEvent::Progress { phase, .. } => phases.push(phase),
            strata_api::ImportEvent::Done { report } => break *report,
            strata_api::ImportEvent::Failed { error } => panic!("pull failed: {error:?}"),
        }
    };
    assert!(
        report.image.config.env.contains(&"GREETING=host".to_string()),
        "picked the host's image: {:?}",
        report.image.config
    );
    assert!(phases.iter().any(|p| p.starts_with("download layer 1/1")), "{phases:?}");
    assert!(phases.iter().any(|p| p.starts_with("unpack layer 1/1")), "{phases:?}");
    let id = d.cli_ok(&["create", "multi"]).trim().to_string();
    assert_eq!(d.cli_ok(&["exec", &id, "--", "echo", "ok"]), "ok\n");
}

#[test]
fn a_registry_demanding_credentials_fails_naming_it() {
    require_host!();
    let (registry_bin, _) = require_tools!();
    // "silly" auth: every request without an Authorization header gets a 401 bearer challenge.
    let realm = format!("http://127.0.0.1:{}/token", free_port());
    let reg =
        Registry::start(&registry_bin, &format!("auth:\n  silly:\n    realm: {realm}\n    service: strata-test\n"));
    let d = TestDaemon::start();
    let out = d.cli(&["image", "pull", &format!("{}/busybox:latest", reg.addr), "--insecure", "--name", "x"]);
    assert_eq!(out.status.code(), Some(1));
    let err = common::stderr(&out);
    assert!(err.contains(&format!("registry {} requires authentication", reg.addr)), "{err}");
    assert!(err.contains("unsupported"), "{err}");
}
