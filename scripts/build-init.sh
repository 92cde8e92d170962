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
