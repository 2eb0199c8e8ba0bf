#!/usr/bin/env bash
# Regenerates docs/console.png, the README's picture of the console's
# overview: an hour of made-up traffic in a fresh database, served by
# `outboxd console --config`, shot by headless Chromium (the browser tests'
# harness, tests/binary/console_browser.rs, test `readme_screenshot`).
# Needs Debian's chromium and chromium-driver (apt-get install chromium
# chromium-driver).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-docs/console.png}"
OUTBOXD_SCREENSHOT="$PWD/$out" cargo test --test binary console_browser::readme_screenshot -- --ignored --exact
echo "wrote $out"
