//! Bringing a network namespace's (or a guest's) `lo` up: the namespace
//! tier's setup (strata-runtime's `Sys::loopback_up`) and a microVM's
//! pid 1 ([`crate::vm`]) both do it ([`crate::netif::up`]).

/// Sets `IFF_UP | IFF_RUNNING` on `lo` (`SIOCGIFFLAGS`, then `SIOCSIFFLAGS`).
pub fn up() -> nix::Result<()> {
    crate::netif::up("lo")
}
