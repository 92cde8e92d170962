#!/usr/bin/env bash
# Downloads the demo's package set (examples/demo/requirements.txt, fully pinned) as
# wheels from PyPI into a local wheelhouse, once:
#
#   scripts/build-wheelhouse.sh [DEST]     (default /var/cache/strata/wheelhouse)
#
# The demo's setup stage and the bench's setup-reuse figure install from it inside a
# sandbox with `pip install --no-index`, so the timing is the install itself, not the
# network. Idempotent: DEST/.stamp holds the requirements' sha256; a matching stamp
# skips the download. The wheels are fetched into a temporary directory and renamed
# into place, so an interrupted run never leaves a half wheelhouse behind.
set -euo pipefail

STRATA_PROG=${STRATA_PROG:-wheelhouse}
# shellcheck source=scripts/lib.sh
. "$(dirname "$(readlink -f "$0")")/lib.sh"
cd "$(dirname "$(readlink -f "$0")")/.."

DEST=${1:-/var/cache/strata/wheelhouse}
REQ=examples/demo/requirements.txt
[ -f "$REQ" ] || die "$REQ missing"
SUM=$(sha256sum "$REQ" | cut -d' ' -f1)
if [ -f "$DEST/.stamp" ] && [ "$(cat "$DEST/.stamp")" = "$SUM" ]; then
    note "wheelhouse $DEST is current ($(find "$DEST" -name '*.whl' | wc -l) wheels)"
    exit 0
fi
command -v python3 >/dev/null || die "python3 is not installed (run scripts/setup-host.sh)"
python3 -m pip --version >/dev/null 2>&1 || die "pip is not installed (run scripts/setup-host.sh)"

mkdir -p "$(dirname "$DEST")"
TMP=$(mktemp -d "$(dirname "$DEST")/.wheelhouse.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
# Binary wheels only, for the CPython 3.11 / glibc of the Debian 12 image the demo uses
# (the same as this host's, but said explicitly so the host's Python does not matter).
dl() {
    python3 -m pip download --quiet --disable-pip-version-check --no-input \
        --only-binary=:all: --implementation cp --python-version 3.11.2 --abi cp311 --abi abi3 --abi none \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any \
        -d "$TMP" -r "$REQ"
}
step "download $(grep -c '==' "$REQ") pinned packages from PyPI into $DEST" dl
cp "$REQ" "$TMP/requirements.txt"
printf '%s\n' "$SUM" >"$TMP/.stamp"
rm -rf "$DEST.old"
[ -e "$DEST" ] && mv "$DEST" "$DEST.old"
mv "$TMP" "$DEST"
rm -rf "$DEST.old"
trap - EXIT
note "wheelhouse: $(find "$DEST" -name '*.whl' | wc -l) wheels, $(du -sh "$DEST" | cut -f1)"
