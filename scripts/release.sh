#!/usr/bin/env bash
# outboxd's release, built and checked on this machine (x86_64 Debian, root):
# fully static, stripped binaries for x86_64 and arm64 Linux (musl), each
# checked static (no interpreter, no NEEDED entries), at most 10 MB and run
# (the smoke of tests/binary/release.rs; arm64 under qemu-user), then a .deb of
# each, checked and installed into a fresh Debian root and removed again,
# and SHA256SUMS, all in one folder; prints a table of sizes and times.
#
#   scripts/release.sh                   # everything, into $RELEASE_OUT
#                                        # (default: <target dir>/outboxd-<version>)
#   scripts/release.sh binary TARGET     # one static binary, built and checked;
#                                        # prints its path, then the qemu-user that
#                                        # runs it here if foreign (tests/binary/release.rs)
#
# TARGET: x86_64-unknown-linux-musl or aarch64-unknown-linux-musl.
#
# Installs what is missing, so it works on a fresh machine: the rustup musl
# targets; zig and cargo-zigbuild from PyPI in a venv under
# <target dir>/release-tools (zig compiles the bundled SQLite and ring's C
# for either target and links with musl); Debian's file, binutils and
# debootstrap; qemu-user from Debian's bookworm-backports, unpacked under
# <target dir>/release-tools (see ensure_qemu); cargo-deb from crates.io. The Debian root for the
# install check is kept under <target dir>/release-tools (made once, ~2 min).
#
# Builds are CPU-heavy (LTO, one codegen unit): they run at `nice -n 19`
# ($RELEASE_NICE). A build that is up to date costs seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
# Run from a test (tests/binary/release.rs), cargo's variables for that test are in
# the environment; build scripts that watch them (ring's) would make every
# such run rebuild. The release is built the same from a shell or a test.
unset OUT_DIR CARGO_MANIFEST_DIR CARGO_MANIFEST_PATH CARGO_CRATE_NAME CARGO_PRIMARY_PACKAGE \
    CARGO_TARGET_TMPDIR CARGO_RUSTC_CURRENT_DIR
for v in $(compgen -e | grep -E '^CARGO_(PKG|BIN)_' || true); do unset "$v"; done

TARGETS=(x86_64-unknown-linux-musl aarch64-unknown-linux-musl)
MAX_BYTES=$((10 * 1000 * 1000))
PROFILE=dist
# Versions known to work together (the zig that cargo-zigbuild supports).
PIP_TOOLS=("ziglang==0.17.*" "cargo-zigbuild==0.24.*")
CARGO_DEB_VERSION="^3"
DEBIAN_SUITE=${RELEASE_DEBIAN_SUITE:-bookworm}
DEBIAN_MIRROR=${RELEASE_DEBIAN_MIRROR:-http://deb.debian.org/debian}

say() { echo "release: $*" >&2; }
die() {
    echo "release: error: $*" >&2
    exit 1
}
quiet_nice() { nice -n "${RELEASE_NICE:-19}" "$@"; }

TARGET_DIR=$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
VERSION=$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "outboxd"))')
TOOLS="$TARGET_DIR/release-tools"
# The static binaries are built with the default features but `assets`
# (the hidden generate-assets and its clap_mangen/clap_complete, ~219 KB the
# 10 MB limit cannot spare); generate_assets runs a native build that has it.
RELEASE_FEATURES=$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(",".join(f for f in next(p for p in json.load(sys.stdin)["packages"] if p["name"] == "outboxd")["features"]["default"] if f != "assets"))')

# ---------------------------------------------------------------------------
# Tools.

apt_updated=0
apt_install() { # PACKAGE... (only those missing)
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return
    say "installing ${missing[*]} (apt)"
    if [ "$apt_updated" = 0 ]; then
        apt-get update -qq >&2
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

arch_of() { echo "${1%%-*}"; }

ensure_build_tools() { # TARGET
    local target=$1
    case " ${TARGETS[*]} " in
        *" $target "*) ;;
        *) die "unknown target $target (one of: ${TARGETS[*]})" ;;
    esac
    rustup target list --installed | grep -qx "$target" || {
        say "adding the $target target (rustup)"
        rustup target add "$target" >&2
    }
    apt_install file binutils
    if [ "$(arch_of "$target")" != "$(uname -m)" ]; then
        ensure_qemu "$(arch_of "$target")"
    fi
    if [ ! -x "$TOOLS/venv/bin/cargo-zigbuild" ]; then
        say "installing ${PIP_TOOLS[*]} (PyPI) into $TOOLS/venv"
        mkdir -p "$TOOLS"
        python3 -m venv "$TOOLS/venv"
        "$TOOLS/venv/bin/pip" install -q "${PIP_TOOLS[@]}" >&2
    fi
    # cargo-zigbuild runs zig as `python3 -m ziglang` from the venv.
    export PATH="$TOOLS/venv/bin:$PATH"
}

# qemu-user from Debian's bookworm-backports (10.x), unpacked under
# $TOOLS/qemu with a private apt configuration: the machine's sources and
# packages are left alone. bookworm's own qemu-user-static (7.2) hangs now
# and then when the emulated relay spawns a command (a child that never
# reaches exec, its parent blocked in posix_spawn); 10.x does not.
QEMU_SUITE=bookworm-backports
QEMU_VERSION="1:10.0.*"
qemu_for() { echo "$TOOLS/qemu/usr/bin/qemu-$1"; }
ensure_qemu() { # ARCH
    [ -x "$(qemu_for "$1")" ] && return
    say "unpacking qemu-user from $QEMU_SUITE into $TOOLS/qemu"
    local apt="$TOOLS/apt"
    mkdir -p "$apt/sources" "$apt/lists/partial" "$apt/archives/partial"
    cat >"$apt/sources/backports.sources" <<SOURCES
Types: deb
URIs: $DEBIAN_MIRROR
Suites: $QEMU_SUITE
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
    local opts=(-o "Dir::Etc::sourcelist=/dev/null" -o "Dir::Etc::sourceparts=$apt/sources"
        -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache::Archives=$apt/archives"
        -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache=" -o "APT::Sandbox::User=root")
    apt-get "${opts[@]}" update -qq >&2
    local version
    version=$(apt-cache "${opts[@]}" madison qemu-user | awk -v v="$QEMU_VERSION" \
        'BEGIN { gsub(/\*/, ".*", v) } $3 ~ "^" v "$" { print $3; exit }')
    [ -n "$version" ] || die "no qemu-user $QEMU_VERSION in $QEMU_SUITE"
    (cd "$apt/archives" && apt-get "${opts[@]}" download "qemu-user=$version" >&2)
    dpkg-deb -x "$apt"/archives/qemu-user_*.deb "$TOOLS/qemu"
    [ -x "$(qemu_for "$1")" ] || die "qemu-user $version has no qemu-$1"
}

ensure_cargo_deb() {
    if ! cargo deb --version 2>/dev/null | grep -Eq '^cargo-deb 3\.'; then
        say "installing cargo-deb $CARGO_DEB_VERSION (crates.io; a few minutes)"
        quiet_nice cargo install --locked --quiet cargo-deb --version "$CARGO_DEB_VERSION" >&2
    fi
}

# ---------------------------------------------------------------------------
# Binaries.

bin_path() { echo "$TARGET_DIR/$1/$PROFILE/outboxd"; }

# Starts a binary of TARGET on this machine (qemu-user for another arch).
run_target() { # TARGET BINARY ARGS...
    local target=$1
    shift
    if [ "$(arch_of "$target")" != "$(uname -m)" ]; then
        "$(qemu_for "$(arch_of "$target")")" "$@"
    else
        "$@"
    fi
}

declare -A BUILD_SECONDS
build() { # TARGET
    local target=$1 start=$SECONDS
    ensure_build_tools "$target"
    say "building $target (profile $PROFILE)"
    quiet_nice cargo zigbuild --locked --profile "$PROFILE" --target "$target" \
        --no-default-features --features "$RELEASE_FEATURES" >&2
    BUILD_SECONDS[$target]=$((SECONDS - start))
    check_binary "$target" "$(bin_path "$target")"
}

# Static (no PT_INTERP, no NEEDED), stripped, the right machine, small, and
# its --version names the target and the commit it was built from.
check_binary() { # TARGET BINARY
    local target=$1 bin=$2 size machine
    [ -x "$bin" ] || die "$bin was not built"
    local what
    what=$(file -b "$bin")
    case "$what" in
        *"statically linked"* | *"static-pie linked"*) ;;
        *) die "$bin is not static: $what" ;;
    esac
    case "$what" in
        *"not stripped"*) die "$bin is not stripped: $what" ;;
        *stripped*) ;;
        *) die "$bin: file does not say stripped: $what" ;;
    esac
    if readelf -lW "$bin" | grep -q 'INTERP'; then
        die "$bin asks for a program interpreter"
    fi
    if readelf -dW "$bin" | grep -q '(NEEDED)'; then
        die "$bin needs shared libraries: $(readelf -dW "$bin" | grep '(NEEDED)')"
    fi
    machine=$(readelf -hW "$bin" | sed -n 's/^ *Machine: *//p')
    case "$(arch_of "$target"):$machine" in
        x86_64:*X86-64* | aarch64:AArch64) ;;
        *) die "$bin is for $machine, not $target" ;;
    esac
    size=$(stat -c %s "$bin")
    [ "$size" -le "$MAX_BYTES" ] || die "$bin is $size bytes, over $MAX_BYTES"
    local version commit
    version=$(run_target "$target" "$bin" --version)
    commit=unknown
    if [ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$(pwd -P)" ]; then
        commit=$(git rev-parse --short=12 HEAD)
        [ -z "$(git status --porcelain --untracked-files=no)" ] ||
            say "warning: uncommitted changes; $target is built from them, not from $commit alone"
    fi
    [ "$version" = "outboxd $VERSION ($target, commit ${OUTBOXD_BUILD_COMMIT:-$commit})" ] ||
        die "$bin --version says: $version"
    say "$target: static, stripped, $machine, $size bytes: $version"
}

# ---------------------------------------------------------------------------
# Packages.

# The man pages and completions, generated from the binary's clap
# definitions by a native (debug) build with the `assets` feature, which the
# static binaries leave out (the same definitions, so the same files), into
# each target's profile directory, where the assets of
# [package.metadata.deb] (target/release/assets/...) resolve.
generate_assets() {
    local gen="$TARGET_DIR/assets-$VERSION"
    rm -rf "$gen"
    quiet_nice cargo run --locked --quiet --bin outboxd --features assets -- \
        generate-assets "$gen" >/dev/null
    # Debian policy wants man pages gzipped; cargo-deb leaves files under the
    # target dir as they are. -n: no name or time inside, the same bytes each run.
    gzip -9n "$gen"/man/*.1
    for target in "${TARGETS[@]}"; do
        rm -rf "$TARGET_DIR/$target/$PROFILE/assets"
        cp -r "$gen" "$TARGET_DIR/$target/$PROFILE/assets"
    done
    say "man pages and completions: $(find "$gen" -type f | wc -l) files"
}

deb_arch() {
    case "$(arch_of "$1")" in
        x86_64) echo amd64 ;;
        aarch64) echo arm64 ;;
    esac
}

package() { # TARGET OUT -> prints the .deb's path
    local target=$1 out=$2
    cargo deb --no-build --no-strip --locked --target "$target" --profile "$PROFILE" \
        --output "$out/outboxd_${VERSION}-1_$(deb_arch "$target").deb" >&2
    echo "$out/outboxd_${VERSION}-1_$(deb_arch "$target").deb"
}

# What the package must hold, with its mode, as dpkg-deb -c lists it.
EXPECTED_FILES=(
    "-rwxr-xr-x ./usr/bin/outboxd"
    "-rw-r--r-- ./etc/outboxd/outboxd.toml.example"
    "-rw-r--r-- ./usr/lib/systemd/system/outboxd.service"
    "-rw-r--r-- ./usr/share/man/man1/outboxd.1.gz"
    "-rw-r--r-- ./usr/share/man/man1/outboxd-run.1.gz"
    "-rw-r--r-- ./usr/share/bash-completion/completions/outboxd"
    "-rw-r--r-- ./usr/share/zsh/vendor-completions/_outboxd"
    "-rw-r--r-- ./usr/share/fish/vendor_completions.d/outboxd.fish"
)

check_deb_contents() { # TARGET DEB
    local target=$1 deb=$2 listing ctl
    listing=$(dpkg-deb -c "$deb" | awk '{print $1, $6}')
    for entry in "${EXPECTED_FILES[@]}"; do
        grep -qxF -- "$entry" <<<"$listing" || die "$deb lacks $entry; it has:
$listing"
    done
    if grep -v '^d' <<<"$listing" | grep -vE ' \./(usr/bin/outboxd|etc/outboxd/|usr/lib/systemd/system/outboxd\.service|usr/share/(man/man1/outboxd[a-z-]*\.1\.gz|bash-completion/completions/outboxd|zsh/vendor-completions/_outboxd|fish/vendor_completions\.d/outboxd\.fish|doc/outboxd/))'; then
        die "$deb holds files it should not (above)"
    fi
    [ "$(dpkg-deb -f "$deb" Architecture)" = "$(deb_arch "$target")" ] ||
        die "$deb is for $(dpkg-deb -f "$deb" Architecture)"
    ctl=$(mktemp -d)
    dpkg-deb -e "$deb" "$ctl"
    # The unit needs a config and the application's user first: the package
    # never starts it (an upgrade try-restarts it only when it was running).
    # Not enabling it is checked in the Debian root, where the scripts run.
    if grep -hE 'deb-systemd-invoke +(start|restart)|_dh_action=start|systemctl +[a-z-]* *(start|enable|restart)' \
        "$ctl"/postinst "$ctl"/preinst 2>/dev/null; then
        die "$deb's maintainer scripts start the unit (above)"
    fi
    grep -qx '/etc/outboxd/outboxd.toml.example' "$ctl/conffiles" ||
        die "$deb does not mark the example config as a conffile"
    rm -rf "$ctl"
}

# A minimal Debian with systemd (so systemd-analyze and deb-systemd-helper
# act as on a real machine), made once and kept.
debian_root() {
    local root="$TOOLS/debian-$DEBIAN_SUITE"
    if [ ! -x "$root/usr/bin/dpkg" ]; then
        apt_install debootstrap
        say "debootstrap $DEBIAN_SUITE into $root (once)"
        rm -rf "$root.tmp"
        debootstrap --variant=minbase --include=systemd "$DEBIAN_SUITE" "$root.tmp" "$DEBIAN_MIRROR" >&2
        mv "$root.tmp" "$root"
    fi
    echo "$root"
}

# Every path in the root but dpkg's own records and logs.
snapshot() { # ROOT
    (cd "$1" && find . -xdev \( -path ./var/lib/dpkg -o -path ./var/log -o -path ./var/cache \
        -o -path ./proc -o -path ./tmp \) -prune -o -print | sort)
}

# dpkg -i into the root, the unit installed but not enabled, and the unit
# checked; then dpkg --purge, after which the root is as it was.
check_deb_install() { # TARGET DEB
    local target=$1 deb=$2 root before after arch foreign=0
    root=$(debian_root)
    arch=$(deb_arch "$target")
    chroot "$root" dpkg --purge outboxd >/dev/null 2>&1 || true # a failed earlier run
    before=$(snapshot "$root")
    if [ "$arch" != "$(chroot "$root" dpkg --print-architecture)" ]; then
        foreign=1
        chroot "$root" dpkg --add-architecture "$arch"
    fi
    cp "$deb" "$root/tmp/outboxd.deb"
    chroot "$root" dpkg -i /tmp/outboxd.deb >&2 || die "dpkg -i $deb failed"
    rm "$root/tmp/outboxd.deb"
    [ -x "$root/usr/bin/outboxd" ] || die "no /usr/bin/outboxd after installing $deb"
    if [ "$foreign" = 0 ]; then
        chroot "$root" /usr/bin/outboxd --version >&2
    fi
    local enabled
    enabled=$(systemctl --root="$root" is-enabled outboxd.service 2>&1 || true)
    [ "$enabled" = disabled ] || die "after dpkg -i, outboxd.service is '$enabled', not disabled"
    if [ -n "$(find "$root/etc/systemd/system" -name 'outboxd*' -print -quit)" ]; then
        die "dpkg -i enabled the unit: $(find "$root/etc/systemd/system" -name 'outboxd*')"
    fi
    check_unit "$root"
    chroot "$root" dpkg --purge outboxd >&2 || die "dpkg --purge outboxd failed"
    if [ "$foreign" = 1 ]; then
        chroot "$root" dpkg --remove-architecture "$arch"
    fi
    after=$(snapshot "$root")
    if [ "$before" != "$after" ]; then
        diff <(echo "$before") <(echo "$after") >&2 || true
        die "purging $deb left the root changed (above)"
    fi
    say "$deb: installs (unit disabled, not started) and purges cleanly in $DEBIAN_SUITE"
}

SECURITY=""
# systemd-analyze verify on the installed unit (its binary and man page
# resolved in the root), and its security exposure, which must stay "OK" or
# better.
check_unit() { # ROOT
    local root=$1 unit="$1/usr/lib/systemd/system/outboxd.service" report line
    if ! command -v systemd-analyze >/dev/null; then
        say "no systemd-analyze here: unit not verified"
        return
    fi
    MANPATH="$root/usr/share/man" systemd-analyze verify --root="$root" "$unit" >&2 ||
        die "systemd-analyze verify failed on the installed unit"
    report=$(systemd-analyze security --offline=true --root="$root" "$unit" 2>&1) ||
        die "systemd-analyze security failed: $report"
    line=$(grep 'Overall exposure level' <<<"$report")
    case "$line" in
        *" OK "* | *" SAFE "* | *" PERFECT "*) ;;
        *) die "the unit's exposure is no longer OK or better: $line" ;;
    esac
    SECURITY=$(sed -E 's/.*: ([0-9.]+ [A-Z]+).*/\1/' <<<"$line")
}

# ---------------------------------------------------------------------------

human() { python3 -c "import sys; print(f'{int(sys.argv[1]) / 1e6:.1f} MB')" "$1"; }

release() {
    local out=${RELEASE_OUT:-$TARGET_DIR/outboxd-$VERSION} start=$SECONDS
    for target in "${TARGETS[@]}"; do
        build "$target"
    done
    generate_assets

    local smoke_start=$SECONDS smoke
    if [ "${RELEASE_SMOKE:-1}" = 0 ]; then
        say "warning: RELEASE_SMOKE=0: the binaries are not run (for iterating on the packaging only)"
        smoke="not run"
    else
        say "smoke of each binary (tests/binary/release.rs)"
        cargo test --locked --test binary -- --ignored --nocapture --test-threads=1 release:: >&2 ||
            die "the smoke failed"
        smoke="$((SECONDS - smoke_start)) s"
    fi

    ensure_cargo_deb
    rm -rf "$out"
    mkdir -p "$out"
    local debs=()
    for target in "${TARGETS[@]}"; do
        local deb
        deb=$(package "$target" "$out")
        check_deb_contents "$target" "$deb"
        check_deb_install "$target" "$deb"
        cp "$(bin_path "$target")" "$out/outboxd-$VERSION-$target"
        debs+=("$deb")
    done
    (cd "$out" && sha256sum -- outboxd-* outboxd_*.deb >SHA256SUMS && sha256sum --quiet -c SHA256SUMS)

    echo
    echo "outboxd $VERSION in $out (unit exposure: $SECURITY; smoke: $smoke; all: $((SECONDS - start)) s)"
    printf '%-44s %12s %9s  %s\n' file bytes size "build (s)"
    for target in "${TARGETS[@]}"; do
        local f="outboxd-$VERSION-$target" s
        s=$(stat -c %s "$out/$f")
        printf '%-44s %12s %9s  %s\n' "$f" "$s" "$(human "$s")" "${BUILD_SECONDS[$target]}"
    done
    for deb in "${debs[@]}"; do
        local s
        s=$(stat -c %s "$deb")
        printf '%-44s %12s %9s\n' "$(basename "$deb")" "$s" "$(human "$s")"
    done
}

case "${1:-}" in
    "") release ;;
    binary)
        [ $# -eq 2 ] || die "usage: scripts/release.sh binary TARGET"
        build "$2"
        bin_path "$2"
        # Then how to start it here: qemu-user for another architecture.
        if [ "$(arch_of "$2")" != "$(uname -m)" ]; then
            qemu_for "$(arch_of "$2")"
        fi
        ;;
    *) die "usage: scripts/release.sh [binary TARGET]" ;;
esac
