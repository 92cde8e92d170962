#!/usr/bin/env bash
# Fetches the JavaScript libraries the web console embeds (crates/server/src/ui/
# assets/vendor/) from npm at their pinned versions and checks them against the
# pinned digests. The files are committed: building strata needs no network.
#
#   scripts/vendor-console.sh
#
# To move to a new version: change VERSION and SHA256 below, run it, and test
# the console (crates/cli/tests/console.rs).
set -euo pipefail

STRATA_PROG='vendor-console'
# shellcheck source=scripts/lib.sh
. "$(dirname "$(readlink -f "$0")")/lib.sh"
cd "$(dirname "$(readlink -f "$0")")/.."

# xterm.js: the sandbox page's terminal (MIT).
XTERM_VERSION=5.5.0
XTERM_SHA256=bd954fa721872170188cc5d7e83e88db3c83c9a18a4e8d24c2783d26491f59d2

command -v npm >/dev/null || die "npm not found (apt-get install npm)"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && npm pack --silent "@xterm/xterm@$XTERM_VERSION" >/dev/null)
TGZ="$WORK/xterm-xterm-$XTERM_VERSION.tgz"
echo "$XTERM_SHA256  $TGZ" | sha256sum -c --quiet - || die "@xterm/xterm@$XTERM_VERSION does not match its pinned digest"
tar -xzf "$TGZ" -C "$WORK"
DEST=crates/server/src/ui/assets/vendor/xterm
mkdir -p "$DEST"
cp "$WORK/package/lib/xterm.js" "$WORK/package/css/xterm.css" "$WORK/package/LICENSE" "$DEST/"
note "xterm.js $XTERM_VERSION -> $DEST"
