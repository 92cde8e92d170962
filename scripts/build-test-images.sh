#!/usr/bin/env bash
# Builds the root filesystems that strata's tests, benchmarks and demo use.
#
#   scripts/build-test-images.sh [--debian] [OUT_DIR]     (OUT_DIR: /var/cache/strata/images)
#
# Always:
#   OUT_DIR/busybox-rootfs/          /bin/busybox (busybox-static) + a symlink per applet,
#                                    /etc/{passwd,group,shadow,hostname,hosts,os-release},
#                                    users root(0), user(1000, /home/user), nobody(65534)
#   OUT_DIR/busybox-rootfs.tar       tar --numeric-owner -C busybox-rootfs .  (reproducible:
#   OUT_DIR/busybox-rootfs.tar.gz    sorted names, fixed mtimes, gzip -n)
# With --debian (slow: minutes; the demo's image, and the E2B `base` template:
# import it with `strata image import OUT_DIR/debian-python.tar.gz --name e2b-base --trusted`):
#   OUT_DIR/debian-python/           debootstrap --variant=minbase bookworm + python3 (also as
#                                    `python`), venv, pip, node (Debian's nodejs) and npm (from
#                                    the npm registry, pinned: NPM_VERSION), git, curl, sudo,
#                                    procps, iproute2; user 1000 with passwordless sudo; no apt
#                                    caches or lists
#   OUT_DIR/debian-python.tar.gz
#
# Idempotent: the busybox image is rebuilt only when this script or busybox changed
# (a stamp file records both); the Debian image when its recipe (packages, npm
# version; recorded in a stamp file) changed, else it is kept.
# Needs root (chown, chroot, debootstrap) and scripts/setup-host.sh's packages.
set -euo pipefail

STRATA_PROG=build-test-images
# shellcheck source=scripts/lib.sh
. "$(dirname "$(readlink -f "$0")")/lib.sh"

usage() {
    sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

DEBIAN=0
OUT=""
for arg in "$@"; do
    case "$arg" in
    --debian) DEBIAN=1 ;;
    -h | --help) usage 0 ;;
    -*) usage 2 >&2 ;;
    *)
        [ -z "$OUT" ] || usage 2 >&2
        OUT=$arg
        ;;
    esac
done
OUT=${OUT:-/var/cache/strata/images}

[ "$(id -u)" -eq 0 ] || die "run as root (images need files owned by uid 0 and 1000)"
mkdir -p "$OUT"
OUT=$(readlink -f "$OUT")

# All files in the images get this mtime, so the tarballs are byte-for-byte
# reproducible (stable layer digests across runs and machines).
EPOCH=${SOURCE_DATE_EPOCH:-1700000000}

# Unmount anything mounted at or below $1 (debootstrap mounts proc/sys in its
# target; an interrupted run can leave them), then delete $1 without ever crossing
# into another filesystem.
safe_rm_tree() {
    local dir=$1 m
    [ -e "$dir" ] || return 0
    dir=$(readlink -f "$dir")
    case "$dir" in
    "$OUT"/?*) ;;
    *) die "refusing to delete $dir (outside $OUT)" ;;
    esac
    awk -v d="$dir" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo |
        sort -r | while read -r m; do umount -l "$m"; done
    if awk -v d="$dir" '$5 == d || index($5, d "/") == 1 { found = 1 } END { exit !found }' /proc/self/mountinfo; then
        die "$dir still has mounts below it; not deleting it"
    fi
    rm -rf --one-file-system "$dir"
}

# Reproducible tar of a rootfs directory's contents.
tar_rootfs() {
    local dir=$1 out=$2
    tar --numeric-owner --sort=name --mtime="@$EPOCH" --format=posix \
        --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
        -C "$dir" -cf "$out.tmp" .
    mv -f "$out.tmp" "$out"
}

# --- busybox ---------------------------------------------------------------------

find_static_busybox() {
    local b
    b=$(dpkg -L busybox-static 2>/dev/null | grep -E '/s?bin/busybox$' | head -n1 || true)
    [ -n "$b" ] && [ -x "$b" ] || die "busybox-static is not installed (run scripts/setup-host.sh)"
    if ldd "$b" >/dev/null 2>&1; then
        die "$b is dynamically linked; need busybox-static's binary"
    fi
    echo "$b"
}

build_busybox_rootfs() {
    local bb=$1 dir=$2 ver applet target up
    ver=$({ "$bb" --help 2>&1 || true; } | awk 'NR == 1 { sub(/^v/, "", $2); print $2 }')
    safe_rm_tree "$dir"
    mkdir -p "$dir"
    cd "$dir"

    install -d -m 0755 bin sbin usr/bin usr/sbin etc dev proc sys run mnt var home usr/local/bin
    install -d -m 1777 tmp var/tmp
    install -d -m 0700 root
    install -d -m 0755 -o 1000 -g 1000 home/user
    install -m 0755 "$bb" bin/busybox

    # One relative symlink per applet, at busybox's own path for it (bin/, sbin/,
    # usr/bin/, usr/sbin/), e.g. usr/bin/env -> ../../bin/busybox.
    "$bb" --list-full | while read -r applet; do
        [ -n "$applet" ] || continue
        [ "$applet" = bin/busybox ] && continue
        [ -e "$applet" ] || [ -L "$applet" ] && continue
        up=${applet//[^\/]/}  # one "/" per directory level below the root
        up=${up//\//../}
        mkdir -p "$(dirname "$applet")"
        if [ "${applet%/*}" = bin ]; then
            ln -s busybox "$applet"
        else
            ln -s "${up}bin/busybox" "$applet"
        fi
    done
    # Every applet of `busybox --list` must now exist somewhere on PATH.
    for applet in $("$bb" --list); do
        for target in bin sbin usr/bin usr/sbin; do
            [ -L "$target/$applet" ] || [ -e "$target/$applet" ] && continue 2
        done
        ln -s busybox "bin/$applet"
    done
    [ -L bin/sh ] || die "busybox has no sh applet"

    cat >etc/passwd <<'EOF'
root:x:0:0:root:/root:/bin/sh
user:x:1000:1000:user:/home/user:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
    cat >etc/group <<'EOF'
root:x:0:
user:x:1000:
nogroup:x:65534:
EOF
    cat >etc/shadow <<'EOF'
root:*:19000:0:99999:7:::
user:*:19000:0:99999:7:::
nobody:*:19000:0:99999:7:::
EOF
    chmod 0644 etc/passwd etc/group
    chmod 0640 etc/shadow
    echo strata >etc/hostname
    cat >etc/hosts <<'EOF'
127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
EOF
    cat >etc/os-release <<EOF
NAME="strata busybox test image"
PRETTY_NAME="strata busybox test image (BusyBox $ver)"
ID=strata-busybox
VERSION_ID="$ver"
HOME_URL="https://busybox.net/"
EOF
    find . -exec touch -h -d "@$EPOCH" {} +
}

BB=$(find_static_busybox)
BB_DIR=$OUT/busybox-rootfs
BB_STAMP=$OUT/.busybox-rootfs.stamp
STAMP_NOW="$(sha256sum "$0" | cut -d' ' -f1) $(sha256sum "$BB" | cut -d' ' -f1) $EPOCH"

if [ -f "$BB_STAMP" ] && [ "$(cat "$BB_STAMP")" = "$STAMP_NOW" ] &&
    [ -x "$BB_DIR/bin/busybox" ] && [ -f "$OUT/busybox-rootfs.tar" ] && [ -f "$OUT/busybox-rootfs.tar.gz" ]; then
    note "busybox-rootfs: up to date ($OUT)"
else
    rm -f "$BB_STAMP"
    step "busybox-rootfs/ ($("$BB" --list | wc -l) applets)" build_busybox_rootfs "$BB" "$BB_DIR"
    step "busybox-rootfs.tar" tar_rootfs "$BB_DIR" "$OUT/busybox-rootfs.tar"
    gz() { gzip -n -9 -c "$1" >"$2.tmp" && mv -f "$2.tmp" "$2"; }
    step "busybox-rootfs.tar.gz" gz "$OUT/busybox-rootfs.tar" "$OUT/busybox-rootfs.tar.gz"
    echo "$STAMP_NOW" >"$BB_STAMP"
    note "busybox-rootfs: $(du -sh "$BB_DIR" | cut -f1) dir, $(du -h "$OUT/busybox-rootfs.tar" | cut -f1) tar, $(du -h "$OUT/busybox-rootfs.tar.gz" | cut -f1) tar.gz"
fi

# --- Debian + Python (only with --debian) ---------------------------------------

DEB_DIR=$OUT/debian-python
DEB_TAR=$OUT/debian-python.tar.gz
DEB_OK=$OUT/.debian-python.rootfs-ok
DEB_INCLUDE=python3,python3-venv,python3-pip,python-is-python3,nodejs,ca-certificates,git,curl,sudo,procps,iproute2
# npm for the image's node (Debian's own npm package drags in a compiler toolchain and
# hundreds of node-* packages): the npm registry's, a version that runs on node 18.
NPM_VERSION=10.9.2
DEB_STAMP=$OUT/.debian-python.stamp
DEB_RECIPE="include=$DEB_INCLUDE npm=$NPM_VERSION"

# npm's own package, unpacked under ROOT/usr/local (as `npm install -g` would place it).
install_npm() {
    local root=$1 work
    command -v npm >/dev/null || die "npm is not installed (run scripts/setup-host.sh)"
    work=$(mktemp -d)
    (cd "$work" && npm pack --silent "npm@$NPM_VERSION" >/dev/null) || { rm -rf "$work"; die "npm pack npm@$NPM_VERSION failed"; }
    install -d "$root/usr/local/lib/node_modules/npm" "$root/usr/local/bin"
    tar -xzf "$work/npm-$NPM_VERSION.tgz" -C "$root/usr/local/lib/node_modules/npm" --strip-components=1 \
        --no-same-owner --no-same-permissions
    rm -rf "$work"
    ln -sfn ../lib/node_modules/npm/bin/npm-cli.js "$root/usr/local/bin/npm"
    ln -sfn ../lib/node_modules/npm/bin/npx-cli.js "$root/usr/local/bin/npx"
    chroot "$root" /usr/local/bin/npm --version >/dev/null || die "npm $NPM_VERSION does not run in the image"
}

debootstrap_rootfs() {
    local mirror=$1 tmp=$DEB_DIR.tmp
    command -v debootstrap >/dev/null || die "debootstrap is not installed (run scripts/setup-host.sh)"
    safe_rm_tree "$tmp"
    rm -f "$DEB_OK"
    debootstrap --variant=minbase --include="$DEB_INCLUDE" bookworm "$tmp" "$mirror"
    # debootstrap unmounts what it mounted; make sure before anything is deleted.
    if awk -v d="$tmp" 'index($5, d "/") == 1 { f = 1 } END { exit !f }' /proc/self/mountinfo; then
        die "mounts left below $tmp after debootstrap"
    fi

    install_npm "$tmp"
    chroot "$tmp" /usr/sbin/useradd --uid 1000 --user-group --create-home \
        --home-dir /home/user --shell /bin/bash user
    echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' >"$tmp/etc/sudoers.d/user"
    chmod 0440 "$tmp/etc/sudoers.d/user"
    chroot "$tmp" /usr/sbin/visudo -cq
    echo strata >"$tmp/etc/hostname"
    printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$tmp/etc/hosts"
    # The runtime provides /etc/resolv.conf; do not ship the build host's.
    rm -f "$tmp/etc/resolv.conf"
    : >"$tmp/etc/resolv.conf"

    # No caches, package lists, logs or device nodes (the runtime makes /dev).
    chroot "$tmp" /usr/bin/apt-get clean
    rm -rf "$tmp"/var/lib/apt/lists/* "$tmp"/var/cache/apt/*.bin \
        "$tmp"/var/cache/debconf/*-old "$tmp"/var/lib/dpkg/*-old \
        "$tmp"/var/log/*.log "$tmp"/var/log/apt/* "$tmp"/var/cache/ldconfig/aux-cache \
        "$tmp"/tmp/* "$tmp"/var/tmp/* "$tmp"/root/.cache "$tmp"/root/.npm
    find "$tmp/dev" -mindepth 1 -delete

    safe_rm_tree "$DEB_DIR"
    mv "$tmp" "$DEB_DIR"
    touch "$DEB_OK"
    printf '%s\n' "$DEB_RECIPE" >"$DEB_STAMP"
}

tar_gz_rootfs() {
    local dir=$1 out=$2
    tar --numeric-owner --sort=name --xattrs --xattrs-include='security.capability' \
        -C "$dir" -cf - . | gzip -n -6 >"$out.tmp"
    mv -f "$out.tmp" "$out"
}

if [ "$DEBIAN" = 1 ]; then
    if [ "$(cat "$DEB_STAMP" 2>/dev/null)" != "$DEB_RECIPE" ] && { [ -f "$DEB_TAR" ] || [ -f "$DEB_OK" ]; }; then
        note "debian-python: its recipe changed ($DEB_RECIPE): rebuilt"
        rm -f "$DEB_TAR" "$DEB_OK"
    fi
    if [ -f "$DEB_TAR" ]; then
        note "debian-python.tar.gz: exists ($(du -h "$DEB_TAR" | cut -f1)), skipped"
    else
        if [ -f "$DEB_OK" ] && [ -x "$DEB_DIR/usr/bin/python3" ]; then
            note "debian-python/: cached rootfs"
        else
            MIRROR=$(debian_mirror)
            step "debian-python/ (debootstrap from $MIRROR)" debootstrap_rootfs "$MIRROR"
        fi
        step "debian-python.tar.gz" tar_gz_rootfs "$DEB_DIR" "$DEB_TAR"
        note "debian-python: $(du -sh "$DEB_DIR" | cut -f1) dir, $(du -h "$DEB_TAR" | cut -f1) tar.gz"
    fi
fi
