#!/usr/bin/env bash
# Runs every crate's unit tests (the lib test binaries) as `nobody`, with no
# capabilities at all: the engine's lifecycle bookkeeping, tenancy, the Rule of
# Two, the runtime's setup sequences (RecordingSys) and the fakes must not need
# root. Builds nothing new: the binaries are the ones `cargo test --workspace` builds.
#
#   scripts/unit-as-nobody.sh [EXTRA CARGO ARGS, e.g. --locked]
#
# Run as root (it drops to nobody with setpriv); exits non-zero when a binary fails.
set -euo pipefail

STRATA_PROG='unit-as-nobody'
# shellcheck source=scripts/lib.sh
. "$(dirname "$(readlink -f "$0")")/lib.sh"
cd "$(dirname "$(readlink -f "$0")")/.."

[ "$(id -u)" -eq 0 ] || die "run as root (it drops to nobody itself)"
command -v setpriv >/dev/null || die "setpriv not found (util-linux)"

# The same build as `cargo test --workspace` (so nothing new is compiled): its
# unit test binaries (libraries' and the CLI's), not the integration tests.
mapfile -t BINS < <(cargo test --workspace --no-run --message-format=json "$@" 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("profile", {}).get("test") or not m.get("executable"):
        continue
    if set(m["target"]["kind"]) & {"lib", "rlib", "bin"}:
        print(m["executable"])
')
[ "${#BINS[@]}" -gt 0 ] || die "no unit test binaries found"

AS_NOBODY=(setpriv --reuid=nobody --regid=nogroup --clear-groups --inh-caps=-all --bounding-set=-all)
# Some unit tests read the checkout (the engine's layer test reads its sources):
# a checkout under a private directory (e.g. /root) cannot be read as nobody.
if ! "${AS_NOBODY[@]}" test -r "$PWD/Cargo.toml" -a -x "${BINS[0]}"; then
    warn "skipped: this checkout ($PWD) or its build is not readable by nobody (a parent directory is private); the unit tests ran as root in the main run"
    exit 0
fi

WORK=$(mktemp -d)
chmod 777 "$WORK"
trap 'rm -rf "$WORK"' EXIT
failed=0
for bin in "${BINS[@]}"; do
    name=$(basename "$bin")
    # No root, no capabilities (bounding set empty), no supplementary groups.
    if out=$(cd "$WORK" && "${AS_NOBODY[@]}" env HOME="$WORK" TMPDIR="$WORK" "$bin" -q 2>&1); then
        note "$name: $(grep -E '^test result' <<<"$out" | tail -1)"
    else
        failed=1
        printf '%s\n' "$out" | tail -40 >&2
        warn "$name failed as nobody"
    fi
done
[ "$failed" -eq 0 ] || die "unit tests failed without root"
note "${#BINS[@]} unit test binaries pass as nobody (no root, no capabilities)"
