//! The file API acts with no more privilege than the sandbox's own root.
//!
//! The daemon reaches a sandbox's files through `/proc/<init>/root` (see
//! [`crate::sandboxfs`]). Opening that link needs the daemon's privileges
//! (init is non-dumpable, so it takes CAP_SYS_PTRACE), but nothing after it
//! does: every operation on the opened root runs on a thread whose
//! *effective* capability set is lowered to what root inside the sandbox
//! holds ([`strata_init::creds::KEPT`]), so whatever the checks of
//! [`crate::sandboxfs`] miss, the kernel answers the daemon like it answers the
//! sandbox (`/proc/kallsyms` reads as zeros without CAP_SYSLOG, `/proc/kmsg`
//! will not open). Capabilities are per thread: `capset` here changes the
//! calling thread only, and the permitted set is left alone so the thread can
//! take its effective set back when the guard is dropped — also when the
//! operation panics. A thread started while the guard is held inherits the
//! lowered set for good: nothing run under the guard starts threads.
//!
//! For a sandbox in a user namespace the thread also takes the sandbox
//! root's host id as its file-system uid and gid ([`SandboxRootCaps::lower_as`]):
//! what it creates belongs to the sandbox's root, and the sandbox's idmapped
//! upper layer stores it as in-sandbox id 0 (host root's id is one that
//! layer cannot store: EOVERFLOW).

use std::marker::PhantomData;

use caps::{CapSet, CapsHashSet};

/// Errors of lowering or restoring a thread's capabilities.
#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    /// `capget`/`capset` failed.
    #[error("{what} the file thread's effective capabilities: {source}")]
    Caps {
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: caps::errors::CapsError,
    },
}

/// While alive, the calling thread's effective capabilities are the sandbox
/// root's ([`strata_init::creds::KEPT`], intersected with what the thread
/// is permitted). Dropping it restores the effective set it found. Not `Send`:
/// capabilities belong to the thread that lowered them.
pub struct SandboxRootCaps {
    saved: CapsHashSet,
    /// The file-system id was changed (restored to 0 on drop).
    fs_id_set: bool,
    _thread_bound: PhantomData<*const ()>,
}

impl SandboxRootCaps {
    /// Lowers the calling thread's effective set to the sandbox root's.
    pub fn lower() -> Result<Self, PrivilegeError> {
        Self::lower_as(None)
    }

    /// [`SandboxRootCaps::lower`], and with `fs_id` the thread's file-system
    /// uid and gid set to it (the host id of a user-namespace sandbox's root).
    pub fn lower_as(fs_id: Option<u32>) -> Result<Self, PrivilegeError> {
        // Read before the fsuid changes (which takes the file-system capabilities out of the effective set).
        let saved =
            caps::read(None, CapSet::Effective).map_err(|source| PrivilegeError::Caps { what: "reading", source })?;
        let permitted =
            caps::read(None, CapSet::Permitted).map_err(|source| PrivilegeError::Caps { what: "reading", source })?;
        let lowered: CapsHashSet = strata_init::creds::KEPT.iter().copied().filter(|c| permitted.contains(c)).collect();
        if let Some(id) = fs_id {
            // SAFETY: setfsuid/setfsgid take an integer and change this thread's credentials only.
            unsafe {
                libc::setfsuid(id);
                libc::setfsgid(id);
            }
        }
        // From here on the guard exists, so a failure below still restores everything.
        let guard = SandboxRootCaps { saved, fs_id_set: fs_id.is_some(), _thread_bound: PhantomData };
        caps::set(None, CapSet::Effective, &lowered)
            .map_err(|source| PrivilegeError::Caps { what: "lowering", source })?;
        Ok(guard)
    }
}

impl Drop for SandboxRootCaps {
    fn drop(&mut self) {
        if self.fs_id_set {
            // SAFETY: as in lower_as; back to the daemon's own ids.
            unsafe {
                libc::setfsuid(0);
                libc::setfsgid(0);
            }
        }
        // Raising the effective set within the unchanged permitted set cannot
        // be refused; should it fail anyway, the thread stays *less*
        // privileged (later operations on it fail closed), never more.
        if let Err(e) = caps::set(None, CapSet::Effective, &self.saved) {
            tracing::error!(error = %e, "restoring a file thread's effective capabilities failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn effective_mask() -> u64 {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("CapEff:")).unwrap();
        u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
    }

    fn kept_mask() -> u64 {
        strata_init::creds::KEPT.iter().fold(0, |m, c| m | c.bitmask())
    }

    fn first_kallsyms_line() -> String {
        std::io::BufRead::lines(std::io::BufReader::new(std::fs::File::open("/proc/kallsyms").unwrap()))
            .next()
            .unwrap()
            .unwrap()
    }

    fn skip_unless_full_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let syslog = caps::has_cap(None, CapSet::Effective, caps::Capability::CAP_SYSLOG).unwrap_or(false);
        if !(root && syslog) {
            println!("skipped: needs root with CAP_SYSLOG (to see the difference)");
            return true;
        }
        false
    }

    #[test]
    fn the_guard_lowers_this_thread_only_and_restores_on_drop_and_panic() {
        if skip_unless_full_root() {
            return;
        }
        // A thread that exists before the guard: it keeps its own set.
        let (ask, asked) = std::sync::mpsc::channel::<()>();
        let (tell, told) = std::sync::mpsc::channel::<u64>();
        let other = std::thread::spawn(move || {
            while asked.recv().is_ok() {
                tell.send(effective_mask()).unwrap();
            }
        });
        std::thread::spawn(move || {
            let full = effective_mask();
            let guard = SandboxRootCaps::lower().unwrap();
            assert_eq!(effective_mask(), kept_mask() & full, "effective set is the sandbox root's");
            ask.send(()).unwrap();
            assert_eq!(told.recv().unwrap(), full, "other threads keep theirs");
            drop(guard);
            assert_eq!(effective_mask(), full, "restored on drop");
            let r = std::panic::catch_unwind(|| {
                let _g = SandboxRootCaps::lower().unwrap();
                assert_ne!(effective_mask(), full);
                panic!("an operation panics");
            });
            assert!(r.is_err());
            assert_eq!(effective_mask(), full, "restored when the operation panicked");
        })
        .join()
        .unwrap();
        other.join().unwrap();
    }

    /// The confused deputy of issue 14: with the daemon's privileges
    /// /proc/kallsyms shows the kernel's addresses; lowered to the sandbox
    /// root's, it shows zeros (as inside the sandbox).
    #[test]
    fn lowered_reads_of_kallsyms_show_no_addresses() {
        if skip_unless_full_root() {
            return;
        }
        std::thread::spawn(|| {
            let kptr_shown = !first_kallsyms_line().starts_with("0000000000000000");
            let lowered = {
                let _g = SandboxRootCaps::lower().unwrap();
                first_kallsyms_line()
            };
            assert!(lowered.starts_with("0000000000000000"), "lowered: {lowered}");
            if !kptr_shown {
                println!("note: this host hides kernel addresses from root too (kptr_restrict)");
            }
            assert!(
                std::fs::File::open("/proc/kmsg").is_ok(),
                "the daemon's own privileges open the host's kernel log"
            );
            let _g = SandboxRootCaps::lower().unwrap();
            let e = std::fs::File::open("/proc/kmsg").unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EPERM), "lowered: {e}");
        })
        .join()
        .unwrap();
    }
}
