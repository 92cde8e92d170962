//! `strata-init _pid1 GRACE_SECS` | `_enter` | `_runsc_exec` | `_hostname NAME` | `_vminit`: see the library docs.

mod bare_pid1;

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("_pid1") => strata_init::pid1::pid1_main(),
        Some("_enter") => strata_init::enter::main(),
        Some("_runsc_exec") => strata_init::runsc::exec_main(),
        Some("_hostname") => strata_init::spawner::hostname_main(),
        Some("_vminit") => strata_init::vm::boot_main(),
        _ => {
            eprintln!("strata-init runs inside strata sandboxes (as `_pid1`, `_enter`, or `_runsc_exec`); it is not meant to be run by hand");
            std::process::exit(2)
        }
    }
}
