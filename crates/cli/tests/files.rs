//! File transfer and file operations, confined to the sandbox root.

mod common;

use common::TestDaemon;
use strata_api::{ErrorCode, FileKind};

#[test]
fn cp_and_file_api_roundtrip() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[]);
    roundtrip(&d, &id);
    let c = d.client();
    // Files of a stopped sandbox: the call starts it again (resume on access) and is served.
    d.cli_ok(&["stop", &id]);
    let st = common::rt().block_on(c.stat(&id, "/bin/sh")).unwrap();
    assert_eq!(st.kind, FileKind::Symlink);
    assert_eq!(common::rt().block_on(c.get_sandbox(&id)).unwrap().state, strata_api::SandboxState::Running);
    // Files of a destroyed sandbox: 404.
    d.cli_ok(&["rm", "-f", &id]);
    let e = common::rt().block_on(c.stat(&id, "/")).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::SandboxNotFound));
}

#[test]
fn the_file_api_reaches_a_microvm_s_files_through_its_guest() {
    require_microvm!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&["--isolation", "microvm", "--network", "none"]);
    roundtrip(&d, &id);
    let c = d.client();
    common::rt().block_on(async {
        // The same refusals as on the other tiers: kernel interfaces and special files are not served.
        for (path, code) in [
            ("/proc/self/status", ErrorCode::PseudoFilesystem),
            ("/dev/null", ErrorCode::SpecialFile),
            ("/nowhere", ErrorCode::FileNotFound),
            ("../etc/passwd", ErrorCode::BadRequest),
        ] {
            let e = c.download(&id, path, false).await.unwrap_err();
            assert_eq!(e.code(), Some(code), "{path}: {e}");
        }
        // A broken tar keeps nothing.
        let e = c.upload(&id, "/srv/broken", bytes::Bytes::from_static(&[7u8; 700]), None, true).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidArchive), "{e}");
        assert_eq!(c.stat(&id, "/srv/broken").await.unwrap_err().code(), Some(ErrorCode::FileNotFound));
    });
    // What was uploaded is in the guest's writable layer: a checkpoint carries it.
    d.cli_ok(&["checkpoint", &id, "--name", "files"]);
    let kid = d.cli_ok(&["fork", "files", "-n", "1"]).trim().to_string();
    assert_eq!(d.cli_ok(&["exec", &kid, "--", "cat", "/srv/tree/link"]), "deep");
    d.cli_ok(&["rm", "-f", &kid, &id]);
    // A template built FROM that checkpoint builds in a microVM: its COPY goes in through the guest.
    let ctx = tempfile::tempdir().unwrap();
    std::fs::write(ctx.path().join("data.txt"), "from the context\n").unwrap();
    let file = common::write_file(ctx.path(), "Stratafile", b"FROM files\nCOPY data.txt /srv/copied.txt\n");
    let out = d.cli(&["template", "build", "vm-app", "-f", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let made = d.cli_ok(&["create", "vm-app"]).trim().to_string();
    let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", &made, "--json"])).unwrap();
    assert_eq!(info["runtime"], "microvm", "{info}");
    assert_eq!(d.cli_ok(&["exec", &made, "--", "cat", "/srv/copied.txt", "/srv/tree/link"]), "from the context\ndeep");
    // Directory watches run in the guest (the host's kernel never sees its writes), with the same events.
    common::rt().block_on(async {
        let (status, body) = api_err(c.watch_dir(&made, "/srv/copied.txt", false).await, "watch a file");
        assert_eq!(status, 400, "{body:?}");
        let (status, _) = api_err(c.watch_dir(&made, "/nope", false).await, "watch nothing");
        assert_eq!(status, 404);
        watch_reports_changes_in_order(&d, &c, &made).await;
    });
    d.cli_ok(&["rm", "-f", &made]);
}

/// A recursive watch of `/w` in running sandbox `id` reports every change,
/// in order, none missed (directories made later are watched too; an upload
/// shows as the sandbox sees its result), and ends saying why when the
/// sandbox stops.
async fn watch_reports_changes_in_order(d: &TestDaemon, c: &strata_client::Client, id: &str) {
    d.cli_ok(&["exec", id, "--", "mkdir", "-p", "/w/sub"]);
    let mut w = c.watch_dir(id, "/w", true).await.unwrap();
    let script = "echo a > /w/a; mv /w/a /w/b; chmod 600 /w/b; echo s > /w/sub/s; rm /w/b; \
                  for i in 1 2 3 4 5 6 7 8 9 10; do touch /w/f$i; rm /w/f$i; done; mkdir /w/new; sleep 0.3; touch /w/new/n";
    d.cli_ok(&["exec", id, "--", "sh", "-c", script]);
    c.upload(id, "/w/up.txt", bytes::Bytes::from_static(b"uploaded"), None, false).await.unwrap();
    let mut seen = Vec::new();
    let want_last = ("write".to_string(), "up.txt".to_string());
    while !seen.contains(&want_last) {
        let line = tokio::time::timeout(std::time::Duration::from_secs(30), w.next()).await;
        match line.expect("an event within 30 s").unwrap().expect("the watch goes on") {
            strata_api::WatchLine::Event(ev) => seen.push((format!("{:?}", ev.op).to_lowercase(), ev.name)),
            strata_api::WatchLine::Ended { error } => panic!("the watch ended: {error:?} after {seen:?}"),
        }
    }
    let pos = |op: &str, name: &str| {
        seen.iter().position(|(o, n)| o == op && n == name).unwrap_or_else(|| panic!("{op} {name} in {seen:?}"))
    };
    assert!(pos("create", "a") < pos("write", "a"));
    assert!(pos("write", "a") < pos("rename", "a"));
    assert!(pos("rename", "a") < pos("create", "b"));
    assert!(pos("create", "b") < pos("chmod", "b"));
    assert!(pos("chmod", "b") < pos("create", "sub/s"));
    assert!(pos("create", "sub/s") < pos("remove", "b"));
    for i in 1..=10 {
        assert!(pos("create", &format!("f{i}")) < pos("remove", &format!("f{i}")));
    }
    assert!(pos("create", "new") < pos("create", "new/n"));
    assert!(pos("create", "new/n") < pos("create", "up.txt"));
    assert!(pos("create", "up.txt") < pos("write", "up.txt"));
    assert!(!seen.iter().any(|(_, n)| n.contains(".strata-")), "the upload's temp file is not shown: {seen:?}");

    // The watch ends, and says so, when the sandbox stops.
    d.cli_ok(&["stop", id]);
    loop {
        let line = tokio::time::timeout(std::time::Duration::from_secs(30), w.next()).await;
        match line.expect("the end within 30 s").unwrap() {
            Some(strata_api::WatchLine::Event(_)) => continue,
            Some(strata_api::WatchLine::Ended { error }) => {
                assert_eq!(error.code, ErrorCode::FileNotFound, "{error:?}");
                assert!(error.message.contains("is gone"), "{error:?}");
                break;
            }
            None => panic!("the stream ended without saying why"),
        }
    }
}

/// Files both ways (cp, tar trees, the file API's operations) in sandbox `id`.
fn roundtrip(d: &TestDaemon, id: &str) {
    let work = tempfile::tempdir().unwrap();
    let bin: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let local = common::write_file(work.path(), "blob.bin", &bin);
    d.cli_ok(&["cp", local.to_str().unwrap(), &format!("{id}:/root/blob.bin")]);
    d.cli_ok(&["cp", local.to_str().unwrap(), &format!("{id}:/tmp/")]);
    assert_eq!(
        d.cli_ok(&["exec", id, "--", "sh", "-c", "wc -c < /root/blob.bin; wc -c < /tmp/blob.bin"]),
        "300000\n300000\n"
    );
    let back = work.path().join("back.bin");
    d.cli_ok(&["cp", &format!("{id}:/root/blob.bin"), back.to_str().unwrap()]);
    assert_eq!(std::fs::read(&back).unwrap(), bin);
    // Directory trees in both directions (tar streams).
    std::fs::create_dir_all(work.path().join("tree/a/b")).unwrap();
    std::fs::write(work.path().join("tree/a/b/c.txt"), "deep").unwrap();
    std::os::unix::fs::symlink("a/b/c.txt", work.path().join("tree/link")).unwrap();
    d.cli_ok(&["cp", work.path().join("tree").to_str().unwrap(), &format!("{id}:/srv/tree")]);
    assert_eq!(d.cli_ok(&["exec", id, "--", "cat", "/srv/tree/link"]), "deep");
    let out = work.path().join("out");
    d.cli_ok(&["cp", &format!("{id}:/srv/tree"), out.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(out.join("a/b/c.txt")).unwrap(), "deep");
    assert_eq!(std::fs::read_link(out.join("link")).unwrap().to_str().unwrap(), "a/b/c.txt");

    let c = d.client();
    common::rt().block_on(async {
        c.mkdir(id, "/work/x/y", true).await.unwrap();
        c.upload(id, "/work/x/y/f", bytes::Bytes::from_static(b"hello"), Some(0o600), false).await.unwrap();
        let st = c.stat(id, "/work/x/y/f").await.unwrap();
        assert_eq!((st.kind, st.size, st.mode), (FileKind::File, 5, 0o600));
        let names: Vec<String> = c.list_dir(id, "/work/x/y").await.unwrap().into_iter().map(|f| f.name).collect();
        assert_eq!(names, ["f"]);
        c.move_path(id, "/work/x/y/f", "/work/g").await.unwrap();
        assert_eq!(&c.download(id, "/work/g", false).await.unwrap()[..], b"hello");
        assert_eq!(c.stat(id, "/work/x/y/f").await.unwrap_err().code(), Some(ErrorCode::FileNotFound));
        let e = c.remove_path(id, "/work", false).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::BadRequest), "non-empty directory needs recursive: {e}");
        c.remove_path(id, "/work", true).await.unwrap();
        assert_eq!(c.stat(id, "/work").await.unwrap_err().code(), Some(ErrorCode::FileNotFound));
        // Symlinks are described, not followed, by stat.
        c.upload(id, "/tmp/t", bytes::Bytes::from_static(b"t"), None, false).await.unwrap();
        let st = c.stat(id, "/bin/sh").await.unwrap();
        assert_eq!(st.kind, FileKind::Symlink);
        assert!(st.link_target.is_some());
    });
}

#[test]
fn paths_and_symlinks_cannot_reach_the_host() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[]);
    let work = tempfile::tempdir().unwrap();
    let canary = work.path().join("canary");
    std::fs::write(&canary, "host secret").unwrap();
    let local = common::write_file(work.path(), "payload", b"owned");
    let depth = "../".repeat(12);
    // Relative symlinks that climb out, absolute symlinks, and .. in the request path.
    d.cli_ok(&[
        "exec",
        &id,
        "--",
        "ln",
        "-s",
        &format!("{depth}{}", work.path().display().to_string().trim_start_matches('/')),
        "/tmp/up",
    ]);
    d.cli_ok(&["exec", &id, "--", "ln", "-s", &work.path().display().to_string(), "/tmp/abs"]);
    let c = d.client();
    common::rt().block_on(async {
        for path in ["/../../etc/strata-escape", "/tmp/up/payload", "/tmp/up/canary"] {
            let e = c.upload(&id, path, bytes::Bytes::from_static(b"owned"), None, false).await.unwrap_err();
            assert_eq!(e.code(), Some(ErrorCode::PathEscape), "{path}: {e}");
        }
        let e = c.download(&id, "/tmp/up/canary", false).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::PathEscape), "{e}");
        // An absolute symlink resolves inside the sandbox: the host path does not exist there.
        let e = c.download(&id, "/tmp/abs/canary", false).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::FileNotFound), "{e}");
        c.upload(&id, "/tmp/abs/payload", bytes::Bytes::from_static(b"inside"), None, false).await.unwrap_err();
        let e = c.upload(&id, "relative/path", bytes::Bytes::new(), None, false).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::BadRequest));
        // Tar uploads with escaping entries are refused too.
        let evil = common::raw_tar(b"../../../../etc/strata-tar-escape", tar::EntryType::Regular, None, b"x");
        let e = c.upload(&id, "/tmp", bytes::Bytes::from(evil), None, true).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::PathEscape), "{e}");
    });
    let out = d.cli(&["cp", local.to_str().unwrap(), &format!("{id}:/tmp/up/canary")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(common::stderr(&out).contains("escapes the sandbox root"), "{}", common::stderr(&out));
    assert_eq!(std::fs::read_to_string(&canary).unwrap(), "host secret", "host file untouched");
    assert!(!work.path().join("payload.strata").exists());
    assert!(
        !std::path::Path::new("/etc/strata-escape").exists()
            && !std::path::Path::new("/etc/strata-tar-escape").exists()
    );
}

#[test]
fn special_files_are_not_served() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[]);
    d.cli_ok(&["exec", &id, "--", "mkfifo", "/tmp/fifo"]);
    let c = d.client();
    common::rt().block_on(async {
        // A FIFO would block a reader forever; the daemon refuses it at once.
        let e = tokio::time::timeout(std::time::Duration::from_secs(10), c.download(&id, "/tmp/fifo", false))
            .await
            .expect("no hang")
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::SpecialFile), "{e}");
        let e = c.download(&id, "/tmp", false).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::BadRequest), "directories need tar: {e}");
        let tar = c.download(&id, "/tmp", true).await.unwrap();
        assert!(!tar.is_empty());
    });
}

fn api_err(r: Result<impl Sized, strata_client::ClientError>, what: &str) -> (u16, strata_api::ApiErrorBody) {
    match r {
        Err(strata_client::ClientError::Api { status, body }) => (status, body),
        Err(e) => panic!("{what}: not an API error: {e}"),
        Ok(_) => panic!("{what}: succeeded"),
    }
}

/// The daemon opens sandbox paths through /proc/<init>/root: without care it
/// would read kernel pseudo-filesystems with its own privileges (the host's
/// kernel addresses in /proc/kallsyms, the host's kernel log in /proc/kmsg).
/// Every file operation refuses them, and device nodes, FIFOs and sockets,
/// with a 403 naming what was refused — never a 500, never the host's view.
#[test]
fn pseudo_filesystems_and_special_files_are_refused() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[]);
    d.cli_ok(&["exec", &id, "--", "sh", "-c", "mkfifo /tmp/fifo && mkdir -p /srv && echo data > /srv/file"]);
    // Inside, the sandbox's root reads the kernel's addresses as zeros.
    let inside = d.cli_ok(&["exec", &id, "--", "head", "-n", "1", "/proc/kallsyms"]);
    assert!(inside.starts_with("0000000000000000"), "{inside}");
    let c = d.client();
    let pseudo = |r: Result<(), strata_client::ClientError>, what: &str| {
        let (status, body) = api_err(r, what);
        assert_eq!((status, body.code), (403, ErrorCode::PseudoFilesystem), "{what}: {}", body.message);
        assert!(body.message.contains("pseudo-filesystem"), "{what}: {}", body.message);
    };
    let special = |r: Result<(), strata_client::ClientError>, what: &str| {
        let (status, body) = api_err(r, what);
        assert_eq!((status, body.code), (403, ErrorCode::SpecialFile), "{what}: {}", body.message);
    };
    common::rt().block_on(async {
        for path in [
            "/proc/kallsyms",
            "/proc/kmsg",
            "/proc/1/environ",
            "/proc/sys/kernel/hostname",
            "/sys/kernel/notes",
            "/sys/fs/cgroup",
            "/dev/pts/ptmx",
            "/dev/mqueue",
            "/proc",
            "/sys",
        ] {
            pseudo(c.download(&id, path, false).await.map(drop), &format!("GET {path}"));
            pseudo(c.download(&id, path, true).await.map(drop), &format!("GET tar {path}"));
            pseudo(c.stat(&id, path).await.map(drop), &format!("stat {path}"));
            pseudo(c.list_dir(&id, path).await.map(drop), &format!("list {path}"));
            pseudo(c.remove_path(&id, path, true).await, &format!("remove {path}"));
            pseudo(c.move_path(&id, path, "/tmp/moved").await, &format!("move {path}"));
        }
        for path in [
            "/proc/strata-upload",
            "/proc/sys/kernel/strata-upload",
            "/sys/kernel/strata-upload",
            "/dev/pts/strata-upload",
        ] {
            pseudo(c.upload(&id, path, bytes::Bytes::from_static(b"x"), None, false).await, &format!("PUT {path}"));
            pseudo(
                c.upload(&id, path, bytes::Bytes::from(common::tar_of(&[("f", b"x")])), None, true).await,
                &format!("PUT tar {path}"),
            );
            pseudo(c.mkdir(&id, path, true).await, &format!("mkdir {path}"));
            pseudo(c.move_path(&id, "/srv/file", path).await, &format!("move to {path}"));
        }
        for path in ["/dev/null", "/dev/zero", "/tmp/fifo"] {
            special(c.download(&id, path, false).await.map(drop), &format!("GET {path}"));
            special(c.download(&id, path, true).await.map(drop), &format!("GET tar {path}"));
            special(c.upload(&id, path, bytes::Bytes::from_static(b"x"), None, false).await, &format!("PUT {path}"));
        }
        // Listing and stat of the sandbox's own directories still work, and a
        // tar of / leaves the pseudo-filesystems out.
        assert_eq!(c.stat(&id, "/srv/file").await.unwrap().size, 5);
        let names: Vec<String> = c.list_dir(&id, "/").await.unwrap().into_iter().map(|f| f.name).collect();
        assert!(names.iter().any(|n| n == "proc") && names.iter().any(|n| n == "srv"), "{names:?}");
        let tar = c.download(&id, "/", true).await.unwrap();
        let names: Vec<String> = tar::Archive::new(&tar[..])
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().any(|n| n.trim_start_matches("./") == "srv/file"), "{names:?}");
        let leaked: Vec<&String> = names
            .iter()
            .filter(|n| {
                ["proc/", "sys/", "dev/pts/", "dev/mqueue/"].iter().any(|p| n.trim_start_matches("./").starts_with(p))
            })
            .collect();
        assert!(leaked.is_empty(), "a tar of / holds pseudo-filesystem entries: {leaked:?}");
    });
    assert!(d.cli_ok(&["exec", &id, "--", "cat", "/srv/file"]) == "data\n", "nothing was moved");
}

fn entry_tar(name: &str, kind: tar::EntryType, link: Option<&str>, data: &[u8]) -> Vec<u8> {
    common::raw_tar(name.as_bytes(), kind, link.map(str::as_bytes), data)
}

/// Files in a sandbox directory, with their contents (`find` + `cat`).
fn tree(d: &TestDaemon, id: &str, dir: &str) -> String {
    d.cli_ok(&[
        "exec",
        id,
        "--",
        "sh",
        "-c",
        &format!("cd {dir} && find . | sort && find . -type f | sort | xargs cat"),
    ])
}

/// Tar uploads: hardlinks to files of the same upload are made (inside the
/// root); hardlinks to anything else and device, FIFO and other special
/// entries are 400s naming the entry and its type; a refused upload is
/// rolled back: what it added is gone and what it replaced is back.
#[test]
fn tar_uploads_take_hardlinks_and_refuse_special_entries() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[]);
    let c = d.client();
    common::rt().block_on(async {
        let tar = common::concat_tars(&[
            entry_tar("a/data", tar::EntryType::Regular, None, b"shared"),
            entry_tar("a/link", tar::EntryType::Link, Some("a/data"), b""),
            entry_tar("./b/second", tar::EntryType::Link, Some("./a/data"), b""),
        ]);
        c.upload(&id, "/srv/t", bytes::Bytes::from(tar), None, true).await.unwrap();
    });
    let inodes = d.cli_ok(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "stat -c %i /srv/t/a/data /srv/t/a/link /srv/t/b/second | sort -u | wc -l; cat /srv/t/b/second",
    ]);
    assert_eq!(inodes, "1\nshared", "one file, three names");

    d.cli_ok(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "mkdir -p /srv/u/good && echo old > /srv/u/good/file && echo keep > /srv/u/keep",
    ]);
    let before = tree(&d, &id, "/srv/u");
    let good = || {
        vec![
            entry_tar("good/file", tar::EntryType::Regular, None, b"new"),
            entry_tar("good/new/added", tar::EntryType::Regular, None, b"added"),
        ]
    };
    common::rt().block_on(async {
        let cases: Vec<(Vec<u8>, &str, ErrorCode, &str)> = vec![
            (entry_tar("dev0", tar::EntryType::Char, None, b""), "dev0", ErrorCode::InvalidArchive, "character device"),
            (entry_tar("dev1", tar::EntryType::Block, None, b""), "dev1", ErrorCode::InvalidArchive, "block device"),
            (entry_tar("pipe", tar::EntryType::Fifo, None, b""), "pipe", ErrorCode::InvalidArchive, "FIFO"),
            (entry_tar("sparse", tar::EntryType::GNUSparse, None, b""), "sparse", ErrorCode::InvalidArchive, "sparse"),
            // A hardlink to a file of the sandbox that the upload did not bring.
            (
                entry_tar("steal", tar::EntryType::Link, Some("keep"), b""),
                "steal",
                ErrorCode::InvalidArchive,
                "not a file of this upload",
            ),
            (entry_tar("up", tar::EntryType::Link, Some("../../etc/passwd"), b""), "up", ErrorCode::PathEscape, ""),
            (entry_tar("../escape", tar::EntryType::Regular, None, b"x"), "../escape", ErrorCode::PathEscape, ""),
        ];
        for (bad, name, code, kind) in cases {
            let mut parts = good();
            parts.push(bad);
            let (status, body) = api_err(
                c.upload(&id, "/srv/u", bytes::Bytes::from(common::concat_tars(&parts)), None, true).await,
                name,
            );
            assert_eq!((status, body.code), (400, code), "{name}: {}", body.message);
            assert!(body.message.contains(name) && body.message.contains(kind), "{name}: {}", body.message);
        }
        // A stream cut short in the middle of an entry is refused the same way.
        let mut cut = common::concat_tars(&good());
        cut.truncate(cut.len() - 1024); // no end marker: the entry below is cut inside its data
        cut.extend_from_slice(&entry_tar("late", tar::EntryType::Regular, None, &[7u8; 4096])[..1024]);
        let (status, body) = api_err(c.upload(&id, "/srv/u", bytes::Bytes::from(cut), None, true).await, "truncated");
        assert_eq!((status, body.code), (400, ErrorCode::InvalidArchive), "{}", body.message);
    });
    assert_eq!(tree(&d, &id, "/srv/u"), before, "refused uploads left nothing behind and restored what they replaced");
}

/// Seen from the daemon (another mount namespace), a sandbox's mount points
/// are ordinary names: unlinking or renaming one detaches the mount inside
/// the sandbox, which no process inside could do (EBUSY). Through the file
/// API that removed /run/strata (the read-only init binary and its tmpfs) so
/// a caller's own file became the helper every exec starts with the daemon's
/// privileges. The file API refuses to remove, rename or replace mount points.
#[test]
fn mount_points_of_the_sandbox_are_not_removed_renamed_or_replaced() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    // A scratch /tmp is a mount point too (by default /tmp is a directory of the root).
    let id = d.create(&["--tmp", "tmpfs"]);
    let mounts = || {
        d.cli_ok(&[
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "cut -d' ' -f5 /proc/self/mountinfo | grep -E '^/(tmp|run/strata|run/strata/init|dev/shm)$' | sort",
        ])
    };
    let before = mounts();
    assert_eq!(before, "/dev/shm\n/run/strata\n/run/strata/init\n/tmp\n");
    d.cli_ok(&["exec", &id, "--", "sh", "-c", "echo f > /srv-file"]);
    let c = d.client();
    let mount_point = |r: Result<(), strata_client::ClientError>, what: &str| {
        let (status, body) = api_err(r, what);
        assert_eq!((status, body.code), (403, ErrorCode::MountPoint), "{what}: {}", body.message);
    };
    common::rt().block_on(async {
        for path in ["/tmp", "/run/strata", "/run/strata/init", "/dev/shm"] {
            mount_point(c.remove_path(&id, path, true).await, &format!("remove {path}"));
            mount_point(c.move_path(&id, path, "/moved").await, &format!("move {path}"));
        }
        mount_point(c.remove_path(&id, "/run", true).await, "remove /run (holds mount points)");
        mount_point(c.move_path(&id, "/srv-file", "/run/strata/init").await, "move onto /run/strata/init");
        mount_point(
            c.upload(&id, "/run/strata/init", bytes::Bytes::from_static(b"#!/bin/sh\n"), Some(0o755), false).await,
            "PUT /run/strata/init",
        );
        let tar = common::tar_of(&[("run/strata/init", b"#!/bin/sh\n")]);
        let (status, body) =
            api_err(c.upload(&id, "/", bytes::Bytes::from(tar), None, true).await, "tar onto /run/strata/init");
        assert_eq!((status, body.code), (400, ErrorCode::InvalidArchive), "{}", body.message);
        assert!(body.message.contains("mount point"), "{}", body.message);
    });
    assert_eq!(mounts(), before, "every mount of the sandbox is still there");
    assert_eq!(d.cli_ok(&["exec", &id, "--", "echo", "still runs"]), "still runs\n");
}

#[test]
fn metadata_symlinks_and_directory_watches() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[]);
    d.cli_ok(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "mkdir -p /w/sub /w/dir && echo t > /w/t && ln -s t /w/link && ln -s /nowhere /w/dangling",
    ]);
    let c = d.client();
    common::rt().block_on(async {
        // A symlink is described with where it leads, inside the sandbox.
        let link = c.stat(&id, "/w/link").await.unwrap();
        assert_eq!(link.kind, FileKind::Symlink);
        assert_eq!(link.link_target.as_deref(), Some("t"));
        let end = link.link_resolved.unwrap();
        assert_eq!((end.path.as_str(), end.kind), ("/w/t", Some(FileKind::File)));
        let dangling = c.stat(&id, "/w/dangling").await.unwrap().link_resolved.unwrap();
        assert_eq!((dangling.path.as_str(), dangling.kind), ("/nowhere", None));

        watch_reports_changes_in_order(&d, &c, &id).await;
        // A watch of a file is refused with the reason (the sandbox is started again for it, as any file call does).
        let (status, body) = api_err(c.watch_dir(&id, "/w/t", false).await, "watch a file");
        assert_eq!(status, 400, "{body:?}");
        assert!(body.message.contains("/w/t"), "{body:?}");
        let (status, _) = api_err(c.watch_dir(&id, "/nope", false).await, "watch nothing");
        assert_eq!(status, 404);
    });
}
