//! Defaults that bound, limit validation, admission control and per-tenant
//! quotas (docs/security.md, "Defaults, admission and quotas"): a sandbox made
//! without limits runs with the daemon's defaults (cgroup and /tmp say so) on
//! every creation path; limits outside sane bounds are a 400 that leaves
//! nothing behind; a new sandbox that does not fit the host's free disk or
//! memory is refused (507 / 503); tenants are held to their quotas (429) also
//! under concurrent creates, forks per minute included; the operator sets
//! per-tenant overrides through the API and the CLI and is itself unlimited.

mod common;

use common::{rt, stderr, TestDaemon};
use strata_api::{CreateSandboxRequest, FanoutPlan, FanoutRequest, ForkRequest, Lifecycle, ResourceLimits};
use strata_client::{Client, ClientError, Endpoint, Method};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn json(d: &TestDaemon, args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&d.cli_ok(args)).unwrap()
}

fn inspect(d: &TestDaemon, id: &str) -> serde_json::Value {
    json(d, &["inspect", id, "--json"])
}

fn ps(d: &TestDaemon) -> Vec<serde_json::Value> {
    serde_json::from_str(&d.cli_ok(&["ps", "--json"])).unwrap()
}

/// A file of a sandbox's cgroup (v1 `<controller>/strata/<id>` or v2 `strata/<id>`).
fn cgroup(id: &str, v1: (&str, &str), v2: &str) -> String {
    let candidates =
        [format!("/sys/fs/cgroup/{}/strata/{id}/{}", v1.0, v1.1), format!("/sys/fs/cgroup/strata/{id}/{v2}")];
    candidates
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_else(|| panic!("no cgroup file among {candidates:?}"))
        .trim()
        .to_string()
}

fn memory_limit(id: &str) -> String {
    cgroup(id, ("memory", "memory.limit_in_bytes"), "memory.max")
}

fn pids_max(id: &str) -> String {
    cgroup(id, ("pids", "pids.max"), "pids.max")
}

/// CPU quota in microseconds per 100 ms period ("max" without one).
fn cpu_quota(id: &str) -> String {
    let v = cgroup(id, ("cpu", "cpu.cfs_quota_us"), "cpu.max");
    match v.split_whitespace().next() {
        Some("-1") | Some("max") => "max".into(),
        Some(q) => q.to_string(),
        None => v,
    }
}

/// Size of /tmp inside the sandbox in KiB (`df -k`).
fn tmp_kib(d: &TestDaemon, id: &str) -> u64 {
    let df = d.cli_ok(&["exec", id, "--", "sh", "-c", "df -k /tmp | tail -1"]);
    df.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("df: {df}"))
}

/// Size in KiB of the filesystem holding the sandbox's root.
fn root_kib(d: &TestDaemon, id: &str) -> u64 {
    let df = d.cli_ok(&["exec", id, "--", "sh", "-c", "df -k / | tail -1"]);
    df.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("df: {df}"))
}

fn host_cpus() -> f64 {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64
}

fn meminfo(key: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let line = text.lines().find(|l| l.starts_with(&format!("{key}:"))).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// (bytes available to unprivileged writers, total bytes) of the filesystem holding `path`.
fn statvfs(path: &std::path::Path) -> (u64, u64) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statvfs writes into a zeroed struct we own.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `s` a valid out-pointer.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0);
    (s.f_bavail as u64 * s.f_frsize as u64, s.f_blocks as u64 * s.f_frsize as u64)
}

/// Status, wire code and message of an API error.
fn api_err<T: std::fmt::Debug>(r: Result<T, ClientError>) -> (u16, String, String) {
    match r {
        Err(ClientError::Api { status, body }) => {
            (status, serde_json::to_value(body.code).unwrap().as_str().unwrap_or_default().to_string(), body.message)
        }
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn fork_req(source: &str, count: u32, limits: Option<ResourceLimits>) -> ForkRequest {
    ForkRequest {
        source: source.into(),
        count,
        name_prefix: None,
        lifecycle: Lifecycle::Persistent,
        ttl: None,
        limits,
        network: None,
        processes: None,
        isolation: None,
    }
}

fn limits(memory: Option<u64>, disk: Option<u64>) -> ResourceLimits {
    ResourceLimits { memory_bytes: memory, disk_bytes: disk, ..Default::default() }
}

fn req(limits: ResourceLimits) -> CreateSandboxRequest {
    CreateSandboxRequest { source: "busybox".into(), lifecycle: Lifecycle::Persistent, limits, ..Default::default() }
}

/// A raw JSON call (routes the typed client may not know): status and body.
fn call(c: &Client, method: Method, path: &str, body: Option<serde_json::Value>) -> (u16, serde_json::Value) {
    use http_body_util::BodyExt;
    let bytes = body.map(|b| serde_json::to_vec(&b).unwrap()).unwrap_or_default();
    rt().block_on(async {
        match c.send(method, path, bytes.into(), "application/json").await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let body = resp.into_body().collect().await.unwrap().to_bytes();
                (status, serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null))
            }
            Err(ClientError::Api { status, body }) => (status, serde_json::to_value(body).unwrap()),
            Err(e) => panic!("{path}: {e}"),
        }
    })
}

/// Ids of sandboxes the daemon ever recorded (every creation records an event).
fn sandboxes_ever_recorded(d: &TestDaemon) -> Vec<String> {
    let out = d.cli_ok(&["events", "--json"]);
    let events: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let mut ids: Vec<String> = events.iter().filter_map(|e| e["sandbox_id"].as_str().map(str::to_string)).collect();
    ids.dedup();
    ids
}

#[test]
fn a_sandbox_without_limits_runs_with_the_daemon_defaults_on_every_path() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let cpus = host_cpus().min(2.0);
    let check_defaults = |id: &str, what: &str| {
        let l = &inspect(&d, id)["limits"];
        assert_eq!(l["memory_bytes"], 2 * GIB, "{what}: {l}");
        assert_eq!(l["pids"], 1024, "{what}: {l}");
        assert_eq!(l["cpus"].as_f64(), Some(cpus), "{what}: {l}");
        assert_eq!(l["disk_bytes"], 10 * GIB, "{what}: {l}");
        assert_eq!(memory_limit(id), (2 * GIB).to_string(), "{what}: the cgroup's memory limit");
        assert_eq!(pids_max(id), "1024", "{what}: the cgroup's pids.max");
        assert_eq!(cpu_quota(id), ((cpus * 100_000.0) as u64).to_string(), "{what}: the cgroup's CPU quota");
        assert_eq!(tmp_kib(&d, id), root_kib(&d, id), "{what}: /tmp is part of the root filesystem (on its disk)");
    };
    // create.
    let id = d.create(&["--name", "plain"]);
    check_defaults(&id, "create");
    let shown = d.cli_ok(&["inspect", &id]);
    assert!(
        shown.contains("memory=2.0 GiB") && shown.contains("pids=1024") && shown.contains("disk=10.0 GiB"),
        "inspect shows the limits it runs with:\n{shown}"
    );
    // run: the one-shot path (a scratch /tmp is capped by the default memory limit).
    let df = d.cli_ok(&["run", "--rm", "--tmp", "tmpfs", "busybox", "--", "sh", "-c", "df -k /tmp | tail -1"]);
    assert_eq!(df.split_whitespace().nth(1), Some((2 * GIB / 1024).to_string().as_str()), "run: {df}");
    // A template sandbox.
    d.cli_ok(&["checkpoint", "plain", "--name", "c0"]);
    d.cli_ok(&["template", "create", "tpl", "--from", "c0"]);
    let from_tpl = d.cli_ok(&["create", "tpl"]).trim().to_string();
    check_defaults(&from_tpl, "template");
    // A pipeline stage.
    let spec = common::write_file(d.dir.path(), "p.toml", b"name = \"limits\"\n\n[[stage]]\nname = \"one\"\nsource = \"image:busybox\"\nlifecycle = \"persistent\"\ncommands = [\"true\"]\n");
    let out = d.cli_ok(&["pipeline", "run", spec.to_str().unwrap(), "--json"]);
    let last: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let stage_sb = last["run"]["stages"][0]["sandboxes"][0].as_str().unwrap().to_string();
    assert_eq!(inspect(&d, &stage_sb)["limits"]["memory_bytes"], 2 * GIB, "pipeline stage");
    assert_eq!(inspect(&d, &stage_sb)["limits"]["pids"], 1024, "pipeline stage");
    // Fork children inherit their source's limits (request fields override them one by one).
    let src = d.create(&["--name", "src", "--memory", "96m", "--pids", "64", "--cpus", "0.5"]);
    d.cli_ok(&["checkpoint", &src, "--name", "c1"]);
    let child = d.cli_ok(&["fork", "c1", "--count", "1"]).trim().to_string();
    let l = &inspect(&d, &child)["limits"];
    assert_eq!(
        (l["memory_bytes"].as_u64(), l["pids"].as_u64(), l["cpus"].as_f64(), l["disk_bytes"].as_u64()),
        (Some(96 * MIB), Some(64), Some(0.5), Some(10 * GIB)),
        "fork child: {l}"
    );
    assert_eq!(
        (memory_limit(&child), pids_max(&child), cpu_quota(&child)),
        ((96 * MIB).to_string(), "64".to_string(), "50000".to_string())
    );
    let c = d.client();
    let r = rt()
        .block_on(c.fork(&fork_req("c1", 1, Some(ResourceLimits { pids: Some(128), ..Default::default() }))))
        .unwrap();
    let l = &inspect(&d, &r.sandboxes[0])["limits"];
    assert_eq!(
        (l["memory_bytes"].as_u64(), l["pids"].as_u64()),
        (Some(96 * MIB), Some(128)),
        "fork with one field given: {l}"
    );
    // Fan-out children too (the winner is kept).
    let f = rt()
        .block_on(c.fanout(&FanoutRequest {
            source: "c1".into(),
            plan: FanoutPlan { run: Some("true".into()), count: Some(1), ..Default::default() },
            ..Default::default()
        }))
        .unwrap();
    let winner = f.winner_sandbox.expect("attempt 1 passed");
    assert_eq!(inspect(&d, &winner)["limits"]["memory_bytes"], 96 * MIB, "fan-out child");
    // The daemon's info names its defaults.
    let (_, info) = call(&c, Method::GET, "/v1/info", None);
    assert_eq!(info["default_limits"]["memory_bytes"], 2 * GIB, "{info}");
    assert_eq!(info["default_limits"]["pids"], 1024, "{info}");
}

#[test]
fn daemon_defaults_are_overridable_and_none_means_no_limit_explicitly() {
    require_host!();
    let d = TestDaemon::start_with_env(&[
        ("STRATA_DEFAULT_MEMORY", "96m"),
        ("STRATA_DEFAULT_PIDS", "none"),
        ("STRATA_DEFAULT_CPUS", "0.5"),
        ("STRATA_DEFAULT_DISK", "64m"),
    ]);
    d.import_busybox();
    let id = d.create(&[]);
    let l = &inspect(&d, &id)["limits"];
    assert_eq!(l["memory_bytes"], 96 * MIB, "{l}");
    assert!(l["pids"].is_null(), "--default-pids none: no pids limit, recorded as none: {l}");
    assert_eq!(l["cpus"].as_f64(), Some(0.5), "{l}");
    assert_eq!(l["disk_bytes"], 64 * MIB, "{l}");
    assert_eq!(memory_limit(&id), (96 * MIB).to_string());
    assert_eq!(pids_max(&id), "max");
    assert_eq!(cpu_quota(&id), "50000");
    assert_eq!(tmp_kib(&d, &id), root_kib(&d, &id), "/tmp on the disk by default");
    let scratch = d.create(&["--tmp", "tmpfs"]);
    assert_eq!(tmp_kib(&d, &scratch), 96 * 1024, "a scratch /tmp is capped by the default memory");
    assert!(d.cli_ok(&["inspect", &id]).contains("pids=none"));
    // Explicit values still win over the defaults.
    let own = d.create(&["--memory", "128m", "--pids", "100"]);
    assert_eq!((memory_limit(&own), pids_max(&own)), ((128 * MIB).to_string(), "100".to_string()));
}

#[test]
fn limits_outside_sane_bounds_are_400_before_anything_exists() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let c = d.client();
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max").unwrap().trim().parse().unwrap();
    let mem_total = meminfo("MemTotal");
    let (_, fs_size) = statvfs(&d.state_dir);
    let cases: Vec<(&str, ResourceLimits, &[&str])> = vec![
        (
            "memory_bytes=1",
            ResourceLimits { memory_bytes: Some(1), ..Default::default() },
            &["limits.memory_bytes", "16.0 MiB"],
        ),
        (
            "memory over the host",
            ResourceLimits { memory_bytes: Some(mem_total + GIB), ..Default::default() },
            &["limits.memory_bytes", "MemTotal"],
        ),
        ("pids=1", ResourceLimits { pids: Some(1), ..Default::default() }, &["limits.pids", "16"]),
        (
            "pids over pid_max",
            ResourceLimits { pids: Some(pid_max + 1), ..Default::default() },
            &["limits.pids", "pid_max"],
        ),
        ("cpus=0", ResourceLimits { cpus: Some(0.0), ..Default::default() }, &["limits.cpus"]),
        ("cpus=0.001", ResourceLimits { cpus: Some(0.001), ..Default::default() }, &["limits.cpus", "0.01"]),
        (
            "cpus over the host",
            ResourceLimits { cpus: Some(host_cpus() + 1.0), ..Default::default() },
            &["limits.cpus", "CPU"],
        ),
        (
            "a 64 TiB disk",
            ResourceLimits { disk_bytes: Some(64 << 40), ..Default::default() },
            &["limits.disk_bytes", "64.0 TiB", "filesystem"],
        ),
        (
            "a disk larger than the filesystem",
            ResourceLimits { disk_bytes: Some(fs_size + GIB), ..Default::default() },
            &["limits.disk_bytes", "filesystem"],
        ),
        (
            "a 1 MiB disk",
            ResourceLimits { disk_bytes: Some(MIB), ..Default::default() },
            &["limits.disk_bytes", "16.0 MiB"],
        ),
    ];
    for (what, l, words) in cases {
        let (status, code, msg) = api_err(rt().block_on(c.create_sandbox(&req(l))));
        assert_eq!((status, code.as_str()), (400, "bad_request"), "{what}: {msg}");
        for w in words {
            assert!(msg.contains(w), "{what}: the message names {w:?}: {msg}");
        }
    }
    // The CLI says the same.
    let out = d.cli(&["create", "busybox", "--memory", "1"]);
    assert!(!out.status.success() && stderr(&out).contains("limits.memory_bytes"), "{}", stderr(&out));
    // Nothing was created: no sandbox, no record in `error`, no event, no directory, no disk image.
    assert!(ps(&d).is_empty(), "{:?}", ps(&d));
    assert!(
        sandboxes_ever_recorded(&d).is_empty(),
        "no sandbox record was ever made: {:?}",
        sandboxes_ever_recorded(&d)
    );
    let left: Vec<_> = std::fs::read_dir(d.state("sandboxes"))
        .map(|r| r.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "sandbox directories left: {left:?}");
    let templates: Vec<String> = std::fs::read_dir(d.state("disk-pool"))
        .map(|r| r.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(
        !templates.iter().any(|t| t.contains(&(64u64 << 40).to_string())),
        "no 64 TiB disk template: {templates:?}"
    );
}

#[test]
fn a_new_sandbox_that_fails_to_start_is_rolled_back_completely() {
    require_host!();
    let d = TestDaemon::start();
    // An image whose /run is a file: its sandboxes cannot start (strata never mounts elsewhere).
    let root = d.dir.path().join("norun");
    let cp = std::process::Command::new("cp")
        .arg("-a")
        .arg(common::images_dir().join("busybox-rootfs"))
        .arg(&root)
        .status()
        .unwrap();
    assert!(cp.success());
    let _ = std::fs::remove_dir_all(root.join("run"));
    std::fs::write(root.join("run"), b"not a directory").unwrap();
    d.cli_ok(&["image", "import", root.to_str().unwrap(), "--name", "norun"]);
    let out = d.cli(&["create", "norun", "--name", "doomed"]);
    assert!(!out.status.success(), "the start must fail");
    // A persistent sandbox whose creation failed leaves nothing: no record in `error`,
    // no directory, no disk; the event log tells what happened.
    assert!(ps(&d).is_empty(), "no sandbox left behind: {:?}", ps(&d));
    let ids = sandboxes_ever_recorded(&d);
    assert_eq!(ids.len(), 1, "{ids:?}");
    let events = d.cli_ok(&["events", &ids[0], "--json"]);
    assert!(events.contains("\"to\":\"error\"") && events.contains("\"to\":\"destroyed\""), "{events}");
    assert!(
        common::wait_until(10, || !d.state(&format!("sandboxes/{}", ids[0])).exists()),
        "its directory and disk are removed"
    );
    assert!(!std::fs::read_to_string("/proc/self/mountinfo").unwrap().contains(&ids[0]), "its disk is unmounted");
    // The name is free again: a second try fails the same way, not with a name conflict.
    let again = d.cli(&["create", "norun", "--name", "doomed"]);
    assert!(
        !again.status.success()
            && !stderr(&again).contains("name_conflict")
            && stderr(&again).contains("nothing was kept"),
        "{}",
        stderr(&again)
    );
}

#[test]
fn admission_refuses_a_disk_larger_than_the_free_space() {
    require_host!();
    let (avail, size) = statvfs(std::path::Path::new("/var/tmp"));
    // Larger than what is free, smaller than the filesystem (so not a validation error).
    // Where the filesystem is nearly empty, reserve all of its free space instead.
    let want = (avail / GIB + 16) * GIB;
    let reserve = avail.to_string();
    let env: Vec<(&str, &str)> = if want < size { vec![] } else { vec![("STRATA_DISK_RESERVE", reserve.as_str())] };
    let want = if want < size { want } else { 4 * GIB };
    let d = TestDaemon::start_with_env(&env);
    d.import_busybox();
    let (status, code, msg) = api_err(rt().block_on(d.client().create_sandbox(&req(limits(None, Some(want))))));
    assert_eq!((status, code.as_str()), (507, "insufficient_storage"), "{msg}");
    assert!(
        msg.contains("limits.disk_bytes") && msg.contains("free") && msg.contains("reserve"),
        "names the resource, the request and what is available: {msg}"
    );
    assert!(ps(&d).is_empty() && sandboxes_ever_recorded(&d).is_empty(), "nothing created");
    // With the default reserve, a disk that fits is fine.
    if env.is_empty() {
        rt().block_on(d.client().create_sandbox(&req(limits(None, Some(64 * MIB))))).unwrap();
    }
}

#[test]
fn admission_bounds_memory_commitments_and_keeps_a_reserve() {
    require_host!();
    let total = meminfo("MemTotal");
    // Room for two 64 MiB sandboxes, not three.
    let ratio = format!("{:.12}", (160 * MIB) as f64 / total as f64);
    let d = TestDaemon::start_with_env(&[("STRATA_MEMORY_OVERCOMMIT", ratio.as_str())]);
    d.import_busybox();
    let a = d.create(&["--memory", "64m"]);
    let _b = d.create(&["--memory", "64m"]);
    let (status, code, msg) = api_err(rt().block_on(d.client().create_sandbox(&req(limits(Some(64 * MIB), None)))));
    assert_eq!((status, code.as_str()), (503, "insufficient_memory"), "{msg}");
    assert!(
        msg.contains("MemTotal") && msg.contains("64.0 MiB") && msg.contains("128.0 MiB"),
        "names the request and what is committed: {msg}"
    );
    assert_eq!(ps(&d).len(), 2, "nothing created");
    // Stopped sandboxes hold no memory; starting one again is admitted like a create.
    d.cli_ok(&["stop", &a]);
    let c = d.create(&["--memory", "64m"]);
    let (status, code, msg) = api_err(rt().block_on(d.client().start_sandbox(&a)));
    assert_eq!((status, code.as_str()), (503, "insufficient_memory"), "{msg}");
    assert_eq!(inspect(&d, &a)["state"], "stopped", "a refused start changes nothing");
    d.cli_ok(&["rm", "-f", &c]);
    d.cli_ok(&["start", &a]);
    drop(d);

    // The reserve: below it nothing new starts.
    let reserve = total.to_string();
    let d = TestDaemon::start_with_env(&[("STRATA_MEMORY_RESERVE", reserve.as_str())]);
    d.import_busybox();
    let (status, code, msg) = api_err(rt().block_on(d.client().create_sandbox(&req(ResourceLimits::default()))));
    assert_eq!((status, code.as_str()), (503, "insufficient_memory"), "{msg}");
    assert!(msg.contains("MemAvailable") && msg.contains("reserve"), "{msg}");
    assert!(ps(&d).is_empty());
}

#[test]
fn twelve_one_tib_disks_are_refused_and_the_disk_quota_holds() {
    require_host!();
    let d = TestDaemon::start_with_env(&[("STRATA_TENANT_QUOTA", "disk=3g")]);
    d.import_busybox();
    let acme = d.client().with_tenant(Some("acme".into()));
    let rt = rt();
    for i in 0..12 {
        let (status, code, msg) = api_err(rt.block_on(acme.create_sandbox(&req(limits(None, Some(1 << 40))))));
        assert!(matches!(status, 400 | 429 | 507), "1 TiB disk #{i}: {status} {code} {msg}");
    }
    assert!(ps(&d).is_empty() && sandboxes_ever_recorded(&d).is_empty(), "no 1 TiB disk was made");
    let mut made = 0;
    for _ in 0..12 {
        match rt.block_on(acme.create_sandbox(&req(limits(Some(32 * MIB), Some(GIB))))) {
            Ok(_) => made += 1,
            r => {
                let (status, code, msg) = api_err(r);
                assert_eq!((status, code.as_str()), (429, "quota_exceeded"), "{msg}");
                assert!(
                    msg.contains("disk") && msg.contains("3.0 GiB") && msg.contains("acme"),
                    "names the quota, its limit and the usage: {msg}"
                );
            }
        }
    }
    assert_eq!(made, 3, "a 3 GiB disk quota holds three 1 GiB disks");
    assert_eq!(ps(&d).len(), 3);
    // The operator (acting in no tenant) is not held to tenant quotas.
    let op = d.create(&["--disk", "1g", "--memory", "32m"]);
    assert_eq!(inspect(&d, &op)["tenant"], "default");
    let (status, usage) = call(&d.client(), Method::GET, "/v1/tenants/acme/usage", None);
    assert_eq!(status, 200, "{usage}");
    assert_eq!(
        (usage["disk_bytes"]["used"].as_u64(), usage["disk_bytes"]["limit"].as_u64()),
        (Some(3 * GIB), Some(3 * GIB)),
        "{usage}"
    );
    assert_eq!(usage["sandboxes"]["used"], 3, "{usage}");
}

#[test]
fn the_sandbox_quota_holds_under_concurrent_creates() {
    require_host!();
    let d = TestDaemon::start_with_env(&[("STRATA_TENANT_QUOTA", "sandboxes=4")]);
    d.import_busybox();
    let acme = d.client().with_tenant(Some("acme".into()));
    let rt = rt();
    let burst = |n: usize| -> Vec<Result<strata_api::CreatedSandbox, ClientError>> {
        rt.block_on(async {
            let mut set = tokio::task::JoinSet::new();
            for _ in 0..n {
                let c = acme.clone();
                set.spawn(async move { c.create_sandbox(&req(limits(Some(32 * MIB), Some(64 * MIB)))).await });
            }
            set.join_all().await
        })
    };
    let results = burst(8);
    let ok: Vec<String> = results.iter().filter_map(|r| r.as_ref().ok().map(|c| c.id.clone())).collect();
    assert_eq!(ok.len(), 4, "exactly the quota passes: {results:?}");
    for r in results.into_iter().filter(|r| r.is_err()) {
        let (status, code, msg) = api_err(r);
        assert_eq!((status, code.as_str()), (429, "quota_exceeded"), "{msg}");
        assert!(msg.contains("sandboxes") && msg.contains('4'), "{msg}");
    }
    assert_eq!(ps(&d).len(), 4, "nothing created beyond the quota");
    // At quota - 1, two parallel creates: one passes.
    d.cli_ok(&["rm", "-f", &ok[0]]);
    let results = burst(2);
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1, "{results:?}");
    // The operator is unlimited; acting as the tenant it is held to the quota.
    d.create(&["--memory", "32m", "--disk", "64m"]);
    d.create(&["--memory", "32m", "--disk", "64m"]);
    let out = d.cli(&["--as-tenant", "acme", "create", "busybox", "--memory", "32m"]);
    assert!(!out.status.success() && stderr(&out).contains("quota"), "{}", stderr(&out));
}

#[test]
fn forks_per_minute_count_fork_and_fanout_children() {
    require_host!();
    let d = TestDaemon::start_with_env(&[("STRATA_TENANT_QUOTA", "forks-per-minute=3")]);
    d.import_busybox();
    let acme = d.client().with_tenant(Some("acme".into()));
    let rt = rt();
    let src = rt.block_on(acme.create_sandbox(&req(limits(Some(32 * MIB), Some(64 * MIB))))).unwrap().id;
    d.cli_ok(&["--as-tenant", "acme", "checkpoint", &src, "--name", "c0"]);
    let fork = |count: u32| rt.block_on(acme.fork(&fork_req("c0", count, None)));
    assert_eq!(fork(2).unwrap().sandboxes.len(), 2);
    let before = ps(&d).len();
    let (status, code, msg) = api_err(fork(2));
    assert_eq!((status, code.as_str()), (429, "quota_exceeded"), "{msg}");
    assert!(
        msg.contains("forks_per_minute") && msg.contains('3') && msg.contains('2'),
        "names the quota, its limit and the usage: {msg}"
    );
    assert_eq!(ps(&d).len(), before, "a refused fork creates nothing");
    assert_eq!(fork(1).unwrap().sandboxes.len(), 1);
    let fan = rt.block_on(acme.fanout(&FanoutRequest {
        source: "c0".into(),
        plan: FanoutPlan { run: Some("true".into()), count: Some(1), ..Default::default() },
        ..Default::default()
    }));
    let (status, code, msg) = api_err(fan);
    assert_eq!((status, code.as_str()), (429, "quota_exceeded"), "fan-out children count as forks: {msg}");
    // The operator forks freely.
    assert_eq!(rt.block_on(d.client().fork(&fork_req("c0", 4, None))).unwrap().sandboxes.len(), 4);
}

#[test]
fn quota_overrides_through_the_api_and_the_cli_over_tcp() {
    require_host!();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let d = TestDaemon::start_with(Some(&addr));
    d.import_busybox();
    let token = |name: &str, tenant: &str| -> Client {
        let v = json(&d, &["token", "create", "--name", name, "--tenant", tenant, "--json"]);
        Client::new(Endpoint::Tcp { addr: addr.clone(), token: Some(v["secret"].as_str().unwrap().to_string()) })
    };
    let acme = token("ci", "acme");
    let _globex = token("ci", "globex");
    let rt = rt();

    // The operator sets an override with the CLI; show names effective values, overrides and defaults.
    d.cli_ok(&["tenant", "quota", "set", "acme", "--sandboxes", "1", "--memory", "256m"]);
    let q = json(&d, &["tenant", "quota", "show", "acme", "--json"]);
    assert_eq!(
        (q["effective"]["sandboxes"].as_u64(), q["effective"]["memory_bytes"].as_u64()),
        (Some(1), Some(256 * MIB)),
        "{q}"
    );
    assert_eq!(q["overrides"]["sandboxes"], 1, "{q}");
    assert_eq!(q["defaults"]["sandboxes"], 100, "{q}");
    assert!(d.cli_ok(&["tenant", "quota", "show", "acme"]).contains("256.0 MiB"));
    // The tenant is held to it.
    let first = rt.block_on(acme.create_sandbox(&req(limits(Some(64 * MIB), Some(64 * MIB))))).unwrap().id;
    let (status, code, msg) = api_err(rt.block_on(acme.create_sandbox(&req(limits(Some(64 * MIB), Some(64 * MIB))))));
    assert_eq!((status, code.as_str()), (429, "quota_exceeded"), "{msg}");
    assert!(msg.contains("sandboxes") && msg.contains("1 of 1"), "{msg}");
    // It sees its own usage, not another tenant's, and cannot change its quota.
    let (status, usage) = call(&acme, Method::GET, "/v1/tenants/acme/usage", None);
    assert_eq!(status, 200, "{usage}");
    assert_eq!(
        (usage["sandboxes"]["used"].as_u64(), usage["sandboxes"]["limit"].as_u64()),
        (Some(1), Some(1)),
        "{usage}"
    );
    assert_eq!(
        (usage["memory_bytes"]["used"].as_u64(), usage["memory_bytes"]["limit"].as_u64()),
        (Some(64 * MIB), Some(256 * MIB)),
        "{usage}"
    );
    assert_eq!(call(&acme, Method::GET, "/v1/tenants/globex/usage", None).0, 403);
    assert_eq!(call(&acme, Method::PUT, "/v1/tenants/acme/quota", Some(serde_json::json!({"sandboxes": 50}))).0, 403);
    assert_eq!(call(&acme, Method::GET, "/v1/tenants/acme/quota", None).0, 403);
    let usage = json(&d, &["tenant", "usage", "acme", "--json"]);
    assert_eq!(usage["sandboxes"]["used"], 1, "{usage}");
    assert!(d.cli_ok(&["tenant", "usage", "acme"]).contains("sandboxes"));

    // Memory: the sum of running sandboxes' limits; a start is admitted like a create.
    d.cli_ok(&["tenant", "quota", "set", "acme", "--sandboxes", "unlimited", "--memory", "160m"]);
    let second = rt.block_on(acme.create_sandbox(&req(limits(Some(64 * MIB), Some(64 * MIB))))).unwrap().id;
    let (status, code, msg) = api_err(rt.block_on(acme.create_sandbox(&req(limits(Some(64 * MIB), Some(64 * MIB))))));
    assert_eq!((status, code.as_str()), (429, "quota_exceeded"), "{msg}");
    assert!(msg.contains("memory") && msg.contains("160.0 MiB") && msg.contains("128.0 MiB"), "{msg}");
    rt.block_on(acme.stop_sandbox(&first)).unwrap();
    let third = rt.block_on(acme.create_sandbox(&req(limits(Some(64 * MIB), Some(64 * MIB))))).unwrap().id;
    let (status, code, msg) = api_err(rt.block_on(acme.start_sandbox(&first)));
    assert_eq!((status, code.as_str()), (429, "quota_exceeded"), "{msg}");
    rt.block_on(acme.remove_sandbox(&third, true)).unwrap();
    rt.block_on(acme.start_sandbox(&first)).unwrap();
    let _ = second;

    // Malformed overrides are 400s naming the field; nothing changes.
    for body in [
        serde_json::json!({"sandboxes": -1}),
        serde_json::json!({"memory_bytes": "lots"}),
        serde_json::json!({"sandbox": 3}),
    ] {
        let (status, v) = call(&d.client(), Method::PUT, "/v1/tenants/acme/quota", Some(body.clone()));
        assert_eq!(status, 400, "{body}: {v}");
    }
    assert_eq!(
        call(&d.client(), Method::PUT, "/v1/tenants/not%20a%20tenant/quota", Some(serde_json::json!({}))).0,
        400
    );
    // Reset: back to the daemon's defaults.
    d.cli_ok(&["tenant", "quota", "reset", "acme"]);
    let q = json(&d, &["tenant", "quota", "show", "acme", "--json"]);
    assert_eq!(q["effective"]["sandboxes"], 100, "{q}");
    // Changes are in the audit log.
    let audit = d.cli_ok(&["audit", "--json"]);
    assert!(audit.contains("/v1/tenants/{tenant}/quota"), "{audit}");
}

#[test]
fn pipeline_stages_are_held_to_the_quota_of_whoever_started_the_run() {
    require_host!();
    let d = TestDaemon::start_with_env(&[("STRATA_TENANT_QUOTA", "sandboxes=1")]);
    d.import_busybox();
    let spec = common::write_file(
        d.dir.path(),
        "p.toml",
        b"[[stage]]\nname = \"one\"\nsource = \"image:busybox\"\nlifecycle = \"persistent\"\ncommands = [\"true\"]\n",
    );
    let run = |extra: &[&str]| -> serde_json::Value {
        let mut args = extra.to_vec();
        args.extend(["pipeline", "run", spec.to_str().unwrap(), "--json"]);
        let out = common::stdout(&d.cli(&args));
        serde_json::from_str::<serde_json::Value>(out.lines().last().unwrap_or("{}")).unwrap()["run"].clone()
    };
    // The operator's own runs (tenant `default`) are not held, like its requests.
    d.create(&["--memory", "32m"]);
    d.create(&["--memory", "32m"]);
    assert_eq!(run(&[])["state"], "succeeded", "the operator's pipeline is not held to default's quota of 1");
    // A run started as a tenant is: its stage would be acme's second sandbox.
    d.cli_ok(&["--as-tenant", "acme", "create", "busybox", "--memory", "32m"]);
    let r = run(&["--as-tenant", "acme"]);
    assert_eq!(r["state"], "failed", "{r}");
    assert!(r["reason"].as_str().unwrap_or_default().contains("sandboxes quota"), "{r}");
}
