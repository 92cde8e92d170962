//! The microvm tier end to end (under TCG on these machines: correct, not
//! fast): a sandbox is a QEMU microVM with a kernel of its own, booted from
//! strata's layers, driven through the same CLI and API as the other tiers
//! (exec with output, exit codes, stdin, users, signals; limits inside the
//! guest; checkpoints, forks, diffs and scans; standby with its processes;
//! stop and start keeping its disk; destroy leaving nothing), what it
//! refuses with why (501), and a guest that cannot boot failing loudly with
//! its console's tail. Boots are few: each costs seconds under TCG.

mod common;

use common::{stderr, stdout, TestDaemon};

fn sh(d: &TestDaemon, id: &str, script: &str) -> std::process::Output {
    d.cli(&["exec", "--timeout", "120s", id, "--", "sh", "-c", script])
}

fn sh_ok(d: &TestDaemon, id: &str, script: &str) -> String {
    let out = sh(d, id, script);
    assert!(out.status.success(), "{script}: {}{}", stdout(&out), stderr(&out));
    stdout(&out)
}

/// The last number a counter process printed (its lines are `tick N`).
fn last_tick(d: &TestDaemon, id: &str, proc_id: &str) -> u64 {
    let logs = d.cli_ok(&["proc", "logs", id, proc_id]);
    logs.lines().rev().filter_map(|l| l.strip_prefix("tick ")).find_map(|n| n.trim().parse().ok()).unwrap_or(0)
}

/// The pid of the VM's QEMU.
fn qemu_pid(id: &str) -> Option<u32> {
    std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        (cmdline.contains("qemu-system") && cmdline.contains(&format!("strata-{id}")))
            .then(|| e.file_name().to_str()?.parse().ok())
            .flatten()
    })
}

fn qemu_runs(id: &str) -> bool {
    qemu_pid(id).is_some()
}

/// Nothing of a destroyed microVM is left on the host: no QEMU, cgroup, run
/// directory or disk.
fn assert_released(d: &TestDaemon, id: &str) {
    let released = common::wait_until(20, || {
        !qemu_runs(id)
            && !std::path::Path::new(&format!("/sys/fs/cgroup/memory/strata/{id}")).exists()
            && !std::path::Path::new(&format!("/sys/fs/cgroup/strata/{id}")).exists()
            && !d.state(&format!("run/microvm/{id}")).exists()
            && !d.state(&format!("sandboxes/{id}")).exists()
    });
    assert!(released, "microVM {id} left something on the host");
}

#[test]
fn a_microvm_sandbox_runs_processes_in_a_guest_kernel_of_its_own() {
    require_microvm!();
    let mut d = TestDaemon::start();
    d.import_busybox();
    let canary = d.create(&["--name", "canary"]);
    let id = d.create(&[
        "--isolation",
        "microvm",
        "--network",
        "none",
        "--name",
        "vm",
        "--memory",
        "256m",
        "--pids",
        "64",
        "--disk",
        "200m",
        "--flush",
        "~/.cache",
    ]);
    let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", &id, "--json"])).unwrap();
    assert_eq!(info["runtime"], "microvm", "{info}");
    assert!(info["limits"]["disk_quota"].as_str().unwrap().contains("microVM's own ext4 disk"), "{info}");

    // Exec: output, stderr, exit status; the kernel is the guest's; strata-init is its pid 1.
    let out = sh(&d, &id, "echo out; echo err >&2; exit 7");
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(stdout(&out), "out\n");
    assert!(stderr(&out).contains("err"), "{}", stderr(&out));
    let seen = sh_ok(
        &d,
        &id,
        "uname -r; cat /proc/1/cmdline | tr '\\0' ' '; echo; hostname; cat /etc/hostname /run/strata/generation",
    );
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let lines: Vec<&str> = seen.lines().collect();
    assert_ne!(lines[0], host_release.trim(), "the guest runs its own kernel: {seen}");
    assert!(lines[0].contains("cloud"), "Debian's cloud kernel: {seen}");
    assert!(lines[1].starts_with("/init _vminit"), "strata-init is pid 1: {seen}");
    assert_eq!(&lines[2..], ["vm", "vm", "0"], "{seen}");
    // Stdin, users from the image's /etc/passwd, the working directory, a missing program.
    let out = d.cli_stdin(&["exec", "-i", &id, "--", "sh", "-c", "tr a-z A-Z"], b"piped\n");
    assert_eq!(stdout(&out), "PIPED\n");
    assert_eq!(d.cli_ok(&["exec", "--user", "user", &id, "--", "id", "-un"]), "user\n");
    assert_eq!(d.cli_ok(&["exec", "--cwd", "/etc", &id, "--", "pwd"]), "/etc\n");
    let missing = d.cli(&["exec", &id, "--", "no-such-program"]);
    assert!(!missing.status.success() && stderr(&missing).contains("no-such-program"), "{}", stderr(&missing));
    // Megabytes through the line both ways: nothing lost, nothing reordered.
    let input: Vec<u8> = (0..(2u32 << 20)).map(|i| (i % 251) as u8).collect();
    let out = d.cli_stdin(&["exec", "-i", &id, "--", "cat"], &input);
    assert!(out.status.success() && out.stdout == input, "{} bytes back of {}", out.stdout.len(), input.len());
    // A timeout signals the process through the guest's pid 1.
    let t = std::time::Instant::now();
    let out = d.cli(&["exec", "--timeout", "2s", &id, "--", "sleep", "60"]);
    assert!(!out.status.success() && t.elapsed() < std::time::Duration::from_secs(30), "{}", stderr(&out));

    // Limits hold inside the guest: its RAM, its process count, its disk.
    let mem_kib: u64 = sh_ok(&d, &id, "awk '/MemTotal/ {print $2}' /proc/meminfo").trim().parse().unwrap();
    assert!(mem_kib > 150 << 10 && mem_kib <= 256 << 10, "guest RAM {mem_kib} KiB for --memory 256m");
    let forks = sh(&d, &id, "for i in $(seq 100); do sleep 4 & done; wait");
    assert!(!forks.status.success() || stderr(&forks).contains("fork"), "100 processes under --pids 64");
    // (Nothing else starts until those end: the limit counts every process in the guest.)
    assert!(common::wait_until(60, || sh(&d, &id, "true | true").status.success()), "the guest recovers");
    let full = sh(&d, &id, "dd if=/dev/zero of=/root/fill bs=1M count=400 2>&1; sync");
    assert!(stdout(&full).contains("No space left"), "the disk limit: {}", stdout(&full));
    sh_ok(&d, &id, "rm -f /root/fill; echo kept > /root/note; sync");

    // QEMU itself is confined: a uid of the sandbox's own (not root), a seccomp filter, an empty root.
    let qemu = qemu_pid(&id).expect("the VM's QEMU");
    let status = std::fs::read_to_string(format!("/proc/{qemu}/status")).unwrap();
    let field = |name: &str| status.lines().find(|l| l.starts_with(name)).unwrap_or_default().to_string();
    let uid: u32 = field("Uid:").split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(uid == strata_runtime::microvm::qemu_uid(&id), "QEMU runs as {uid}: {}", field("Uid:"));
    assert!(field("Uid:").split_whitespace().skip(1).all(|u| u != "0"), "{}", field("Uid:"));
    assert_eq!(field("Seccomp:").split_whitespace().nth(1), Some("2"), "QEMU has a seccomp filter");
    assert_eq!(field("CapEff:").split_whitespace().nth(1), Some("0000000000000000"), "QEMU has no capability");
    let root = std::fs::read_link(format!("/proc/{qemu}/root")).unwrap();
    assert!(root.ends_with("microvm-empty-root"), "QEMU's root is {}", root.display());
    assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0, "and it is empty");

    // The guest reaches nothing of the host: no network device, no host process, no host file.
    assert_eq!(sh_ok(&d, &id, "ls /sys/class/net"), "lo\n");
    let daemon_pid = d.pid();
    let out = sh(&d, &id, &format!("cat /proc/{daemon_pid}/cmdline | grep -q strata"));
    assert!(!out.status.success(), "the daemon's process is visible in the guest");
    let out = sh(&d, &id, &format!("ls {}", d.dir.path().display()));
    assert!(!out.status.success(), "the test's host directory is visible in the guest");

    // The host never mounts a disk a guest has written (a crafted file system
    // would meet the host kernel's ext4 driver): not while it runs, not in
    // standby, not stopped, not through a daemon restart.
    let disk_mounted = |d: &TestDaemon| {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let dir = d.state(&format!("sandboxes/{id}/disk"));
        mounts.lines().find(|l| l.split_whitespace().nth(4) == Some(dir.to_str().unwrap())).map(str::to_string)
    };
    assert_eq!(disk_mounted(&d), None, "the disk of a running microVM is on the host");

    // A checkpoint of the running microVM: the guest wipes its flush paths,
    // freezes its disk and writes out what changed, which the host unpacks as
    // untrusted input; the guest goes on writing afterwards.
    sh_ok(&d, &id, "mkdir -p /srv ~/.cache && echo two > /srv/b && rm /etc/group && echo tmp > ~/.cache/junk");
    let ck = d.cli_ok(&["checkpoint", &id, "--name", "vm-ck"]).trim().to_string();
    assert_eq!(sh_ok(&d, &id, "ls -A ~/.cache"), "", "the flush rule emptied ~/.cache in the guest");
    let events = d.cli_ok(&["events", &id]);
    assert!(events.contains("/root/.cache: 1 entries removed"), "{events}");
    sh_ok(&d, &id, "echo after > /root/after");
    let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["checkpoint", "inspect", &ck, "--json"])).unwrap();
    assert_eq!(info["isolation"], "microvm", "{info}");
    // Diffs and scans of the running microVM read its layer through the guest too.
    let diff = d.cli_ok(&["diff", &id]);
    assert!(diff.contains("/root/after") && !diff.contains("/srv/b"), "changes since the checkpoint: {diff}");
    let scan = stdout(&d.cli(&["scan", &id]));
    assert!(scan.contains("paths changed above image busybox") && scan.contains("finding"), "{scan}");

    // Standby: the VM's memory and devices go to a file, QEMU ends, the disk
    // waits frozen; an exec resumes it with the same processes, still counting.
    let counter = "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done";
    let proc_id = d.cli_ok(&["exec", "-d", &id, "--", "sh", "-c", counter]).trim().to_string();
    assert!(common::wait_until(30, || last_tick(&d, &id, &proc_id) >= 3), "the counter does not count");
    d.cli_ok(&["standby", &id]);
    let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", &id, "--json"])).unwrap();
    assert_eq!(info["state"], "standby", "{info}");
    assert!(common::wait_until(10, || !qemu_runs(&id)), "QEMU outlived the standby");
    assert_eq!(disk_mounted(&d), None, "the disk of a microVM in standby is on the host");
    let before = last_tick(&d, &id, &proc_id);
    assert_eq!(sh_ok(&d, &id, "cat /root/note"), "kept\n", "resumed on access");
    assert!(common::wait_until(30, || last_tick(&d, &id, &proc_id) > before + 2), "the counter did not go on");
    let ticks = d.cli_ok(&["proc", "logs", &id, &proc_id]);
    let numbers: Vec<u64> = ticks.lines().filter_map(|l| l.strip_prefix("tick ")?.trim().parse().ok()).collect();
    assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "the same process, nothing lost or repeated: {ticks}");
    let guest_now: u64 = sh_ok(&d, &id, "date +%s").trim().parse().unwrap();
    let host_now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    assert!(guest_now.abs_diff(host_now) <= 5, "the guest's clock was stepped on resume: {guest_now} vs {host_now}");
    d.cli_ok(&["proc", "kill", &id, &proc_id, "--signal", "KILL"]);
    // Through a daemon restart (API processes are the daemon's memory; the guest's are its own).
    d.cli_ok(&["standby", &id]);
    d.kill9_and_restart();
    assert_eq!(disk_mounted(&d), None, "the disk is on the host after a daemon restart");
    assert_eq!(sh_ok(&d, &id, "cat /root/note"), "kept\n", "resumed on access after the restart");

    // Stop powers the guest off; its disk stays the guest's. A diff and a
    // scan of the stopped microVM boot a guest on it for the read (none of
    // the sandbox's processes runs) and power it off again.
    d.cli_ok(&["stop", &id]);
    assert!(common::wait_until(10, || !qemu_runs(&id)), "QEMU outlived the stop");

    let diff = d.cli_ok(&["diff", &id]);
    assert!(diff.contains("/root/after") && !diff.contains("/srv/b"), "changes since the checkpoint: {diff}");
    // (Its findings, a deleted /etc/group among them, make the exit status 2.)
    let scan = stdout(&d.cli(&["scan", &id]));
    assert!(scan.contains("paths changed above image busybox") && scan.contains("finding"), "{scan}");
    let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", &id, "--json"])).unwrap();
    assert_eq!(info["state"], "stopped", "a read leaves the sandbox stopped: {info}");
    assert!(
        !qemu_runs(&id) && disk_mounted(&d).is_none(),
        "the guest booted for the read is gone, the disk not on the host"
    );
    // A checkpoint of the stopped microVM: only what changed since the last one.
    let ck2 = d.cli_ok(&["checkpoint", &id, "--name", "vm-ck2"]).trim().to_string();
    let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["checkpoint", "inspect", &ck2, "--json"])).unwrap();
    assert_eq!(info["changed_paths"], 1, "only /root/after changed since vm-ck: {info}");
    // Against an older checkpoint: the guest's whole layer, compared with that checkpoint's files.
    let diff = d.cli_ok(&["diff", &id, "--against", "vm-ck"]);
    assert!(diff.contains("/root/after") && !diff.contains("/srv/b"), "changes since vm-ck: {diff}");
    // Archive: the disk image goes to the archive store as it is (holes kept,
    // never mounted); start brings it back and boots it.
    d.cli_ok(&["archive", &id]);
    let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", &id, "--json"])).unwrap();
    assert_eq!(info["state"], "archived", "{info}");
    assert!(!d.state(&format!("sandboxes/{id}/disk.img")).exists(), "the archived disk stayed on the host");
    // Start boots it again on the same disk.
    d.cli_ok(&["start", &id]);
    assert_eq!(sh_ok(&d, &id, "cat /root/note /root/after"), "kept\nafter\n");

    // A warm checkpoint: the VM's memory and devices with its disk, taken with the
    // guest's processes frozen; the source runs on.
    let proc_id = d.cli_ok(&["exec", "-d", &id, "--", "sh", "-c", counter]).trim().to_string();
    assert!(common::wait_until(30, || last_tick(&d, &id, &proc_id) >= 3), "the counter does not count");
    sh_ok(&d, &id, "echo warm > /root/warm; echo held in RAM > /dev/shm/mem");
    let warm = d.cli_ok(&["checkpoint", &id, "--processes", "--name", "vm-warm"]).trim().to_string();
    let at_copy = last_tick(&d, &id, &proc_id);
    assert!(common::wait_until(30, || last_tick(&d, &id, &proc_id) > at_copy + 2), "the source stopped counting");
    sh_ok(&d, &id, "echo later > /root/later");
    let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["checkpoint", "inspect", &warm, "--json"])).unwrap();
    assert_eq!(info["processes"]["api_processes"], 1, "{info}");

    // Warm forks: VMs restored from that snapshot, the RAM file mapped private
    // (pages shared), each on a copy of the disk, with identities of their own
    // and a generator reseeded before any of their processes ran again.
    let kids: Vec<String> = d.cli_ok(&["fork", &warm, "-n", "2"]).split_whitespace().map(str::to_string).collect();
    assert_eq!(kids.len(), 2);
    let mut randoms = vec![sh_ok(&d, &id, "head -c 16 /dev/urandom | od -An -tx1")];
    for (i, kid) in kids.iter().enumerate() {
        let seen = sh_ok(&d, kid, "cat /dev/shm/mem /root/warm; test -e /root/later || echo not later; cat /run/strata/generation /run/strata/sandbox-id; hostname");
        let lines: Vec<&str> = seen.lines().collect();
        assert_eq!(&lines[..4], ["held in RAM", "warm", "not later", "1"], "warm fork {kid}: {seen}");
        assert_eq!(lines[4], kid, "{seen}");
        assert!(lines[5].starts_with("vm-") && lines[5] != "vm", "its own hostname: {seen}");
        // The API process came along, with its id, and counts on from where it was copied.
        assert!(
            common::wait_until(30, || last_tick(&d, kid, &proc_id) > at_copy.saturating_sub(10) + 3),
            "the copied counter does not count in {kid}: {}",
            d.cli_ok(&["proc", "logs", kid, &proc_id])
        );
        randoms.push(sh_ok(&d, kid, "head -c 16 /dev/urandom | od -An -tx1"));
        // Its QEMU maps the checkpoint's RAM file: the pages are the host's page cache, shared.
        let qemu = qemu_pid(kid).expect("the fork's QEMU");
        let maps = std::fs::read_to_string(format!("/proc/{qemu}/maps")).unwrap();
        assert!(maps.contains(&format!("checkpoints/{warm}/processes/ram")), "fork {kid} does not map the RAM file");
        sh_ok(&d, kid, &format!("echo {i} > /root/mine"));
    }
    assert_eq!(sh_ok(&d, &kids[1], "cat /root/mine"), "1\n", "the forks' disks are their own");
    let mut distinct = randoms.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), randoms.len(), "copies of one snapshot read the same random bytes: {randoms:?}");
    // A warm fork's checkpoint holds what changed since the warm checkpoint.
    let kid_ck = d.cli_ok(&["checkpoint", &kids[0]]).trim().to_string();
    let info: serde_json::Value =
        serde_json::from_str(&d.cli_ok(&["checkpoint", "inspect", &kid_ck, "--json"])).unwrap();
    assert_eq!(info["changed_paths"], 1, "only /root/mine: {info}");
    for kid in &kids {
        d.cli_ok(&["rm", "-f", kid]);
        assert_released(&d, kid);
    }

    // Rollback: to a checkpoint (a fresh disk on its chain: a stopped microVM
    // has none until it boots, and archives so), then to the warm one (its VM:
    // the processes and the RAM come back too).
    d.cli_ok(&["stop", &id]);
    d.cli_ok(&["restore", &id, "--to", "vm-ck"]);
    assert!(!d.state(&format!("sandboxes/{id}/disk.img")).exists(), "the rolled-back disk is still there");
    d.cli_ok(&["archive", &id]);
    d.cli_ok(&["start", &id]);
    assert_eq!(
        sh_ok(&d, &id, "cat /srv/b /root/note; ls /root/after /root/warm /dev/shm/mem 2>&1 | grep -c 'No such'"),
        "two\nkept\n3\n",
        "rolled back to vm-ck"
    );
    d.cli_ok(&["restore", &id, "--to", "vm-warm"]);
    assert_eq!(
        sh_ok(&d, &id, "cat /root/warm /dev/shm/mem; cat /run/strata/sandbox-id"),
        format!("warm\nheld in RAM\n{id}\n")
    );
    assert!(
        common::wait_until(30, || last_tick(&d, &id, &proc_id) > 3),
        "the warm checkpoint's counter does not count after the rollback"
    );
    // Standby, archived, and resumed on access: the same process counts on.
    d.cli_ok(&["standby", &id]);
    d.cli_ok(&["archive", &id]);
    let before = last_tick(&d, &id, &proc_id);
    assert_eq!(sh_ok(&d, &id, "cat /root/warm"), "warm\n", "resumed from the archive on access");
    assert!(common::wait_until(30, || last_tick(&d, &id, &proc_id) > before + 2), "the counter did not go on");
    d.cli_ok(&["proc", "kill", &id, &proc_id, "--signal", "KILL"]);

    // A damaged VM snapshot is refused at the resume (the sandbox goes to
    // `error`, its files kept), and a start boots a fresh guest on its disk.
    d.cli_ok(&["standby", &id]);
    let image = d.state(&format!("sandboxes/{id}/standby"));
    let state_file = image.join("vm.state");
    let mut bytes = std::fs::read(&state_file).expect("the VM's device state in the standby image");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&state_file, bytes).unwrap();
    let out = d.cli(&["resume", &id]);
    assert!(!out.status.success(), "a damaged snapshot was resumed");
    assert!(stderr(&out).contains("corrupt") && stderr(&out).contains("vm.state"), "{}", stderr(&out));
    let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", &id, "--json"])).unwrap();
    assert_eq!(
        (info["state"].as_str(), info["state_reason"].as_str()),
        (Some("error"), Some("standby_image_invalid")),
        "{info}"
    );
    assert!(image.exists() && !qemu_runs(&id), "the image is kept, no QEMU left");
    d.cli_ok(&["start", &id]);
    assert_eq!(sh_ok(&d, &id, "cat /root/warm"), "warm\n", "the disk was kept");

    // Forks of the checkpoint are microVMs with its files and identities of their own.
    let kids: Vec<String> = d.cli_ok(&["fork", &ck, "-n", "2"]).split_whitespace().map(str::to_string).collect();
    assert_eq!(kids.len(), 2);
    for kid in &kids {
        let seen = sh_ok(&d, kid, "cat /srv/b /root/note; test -e /etc/group || echo gone; test -e /root/after || echo new; cat /run/strata/generation; hostname");
        assert!(seen.starts_with("two\nkept\ngone\nnew\n1\nvm-"), "fork {kid}: {seen}");
        d.cli_ok(&["rm", "-f", kid]);
        assert_released(&d, kid);
    }

    // Last (the guest is spent after them): a memory bomb and a fork bomb stay inside the guest; the host and another sandbox keep working.
    let _ = d.cli(&["exec", "--timeout", "20s", &id, "--", "sh", "-c", "x=$(head -c 400m /dev/zero | tr '\\0' a)"]);
    let _ = d.cli(&["exec", "--timeout", "10s", &id, "--", "sh", "-c", "b() { b | b & }; b"]);
    assert_eq!(sh_ok(&d, &canary, "echo alive"), "alive\n");
    d.cli_ok(&["rm", "-f", &id]);
    assert_released(&d, &id);
    d.cli_ok(&["rm", "-f", &canary]);
}

#[test]
fn a_guest_that_cannot_boot_fails_with_its_console_and_leaves_nothing() {
    require_microvm!();
    // A kernel file QEMU cannot boot: the create fails at once, saying why.
    let assets = tempfile::tempdir().unwrap();
    let real = strata_runtime::microvm::assets::assets_dir();
    std::fs::create_dir(assets.path().join("modules")).unwrap();
    for f in ["kernel-version", "modules/order"] {
        std::fs::copy(real.join(f), assets.path().join(f)).unwrap();
    }
    for m in std::fs::read_to_string(real.join("modules/order")).unwrap().lines().filter(|l| !l.is_empty()) {
        std::fs::copy(real.join("modules").join(m), assets.path().join("modules").join(m)).unwrap();
    }
    std::fs::write(assets.path().join("vmlinuz"), vec![0u8; 1 << 20]).unwrap();
    let d = TestDaemon::start_with_env(&[("STRATA_MICROVM_ASSETS", assets.path().to_str().unwrap())]);
    d.import_busybox();
    let out = d.cli(&["create", "busybox", "--isolation", "microvm", "--network", "none", "--name", "broken"]);
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(stderr(&out).contains("QEMU exited"), "{}", stderr(&out));
    let listed = d.cli_ok(&["ps", "--json"]);
    assert!(!listed.contains("broken"), "a failed boot keeps no sandbox: {listed}");
    assert!(
        std::fs::read_dir(d.state("run/microvm")).map(|r| r.count()).unwrap_or(0) == 0,
        "a failed boot leaves no run directory"
    );
    assert!(!std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        let c = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        String::from_utf8_lossy(&c).contains(assets.path().to_str().unwrap())
    }));
}
