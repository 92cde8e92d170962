//! Per-sandbox disk limit: the writable layer is a filesystem of `--disk` bytes
//! of its own (see crates/runtime/src/disk.rs). Filling it fails with ENOSPC at
//! about the limit; the sandbox stays usable, other sandboxes and the host do
//! not notice, and the limit holds across standby/resume, forks, checkpoint
//! rollbacks and daemon restarts. Also: a /tmp on disk (the default) fills the
//! same disk, a scratch one (`--tmp tmpfs`) is capped by --memory.

mod common;

use common::{stderr, stdout, TestDaemon};

const MIB: u64 = 1 << 20;

fn run(d: &TestDaemon, id: &str, script: &str) -> (i32, String) {
    let out = d.cli(&["exec", "--timeout", "120s", id, "--", "sh", "-c", script]);
    (out.status.code().unwrap_or(-1), format!("{}{}", stdout(&out), stderr(&out)))
}

fn inspect(d: &TestDaemon, id: &str) -> serde_json::Value {
    serde_json::from_str(&d.cli_ok(&["inspect", id, "--json"])).unwrap()
}

/// Fills the disk with /big (dd until it fails); returns the MiB written.
#[track_caller]
fn fill(d: &TestDaemon, id: &str, limit_mib: u64) -> u64 {
    let (code, out) =
        run(d, id, "dd if=/dev/zero of=/big bs=1M 2>&1; sync; echo size=$(($(stat -c %s /big) / 1048576))");
    assert!(
        out.contains("No space left on device") || out.contains("Disk quota exceeded"),
        "dd did not hit the limit (exit {code}):\n{out}"
    );
    let mib: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("size="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(mib <= limit_mib && mib >= limit_mib * 3 / 4, "wrote {mib} MiB against a {limit_mib} MiB disk:\n{out}");
    mib
}

/// The host blocks a sandbox's disk image holds (its allocation on the host's
/// filesystem, in MiB): all the host space the sandbox's writes can take. (The
/// host's free space would also count what tests running beside this one write.)
fn disk_image_mib(d: &TestDaemon, id: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let image = d.state("sandboxes").join(id).join(strata_runtime::disk::IMAGE);
    std::fs::metadata(&image).unwrap_or_else(|e| panic!("{}: {e}", image.display())).blocks() * 512 / MIB
}

#[test]
fn filling_the_disk_stops_at_the_limit_and_harms_nobody() {
    require_host!();
    let mut d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&["--disk", "64m"]);
    let info = inspect(&d, &id);
    assert_eq!(info["limits"]["disk_bytes"], 64 * MIB, "{info}");
    let quota = info["limits"]["disk_quota"].as_str().unwrap().to_string();
    assert!(quota.starts_with("enforced"), "this host can enforce disk limits: {quota}");
    assert!(
        d.cli_ok(&["inspect", &id]).contains("disk=64.0 MiB") || d.cli_ok(&["inspect", &id]).contains("disk=64"),
        "{}",
        d.cli_ok(&["inspect", &id])
    );
    // df inside shows the sandbox's own filesystem, not the host's.
    let (_, df) = run(&d, &id, "df -k / | tail -1");
    let size_k: u64 = df.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(size_k <= 64 * 1024, "df / shows {size_k} KiB: {df}");

    let other = d.create(&["--disk", "64m"]);
    d.cli_ok(&["exec", &id, "--", "sh", "-c", "echo precious > /kept; dd if=/dev/urandom of=/kept.bin bs=1k count=512 2>/dev/null; md5sum /kept.bin > /kept.md5"]);
    let image_before = disk_image_mib(&d, &id);
    let written = fill(&d, &id, 64);
    // The writes went into the sandbox's own disk image, and the host lost at most its limit.
    let image_after = disk_image_mib(&d, &id);
    assert!(
        image_after <= 64 && image_after >= image_before + written.saturating_sub(8),
        "the disk image holds {image_before} -> {image_after} MiB of host space after {written} MiB written"
    );
    // Full: another write fails, the sandbox still runs commands, earlier files are intact.
    // (ext4 may leave a last block or two that a 4 KiB-block dd did not take: a few small files, then nothing.)
    let (code, out) = run(&d, &id, "dd if=/dev/zero of=/big2 bs=4k 2>/dev/null; sync; for i in 1 2 3 4 5 6 7 8; do echo more > /more$i || exit 1; done");
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("No space left") || out.contains("Disk quota"), "{out}");
    assert_eq!(d.cli_ok(&["exec", &id, "--", "cat", "/kept"]), "precious\n");
    d.cli_ok(&["exec", &id, "--", "md5sum", "-c", "/kept.md5"]);
    // The other sandbox is unaffected, with its whole disk.
    assert_eq!(d.cli_ok(&["exec", &other, "--", "sh", "-c", "echo fine > /f && cat /f"]), "fine\n");
    fill(&d, &other, 64);
    d.cli_ok(&["exec", &other, "--", "rm", "/big"]);
    // Deleting the file frees the space again.
    d.cli_ok(&["exec", &id, "--", "sh", "-c", "rm -f /big /big2 /more*"]);
    let again = fill(&d, &id, 64);
    assert!(again + 2 >= written, "space came back: {written} then {again} MiB");
    d.cli_ok(&["exec", &id, "--", "rm", "/big"]);

    // Across a daemon restart (SIGKILL; the sandbox keeps running) the limit holds.
    d.kill9_and_restart();
    fill(&d, &id, 64);
    d.cli_ok(&["exec", &id, "--", "rm", "/big"]);
    // And across stop/start, and a checkpoint rollback (the upper layer is replaced).
    d.cli_ok(&["stop", &id]);
    d.cli_ok(&["start", &id]);
    assert_eq!(d.cli_ok(&["exec", &id, "--", "cat", "/kept"]), "precious\n");
    d.cli_ok(&["checkpoint", &id, "--name", "c1"]);
    d.cli_ok(&["exec", &id, "--", "rm", "/kept"]);
    d.cli_ok(&["restore", &id, "--to", "c1"]);
    assert_eq!(d.cli_ok(&["exec", &id, "--", "cat", "/kept"]), "precious\n");
    fill(&d, &id, 64);
    // Destroying a sandbox unmounts its disk and deletes its image.
    let dir = d.state(&format!("sandboxes/{id}"));
    d.cli_ok(&["rm", "-f", &id]);
    assert!(common::wait_until(10, || !dir.exists()), "sandbox directory (and its disk) removed");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&id), "the disk of a destroyed sandbox is still mounted");
}

#[test]
fn the_limit_holds_after_standby_resume_and_in_forks() {
    require_criu!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&["--disk", "48m"]);
    d.cli_ok(&["exec", &id, "--", "sh", "-c", "echo before > /kept"]);
    d.cli_ok(&[
        "exec",
        "-d",
        &id,
        "--",
        "sh",
        "-c",
        "i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 0.1; done",
    ]);
    d.cli_ok(&["standby", &id]);
    let info = inspect(&d, &id);
    assert_eq!(info["state"], "standby", "{info}");
    assert_eq!(info["standby"]["mode"], "processes", "{info}");
    d.cli_ok(&["resume", &id]);
    assert_eq!(d.cli_ok(&["exec", &id, "--", "cat", "/kept"]), "before\n");
    fill(&d, &id, 48);
    d.cli_ok(&["exec", &id, "--", "rm", "/big"]);

    // Forks get a disk of the same size of their own.
    let ids: Vec<String> = d.cli_ok(&["fork", &id, "--count", "2"]).lines().map(str::to_string).collect();
    assert_eq!(ids.len(), 2);
    for f in &ids {
        let info = inspect(&d, f);
        assert_eq!(info["limits"]["disk_bytes"], 48 * MIB, "{info}");
        assert!(info["limits"]["disk_quota"].as_str().unwrap().starts_with("enforced"), "{info}");
        assert_eq!(d.cli_ok(&["exec", f, "--", "cat", "/kept"]), "before\n");
    }
    fill(&d, &ids[0], 48);
    // The parent and the sibling still have their space.
    assert_eq!(d.cli_ok(&["exec", &ids[1], "--", "sh", "-c", "echo ok > /x && cat /x"]), "ok\n");
    assert_eq!(d.cli_ok(&["exec", &id, "--", "sh", "-c", "echo ok > /x && cat /x"]), "ok\n");
}

#[test]
fn disk_limits_are_validated_defaulted_and_hold_tmp_and_a_scratch_tmp_is_capped_by_memory() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    // Too small or malformed: refused, naming the field.
    let out = d.cli(&["create", "busybox", "--disk", "1m"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("disk_bytes"), "{}", stderr(&out));
    let out = d.cli(&["create", "busybox", "--disk", "lots"]);
    assert!(!out.status.success(), "{}", stdout(&out));
    let rt = common::rt();
    let err = rt
        .block_on(d.client().create_sandbox(&strata_api::CreateSandboxRequest {
            source: "busybox".into(),
            limits: strata_api::ResourceLimits { disk_bytes: Some(4096), ..Default::default() },
            ..Default::default()
        }))
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("400") || text.contains("bad_request") || text.contains("invalid"), "{text}");
    assert!(text.contains("disk_bytes"), "{text}");
    // The daemon's default (10 GiB) applies when none is given.
    let id = d.create(&["--memory", "64m"]);
    let info = inspect(&d, &id);
    assert_eq!(info["limits"]["disk_bytes"], 10u64 << 30, "{info}");
    assert!(info["limits"]["disk_quota"].as_str().unwrap().starts_with("enforced"), "{info}");
    // /tmp is a directory of that disk: it fills the same quota.
    let small = d.create(&["--disk", "32m"]);
    let (code, out) = run(&d, &small, "dd if=/dev/zero of=/tmp/fill bs=1M count=100 2>&1");
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("No space left") || out.contains("Disk quota exceeded"), "{out}");
    assert_eq!(run(&d, &small, "rm /tmp/fill && echo ok > /x && cat /x"), (0, "ok\n".into()));
    // A scratch /tmp is a tmpfs no larger than the memory limit.
    let id = d.create(&["--memory", "64m", "--tmp", "tmpfs"]);
    assert_eq!(inspect(&d, &id)["tmp"], "tmpfs");
    let (_, df) = run(&d, &id, "df -k /tmp | tail -1");
    let size_k: u64 = df.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert_eq!(size_k, 64 * 1024, "{df}");
    let (code, out) = run(&d, &id, "dd if=/dev/zero of=/tmp/fill bs=1M count=100 2>&1");
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("No space left") || code == 137, "{out}");
}

#[test]
fn a_host_that_cannot_makes_sandboxes_without_a_disk_and_says_so() {
    require_host!();
    let d = TestDaemon::start_with_env(&[("STRATA_FAILPOINTS", "disk-unavailable")]);
    d.import_busybox();
    let id = d.create(&["--disk", "64m"]);
    let info = inspect(&d, &id);
    assert_eq!(info["limits"]["disk_bytes"], 64 * MIB, "{info}");
    assert_eq!(info["limits"]["disk_quota"], "unavailable (disabled by the disk-unavailable failpoint)", "{info}");
    assert!(d.cli_ok(&["inspect", &id]).contains("disk_quota"), "inspect shows it");
    assert!(d.log().contains("per-sandbox disk limits are unavailable"), "the daemon says so at start:\n{}", d.log());
    assert!(
        d.state(&format!("sandboxes/{id}/upper")).is_dir() && !d.state(&format!("sandboxes/{id}/disk.img")).exists()
    );
    assert_eq!(d.cli_ok(&["exec", &id, "--", "sh", "-c", "echo ok > /x && cat /x"]), "ok\n");
}

#[test]
fn a_daemon_without_a_default_records_none() {
    require_host!();
    let d = TestDaemon::start_with_env(&[("STRATA_DEFAULT_DISK", "none")]);
    d.import_busybox();
    let id = d.create(&[]);
    let info = inspect(&d, &id);
    assert!(info["limits"]["disk_bytes"].is_null(), "{info}");
    assert_eq!(info["limits"]["disk_quota"], "none", "{info}");
    assert!(
        d.state(&format!("sandboxes/{id}/upper")).is_dir(),
        "without a disk the upper directory is on the host filesystem"
    );
    assert_eq!(d.cli_ok(&["exec", &id, "--", "sh", "-c", "echo ok > /x && cat /x"]), "ok\n");
}
