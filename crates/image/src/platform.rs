//! What an image's files say it is: its operating system family and version
//! (`/etc/os-release`) and its machine (the ELF header of its shell).
//!
//! A rootfs tarball carries no OCI config, and an OCI config's `architecture`
//! is only a claim: the files are what will run, so they are what is read.
//! Paths are resolved through the layer stack the way the sandbox will see
//! them (symlinks included, `/bin -> usr/bin` of merged-usr systems too),
//! logically: nothing on the host is followed.

use std::path::{Path, PathBuf};

use strata_api::Platform;

use crate::changes::{lookup, read_entry, EntryKind};
use crate::ImageError;

/// Symlinks followed before a path is given up on (as the kernel's ELOOP limit).
const MAX_LINKS: usize = 40;

/// The shells (and, failing them, other binaries every system has) whose ELF
/// header names the machine.
const PROBES: &[&str] = &["bin/sh", "bin/busybox", "usr/bin/env", "bin/ls", "usr/bin/ls"];

/// Reads the platform of the view made by `stack_top_first` (layer
/// directories, top first).
pub fn detect(stack_top_first: &[PathBuf]) -> Result<Platform, ImageError> {
    let mut architecture = "unknown".to_string();
    let mut busybox = false;
    for probe in PROBES {
        let Some((layer, rel)) = resolve(stack_top_first, probe)? else { continue };
        let Some((_, _, Some(head))) = read_entry(&stack_top_first[layer], &rel, 4096)? else {
            // Larger than the cap: read just the header.
            let Some(arch) = elf_machine_of(&stack_top_first[layer].join(&rel)) else { continue };
            architecture = arch.to_string();
            busybox |= rel.ends_with("busybox");
            break;
        };
        if let Some(arch) = elf_machine(&head) {
            architecture = arch.to_string();
            busybox |= rel.ends_with("busybox");
            break;
        }
    }
    let os = if architecture == "unknown" { "unknown" } else { "linux" }.to_string();
    let release = ["etc/os-release", "usr/lib/os-release"]
        .iter()
        .find_map(|p| resolve(stack_top_first, p).ok().flatten())
        .and_then(|(layer, rel)| read_entry(&stack_top_first[layer], &rel, 64 * 1024).ok().flatten())
        .and_then(|(_, _, data)| data)
        .map(|d| String::from_utf8_lossy(&d).into_owned());
    let field = |key: &str| {
        release.as_deref().and_then(|r| {
            r.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                .map(|v| v.trim().trim_matches('"').to_string())
        })
    };
    let family = match field("ID").filter(|v| !v.is_empty()) {
        Some(id) => id.to_ascii_lowercase(),
        None if busybox => "busybox".to_string(),
        None => "unknown".to_string(),
    };
    Ok(Platform { os, architecture, family, version: field("VERSION_ID").filter(|v| !v.is_empty()) })
}

/// Resolves `path` in the stack as the sandbox would, following symlinks
/// (relative or absolute, in any component) within the view: the providing
/// layer and the path with no symlink left in it.
pub fn resolve(stack_top_first: &[PathBuf], path: &str) -> Result<Option<(usize, String)>, ImageError> {
    let mut pending: Vec<String> = path.split('/').filter(|c| !c.is_empty()).rev().map(str::to_string).collect();
    let mut done: Vec<String> = Vec::new();
    let mut links = 0;
    let mut last = None;
    while let Some(c) = pending.pop() {
        match c.as_str() {
            "." => continue,
            ".." => {
                done.pop();
                continue;
            }
            _ => {}
        }
        done.push(c);
        let rel = done.join("/");
        let Some((layer, kind, _)) = lookup(stack_top_first, &rel)? else { return Ok(None) };
        match kind {
            EntryKind::Symlink => {
                links += 1;
                if links > MAX_LINKS {
                    return Ok(None);
                }
                // `lookup` found every parent a real directory in that layer: reading the link reads only it.
                let Ok(target) = std::fs::read_link(stack_top_first[layer].join(&rel)) else { return Ok(None) };
                let target = target.to_string_lossy().into_owned();
                done.pop();
                if target.starts_with('/') {
                    done.clear();
                }
                pending.extend(target.split('/').filter(|c| !c.is_empty()).rev().map(str::to_string));
                last = None;
            }
            EntryKind::Dir if !pending.is_empty() => last = Some(layer),
            _ if !pending.is_empty() => return Ok(None),
            _ => last = Some(layer),
        }
    }
    Ok(last.filter(|_| !done.is_empty()).map(|l| (l, done.join("/"))))
}

fn elf_machine_of(path: &Path) -> Option<&'static str> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut head = [0u8; 20];
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path).ok()?;
    f.take(20).read_exact(&mut head).ok()?;
    elf_machine(&head)
}

/// The machine an ELF header names, in Go/OCI architecture names.
pub fn elf_machine(head: &[u8]) -> Option<&'static str> {
    if head.len() < 20 || &head[..4] != b"\x7fELF" {
        return None;
    }
    let machine = match head[5] {
        1 => u16::from_le_bytes([head[18], head[19]]),
        2 => u16::from_be_bytes([head[18], head[19]]),
        _ => return None,
    };
    Some(match (machine, head[4]) {
        (3, _) => "386",
        (62, _) => "amd64",
        (40, _) => "arm",
        (183, _) => "arm64",
        (243, _) => "riscv64",
        (8, 1) => "mips",
        (8, _) => "mips64",
        (20, _) => "ppc",
        (21, _) => "ppc64le",
        (22, _) => "s390x",
        (258, _) => "loong64",
        _ => "unknown",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elf(machine: u16) -> Vec<u8> {
        let mut h = vec![0x7f, b'E', b'L', b'F', 2, 1, 1, 0];
        h.resize(18, 0);
        h.extend_from_slice(&machine.to_le_bytes());
        h.resize(64, 0);
        h
    }

    #[test]
    fn reads_machine_family_and_version_through_links_and_layers() {
        let t = tempfile::tempdir().unwrap();
        let (lower, upper) = (t.path().join("lower"), t.path().join("upper"));
        // A merged-usr lower: /bin -> usr/bin, /etc/os-release -> ../usr/lib/os-release.
        std::fs::create_dir_all(lower.join("usr/bin")).unwrap();
        std::fs::create_dir_all(lower.join("usr/lib")).unwrap();
        std::fs::create_dir_all(lower.join("etc")).unwrap();
        std::os::unix::fs::symlink("usr/bin", lower.join("bin")).unwrap();
        std::fs::write(lower.join("usr/bin/dash"), elf(62)).unwrap();
        std::os::unix::fs::symlink("dash", lower.join("usr/bin/sh")).unwrap();
        std::fs::write(lower.join("usr/lib/os-release"), "ID=debian\nVERSION_ID=\"12\"\n").unwrap();
        std::os::unix::fs::symlink("../usr/lib/os-release", lower.join("etc/os-release")).unwrap();
        std::fs::create_dir_all(&upper).unwrap();
        let p = detect(&[upper.clone(), lower.clone()]).unwrap();
        assert_eq!(
            p,
            Platform {
                os: "linux".into(),
                architecture: "amd64".into(),
                family: "debian".into(),
                version: Some("12".into())
            }
        );
        // An upper layer replacing the shell with an arm64 one changes the answer.
        std::fs::create_dir_all(upper.join("usr/bin")).unwrap();
        std::fs::write(upper.join("usr/bin/dash"), elf(183)).unwrap();
        assert_eq!(detect(&[upper.clone(), lower.clone()]).unwrap().architecture, "arm64");
        // A link out of the view resolves inside it, never on the host.
        std::os::unix::fs::symlink("/../../../../etc/passwd", upper.join("escape")).unwrap();
        assert_eq!(resolve(&[upper.clone(), lower], "escape").unwrap(), None);
    }

    #[test]
    fn a_bare_busybox_root_is_its_own_family() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("bin")).unwrap();
        std::fs::write(t.path().join("bin/busybox"), elf(62)).unwrap();
        std::os::unix::fs::symlink("busybox", t.path().join("bin/sh")).unwrap();
        let p = detect(&[t.path().to_path_buf()]).unwrap();
        assert_eq!((p.family.as_str(), p.architecture.as_str(), p.version), ("busybox", "amd64", None));
        assert_eq!(elf_machine(b"#!/bin/sh\n"), None);
    }
}
