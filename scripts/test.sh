#!/usr/bin/env bash
# Builds the strata workspace and runs its whole test suite (unit + integration;
# the integration tests start private daemons and need root, as in CI).
#
#   scripts/test.sh [EXTRA CARGO TEST ARGS, e.g. -p strata-store]
#
# Works on a fresh Debian 12 machine: as root it first runs scripts/setup-host.sh
# and scripts/build-test-images.sh --debian (both idempotent and quick when already done;
# STRATA_SKIP_SETUP=1 skips them). The tests find the images through
# STRATA_TEST_IMAGES (default /var/cache/strata/images).
# Uses --locked when Cargo.lock is tracked by git (set STRATA_CARGO_LOCKED=0 to not).
# Ends with one line "summary: N passed, N failed, N skipped" and cargo's exit code.
set -euo pipefail

STRATA_PROG='test'
# shellcheck source=scripts/lib.sh
. "$(dirname "$(readlink -f "$0")")/lib.sh"
cd "$(dirname "$(readlink -f "$0")")/.."

export STRATA_TEST_IMAGES=${STRATA_TEST_IMAGES:-/var/cache/strata/images}
if [ "${STRATA_SKIP_SETUP:-0}" != 1 ] && [ "$(id -u)" -eq 0 ]; then
    scripts/setup-host.sh
    # --debian: the E2B suite's `base` template (slow once, then cached).
    scripts/build-test-images.sh --debian "$STRATA_TEST_IMAGES"
fi
if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null || die "cargo not found (need a Rust toolchain >= 1.80)"
[ -f "$STRATA_TEST_IMAGES/busybox-rootfs.tar" ] ||
    warn "no test images in $STRATA_TEST_IMAGES (run scripts/build-test-images.sh)"

LOCKED=()
if [ "${STRATA_CARGO_LOCKED:-1}" != 0 ] && git ls-files --error-unmatch Cargo.lock >/dev/null 2>&1; then
    LOCKED=(--locked)
fi

step "build strata-init (static)" scripts/build-init.sh "${LOCKED[@]}"
# Formatting and lints hold on main (rustfmt.toml, [workspace.lints] in Cargo.toml).
step "cargo fmt --check" cargo fmt --all --check
step "cargo clippy -D warnings" cargo clippy --workspace --tests "${LOCKED[@]}" -- -D warnings
step "cargo build --tests ${LOCKED[*]}" cargo test --workspace "${LOCKED[@]}" --no-run
# The unit tests need no root: run them once more as nobody, with no capabilities.
# (Not through `step`: its lines, a skip with its reason included, go to the log.)
if [ "$(id -u)" -eq 0 ]; then
    scripts/unit-as-nobody.sh "${LOCKED[@]}"
fi

T0=$(_now)
LOG=$(mktemp "${TMPDIR:-/tmp}/strata-test.XXXXXX")
trap 'rm -f "$LOG"' EXIT
set +e
cargo test --workspace "${LOCKED[@]}" --no-fail-fast "$@" -- --test-threads=2 --show-output 2>&1 | tee "$LOG"
RC=${PIPESTATUS[0]}
set -e

# Sum cargo's per-binary "test result: ok. 3 passed; 0 failed; 1 ignored; ..." lines;
# tests that could not run here print "skipped: <reason>" and are counted as skipped.
SUMMARY=$(awk '
    /^test result:/ {
        for (i = 1; i <= NF; i++) {
            v = $i; sub(/;$/, "", $(i + 1))
            if ($(i + 1) == "passed") p += v
            else if ($(i + 1) == "failed") f += v
            else if ($(i + 1) == "ignored") s += v
        }
    }
    /^skipped: / { skipped_lines++ }
    END { printf "%d passed, %d failed, %d skipped", p - skipped_lines, f, s + skipped_lines }
' "$LOG")
note "cargo test: exit $RC after $(_since "$T0")"
echo "summary: $SUMMARY"
exit "$RC"
