#!/usr/bin/env bash
# strata benchmarks: builds the release binaries, starts a private strata daemon, measures
# strata against baselines run in the same process (bwrap, unshare, nsenter, tar -xf, cp), prints
# the table and writes docs/benchmarks.md.
#
#   bench/run.sh [--quick] [EXTRA strata-bench ARGS, e.g. --only create,exec --runs 300]
#
# Run as root on a host prepared by scripts/setup-host.sh. Test images come from
# scripts/build-test-images.sh (the busybox image is built here if missing; run it with
# --debian first to benchmark importing the ~325 MB Debian rootfs instead of a generated one).
# --quick: small sample counts. Only a run with the default settings (no --quick, no extra
# arguments) writes docs/benchmarks.md; other runs write <cargo target dir>/benchmarks-custom.md.
# The pipeline figure also needs the Debian+python image and the demo's wheelhouse (both made
# here when missing: scripts/build-test-images.sh --debian, scripts/build-wheelhouse.sh).
# Env: STRATA_TEST_IMAGES (default /var/cache/strata/images), STRATA_WHEELHOUSE (default
# /var/cache/strata/wheelhouse), BENCH_KEEP=1 keeps the temp dir,
# CARGO_TARGET_DIR (binaries and the static strata-init are built and taken from there).
# Exit status: 0 when every figure was measured (missed targets show as FAIL in the table).
set -euo pipefail

STRATA_PROG=bench
ROOT=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"
cd "$ROOT"

QUICK=0
EXTRA=()
for arg in "$@"; do
    case "$arg" in
    --quick) QUICK=1 ;;
    -h | --help)
        sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *) EXTRA+=("$arg") ;;
    esac
done

[ "$(id -u)" -eq 0 ] || die "run as root (sandboxes need namespaces, mounts and cgroups)"
if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
for t in cargo bwrap unshare nsenter chroot tar du sync setsid; do
    command -v "$t" >/dev/null || die "$t not found (run scripts/setup-host.sh)"
done

IMAGES=${STRATA_TEST_IMAGES:-/var/cache/strata/images}
if [ ! -x "$IMAGES/busybox-rootfs/bin/busybox" ] || [ ! -f "$IMAGES/busybox-rootfs.tar" ]; then
    step "scripts/build-test-images.sh $IMAGES" "$ROOT/scripts/build-test-images.sh" "$IMAGES"
fi

# The pipeline figure (setup reuse, pipeline overhead) needs the Debian+python image and the demo's wheelhouse.
WANT_PIPELINE=1
for ((i = 0; i < ${#EXTRA[@]}; i++)); do
    if [ "${EXTRA[$i]}" = --only ]; then
        case ",${EXTRA[$((i + 1))]:-}," in *,pipeline,*) ;; *) WANT_PIPELINE=0 ;; esac
    fi
done
if [ "$WANT_PIPELINE" = 1 ]; then
    [ -f "$IMAGES/debian-python.tar.gz" ] ||
        step "scripts/build-test-images.sh --debian $IMAGES" "$ROOT/scripts/build-test-images.sh" --debian "$IMAGES"
    "$ROOT/scripts/build-wheelhouse.sh" "${STRATA_WHEELHOUSE:-/var/cache/strata/wheelhouse}"
fi

step "cargo build --release -p strata-bench -p strata" cargo build --release -p strata-bench -p strata
step "build strata-init (static)" scripts/build-init.sh
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps 2>/dev/null |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
TARGET_DIR=${TARGET_DIR:-$ROOT/target}
STRATA=$TARGET_DIR/release/strata
BENCH=$TARGET_DIR/release/strata-bench
[ -x "$STRATA" ] && [ -x "$BENCH" ] || die "release binaries not found in $TARGET_DIR/release"
# The strata-init scripts/build-init.sh just built (into the same target dir).
INIT=$TARGET_DIR/x86_64-unknown-linux-gnu/release/strata-init
[ -x "$INIT" ] || die "static strata-init not found at $INIT"

TMP=$(mktemp -d /var/tmp/strata-bench.XXXXXX)
STATE=$TMP/state
SOCK=$TMP/s.sock
DAEMON_PID=""

# Destroys our sandboxes, stops our daemon, removes the temp dir. Runs on every exit.
cleanup() {
    local rc=$? ids id pid cg m
    set +e
    trap - EXIT INT TERM
    if [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
        ids=$("$STRATA" --socket "$SOCK" ps --json 2>/dev/null | grep -o '"id": *"[0-9a-zA-Z_-]*"' | sed 's/.*"\([^"]*\)"$/\1/')
        if [ -n "$ids" ]; then
            note "cleanup: destroying $(echo "$ids" | wc -l) leftover sandbox(es)"
            # shellcheck disable=SC2086
            timeout 120 "$STRATA" --socket "$SOCK" rm -f $ids >/dev/null 2>&1
        fi
        kill -TERM "$DAEMON_PID" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$DAEMON_PID" 2>/dev/null
        wait "$DAEMON_PID" 2>/dev/null
    fi
    # Sandboxes the daemon could not destroy: kill what is in their cgroups (ids are ours:
    # they are the directories of our private state dir), then remove the cgroups.
    if [ -d "$STATE/sandboxes" ]; then
        for d in "$STATE"/sandboxes/*/; do
            [ -d "$d" ] || continue
            id=$(basename "$d")
            for cg in /sys/fs/cgroup/*/strata/"$id" /sys/fs/cgroup/strata/"$id"; do
                [ -f "$cg/cgroup.procs" ] || continue
                while read -r pid; do kill -KILL "$pid" 2>/dev/null; done <"$cg/cgroup.procs"
            done
            sleep 0.2
            for cg in /sys/fs/cgroup/*/strata/"$id" /sys/fs/cgroup/strata/"$id"; do
                [ -d "$cg" ] && rmdir "$cg" 2>/dev/null
            done
            warn "cleanup: killed leftover sandbox $id"
        done
    fi
    awk -v d="$TMP" 'index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r |
        while read -r m; do umount -l "$m"; done
    if [ "${BENCH_KEEP:-0}" = 1 ]; then
        note "kept $TMP (daemon log: $TMP/daemon.log)"
    else
        rm -rf --one-file-system "$TMP"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Own session: a Ctrl-C in the terminal must not stop the daemon before cleanup has used it.
# A TCP listener on a free loopback port: the preview figure's proxied requests go
# there, and the e2b figure drives it with the E2B SDK.
LISTEN=127.0.0.1:$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
setsid "$STRATA" daemon --state-dir "$STATE" --socket "$SOCK" --init-binary "$INIT" --listen "$LISTEN" >"$TMP/daemon.log" 2>&1 &
DAEMON_PID=$!
for _ in $(seq 100); do
    [ -S "$SOCK" ] && "$STRATA" --socket "$SOCK" ps >/dev/null 2>&1 && break
    if ! kill -0 "$DAEMON_PID" 2>/dev/null; then
        tail -n 20 "$TMP/daemon.log" >&2
        die "the daemon exited during startup"
    fi
    sleep 0.1
done
[ -S "$SOCK" ] || die "the daemon did not open $SOCK within 10 s"
[ "$(readlink "/proc/$DAEMON_PID/exe")" = "$(readlink -f "$STRATA")" ] || die "pid $DAEMON_PID is not the daemon"
note "daemon pid $DAEMON_PID, state $STATE"

step "strata image import busybox-rootfs.tar --name busybox" \
    "$STRATA" --socket "$SOCK" image import "$IMAGES/busybox-rootfs.tar" --name busybox

# The e2b, warm and preview figures: the Debian test image (the E2B `base` template), imported as e2b-base.
WANT_E2B=1
for ((i = 0; i < ${#EXTRA[@]}; i++)); do
    if [ "${EXTRA[$i]}" = --only ]; then
        case ",${EXTRA[$((i + 1))]:-}," in *,e2b,* | *,warm,* | *,preview,*) ;; *) WANT_E2B=0 ;; esac
    fi
done
if [ "$WANT_E2B" = 1 ]; then
    [ -f "$IMAGES/debian-python.tar.gz" ] ||
        step "scripts/build-test-images.sh --debian $IMAGES" "$ROOT/scripts/build-test-images.sh" --debian "$IMAGES"
    step "strata image import debian-python.tar.gz --name e2b-base --trusted" \
        "$STRATA" --socket "$SOCK" image import "$IMAGES/debian-python.tar.gz" --name e2b-base --trusted
fi

COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain 2>/dev/null)" ]; then COMMIT="$COMMIT (working tree has uncommitted changes)"; fi

ARGS=(--socket "$SOCK" --strata "$STRATA" --daemon-pid "$DAEMON_PID" --state-dir "$STATE"
    --images "$IMAGES" --image busybox --work "$TMP" --out "$TMP/benchmarks.md"
    --date "$(date -u +%Y-%m-%dT%H:%M:%SZ)" --commit "$COMMIT" --listen "$LISTEN")
OUT=docs/benchmarks.md
if [ "$QUICK" = 1 ]; then
    ARGS+=(--runs 30 --cli-runs 10 --idle 50 --warmup 3 --standby-count 100 --standby-idle 10)
fi
if [ "$QUICK" = 1 ] || [ "${#EXTRA[@]}" -gt 0 ]; then
    OUT=$TARGET_DIR/benchmarks-custom.md
fi

set +e
timeout --foreground 1800 "$BENCH" "${ARGS[@]}" "${EXTRA[@]}"
RC=$?
set -e
if [ -f "$TMP/benchmarks.md" ]; then
    if [ "$RC" -eq 0 ]; then
        mkdir -p "$(dirname "$OUT")"
        cp "$TMP/benchmarks.md" "$OUT"
        note "wrote $OUT"
    else
        cp "$TMP/benchmarks.md" "$TARGET_DIR/benchmarks-failed.md"
        warn "not all figures were measured; partial results in $TARGET_DIR/benchmarks-failed.md ($OUT unchanged)"
    fi
fi
if [ "$RC" -ne 0 ]; then
    tail -n 20 "$TMP/daemon.log" | sed 's/^/    daemon: /' >&2
fi
exit "$RC"
