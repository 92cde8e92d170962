//! Image import from every source kind (also archives written by skopeo and podman), deduplication, hostile archives and removal.

mod common;

use common::TestDaemon;
use strata_api::{ErrorCode, ImageConfig, ImportImageRequest};

fn import_json(d: &TestDaemon, src: &std::path::Path, name: &str) -> serde_json::Value {
    let out = d.cli_ok(&["image", "import", src.to_str().unwrap(), "--name", name, "--json"]);
    serde_json::from_str(&out).unwrap()
}

#[test]
fn every_source_kind_imports_and_identical_content_is_stored_once() {
    require_host!();
    let d = TestDaemon::start();
    let imgs = common::images_dir();
    let work = tempfile::tempdir().unwrap();

    let first = import_json(&d, &imgs.join("busybox-rootfs.tar"), "bb-tar");
    assert_eq!(first["image"]["source_kind"], "rootfs-tar");
    assert_eq!(first["layers_new"], 1);
    assert!(first["bytes_stored"].as_u64().unwrap() > 1_000_000);
    let digest = first["image"]["layers"][0]["digest"].as_str().unwrap().to_string();
    assert!(d.state(&format!("layers/sha256/{}/fs/bin/busybox", digest.trim_start_matches("sha256:"))).exists());

    // The same bytes again (plain and gzip): nothing new is stored.
    for (src, name) in [(imgs.join("busybox-rootfs.tar"), "bb-again"), (imgs.join("busybox-rootfs.tar.gz"), "bb-gz")] {
        let r = import_json(&d, &src, name);
        assert_eq!(r["layers_new"], 0, "{name}: {r}");
        assert_eq!(r["bytes_stored"], 0, "{name}");
        assert_eq!(r["image"]["layers"][0]["digest"], digest.as_str());
    }

    // OCI layout and docker-save archive made from the same rootfs by the project's own code.
    let cfg = ImageConfig {
        env: vec!["PATH=/bin:/sbin".into(), "GREETING=hi".into()],
        cmd: vec!["sh".into()],
        working_dir: Some("/tmp".into()),
        ..Default::default()
    };
    let oci = work.path().join("oci");
    strata_image::write_oci_layout(&imgs.join("busybox-rootfs.tar"), &oci, &cfg).unwrap();
    let r = import_json(&d, &oci, "bb-oci");
    assert_eq!(r["image"]["source_kind"], "oci-layout");
    assert_eq!(r["image"]["config"]["working_dir"], "/tmp");
    assert_eq!(r["image"]["layers"][0]["digest"], digest.as_str(), "same diff id as the plain tar");
    assert_eq!(r["bytes_stored"], 0);
    let docker = work.path().join("docker.tar");
    strata_image::write_docker_archive(&imgs.join("busybox-rootfs.tar"), &docker, &cfg, Some("busybox:test")).unwrap();
    let r = import_json(&d, &docker, "bb-docker");
    assert_eq!(r["image"]["source_kind"], "docker-archive");

    // A rootfs directory.
    let r = import_json(&d, &imgs.join("busybox-rootfs"), "bb-dir");
    assert_eq!(r["image"]["source_kind"], "rootfs-dir");
    let dir_digest = r["image"]["layers"][0]["digest"].as_str().unwrap().to_string();

    // The image's config reaches processes: env and working directory.
    let id = d.cli_ok(&["create", "bb-oci"]).trim().to_string();
    let out = d.cli_ok(&["exec", &id, "--", "sh", "-c", "echo $GREETING; pwd"]);
    assert_eq!(out, "hi\n/tmp\n");

    let ls: Vec<serde_json::Value> = serde_json::from_str(&d.cli_ok(&["image", "ls", "--json"])).unwrap();
    assert_eq!(ls.len(), 6);
    // In use -> 409 naming the dependents; after the sandbox is gone it can be removed.
    let out = d.cli(&["image", "rm", "bb-oci"]);
    assert!(!out.status.success());
    assert!(common::stderr(&out).contains("in_use"), "{}", common::stderr(&out));
    d.cli_ok(&["rm", "-f", &id]);
    d.cli_ok(&["image", "rm", "bb-oci", "bb-tar", "bb-again", "bb-gz", "bb-docker"]);
    let tar_layer = d.state(&format!("layers/sha256/{}", digest.trim_start_matches("sha256:")));
    assert_eq!(tar_layer.exists(), dir_digest == digest, "a layer lives exactly as long as an image uses it");
    d.cli_ok(&["image", "rm", "bb-dir"]);
    let left: Vec<_> = std::fs::read_dir(d.state("layers/sha256")).unwrap().collect();
    assert!(left.is_empty(), "unreferenced layers are removed with the last image");
}

#[test]
fn hostile_archives_are_rejected_naming_the_entry_and_leave_nothing() {
    require_host!();
    let d = TestDaemon::start();
    let work = tempfile::tempdir().unwrap();
    let ok = common::raw_tar(b"bin/ok", tar::EntryType::Regular, None, b"fine");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "dotdot",
            common::concat_tars(&[ok.clone(), common::raw_tar(b"../escape", tar::EntryType::Regular, None, b"x")]),
            "../escape",
        ),
        ("absolute", common::raw_tar(b"/etc/evil", tar::EntryType::Regular, None, b"x"), "/etc/evil"),
        (
            "symlink-parent",
            common::concat_tars(&[
                common::raw_tar(b"link", tar::EntryType::Symlink, Some(b"/etc"), b""),
                common::raw_tar(b"link/passwd", tar::EntryType::Regular, None, b"x"),
            ]),
            "link/passwd",
        ),
        ("hardlink-out", common::raw_tar(b"hl", tar::EntryType::Link, Some(b"../../etc/shadow"), b""), "hl"),
    ];
    let c = d.client();
    for (name, bytes, entry) in cases {
        let p = common::write_file(work.path(), &format!("{name}.tar"), &bytes);
        let req =
            ImportImageRequest { source: p.display().to_string(), name: name.into(), trusted: false, replace: false };
        let e = common::rt().block_on(c.import_image(&req)).unwrap_err();
        match &e {
            strata_client::ClientError::Api { status, body } => {
                assert_eq!(*status, 400, "{name}: {e}");
                assert_eq!(body.code, ErrorCode::InvalidArchive, "{name}: {e}");
                assert!(body.message.contains(entry), "{name}: message should name {entry:?}: {}", body.message);
            }
            other => panic!("{name}: {other}"),
        }
        assert!(common::rt().block_on(c.get_image(name)).is_err(), "{name} must not be registered");
    }
    assert_eq!(std::fs::read_dir(d.state("layers/sha256")).unwrap().count(), 0, "no layer left behind");
    assert_eq!(std::fs::read_dir(d.state("layers/staging")).unwrap().count(), 0, "no staging left behind");
    // The CLI prints the reason and exits non-zero.
    let p = common::write_file(work.path(), "cli.tar", &common::raw_tar(b"../x", tar::EntryType::Regular, None, b"x"));
    let out = d.cli(&["image", "import", p.to_str().unwrap(), "--name", "cli"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(common::stderr(&out).contains("../x"), "{}", common::stderr(&out));
    // Garbage is not an image.
    let p = common::write_file(work.path(), "garbage.tar", b"this is not a tar archive at all");
    let out = d.cli(&["image", "import", p.to_str().unwrap(), "--name", "garbage"]);
    assert_eq!(out.status.code(), Some(1), "{}", common::stderr(&out));
}

#[test]
fn device_nodes_are_dropped_and_setuid_is_stripped_unless_trusted() {
    require_host!();
    let d = TestDaemon::start();
    let work = tempfile::tempdir().unwrap();
    let mut dev = tar::Header::new_gnu();
    dev.set_path("dev/sda").unwrap();
    dev.set_entry_type(tar::EntryType::Block);
    dev.set_device_major(8).unwrap();
    dev.set_device_minor(0).unwrap();
    dev.set_mode(0o666);
    dev.set_size(0);
    dev.set_uid(0);
    dev.set_gid(0);
    dev.set_mtime(0);
    dev.set_cksum();
    let mut suid = tar::Header::new_gnu();
    suid.set_path("bin/suid").unwrap();
    suid.set_entry_type(tar::EntryType::Regular);
    suid.set_mode(0o4755);
    suid.set_size(2);
    suid.set_uid(0);
    suid.set_gid(0);
    suid.set_mtime(0);
    suid.set_cksum();
    let mut b = tar::Builder::new(Vec::new());
    b.append(&dev, &[][..]).unwrap();
    b.append(&suid, &b"#!"[..]).unwrap();
    let p = common::write_file(work.path(), "special.tar", &b.into_inner().unwrap());
    let r: serde_json::Value =
        serde_json::from_str(&d.cli_ok(&["image", "import", p.to_str().unwrap(), "--name", "special", "--json"]))
            .unwrap();
    let warnings = r["warnings"].to_string();
    assert!(warnings.contains("dev/sda"), "{warnings}");
    let layer = d.state(&format!(
        "layers/sha256/{}/fs",
        r["image"]["layers"][0]["digest"].as_str().unwrap().trim_start_matches("sha256:")
    ));
    assert!(!layer.join("dev/sda").exists());
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(layer.join("bin/suid")).unwrap().permissions());
    assert_eq!(mode & 0o7777, 0o755, "setuid stripped");
}

/// A busybox rootfs with a setuid-root file `bin/suid` (mode 04755), as a tar.
fn rootfs_with_setuid_file() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.append_dir_all(".", common::images_dir().join("busybox-rootfs")).unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_path("bin/suid").unwrap();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o4755);
    h.set_size(10);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_cksum();
    b.append(&h, &b"#!/bin/sh\n"[..]).unwrap();
    b.into_inner().unwrap()
}

fn mode_of(p: &std::path::Path) -> u32 {
    std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).unwrap().permissions()) & 0o7777
}

/// Unpacked layers are keyed by digest *and* unpack policy: an untrusted import
/// of bytes first imported `--trusted` unpacks them again (setuid stripped)
/// instead of reusing the trusted copy, a trusted import after an untrusted one
/// keeps its setuid bits, the two share nothing on disk, and removing one image
/// leaves the other's layer intact.
#[test]
fn trusted_and_untrusted_imports_of_the_same_bytes_share_no_layer() {
    require_host!();
    let d = TestDaemon::start();
    let work = tempfile::tempdir().unwrap();
    let src = common::write_file(work.path(), "suid.tar", &rootfs_with_setuid_file());
    let src = src.to_str().unwrap();
    let layer_fs = |r: &serde_json::Value| {
        d.state(&format!(
            "layers/sha256/{}/fs",
            r["image"]["layers"][0]["digest"].as_str().unwrap().trim_start_matches("sha256:")
        ))
    };

    let trusted: serde_json::Value =
        serde_json::from_str(&d.cli_ok(&["image", "import", src, "--name", "suid-trusted", "--trusted", "--json"]))
            .unwrap();
    assert_eq!(trusted["layers_new"], 1);
    let untrusted: serde_json::Value =
        serde_json::from_str(&d.cli_ok(&["image", "import", src, "--name", "suid-plain", "--json"])).unwrap();
    assert_eq!(untrusted["layers_new"], 1, "an untrusted import never reuses a trusted unpack: {untrusted}");
    assert!(untrusted["warnings"].to_string().contains("setuid"), "{untrusted}");
    let (t_fs, u_fs) = (layer_fs(&trusted), layer_fs(&untrusted));
    assert_ne!(t_fs, u_fs, "the two imports share no unpacked layer");
    assert_ne!(trusted["image"]["layers"][0]["digest"], untrusted["image"]["layers"][0]["digest"]);
    assert_ne!(trusted["image"]["id"], untrusted["image"]["id"], "different content on disk, different image ids");
    assert_eq!(mode_of(&t_fs.join("bin/suid")), 0o4755, "the trusted import keeps the setuid bit");
    assert_eq!(mode_of(&u_fs.join("bin/suid")), 0o755, "the untrusted import has none");
    // The same inside sandboxes made from each.
    let in_sandbox = |image: &str| {
        let id = d.cli_ok(&["create", image]).trim().to_string();
        let mode = d.cli_ok(&["exec", &id, "--", "stat", "-c", "%a", "/bin/suid"]).trim().to_string();
        d.cli_ok(&["rm", "-f", &id]);
        mode
    };
    assert_eq!(in_sandbox("suid-trusted"), "4755");
    assert_eq!(in_sandbox("suid-plain"), "755");
    // Importing either again reuses the layer of its own policy only.
    let again: serde_json::Value =
        serde_json::from_str(&d.cli_ok(&["image", "import", src, "--name", "suid-plain-2", "--json"])).unwrap();
    assert_eq!((again["layers_new"].as_u64(), layer_fs(&again)), (Some(0), u_fs.clone()));

    // Removing the trusted image removes its layer and leaves the untrusted one intact.
    d.cli_ok(&["image", "rm", "suid-trusted"]);
    assert!(!t_fs.exists(), "the trusted layer went with its image");
    assert_eq!(mode_of(&u_fs.join("bin/suid")), 0o755);
    assert_eq!(in_sandbox("suid-plain"), "755");
    // Trusted after untrusted: a fresh unpack that keeps the bit (not the stripped copy).
    let trusted2: serde_json::Value =
        serde_json::from_str(&d.cli_ok(&["image", "import", src, "--name", "suid-trusted", "--trusted", "--json"]))
            .unwrap();
    assert_eq!(trusted2["layers_new"], 1, "{trusted2}");
    assert_eq!(mode_of(&layer_fs(&trusted2).join("bin/suid")), 0o4755);
    assert_eq!(in_sandbox("suid-trusted"), "4755");
    // And removing the untrusted images leaves the trusted layer intact.
    d.cli_ok(&["image", "rm", "suid-plain", "suid-plain-2"]);
    assert!(!u_fs.exists());
    assert_eq!(in_sandbox("suid-trusted"), "4755");
}

// --- image archives written by real tools -------------------------------------------------

/// `/usr/bin/<name>`, or `name` found in PATH.
fn find_tool(name: &str) -> Option<std::path::PathBuf> {
    let usr = std::path::Path::new("/usr/bin").join(name);
    if usr.is_file() {
        return Some(usr);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// Like `require_host!`, for a tool: evaluates to its path, or skips the test
/// (printing `skipped: <reason>`); in CI a missing tool fails it.
macro_rules! require_tool {
    ($name:literal) => {
        match find_tool($name) {
            Some(path) => path,
            None => {
                let reason =
                    concat!($name, " not installed (Debian package ", $name, "; scripts/setup-host.sh installs it)");
                if std::env::var("CI").is_ok_and(|v| v == "true") {
                    panic!("CI must be able to run this test, but: {reason}");
                }
                println!("skipped: {reason}");
                return;
            }
        }
    };
}

/// Runs a tool, asserting success.
fn run_tool(cmd: &mut std::process::Command) {
    let out = cmd.stdin(std::process::Stdio::null()).output().expect("run tool");
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `skopeo copy` from the `latest` image of an OCI layout to `dest`.
fn skopeo_copy(skopeo: &std::path::Path, layout: &std::path::Path, dest: &str) {
    run_tool(
        std::process::Command::new(skopeo)
            .args(["--insecure-policy", "copy", "-q"])
            .arg(format!("oci:{}:latest", layout.display()))
            .arg(dest),
    );
}

/// The diff id of the busybox test image's only layer (the sha256 of its tar).
fn busybox_diff_id() -> String {
    let out =
        std::process::Command::new("sha256sum").arg(common::images_dir().join("busybox-rootfs.tar")).output().unwrap();
    assert!(out.status.success());
    format!("sha256:{}", String::from_utf8(out.stdout).unwrap().split_whitespace().next().unwrap())
}

/// Imports `archive` as `name` and checks its kind and layer, then runs a
/// command in a sandbox made from it: the image's config and files work.
fn import_and_run(
    d: &TestDaemon,
    archive: &std::path::Path,
    name: &str,
    kind: &str,
    greeting: &str,
) -> serde_json::Value {
    let r = import_json(d, archive, name);
    assert_eq!(r["image"]["source_kind"], kind, "{name}: {r}");
    let layers = r["image"]["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{name}: {r}");
    let digest = layers[0]["digest"].as_str().unwrap();
    assert!(digest.starts_with(&busybox_diff_id()), "{name}: the busybox layer, not the archive's files: {r}");
    let id = d.cli_ok(&["create", name]).trim().to_string();
    assert_eq!(d.cli_ok(&["exec", &id, "--", "echo", "ok"]), "ok\n", "{name}");
    assert_eq!(d.cli_ok(&["exec", &id, "--", "sh", "-c", "echo $GREETING"]), format!("{greeting}\n"), "{name}");
    d.cli_ok(&["rm", "-f", &id]);
    r
}

/// `skopeo copy` to `docker-archive:` and `oci-archive:` (the containers/image
/// writers podman, buildah and skopeo share: `manifest.json` last, `<hex>.tar`
/// layers, symlinked `<id>/layer.tar`, read-only members; a gzip layer in the
/// OCI archive): both import and run.
#[test]
fn skopeo_docker_and_oci_archives_import_and_run() {
    require_host!();
    let skopeo = require_tool!("skopeo");
    let d = TestDaemon::start();
    let work = tempfile::tempdir().unwrap();
    let layout = common::busybox_layout(work.path(), "from-skopeo");
    let docker = work.path().join("x.tar");
    skopeo_copy(&skopeo, &layout, &format!("docker-archive:{}:img:latest", docker.display()));
    let oci = work.path().join("y.tar");
    skopeo_copy(&skopeo, &layout, &format!("oci-archive:{}:latest", oci.display()));

    import_and_run(&d, &docker, "skopeo-docker", "docker-archive", "from-skopeo");
    import_and_run(&d, &oci, "skopeo-oci", "oci-archive", "from-skopeo");
    // Gzipped as a whole, both still import.
    for (src, name, kind) in [(&docker, "skopeo-docker-gz", "docker-archive"), (&oci, "skopeo-oci-gz", "oci-archive")] {
        let gz = work.path().join(format!("{name}.tar.gz"));
        run_tool(std::process::Command::new("sh").arg("-c").arg(format!(
            "gzip -c {} > {}",
            src.display(),
            gz.display()
        )));
        let r = import_json(&d, &gz, name);
        assert_eq!(r["image"]["source_kind"], kind, "{name}: {r}");
        assert_eq!(r["layers_new"], 0, "{name}: the same layer: {r}");
    }
    assert_eq!(std::fs::read_dir(d.state("layers/staging")).unwrap().count(), 0, "no staging left behind");
}

/// podman (containers/image, like skopeo) with a private storage root: load
/// an archive skopeo made, save it as `docker-archive` and `oci-archive`, and
/// as a multi-image `docker-archive`. podman runs no container here.
struct Podman {
    bin: std::path::PathBuf,
    dir: tempfile::TempDir,
}

impl Podman {
    fn new(bin: std::path::PathBuf) -> Podman {
        Podman { bin, dir: tempfile::Builder::new().prefix("strata-podman-").tempdir_in("/var/tmp").unwrap() }
    }

    fn run(&self, args: &[&str]) {
        let p = |rel: &str| self.dir.path().join(rel);
        run_tool(
            std::process::Command::new(&self.bin)
                .arg("--root")
                .arg(p("storage"))
                .arg("--runroot")
                .arg(p("run"))
                .arg("--tmpdir")
                .arg(p("tmp"))
                .args(["--storage-driver", "vfs", "--events-backend", "none", "--log-level", "error"])
                .args(args),
        );
    }
}

#[test]
fn podman_save_archives_import_and_run() {
    require_host!();
    let skopeo = require_tool!("skopeo");
    let podman = Podman::new(require_tool!("podman"));
    let d = TestDaemon::start();
    let work = tempfile::tempdir().unwrap();
    let path = |name: &str| work.path().join(name);
    let s = |p: &std::path::Path| p.to_str().unwrap().to_string();

    for (greeting, tag) in [("first", "first:v1"), ("second", "second:v2")] {
        let layout = common::busybox_layout(work.path(), greeting);
        let archive = path(&format!("{greeting}.skopeo.tar"));
        skopeo_copy(&skopeo, &layout, &format!("docker-archive:{}:{tag}", archive.display()));
        podman.run(&["load", "-q", "-i", &s(&archive)]);
    }
    podman.run(&["save", "-q", "--format", "docker-archive", "-o", &s(&path("p-docker.tar")), "first:v1"]);
    podman.run(&["save", "-q", "--format", "oci-archive", "-o", &s(&path("p-oci.tar")), "first:v1"]);
    podman.run(&[
        "save",
        "-q",
        "-m",
        "--format",
        "docker-archive",
        "-o",
        &s(&path("p-multi.tar")),
        "second:v2",
        "first:v1",
    ]);

    import_and_run(&d, &path("p-docker.tar"), "podman-docker", "docker-archive", "first");
    import_and_run(&d, &path("p-oci.tar"), "podman-oci", "oci-archive", "first");
    // Several images: the first is imported, and the report says so, naming them all.
    let r = import_and_run(&d, &path("p-multi.tar"), "podman-multi", "docker-archive", "second");
    let warnings = r["warnings"].to_string();
    assert!(warnings.contains("2 images") && warnings.contains("second:v2") && warnings.contains("first:v1"), "{r}");
    assert!(warnings.contains("imported the first"), "{r}");
}

/// Image metadata at the top of an archive that is not a valid image: 400
/// `invalid_archive`, nothing registered or stored; never a rootfs.
#[test]
fn image_metadata_that_is_not_an_image_is_rejected_not_imported_as_a_rootfs() {
    require_host!();
    let d = TestDaemon::start();
    let work = tempfile::tempdir().unwrap();
    let c = d.client();
    let cases = [
        ("manifest-last", common::tar_of(&[("bin/ok", &b"fine"[..]), ("manifest.json", b"{}")]), "manifest.json"),
        ("manifest-first", common::tar_of(&[("manifest.json", &b"[]"[..]), ("bin/ok", b"fine")]), "manifest.json"),
        ("index-only", common::tar_of(&[("index.json", &b"{}"[..])]), "oci-layout"),
    ];
    for (name, bytes, mention) in cases {
        let p = common::write_file(work.path(), &format!("{name}.tar"), &bytes);
        let req =
            ImportImageRequest { source: p.display().to_string(), name: name.into(), trusted: false, replace: false };
        match common::rt().block_on(c.import_image(&req)) {
            Err(strata_client::ClientError::Api { status, body }) => {
                assert_eq!(status, 400, "{name}: {}", body.message);
                assert_eq!(body.code, ErrorCode::InvalidArchive, "{name}");
                assert!(body.message.contains(mention), "{name}: {}", body.message);
                assert!(body.message.contains("not imported as a rootfs"), "{name}: {}", body.message);
            }
            other => panic!("{name}: should be rejected: {other:?}"),
        }
        assert!(common::rt().block_on(c.get_image(name)).is_err(), "{name} must not be registered");
    }
    assert_eq!(std::fs::read_dir(d.state("layers/sha256")).unwrap().count(), 0, "no layer left behind");
    assert_eq!(std::fs::read_dir(d.state("layers/staging")).unwrap().count(), 0, "no staging left behind");
}
