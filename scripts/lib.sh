# shellcheck shell=bash
# Helpers shared by the host scripts. Source it; do not execute it.
#
#   step NAME CMD ARGS...   run CMD quietly, print "[prog] NAME  1.2s" when it
#                           succeeds, or its last output lines and exit when it fails.
#   note MSG / warn MSG / die MSG
#   debian_mirror           the Debian mirror this machine's apt uses
#   missing_debs PKG...     the packages of the list that are not installed

STRATA_PROG=${STRATA_PROG:-$(basename "$0")}

note() { printf '[%s] %s\n' "$STRATA_PROG" "$*"; }
warn() { printf '[%s] WARNING: %s\n' "$STRATA_PROG" "$*" >&2; }
die() {
    printf '[%s] ERROR: %s\n' "$STRATA_PROG" "$*" >&2
    exit 1
}

# Seconds since the epoch with milliseconds, and elapsed time since $1.
_now() { date +%s.%N; }
_since() { awk -v a="$1" -v b="$(_now)" 'BEGIN { printf "%.1fs", b - a }'; }

# step NAME CMD ARGS...
# Runs CMD in a subshell with errexit active (it is not part of a condition, so
# `set -e` holds inside shell functions too), its output kept in a log that is
# only shown when the step fails. Steps run in subshells: they communicate
# through files, not through shell variables.
step() {
    local name=$1
    shift
    local t0 log rc
    t0=$(_now)
    log=$(mktemp "${TMPDIR:-/tmp}/strata-step.XXXXXX")
    set +e
    (
        set -euo pipefail
        "$@"
    ) </dev/null >"$log" 2>&1
    rc=$?
    set -e
    if [ "$rc" -ne 0 ]; then
        printf '[%s] FAILED: %s (exit %s after %s); last output:\n' \
            "$STRATA_PROG" "$name" "$rc" "$(_since "$t0")" >&2
        tail -n 80 "$log" | sed 's/^/    /' >&2
        rm -f "$log"
        exit "$rc"
    fi
    rm -f "$log"
    printf '[%s] %-44s %8s\n' "$STRATA_PROG" "$name" "$(_since "$t0")"
}

# The codename of this machine's Debian release (bookworm on Debian 12).
debian_codename() {
    local c=""
    if [ -r /etc/os-release ]; then
        c=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    fi
    echo "${c:-bookworm}"
}

# The mirror that apt uses for the main archive of this release: the first URI of
# an enabled "deb" entry whose suite is exactly the release codename, read from
# /etc/apt/sources.list.d/*.sources (deb822) or the one-line sources.list files.
# Falls back to http://deb.debian.org/debian.
debian_mirror() {
    local codename uri=""
    codename=$(debian_codename)
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        uri=$(awk -v want="$codename" '
            function flush() {
                if (enabled && types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " want " ") && uris != "") {
                    split(uris, u, " "); print u[1]; found = 1; exit
                }
                types = ""; suites = ""; uris = ""; enabled = 1
            }
            BEGIN { enabled = 1 }
            /^[ \t]*#/ { next }
            /^[ \t]*$/ { flush(); next }
            {
                key = tolower($1); sub(/:$/, "", key); $1 = ""; sub(/^ +/, "")
                if (key == "types") types = $0
                else if (key == "suites") suites = $0
                else if (key == "uris") uris = $0
                else if (key == "enabled" && tolower($0) == "no") enabled = 0
            }
            END { if (!found) flush() }
        ' "$f")
        [ -n "$uri" ] && break
    done
    if [ -z "$uri" ]; then
        for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
            [ -r "$f" ] || continue
            uri=$(awk -v want="$codename" '
                $1 == "deb" {
                    i = 2
                    if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                    if ($(i + 1) == want) { print $i; exit }
                }' "$f")
            [ -n "$uri" ] && break
        done
    fi
    echo "${uri:-http://deb.debian.org/debian}" | sed 's:/*$::'
}

missing_debs() {
    local p
    for p in "$@"; do
        if [ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null)" != "ii " ]; then
            echo "$p"
        fi
    done
}
