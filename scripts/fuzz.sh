#!/usr/bin/env bash
# Runs every fuzz target for N seconds each (default 30). Needs a nightly
# toolchain and cargo-fuzz (`cargo install cargo-fuzz`). Not part of CI.
#   scripts/fuzz.sh [SECONDS] [TARGET...]   (FUZZ_TARGET_DIR overrides fuzz/target)
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${1:-30}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
for t in "${targets[@]}"; do
    echo "== $t: ${secs}s"
    mkdir -p "corpus/$t"
    cargo +nightly fuzz run --target-dir "${FUZZ_TARGET_DIR:-target}" "$t" "corpus/$t" -- -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048
done
echo "fuzz: ${#targets[@]} targets, ${secs}s each, no crash"
