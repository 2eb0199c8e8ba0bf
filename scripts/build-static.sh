#!/usr/bin/env bash
# Builds the fully static x86_64 Linux binary with the shipping profile and
# checks that it is static. musl first; glibc with crt-static as the fallback.
#   scripts/build-static.sh            # -> target/x86_64-unknown-linux-musl/dist/outboxd
# (under $CARGO_TARGET_DIR instead of target/ when that is set)
set -euo pipefail
cd "$(dirname "$0")/.."
target=x86_64-unknown-linux-musl
if rustup target list --installed 2>/dev/null | grep -q "$target" || rustup target add "$target"; then
    command -v x86_64-linux-musl-gcc >/dev/null || {
        apt-get update -qq && apt-get install -y -qq musl-tools >/dev/null
    }
    cargo build --locked --profile dist --target "$target"
else
    echo "musl target unavailable; building glibc with crt-static" >&2
    target=x86_64-unknown-linux-gnu
    RUSTFLAGS='-C target-feature=+crt-static' cargo build --locked --profile dist --target "$target"
fi
bin="${CARGO_TARGET_DIR:-target}/$target/dist/outboxd"
if ldd "$bin" 2>&1 | grep -Eq 'not a dynamic executable|statically linked'; then
    echo "static: $bin ($(stat -c %s "$bin") bytes)"
else
    echo "error: $bin is dynamically linked:" >&2
    ldd "$bin" >&2
    exit 1
fi
