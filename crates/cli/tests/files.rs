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
    let work = tempfile::tempdir().unwrap();
    let bin: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let local = common::write_file(work.path(), "blob.bin", &bin);
    d.cli_ok(&["cp", local.to_str().unwrap(), &format!("{id}:/root/blob.bin")]);
    d.cli_ok(&["cp", local.to_str().unwrap(), &format!("{id}:/tmp/")]);
    assert_eq!(d.cli_ok(&["exec", &id, "--", "sh", "-c", "wc -c < /root/blob.bin; wc -c < /tmp/blob.bin"]), "300000\n300000\n");
    let back = work.path().join("back.bin");
    d.cli_ok(&["cp", &format!("{id}:/root/blob.bin"), back.to_str().unwrap()]);
    assert_eq!(std::fs::read(&back).unwrap(), bin);
    // Directory trees in both directions (tar streams).
    std::fs::create_dir_all(work.path().join("tree/a/b")).unwrap();
    std::fs::write(work.path().join("tree/a/b/c.txt"), "deep").unwrap();
    std::os::unix::fs::symlink("a/b/c.txt", work.path().join("tree/link")).unwrap();
    d.cli_ok(&["cp", work.path().join("tree").to_str().unwrap(), &format!("{id}:/srv/tree")]);
    assert_eq!(d.cli_ok(&["exec", &id, "--", "cat", "/srv/tree/link"]), "deep");
    let out = work.path().join("out");
    d.cli_ok(&["cp", &format!("{id}:/srv/tree"), out.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(out.join("a/b/c.txt")).unwrap(), "deep");
    assert_eq!(std::fs::read_link(out.join("link")).unwrap().to_str().unwrap(), "a/b/c.txt");

    let c = d.client();
    common::rt().block_on(async {
        c.mkdir(&id, "/work/x/y", true).await.unwrap();
        c.upload(&id, "/work/x/y/f", bytes::Bytes::from_static(b"hello"), Some(0o600), false).await.unwrap();
        let st = c.stat(&id, "/work/x/y/f").await.unwrap();
        assert_eq!((st.kind, st.size, st.mode), (FileKind::File, 5, 0o600));
        let names: Vec<String> = c.list_dir(&id, "/work/x/y").await.unwrap().into_iter().map(|f| f.name).collect();
        assert_eq!(names, ["f"]);
        c.move_path(&id, "/work/x/y/f", "/work/g").await.unwrap();
        assert_eq!(&c.download(&id, "/work/g", false).await.unwrap()[..], b"hello");
        assert_eq!(c.stat(&id, "/work/x/y/f").await.unwrap_err().code(), Some(ErrorCode::FileNotFound));
        let e = c.remove_path(&id, "/work", false).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::BadRequest), "non-empty directory needs recursive: {e}");
        c.remove_path(&id, "/work", true).await.unwrap();
        assert_eq!(c.stat(&id, "/work").await.unwrap_err().code(), Some(ErrorCode::FileNotFound));
        // Symlinks are described, not followed, by stat.
        c.upload(&id, "/tmp/t", bytes::Bytes::from_static(b"t"), None, false).await.unwrap();
        let st = c.stat(&id, "/bin/sh").await.unwrap();
        assert_eq!(st.kind, FileKind::Symlink);
        assert!(st.link_target.is_some());
    });
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
    d.cli_ok(&["exec", &id, "--", "ln", "-s", &format!("{depth}{}", work.path().display().to_string().trim_start_matches('/')), "/tmp/up"]);
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
    assert!(!std::path::Path::new("/etc/strata-escape").exists() && !std::path::Path::new("/etc/strata-tar-escape").exists());
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
        let e = tokio::time::timeout(std::time::Duration::from_secs(10), c.download(&id, "/tmp/fifo", false)).await.expect("no hang").unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{e}");
        let e = c.download(&id, "/tmp", false).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::BadRequest), "directories need tar: {e}");
        let tar = c.download(&id, "/tmp", true).await.unwrap();
        assert!(!tar.is_empty());
    });
}
