//! The seccomp filter applied to every sandbox process.
//!
//! A deny-list in the spirit of Docker's default profile: syscalls that reach
//! beyond the sandbox (mounts, kernel modules, kexec, bpf, keyrings, clock
//! changes, swap, reboot, namespace creation/entry, handle-based opens, io_uring)
//! fail with EPERM. `clone3` fails with ENOSYS so libc falls back to `clone`,
//! whose flags can be inspected. Sockets of families other than
//! [`ALLOWED_SOCKET_FAMILIES`] fail with EAFNOSUPPORT.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};

/// Syscalls denied outright with EPERM.
pub fn denied_syscalls() -> Vec<(&'static str, i64)> {
    let mut v: Vec<(&'static str, i64)> = vec![
        ("mount", libc::SYS_mount),
        ("umount2", libc::SYS_umount2),
        ("pivot_root", libc::SYS_pivot_root),
        ("setns", libc::SYS_setns),
        ("kexec_load", libc::SYS_kexec_load),
        ("kexec_file_load", libc::SYS_kexec_file_load),
        ("init_module", libc::SYS_init_module),
        ("finit_module", libc::SYS_finit_module),
        ("delete_module", libc::SYS_delete_module),
        ("bpf", libc::SYS_bpf),
        ("keyctl", libc::SYS_keyctl),
        ("add_key", libc::SYS_add_key),
        ("request_key", libc::SYS_request_key),
        ("swapon", libc::SYS_swapon),
        ("swapoff", libc::SYS_swapoff),
        ("reboot", libc::SYS_reboot),
        ("settimeofday", libc::SYS_settimeofday),
        ("clock_settime", libc::SYS_clock_settime),
        ("clock_adjtime", libc::SYS_clock_adjtime),
        ("adjtimex", libc::SYS_adjtimex),
        ("acct", libc::SYS_acct),
        ("quotactl", libc::SYS_quotactl),
        ("open_by_handle_at", libc::SYS_open_by_handle_at),
        ("name_to_handle_at", libc::SYS_name_to_handle_at),
        ("perf_event_open", libc::SYS_perf_event_open),
        ("lookup_dcookie", libc::SYS_lookup_dcookie),
        ("fsopen", libc::SYS_fsopen),
        ("fsconfig", libc::SYS_fsconfig),
        ("fsmount", libc::SYS_fsmount),
        ("fspick", libc::SYS_fspick),
        ("move_mount", libc::SYS_move_mount),
        ("open_tree", libc::SYS_open_tree),
        ("mount_setattr", libc::SYS_mount_setattr),
        ("syslog", libc::SYS_syslog),
        ("vhangup", libc::SYS_vhangup),
        ("userfaultfd", libc::SYS_userfaultfd),
        ("io_uring_setup", libc::SYS_io_uring_setup),
        ("io_uring_enter", libc::SYS_io_uring_enter),
        ("io_uring_register", libc::SYS_io_uring_register),
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        ("iopl", libc::SYS_iopl),
        ("ioperm", libc::SYS_ioperm),
        ("uselib", libc::SYS_uselib),
        ("_sysctl", libc::SYS__sysctl),
    ]);
    v
}

/// Socket address families sandbox processes may use; `socket` and
/// `socketpair` with any other family fail with EAFNOSUPPORT, as on a kernel
/// without it. Families outside this list either are not confined by the
/// network namespace (AF_VSOCK shares the host's port space, both ways) or
/// give a sandbox only kernel attack surface (AF_ALG, AF_TIPC, AF_RDS,
/// AF_BLUETOOTH, ...). AF_PACKET stays on the list: it is network-namespaced
/// and needs CAP_NET_RAW, which sandbox processes lack.
pub const ALLOWED_SOCKET_FAMILIES: [u64; 5] = [
    libc::AF_UNIX as u64,
    libc::AF_INET as u64,
    libc::AF_INET6 as u64,
    libc::AF_NETLINK as u64,
    libc::AF_PACKET as u64,
];

/// Namespace-creating clone/unshare flags that sandbox processes may not use.
pub const NAMESPACE_FLAGS: [u64; 7] = [
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWCGROUP as u64,
];

fn arch() -> Result<seccompiler::TargetArch, String> {
    std::env::consts::ARCH.try_into().map_err(|e| format!("seccomp: unsupported architecture: {e:?}"))
}

fn flag_rules(arg: u8) -> Result<Vec<SeccompRule>, String> {
    NAMESPACE_FLAGS
        .iter()
        .map(|&flag| {
            let cond = SeccompCondition::new(arg, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(flag), flag)
                .map_err(|e| format!("seccomp condition: {e}"))?;
            SeccompRule::new(vec![cond]).map_err(|e| format!("seccomp rule: {e}"))
        })
        .collect()
}

/// A rule matching a call whose first argument (the address family) is none of
/// [`ALLOWED_SOCKET_FAMILIES`].
fn foreign_family_rule() -> Result<Vec<SeccompRule>, String> {
    let conds = ALLOWED_SOCKET_FAMILIES
        .iter()
        .map(|&family| {
            SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, family)
                .map_err(|e| format!("seccomp condition: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(vec![SeccompRule::new(conds).map_err(|e| format!("seccomp rule: {e}"))?])
}

/// Compiles the filters: the EPERM deny-list (with clone/unshare flag checks),
/// the clone3 ENOSYS filter and the EAFNOSUPPORT filter of socket families.
pub fn build_filters() -> Result<Vec<BpfProgram>, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (_, nr) in denied_syscalls() {
        rules.insert(nr, vec![]);
    }
    rules.insert(libc::SYS_unshare, flag_rules(0)?);
    // x86_64 and aarch64 both take clone's flags as the first argument.
    rules.insert(libc::SYS_clone, flag_rules(0)?);
    let deny = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch()?)
        .map_err(|e| format!("seccomp filter: {e}"))?;
    let mut clone3 = BTreeMap::new();
    clone3.insert(libc::SYS_clone3, vec![]);
    let enosys = SeccompFilter::new(clone3, SeccompAction::Allow, SeccompAction::Errno(libc::ENOSYS as u32), arch()?)
        .map_err(|e| format!("seccomp filter: {e}"))?;
    let mut families = BTreeMap::new();
    families.insert(libc::SYS_socket, foreign_family_rule()?);
    families.insert(libc::SYS_socketpair, foreign_family_rule()?);
    let eafnosupport =
        SeccompFilter::new(families, SeccompAction::Allow, SeccompAction::Errno(libc::EAFNOSUPPORT as u32), arch()?)
            .map_err(|e| format!("seccomp filter: {e}"))?;
    [deny, enosys, eafnosupport]
        .into_iter()
        .map(|f| f.try_into().map_err(|e| format!("seccomp compile: {e}")))
        .collect()
}

/// Installs the filters on the calling thread (no_new_privs must already be set).
pub fn apply(filters: &[BpfProgram]) -> Result<(), String> {
    for f in filters {
        seccompiler::apply_filter(f).map_err(|e| format!("seccomp apply: {e}"))?;
    }
    Ok(())
}

/// Installs the filters without setting no_new_privs; the calling thread must
/// hold CAP_SYS_ADMIN (seccompiler's `apply_filter` always sets no_new_privs).
pub fn apply_privileged(filters: &[BpfProgram]) -> Result<(), String> {
    for f in filters {
        let len = u16::try_from(f.len()).map_err(|_| "seccomp filter too long".to_string())?;
        // seccompiler's sock_filter has the kernel's layout (u16, u8, u8, u32), as libc's does.
        let prog = libc::sock_fprog { len, filter: f.as_ptr() as *mut libc::sock_filter };
        // SAFETY: `prog` points at `f`, which outlives the call; the kernel copies the program.
        let r = unsafe {
            libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, 0u32, &prog as *const libc::sock_fprog)
        };
        if r != 0 {
            return Err(format!("seccomp apply: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_compile_and_cover_the_required_syscalls() {
        let f = build_filters().unwrap();
        assert_eq!(f.len(), 3);
        let names: Vec<_> = denied_syscalls().into_iter().map(|(n, _)| n).collect();
        for required in ["mount", "kexec_load", "init_module", "bpf", "keyctl", "setns", "open_by_handle_at"] {
            assert!(names.contains(&required), "{required} must be denied");
        }
    }
}
