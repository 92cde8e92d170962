#!/usr/bin/env bash
# Installs what strata's build, tests, benchmarks and demo need on a Debian 12 host,
# as root: Debian packages, and CRIU >= 4 built from source into /usr/local/sbin/criu
# (Debian 12's own criu 3.17 fails `criu check` on current kernels), runsc, and for the
# microvm tier QEMU >= 10 and a guest kernel with its modules in /usr/local/lib/strata/microvm.
#
# Idempotent: packages already installed and a CRIU >= 4 built with the current patch
# set (scripts/criu-patches/, e.g. the Linux 6.16 socket-option fix) and make flags are skipped,
# and CRIU's source tarball and build tree are cached under /var/cache/strata/.
# The system's apt sources are never modified: CRIU's source is located through a
# private apt configuration (its own sources list and index directory under the
# cache) that points a deb-src line for trixie at the mirror this machine uses.
#
# Environment:
#   STRATA_CACHE          cache root (default /var/cache/strata)
#   STRATA_CRIU_SUITE     Debian suite whose criu source package is built (default trixie)
#   STRATA_FORCE_CRIU=1   rebuild and reinstall CRIU even if a CRIU >= 4 is installed
#   STRATA_FORCE_MICROVM=1  fetch the microvm guest kernel and modules again
set -euo pipefail

STRATA_PROG=setup-host
# shellcheck source=scripts/lib.sh
. "$(dirname "$(readlink -f "$0")")/lib.sh"

CACHE=${STRATA_CACHE:-/var/cache/strata}
CRIU_SUITE=${STRATA_CRIU_SUITE:-trixie}
CRIU_BIN=/usr/local/sbin/criu
CRIU_CACHE=$CACHE/criu
# Patches applied to CRIU's source before building (see scripts/criu-patches/); a CRIU
# built from another patch set (or none) is rebuilt. The stamp records which one.
CRIU_PATCH_DIR=$(dirname "$(readlink -f "$0")")/criu-patches
# CRIU caches what it probed about the kernel (~20-40 ms per run) in RUNDIR/criu.kdat,
# but only on a tmpfs (so that a reboot drops it); /run is not a tmpfs on every host,
# so strata's daemon keeps a small tmpfs at /run/strata/criu for it.
CRIU_MAKE_FLAGS=(RUNDIR=/run/strata/criu)
CRIU_PATCH_SET=$( (cat "$CRIU_PATCH_DIR"/*.patch 2>/dev/null; echo "${CRIU_MAKE_FLAGS[*]}") | sha256sum | cut -c1-12)
CRIU_STAMP=/usr/local/lib/strata/criu.patch-set
APT_SRC=$CACHE/apt-src
export DEBIAN_FRONTEND=noninteractive

[ "$(id -u)" -eq 0 ] || die "run as root"
command -v apt-get >/dev/null || die "apt-get not found: this script is for Debian 12"

T_START=$(_now)

# --- Debian packages -------------------------------------------------------------

# Sandboxes, tests, benchmarks and the demo.
RUNTIME_DEBS=(
    busybox-static   # test rootfs
    bubblewrap       # baseline for benchmarks
    hyperfine        # benchmarks
    debootstrap      # the demo's Debian rootfs
    iproute2         # ip netns, veth
    nftables         # sandbox networking; also CRIU's network lock backend
    iptables         # CRIU runs iptables-save/iptables-restore for net namespaces
    util-linux       # nsenter, unshare, mount
    mount            # mount -o loop: per-sandbox disks (ext4 image on a loop device)
    e2fsprogs        # mkfs.ext4 for per-sandbox disks and the microvm tier's layer-chain images (-d)
    ca-certificates
    tar gzip xz-utils
    python3 python3-venv python3-pip   # the demo's Python client
    pkg-config
    gcc libc6-dev make                 # cc for Rust crates with C parts (rusqlite bundled, ring)
    docker-registry skopeo             # registry pull tests: a registry on loopback, fed by skopeo
    podman                             # image import tests: archives from `podman save` (private storage, no containers)
    chromium chromium-driver           # the web console's tests in a real browser (headless, driven by Selenium)
    postgresql-15                      # PostgreSQL metadata tests: each test process runs a private cluster (initdb) on loopback
    # CRIU's runtime libraries (also pulled in by the -dev packages below)
    libprotobuf-c1 libnl-3-200 libnet1 libcap2 libuuid1 libbsd0 libgnutls30 libnftables1
)
# Only needed to build CRIU (`make criu`; no docs, no crit, no python bindings).
CRIU_BUILD_DEBS=(
    libprotobuf-c-dev protobuf-c-compiler libprotobuf-dev   # descriptor.proto
    libnl-3-dev libnet1-dev libcap-dev uuid-dev
    libbsd-dev libgnutls28-dev libnftables-dev
    patch
)

# criu_version BIN: prints "MAJOR.MINOR.PATCH" or nothing.
criu_version() {
    [ -x "$1" ] || return 0
    "$1" --version 2>/dev/null | awk '/^Version:/ { print $2; exit }'
}
criu_ok() {
    local v
    v=$(criu_version "$1")
    [ -n "$v" ] && [ "${v%%.*}" -ge 4 ] 2>/dev/null
}

NEED_CRIU_BUILD=1
if [ "${STRATA_FORCE_CRIU:-0}" != 1 ] && criu_ok "$CRIU_BIN" && [ "$(cat "$CRIU_STAMP" 2>/dev/null)" = "$CRIU_PATCH_SET" ]; then
    NEED_CRIU_BUILD=0
fi

WANT=("${RUNTIME_DEBS[@]}")
if [ "$NEED_CRIU_BUILD" = 1 ]; then
    WANT+=("${CRIU_BUILD_DEBS[@]}")
fi
mapfile -t MISSING < <(missing_debs "${WANT[@]}")

apt_install() {
    apt-get update -q
    apt-get install -y -q --no-install-recommends "$@"
}
# Debian's docker-registry package starts a registry on [::]:5000 when installed;
# the tests run their own on loopback, so that service is stopped and disabled.
stop_packaged_registry() {
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
        systemctl disable --now docker-registry.service >/dev/null 2>&1 || true
    elif [ -x /etc/init.d/docker-registry ]; then
        /etc/init.d/docker-registry stop >/dev/null 2>&1 || true
        update-rc.d docker-registry disable >/dev/null 2>&1 || true
    fi
}
if [ "${#MISSING[@]}" -gt 0 ]; then
    step "apt-get install (${#MISSING[@]} packages)" apt_install "${MISSING[@]}"
    if printf '%s\n' "${MISSING[@]}" | grep -qx docker-registry; then
        stop_packaged_registry
        note "docker-registry: packaged service stopped and disabled (tests start their own)"
    fi
else
    note "Debian packages: all ${#WANT[@]} present"
fi

# --- CRIU >= 4 from Debian's newer source package -----------------------------------

# A private apt configuration rooted at directory $1 (its sources.list names only
# what one step needs): it uses its own index directory, so the system's sources,
# indexes and pins are untouched, and apt checks what it downloads against the
# signed index. CRIU's source and runsc from backports come through it.
apt_private() {
    local dir=$1
    shift
    apt-get \
        -o Dir::Etc::sourcelist="$dir/sources.list" \
        -o Dir::Etc::sourceparts="$dir/sources.list.d" \
        -o Dir::Etc::preferencesparts="$dir/preferences.d" \
        -o Dir::State::Lists="$dir/lists" \
        -o Dir::Cache="$dir/cache" \
        -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= \
        -o APT::Sandbox::User=root \
        "$@"
}

fetch_criu_source() {
    local mirror
    mirror=$(debian_mirror)
    mkdir -p "$APT_SRC"/{lists/partial,cache/archives/partial,sources.list.d,preferences.d} "$CRIU_CACHE"
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $CRIU_SUITE main" \
        >"$APT_SRC/sources.list"
    apt_private "$APT_SRC" update -q
    local tmp
    tmp=$(mktemp -d "$CRIU_CACHE/dl.XXXXXX")
    # Only the upstream (orig) tarball: the build uses no Debian patches.
    (cd "$tmp" && apt_private "$APT_SRC" source --download-only --tar-only -q "criu/$CRIU_SUITE")
    local f
    f=$(find "$tmp" -maxdepth 1 -name 'criu_*.orig.tar.*' | head -n1)
    [ -n "$f" ] || { echo "no criu orig tarball was downloaded" >&2; exit 1; }
    mv -f "$f" "$CRIU_CACHE/"
    rm -rf "$tmp" "$APT_SRC"  # ~20 MB of indexes, not needed once the tarball is cached
}

# The newest cached orig tarball whose version is >= 4.
cached_criu_tarball() {
    local f v
    for f in "$CRIU_CACHE"/criu_*.orig.tar.*; do
        [ -f "$f" ] || continue
        v=${f##*/criu_}
        if [ "${v%%.*}" -ge 4 ] 2>/dev/null; then echo "$f"; fi
    done | sort -V | tail -n1
}

build_criu() {
    local tarball=$1 ver src p
    ver=$(basename "$tarball" | sed -E 's/^criu_(.*)\.orig\.tar\..*$/\1/')
    src=$CRIU_CACHE/criu-$ver-$CRIU_PATCH_SET
    if [ ! -x "$src/criu/criu" ]; then
        rm -rf "$src"
        mkdir -p "$src"
        tar -xf "$tarball" -C "$src" --strip-components=1
        for p in "$CRIU_PATCH_DIR"/*.patch; do
            [ -f "$p" ] || continue
            if patch -d "$src" -p1 -N --dry-run -s <"$p" >/dev/null 2>&1; then
                patch -d "$src" -p1 -N -s <"$p"
                echo "applied $(basename "$p")"
            else
                echo "skipped $(basename "$p") (does not apply: fixed upstream in $ver?)"
            fi
        done
        make -C "$src" -j"$(nproc)" "${CRIU_MAKE_FLAGS[@]}" criu
    fi
    "$src/criu/criu" --version
    install -D -m 0755 "$src/criu/criu" "$CRIU_BIN"
    mkdir -p "$(dirname "$CRIU_STAMP")"
    echo "$CRIU_PATCH_SET" >"$CRIU_STAMP"
}

if [ "$NEED_CRIU_BUILD" = 1 ]; then
    TARBALL=$(cached_criu_tarball)
    if [ -z "$TARBALL" ]; then
        step "fetch criu source ($CRIU_SUITE orig tarball)" fetch_criu_source
        TARBALL=$(cached_criu_tarball)
        [ -n "$TARBALL" ] || die "no criu >= 4 source tarball in $CRIU_CACHE"
    else
        note "criu source: cached $(basename "$TARBALL")"
    fi
    step "build + install criu ($(basename "$TARBALL"))" build_criu "$TARBALL"
fi

CRIU_VER=$(criu_version "$CRIU_BIN")
criu_ok "$CRIU_BIN" || die "$CRIU_BIN reports version '${CRIU_VER:-none}', need >= 4"
case ":$PATH:" in
*:/usr/local/sbin:*) ;;
*) warn "/usr/local/sbin is not in PATH; strata should call $CRIU_BIN by its full path" ;;
esac
if [ -x /usr/sbin/criu ]; then
    warn "/usr/sbin/criu ($(criu_version /usr/sbin/criu)) is also installed; prefer $CRIU_BIN"
fi

# `criu check` verdict: informative only, never fatal here.
T0=$(_now)
set +e
CHECK_OUT=$(timeout 60 "$CRIU_BIN" check 2>&1)
CHECK_RC=$?
set -e
if [ "$CHECK_RC" -eq 0 ] && grep -q 'Looks good' <<<"$CHECK_OUT"; then
    note "criu $CRIU_VER at $CRIU_BIN; criu check: $(grep 'Looks good' <<<"$CHECK_OUT" | tail -n1) ($(_since "$T0"))"
    # Optional features (e.g. soft-dirty tracking for incremental dumps): one line.
    ALL_OUT=$(timeout 60 "$CRIU_BIN" check --all 2>&1 || true)
    MISSING_FEATS=$(grep -E '^(Warn|Error)' <<<"$ALL_OUT" | sed -E 's/^[A-Za-z]+ *\([^)]*\): *//' | paste -sd ';' - || true)
    note "criu check --all: $(grep -m1 'Looks good' <<<"$ALL_OUT" || echo 'see criu check --all')${MISSING_FEATS:+ ($MISSING_FEATS)}"
else
    warn "criu $CRIU_VER at $CRIU_BIN; 'criu check' FAILED (exit $CHECK_RC):"
    sed 's/^/    /' <<<"$CHECK_OUT" | tail -n 30 >&2
    warn "checkpoint/restore tests may fail or be skipped on this host"
fi

# --- gVisor (runsc) from bookworm-backports -----------------------------------------
# The gvisor tier takes runsc >= 0.0~20240729 (the systrap platform; checkpoint and
# restore that keep the processes), which only bookworm-backports has: Debian 12's
# own 0.0~20221219 is ptrace-only. Like CRIU's source, it comes through a private apt
# configuration (apt_private) that knows only backports (the system's sources, indexes and pins are
# untouched); the .deb is checked against the signed index, then installed (runsc is
# one static binary with no dependencies). See docs/design/gvisor-tier.md.
RUNSC_MIN=0.0~20240729
APT_BPO=$CACHE/apt-bpo

runsc_current() {
    local v
    v=$(dpkg-query -W -f='${Version}' runsc 2>/dev/null) || return 1
    dpkg --compare-versions "$v" ge "$RUNSC_MIN"
}

install_runsc() {
    rm -rf "$APT_BPO"
    mkdir -p "$APT_BPO"/{lists/partial,cache/archives/partial,sources.list.d,preferences.d,debs}
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $(debian_mirror) bookworm-backports main" \
        >"$APT_BPO/sources.list"
    apt_private "$APT_BPO" update -q
    (cd "$APT_BPO/debs" && apt_private "$APT_BPO" download runsc/bookworm-backports)
    apt-get install -y -q --no-install-recommends "$APT_BPO"/debs/runsc_*.deb
    rm -rf "$APT_BPO"
    runsc --version | sed -n 1p  # not head: runsc gets SIGPIPE and pipefail fails the step
}

if [ "$(debian_codename)" != bookworm ]; then
    note "runsc: not bookworm ($(debian_codename)); install runsc >= $RUNSC_MIN yourself for the gvisor tier"
elif runsc_current; then
    note "runsc: $(dpkg-query -W -f='${Version}' runsc) present"
else
    step "install runsc (bookworm-backports)" install_runsc
fi

# --- microVM tier: QEMU >= 10 and a guest kernel -------------------------------------
# The microvm tier boots `qemu-system-x86_64 -M microvm` (TCG here: /dev/kvm is PVM and
# hangs guests) with Debian's cloud kernel and an initramfs that strata builds from its
# own strata-init and the kernel's modules; the guest's root is an overlay of the layer
# chain as a read-only ext4 image (`mkfs.ext4 -d`, e2fsprogs) and the sandbox's own ext4
# disk (docs/microvm.md).
#
# QEMU: the machine image carries qemu-utils 10.0.2 from bookworm-backports, beside which
# Debian 12's own qemu-system-x86 7.2 does not install (qemu-utils 10 breaks
# qemu-system-common < 8). So on bookworm the packages that must come from backports are
# downloaded through the private apt configuration (as runsc is) and installed as local
# .debs; the system's apt resolves their libraries from its own sources. They are the ones
# whose bookworm versions do not satisfy qemu-system-x86 10: qemu-system-common (= its
# version), qemu-system-data (>> 10.0.2) and seabios (>> 1.16.3; bookworm has 1.16.2).
# (`apt-get install -t bookworm-backports` would need backports among the system's
# sources, and would take every other dependency backports has from there too.)
#
# Guest kernel: the package linux-image-cloud-amd64 depends on (the system's candidate)
# is downloaded, never installed (that would run the host's initramfs and boot-loader
# hooks), and unpacked with dpkg-deb -x; only what a guest needs is kept in
# $MICROVM_DIR: vmlinuz, kernel-version (its `uname -r`), package ("NAME VERSION" of
# the .deb), and modules/: the modules of MICROVM_MODULES that are not built into that
# kernel, with what they depend on (each .ko's modinfo `depends=`: the package has no
# modules.dep), uncompressed, and modules/order, one file name a line, dependencies
# first: what the initramfs insmods in that order; modules/builtin names those of the
# list built into the kernel (ext4 in Debian 12's). The directory is built beside its
# place and renamed into it. Skipped when present with every module of the list
# (STRATA_FORCE_MICROVM=1 fetches it again).
QEMU_MIN_MAJOR=10
QEMU_BPO_DEBS=(qemu-system-x86 qemu-system-common qemu-system-data seabios)
MICROVM_DIR=/usr/local/lib/strata/microvm
# Module names (as modinfo spells them) the guest needs, and ones it uses when its kernel
# has them: virtio-mmio transport (devices found through microvm's ACPI tables), block,
# console (virtio-serial: the agent's channel), net, rng; ext4 for the disks, overlay to join them.
MICROVM_MODULES=(virtio_mmio virtio_blk virtio_console virtio_net virtio_rng ext4 overlay)
MICROVM_OPTIONAL_MODULES=(vmgenid)

qemu_major() {
    qemu-system-x86_64 --version 2>/dev/null | sed -nE '1s/^QEMU emulator version ([0-9]+)\..*/\1/p'
}
qemu_current() {
    local m
    m=$(qemu_major)
    [ -n "$m" ] && [ "$m" -ge "$QEMU_MIN_MAJOR" ]
}

install_qemu_bpo() {
    rm -rf "$APT_BPO"
    mkdir -p "$APT_BPO"/{lists/partial,cache/archives/partial,sources.list.d,preferences.d,debs}
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $(debian_mirror) bookworm-backports main" \
        >"$APT_BPO/sources.list"
    apt_private "$APT_BPO" update -q
    (cd "$APT_BPO/debs" && apt_private "$APT_BPO" download "${QEMU_BPO_DEBS[@]/%//bookworm-backports}")
    apt-get update -q  # the libraries come from the system's own sources
    apt-get install -y -q --no-install-recommends "$APT_BPO"/debs/*.deb
    # Only qemu-system-x86 was asked for: the others go when it goes (apt autoremove).
    apt-mark auto "${QEMU_BPO_DEBS[@]:1}"
    rm -rf "$APT_BPO"
    qemu-system-x86_64 --version | sed -n 1p
}

# microvm_assets_present: the kernel, its version and every module of the list is there
# (in modules/order, or recorded as built in).
microvm_assets_present() {
    local m
    [ -s "$MICROVM_DIR/vmlinuz" ] && [ -s "$MICROVM_DIR/kernel-version" ] && [ -f "$MICROVM_DIR/modules/order" ] || return 1
    for m in "${MICROVM_MODULES[@]}"; do
        grep -qxF "$m" "$MICROVM_DIR/modules/builtin" 2>/dev/null ||
            sed 's/\.ko$//; s/-/_/g' "$MICROVM_DIR/modules/order" | grep -qxF "$m" || return 1
    done
}

fetch_microvm_kernel() {
    local pkg tmp kver kdir
    # Runs in step's subshell: this trap cleans up after a failure too.
    MVM_CLEAN=()
    trap 'rm -rf "${MVM_CLEAN[@]}"' EXIT
    apt-get update -q
    pkg=$(apt-cache depends linux-image-cloud-amd64 | awk '$1 == "Depends:" && $2 ~ /^linux-image-.*-cloud-amd64$/ { print $2; exit }')
    [ -n "$pkg" ] || { echo "linux-image-cloud-amd64 depends on no linux-image-*-cloud-amd64" >&2; exit 1; }
    mkdir -p "$CACHE" "$(dirname "$MICROVM_DIR")"
    tmp=$(mktemp -d "$CACHE/microvm-kernel.XXXXXX")
    MVM_CLEAN+=("$tmp")
    (cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root "$pkg")
    local deb
    deb=$(find "$tmp" -maxdepth 1 -name "${pkg}_*.deb" | head -n1)
    [ -n "$deb" ] || { echo "apt-get download $pkg left no .deb" >&2; exit 1; }
    dpkg-deb -x "$deb" "$tmp/x"
    kdir=$(find "$tmp/x/lib/modules" -mindepth 1 -maxdepth 1 -type d | head -n1)
    kver=$(basename "$kdir")
    [ -f "$tmp/x/boot/vmlinuz-$kver" ] || { echo "no boot/vmlinuz-$kver in $pkg" >&2; exit 1; }

    # Module name -> file (names with '-' and '_' are the same module).
    declare -A kofile=() seen=()
    local f n
    while IFS= read -r f; do
        n=$(basename "$f")
        n=${n%%.ko*}
        kofile[${n//-/_}]=$f
    done < <(find "$kdir" -name '*.ko' -o -name '*.ko.xz' -o -name '*.ko.zst' -o -name '*.ko.gz')
    builtin_mod() { sed 's:.*/::; s/\.ko$//; s/-/_/g' "$kdir/modules.builtin" | grep -qxF "$1"; }
    ko_depends() {
        local z dep
        case $1 in
        *.xz) z=(xz -dc) ;; *.zst) z=(zstd -dc) ;; *.gz) z=(gzip -dc) ;; *) z=(cat) ;;
        esac
        dep=$("${z[@]}" "$1" | tr '\0' '\n' | sed -n 's/^depends=//p')
        dep=${dep%%$'\n'*}
        echo "${dep//,/ }"
    }
    local order=() builtins=() absent=()
    add_module() {  # post-order: dependencies first
        local m=$1 d
        [ -z "${seen[$m]:-}" ] || return 0
        seen[$m]=1
        for d in $(ko_depends "${kofile[$m]}"); do
            if [ -n "${kofile[${d//-/_}]:-}" ]; then add_module "${d//-/_}"; else builtin_mod "$d" || { echo "$m needs $d: neither a module nor built in" >&2; exit 1; }; fi
        done
        order+=("${kofile[$m]}")
    }
    for n in "${MICROVM_MODULES[@]}" "${MICROVM_OPTIONAL_MODULES[@]}"; do
        if [ -n "${kofile[$n]:-}" ]; then
            add_module "$n"
        elif builtin_mod "$n"; then
            builtins+=("$n")
        elif printf '%s\n' "${MICROVM_OPTIONAL_MODULES[@]}" | grep -qxF "$n"; then
            absent+=("$n")
        else
            echo "$kver has no $n (neither a module nor built in)" >&2
            exit 1
        fi
    done

    local new=$MICROVM_DIR.new.$$ out
    rm -rf "$new"
    MVM_CLEAN+=("$new")
    mkdir -p "$new/modules"
    cp "$tmp/x/boot/vmlinuz-$kver" "$new/vmlinuz"
    echo "$kver" >"$new/kernel-version"
    echo "$(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version)" >"$new/package"
    : >"$new/modules/order"
    for f in "${order[@]}"; do
        n=$(basename "$f")
        out=${n%%.ko*}.ko
        case $f in
        *.xz) xz -dc "$f" >"$new/modules/$out" ;;
        *.zst) zstd -dc "$f" >"$new/modules/$out" ;;
        *.gz) gzip -dc "$f" >"$new/modules/$out" ;;
        *) cp "$f" "$new/modules/$out" ;;
        esac
        echo "$out" >>"$new/modules/order"
    done
    { [ "${#builtins[@]}" -eq 0 ] || printf '%s\n' "${builtins[@]}"; } >"$new/modules/builtin"
    chmod -R a+rX "$new"
    rm -rf "$MICROVM_DIR.old"
    [ ! -e "$MICROVM_DIR" ] || mv -T "$MICROVM_DIR" "$MICROVM_DIR.old"
    mv -T "$new" "$MICROVM_DIR"
    rm -rf "$MICROVM_DIR.old"
    echo "$pkg: $kver; modules: $(sed 's/\.ko$//' "$MICROVM_DIR/modules/order" | paste -sd ' ' -); built in: ${builtins[*]:-none}; absent: ${absent[*]:-none}"
}

if ! qemu_current; then
    if [ "$(debian_codename)" = bookworm ]; then
        step "install qemu-system-x86 (bookworm-backports)" install_qemu_bpo
    else
        step "apt-get install qemu-system-x86" apt_install qemu-system-x86
    fi
fi
qemu_current || die "qemu-system-x86_64 reports version '$(qemu-system-x86_64 --version 2>/dev/null | sed -n 1p)', the microvm tier needs QEMU >= $QEMU_MIN_MAJOR"
note "qemu: $(qemu-system-x86_64 --version | sed -n 1p)"

if [ "${STRATA_FORCE_MICROVM:-0}" != 1 ] && microvm_assets_present; then
    note "microvm kernel: $(cat "$MICROVM_DIR/package") ($(cat "$MICROVM_DIR/kernel-version")) present in $MICROVM_DIR"
else
    step "microvm guest kernel + modules ($MICROVM_DIR)" fetch_microvm_kernel
    note "microvm kernel: $(cat "$MICROVM_DIR/package"); modules/order: $(sed 's/\.ko$//' "$MICROVM_DIR/modules/order" | paste -sd ' ' -); built in: $(paste -sd ' ' "$MICROVM_DIR/modules/builtin")"
fi
# The guests' disks (mkfs.ext4 -d) need e2fsprogs; it is in RUNTIME_DEBS above, so this
# only catches a failed install.
mapfile -t MISSING < <(missing_debs e2fsprogs)
[ "${#MISSING[@]}" -eq 0 ] || die "the microvm tier needs ${MISSING[*]}"

# --- pinned Python SDKs for the MCP and E2B tests ---------------------------------
# Each official SDK, pinned, in its own venv; skipped when that venv already has the
# version. pinned_venv PACKAGE VERSION VENV IMPORTS
pinned_venv() {
    local pkg=$1 version=$2 venv=$3 imports=$4
    install_venv() {
        rm -rf "$venv"
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check "$pkg==$version"
        "$venv/bin/python" -c "import $imports"
    }
    if [ "$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('$pkg'))" 2>/dev/null)" = "$version" ]; then
        note "$pkg $version: present in $venv"
    else
        step "python venv with $pkg==$version ($venv)" install_venv
    fi
}
# The MCP Python SDK for crates/cli/tests/mcp.rs (STRATA_MCP_VENV overrides; the tests read it too).
pinned_venv mcp 2.3.0 "${STRATA_MCP_VENV:-$CACHE/venv-mcp}" "mcp, httpx2"
# The `e2b` SDK for the E2B compatibility suite, crates/cli/tests/e2b.rs and docs/e2b-compat.md
# (STRATA_E2B_VENV overrides; the tests read it too).
pinned_venv e2b 2.63.0 "${STRATA_E2B_VENV:-$CACHE/venv-e2b}" e2b
# Selenium for the web console's browser test, crates/cli/tests/console.rs (STRATA_SELENIUM_VENV
# overrides; the test reads it too). 4.40.0: newer ones need a certifi the PyPI mirror lacks.
pinned_venv selenium 4.40.0 "${STRATA_SELENIUM_VENV:-$CACHE/venv-selenium}" selenium

# --- pinned JavaScript SDKs for the E2B compatibility suite -------------------------
# The official `e2b` npm package, an old (2.45, the last to check the key's form) and a
# current version, exactly as crates/cli/tests/e2b/js/package-lock.json pins them (versions
# and integrity hashes), installed with `npm ci` into $CACHE/e2b-js (STRATA_E2B_JS
# overrides; the test reads it too); skipped when that lockfile is already installed there.
# The SDK needs Node.js >= 20.18 (undici 7).
E2B_JS=${STRATA_E2B_JS:-$CACHE/e2b-js}
E2B_JS_SRC="$(dirname "$(readlink -f "$0")")/../crates/cli/tests/e2b/js"
node_ok() {
    command -v node >/dev/null &&
        node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 18) ? 0 : 1)'
}
if ! node_ok; then
    step "apt-get install nodejs npm" apt_install nodejs npm
fi
node_ok || die "the E2B JS suite needs Node.js >= 20.18 and npm (found node $(node --version 2>/dev/null || echo none))"
install_e2b_js() {
    rm -rf "$E2B_JS"
    mkdir -p "$E2B_JS"
    cp "$E2B_JS_SRC/package.json" "$E2B_JS_SRC/package-lock.json" "$E2B_JS/"
    (cd "$E2B_JS" && npm ci --no-audit --no-fund --loglevel=error)
}
if cmp -s "$E2B_JS_SRC/package-lock.json" "$E2B_JS/package-lock.json" && [ -f "$E2B_JS/node_modules/e2b/package.json" ]; then
    note "e2b npm SDKs: present in $E2B_JS"
else
    step "npm ci: e2b SDKs for the JS suite ($E2B_JS)" install_e2b_js
fi

# --- an S3 server for the object-store tests ----------------------------------------
# s3s-fs (crates.io, the s3s project's file-system backend): an S3 API over a directory,
# which the tests of `--archive-url s3://...` run on loopback (crates/cli/tests/archive.rs).
# Chosen over Garage for a test fixture: one small binary and a directory, nothing to lay
# out (Garage wants a cluster layout and keys made through its admin CLI first); Garage is
# what a deployment would run, and the same S3 client code talks to either. 0.14.1 is the
# newest that builds with this machine's rustc (1.95); about 2 minutes to build.
S3S_VERSION=0.14.1
S3S_BIN=/usr/local/bin/s3s-fs
S3S_STAMP=/usr/local/lib/strata/s3s-fs.version
install_s3s_fs() {
    local cargo
    cargo=$(command -v cargo || echo "$HOME/.cargo/bin/cargo")
    "$cargo" install s3s-fs --version "$S3S_VERSION" --locked --features binary --root "$CACHE/s3s-fs"
    install -m 0755 "$CACHE/s3s-fs/bin/s3s-fs" "$S3S_BIN"
    mkdir -p "$(dirname "$S3S_STAMP")"
    echo "$S3S_VERSION" > "$S3S_STAMP"
}
if [ -x "$S3S_BIN" ] && [ "$(cat "$S3S_STAMP" 2>/dev/null)" = "$S3S_VERSION" ]; then
    note "s3s-fs $S3S_VERSION: present ($S3S_BIN)"
else
    step "cargo install s3s-fs $S3S_VERSION (the tests' S3 server)" install_s3s_fs
fi

# --- Rust toolchain (not installable from Debian 12: its rustc is too old) ---------
if ! command -v cargo >/dev/null && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
    warn "cargo not found: strata needs a Rust toolchain >= 1.80 (rustup); Debian 12's rustc is too old"
fi

note "host ready in $(_since "$T_START")"
