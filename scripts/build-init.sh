#!/usr/bin/env bash
# Builds strata-init, the binary that runs inside every sandbox (its pid 1 and
# the shim of every process), as a static executable: it executes from inside
# the sandbox's root filesystem, where the host's dynamic loader and libc are
# not available. Output: target/x86_64-unknown-linux-gnu/release/strata-init,
# where the daemon finds it (or pass --init-binary / STRATA_INIT_BINARY).
#
#   scripts/build-init.sh [EXTRA CARGO ARGS, e.g. --locked]
#
# An explicit --target keeps the static-CRT flag off build scripts and proc macros.
set -euo pipefail
STRATA_PROG=build-init
# shellcheck source=scripts/lib.sh
. "$(dirname "$(readlink -f "$0")")/lib.sh"
cd "$(dirname "$(readlink -f "$0")")/.."
if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release -p strata-init --target x86_64-unknown-linux-gnu "$@"
# The daemon refuses a dynamically linked strata-init with a clear error.

# Pid 1's idle loop runs before the C library starts (crates/init/src/bare_pid1.rs):
# its code must call nothing outside itself and touch no thread-local storage.
BIN=${CARGO_TARGET_DIR:-target}/x86_64-unknown-linux-gnu/release/strata-init
command -v objdump >/dev/null || die "objdump not found (binutils): needed to check pid 1's code"
BARE=$(objdump -d --no-show-raw-insn -M intel "$BIN" |
    awk '/^[0-9a-f]+ <[^>]*(bare_pid1|strata_init_entry)[^>]*>:$/ { p = 1; n++; next } /^$/ { p = 0 } p')
[ -n "$BARE" ] || die "no bare_pid1 code found in $BIN"
BAD=$(printf '%s\n' "$BARE" | grep -E '\bcall\b|\bjmp\b.*<' | grep -vE '<[^>]*(bare_pid1|strata_init_entry)' |
    grep -vE 'jmp +[0-9a-f]+ <_start>' || true)
BAD+=$(printf '%s\n' "$BARE" | grep -E '(fs|gs):' || true)
[ -z "$BAD" ] || die "pid 1's bare code calls out or uses thread-local storage (see crates/init/src/bare_pid1.rs):
$BAD"
