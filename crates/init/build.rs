//! The `strata-init` binary starts at `strata_init_entry` (src/bare_pid1.rs),
//! which runs a sandbox's idle pid 1 before the C library starts and jumps to
//! the C library's `_start` for everything else.

fn main() {
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if arch == "x86_64" && os == "linux" {
        println!("cargo:rustc-link-arg-bin=strata-init=-Wl,--entry=strata_init_entry");
    }
}
