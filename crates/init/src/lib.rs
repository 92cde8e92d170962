//! `strata-init`: the one binary that runs inside every sandbox (the
//! namespace and the gVisor tier; a microVM's first process). It is built statically (scripts/build-init.sh) because it
//! executes from inside the sandbox's root, where the image's libraries (if
//! any) are not the host's.
//!
//! * [`pid1`]: the sandbox's pid 1 after setup (reaper, stop relay).
//! * [`enter`]: `_enter`, run by the daemon on the host: joins a sandbox and
//!   hands one process to a shim inside (its inner child).
//! * [`exec`]: the per-process shim and everything between fork and exec.
//! * [`runsc`]: the gVisor tier's `_runsc_exec` (on the host).
//! * [`spawner`]: the gVisor tier's pid 1 as the parent of every API process
//!   (so they survive `runsc checkpoint`), reached over [`channel`] (frames
//!   over connections pid 1 opens to the sandbox's broker on the host), and
//!   `_hostname` (inside).
//! * [`vm`]: the microvm tier's guest side: `/init _vminit` boots the guest
//!   (modules, the overlay of its two disks as root, identity) and serves the
//!   exec channel over [`mux`], many streams on one virtio-serial port.
//! * [`layer`]: a microVM guest's writable layer (its overlay upper
//!   directory) for the host: a manifest of its entries and a layer tar.
//! * [`netif`]: a microVM guest's network interface (address, default route).
//! * [`guestfs`]: the file API inside a microVM guest (stat, list, mkdir,
//!   remove, rename, file and tar downloads and uploads).
//! * [`xattr`]: `user.` extended attributes read and replaced through a
//!   descriptor (the host's file API and a microVM guest's).
//! * [`pty`]: pseudo-terminals for processes that run on one (both tiers).
//! * [`creds`], [`seccomp`], [`user`]: credentials, syscall filter, user lookup.
//!
//! Keeping every sandbox process's mappings inside the sandbox's own mount tree
//! is what lets CRIU dump the whole tree for standby.

pub mod channel;
pub mod creds;
pub mod enter;
pub mod exec;
pub mod guestfs;
pub mod guestport;
pub mod guestwatch;
pub mod layer;
pub mod loopback;
pub mod mux;
pub mod netif;
pub mod openat2;
pub mod pid1;
pub mod pty;
pub mod runsc;
pub mod seccomp;
pub mod spawner;
pub mod user;
pub mod vm;
pub mod xattr;

/// Where strata-init is bind-mounted (read-only) inside every sandbox: pid 1
/// and every process's shim run from it, so no mapping of the sandbox's
/// processes points outside its mount tree.
pub const SELF_PATH: &str = "/run/strata/init";
