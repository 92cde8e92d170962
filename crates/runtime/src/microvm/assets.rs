//! What every microVM boots from, prepared once per host: the guest kernel
//! and its modules (Debian's cloud kernel, unpacked by scripts/setup-host.sh
//! into [`DEFAULT_DIR`]), and the initramfs strata builds from them and its
//! own `strata-init` (the guest's first process, [`strata_init::vm`]).
//!
//! The initramfs is an uncompressed `newc` cpio archive ([`Cpio`]): `/init`,
//! `/lib/modules/*.ko` and their load `order`, and the directories `/init`
//! mounts on. It is cached under the tier's directory by the digest of what
//! goes in, so a new strata-init or kernel makes a new one and nothing else
//! does. (The format is six lines of spec; writing it here spares a `cpio`
//! process and a staging tree per build.)

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::Digest;

use crate::RuntimeError;

/// Where setup-host puts the guest kernel (`vmlinuz`, `kernel-version`,
/// `modules/*.ko`, `modules/order`). `STRATA_MICROVM_ASSETS` overrides it.
pub const DEFAULT_DIR: &str = "/usr/local/lib/strata/microvm";

/// The guest kernel and its modules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestKernel {
    /// The kernel image.
    pub vmlinuz: PathBuf,
    /// Its release (`6.1.0-28-cloud-amd64`).
    pub version: String,
    /// The modules directory (`*.ko` and `order`).
    pub modules: PathBuf,
}

/// The assets directory this host uses.
pub fn assets_dir() -> PathBuf {
    std::env::var_os("STRATA_MICROVM_ASSETS").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(DEFAULT_DIR))
}

impl GuestKernel {
    /// The kernel in `dir`, or why there is none usable.
    pub fn find(dir: &Path) -> Result<GuestKernel, String> {
        let vmlinuz = dir.join("vmlinuz");
        if !vmlinuz.is_file() {
            return Err(format!(
                "no guest kernel at {} (scripts/setup-host.sh unpacks Debian's cloud kernel there)",
                vmlinuz.display()
            ));
        }
        let version = std::fs::read_to_string(dir.join("kernel-version")).unwrap_or_default().trim().to_string();
        let modules = dir.join("modules");
        let order = modules.join("order");
        let listed = std::fs::read_to_string(&order).map_err(|e| format!("{}: {e}", order.display()))?;
        for m in listed.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if !modules.join(m).is_file() {
                return Err(format!("module {m} listed in {} is missing", order.display()));
            }
        }
        Ok(GuestKernel { vmlinuz, version, modules })
    }

    fn module_names(&self) -> Vec<String> {
        std::fs::read_to_string(self.modules.join("order"))
            .unwrap_or_default()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// The initramfs for this kernel with `init_binary` as `/init`, built
    /// into `cache_dir` the first time (staged, then renamed).
    pub fn initramfs(&self, init_binary: &Path, cache_dir: &Path) -> Result<PathBuf, RuntimeError> {
        let read = |p: &Path| std::fs::read(p).map_err(|e| RuntimeError::sys(format!("read {}", p.display()), e));
        let init = read(init_binary)?;
        let names = self.module_names();
        let mut modules = Vec::with_capacity(names.len());
        let mut h = sha2::Sha256::new();
        h.update(b"strata initramfs v1\n");
        h.update(&init);
        for n in &names {
            let bytes = read(&self.modules.join(n))?;
            h.update(n.as_bytes());
            h.update(&bytes);
            modules.push((n.clone(), bytes));
        }
        let digest: String = h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect();
        let path = cache_dir.join(format!("initramfs-{digest}.cpio"));
        if path.is_file() {
            return Ok(path);
        }
        let mut cpio = Cpio::default();
        for d in ["dev", "proc", "sys", "lower", "disk", "newroot", "lib", "lib/modules"] {
            cpio.dir(d);
        }
        cpio.file("init", 0o755, &init);
        for (n, bytes) in &modules {
            cpio.file(&format!("lib/modules/{n}"), 0o644, bytes);
        }
        cpio.file("lib/modules/order", 0o644, format!("{}\n", names.join("\n")).as_bytes());
        crate::microvm::disks::write_atomically(&path, &cpio.finish())?;
        Ok(path)
    }
}

/// A `newc` cpio archive in memory.
#[derive(Debug, Default)]
pub struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.ino += 1;
        let fields = [self.ino, mode, 0, 0, 1, 0, data.len() as u32, 0, 0, 0, 0, name.len() as u32 + 1, 0];
        let _ = write!(self.out, "070701");
        for f in fields {
            let _ = write!(self.out, "{f:08x}");
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    /// A directory (mode 0755).
    pub fn dir(&mut self, name: &str) {
        self.entry(name, libc::S_IFDIR | 0o755, &[]);
    }

    /// A regular file.
    pub fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, libc::S_IFREG | perm, data);
    }

    /// The archive, with its trailer.
    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpio_archive_is_what_cpio_itself_reads() {
        let mut c = Cpio::default();
        c.dir("lib");
        c.file("lib/hello", 0o644, b"hello\n");
        c.file("init", 0o755, b"#!/bin/sh\n");
        let bytes = c.finish();
        assert_eq!(&bytes[..6], b"070701");
        assert_eq!(bytes.len() % 4, 0);
        // The system's cpio lists it (when installed; the format is checked above either way).
        if let Ok(mut child) = std::process::Command::new("cpio")
            .args(["-t", "--quiet"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
        {
            child.stdin.take().unwrap().write_all(&bytes).unwrap();
            let out = child.wait_with_output().unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout), "lib\nlib/hello\ninit\n");
        }
    }

    #[test]
    fn a_kernel_without_its_modules_is_refused_with_the_reason() {
        let d = tempfile::tempdir().unwrap();
        assert!(GuestKernel::find(d.path()).unwrap_err().contains("no guest kernel"));
        std::fs::write(d.path().join("vmlinuz"), b"k").unwrap();
        std::fs::create_dir(d.path().join("modules")).unwrap();
        std::fs::write(d.path().join("modules/order"), "virtio.ko\n").unwrap();
        assert!(GuestKernel::find(d.path()).unwrap_err().contains("virtio.ko"));
        std::fs::write(d.path().join("modules/virtio.ko"), b"m").unwrap();
        std::fs::write(d.path().join("kernel-version"), "6.1.0-test\n").unwrap();
        let k = GuestKernel::find(d.path()).unwrap();
        assert_eq!(k.version, "6.1.0-test");
        let init = d.path().join("init");
        std::fs::write(&init, b"\x7fELF").unwrap();
        let cache = d.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        let a = k.initramfs(&init, &cache).unwrap();
        assert_eq!(k.initramfs(&init, &cache).unwrap(), a, "cached by content");
        std::fs::write(&init, b"\x7fELF2").unwrap();
        assert_ne!(k.initramfs(&init, &cache).unwrap(), a, "a new init is a new initramfs");
    }
}
