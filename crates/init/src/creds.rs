//! Capabilities and credentials of sandbox processes.

use caps::{CapSet, Capability, CapsHashSet};

use super::user::ResolvedUser;

/// Capabilities a root process inside the sandbox keeps (a subset of Docker's
/// defaults: no CAP_MKNOD, no CAP_NET_RAW, no CAP_SETFCAP, no CAP_AUDIT_WRITE).
pub const KEPT: [Capability; 9] = [
    Capability::CAP_CHOWN,
    Capability::CAP_DAC_OVERRIDE,
    Capability::CAP_FSETID,
    Capability::CAP_FOWNER,
    Capability::CAP_SETGID,
    Capability::CAP_SETUID,
    Capability::CAP_SETPCAP,
    Capability::CAP_NET_BIND_SERVICE,
    Capability::CAP_KILL,
];

/// Drops every capability outside `keep` from the bounding set, switches to
/// `user`, and leaves a root user with exactly `keep` (effective, permitted,
/// inheritable); a non-root user ends with none.
pub fn drop_to(user: &ResolvedUser, keep: &[Capability]) -> Result<(), String> {
    let keep_set: CapsHashSet = keep.iter().copied().collect();
    for cap in caps::all() {
        if !keep_set.contains(&cap) {
            // Capabilities unknown to the running kernel fail with EINVAL; skip them.
            let _ = caps::drop(None, CapSet::Bounding, cap);
        }
    }
    let gids: Vec<nix::unistd::Gid> = user.groups.iter().map(|g| nix::unistd::Gid::from_raw(*g)).collect();
    nix::unistd::setgroups(&gids).map_err(|e| format!("setgroups: {e}"))?;
    nix::unistd::setresgid(user.gid.into(), user.gid.into(), user.gid.into())
        .map_err(|e| format!("setgid {}: {e}", user.gid))?;
    nix::unistd::setresuid(user.uid.into(), user.uid.into(), user.uid.into())
        .map_err(|e| format!("setuid {}: {e}", user.uid))?;
    let final_set = if user.uid == 0 { keep_set } else { CapsHashSet::new() };
    // gVisor's sentry has no ambient capabilities (PR_CAP_AMBIENT is EINVAL
    // there): with none to clear, that is the state wanted.
    if let Err(e) = caps::clear(None, CapSet::Ambient) {
        let unsupported = caps::read(None, CapSet::Ambient).is_err();
        if !unsupported {
            return Err(format!("clear ambient caps: {e}"));
        }
    }
    caps::set(None, CapSet::Inheritable, &final_set).map_err(|e| format!("set inheritable caps: {e}"))?;
    caps::set(None, CapSet::Effective, &final_set).map_err(|e| format!("set effective caps: {e}"))?;
    caps::set(None, CapSet::Permitted, &final_set).map_err(|e| format!("set permitted caps: {e}"))?;
    Ok(())
}

/// Sets no_new_privs: setuid binaries and file capabilities grant nothing after exec.
pub fn no_new_privs() -> Result<(), String> {
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) takes integer arguments only.
    let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if r != 0 {
        return Err(format!("no_new_privs: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Joins the user namespace `ns` and becomes its root: uid and gid 0 inside,
/// the host ids its map gives them outside. The caller must be
/// single-threaded and privileged over the namespace's parent (host root).
/// Namespaces joined before stay joined; the capabilities the process now
/// holds are those of the new namespace, which owns none of them.
pub fn join_userns_as_root(ns: std::os::fd::BorrowedFd<'_>) -> Result<(), String> {
    nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWUSER)
        .map_err(|e| format!("join the user namespace: {e}"))?;
    let gid = nix::unistd::Gid::from_raw(0);
    nix::unistd::setgroups(&[gid]).map_err(|e| format!("setgroups in the user namespace: {e}"))?;
    nix::unistd::setresgid(gid, gid, gid).map_err(|e| format!("setgid 0 in the user namespace: {e}"))?;
    let uid = nix::unistd::Uid::from_raw(0);
    nix::unistd::setresuid(uid, uid, uid).map_err(|e| format!("setuid 0 in the user namespace: {e}"))
}
