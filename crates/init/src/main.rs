//! `strata-init _pid1 GRACE_SECS` | `strata-init _shim`: see the library docs.

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("_pid1") => strata_init::pid1::pid1_main(),
        Some("_shim") => strata_init::exec::shim_main(),
        Some("_enter") => strata_init::enter::main(),
        _ => {
            eprintln!("strata-init runs inside strata sandboxes (as `_pid1`, `_shim` or `_enter`); it is not meant to be run by hand");
            std::process::exit(2)
        }
    }
}
