#!/usr/bin/env bash
# The long forms of every reliability suite (RELIABILITY.md), in release
# mode: among them process_faults' 2-minute operator soak (three relays, two
# producers, purge/replay/requeue; issue 11.1) and run_faults' eight 50 MB
# payloads under prlimit (11.3); then the fuzz targets when a nightly
# toolchain and cargo-fuzz are installed, then the arm64 smoke of the
# static release binary (`release`:
# tests/binary/release.rs cross-builds it with scripts/release.sh and runs it under
# qemu-user). Prints each suite's figures and a summary; exits non-zero if
# any suite failed. Takes about an hour on a 2-core machine.
#
#   scripts/soak.sh                 # everything
#   scripts/soak.sh model           # only the named suites (a test binary, or a
#                                   # file of a grouped one: tests/README.md)
#   FUZZ_SECONDS=120 scripts/soak.sh  # seconds per fuzz target (default 60; 0 skips fuzzing)
#   SOAK_RELEASE=0 scripts/soak.sh    # debug build (the figures in RELIABILITY.md are from one)
#
# Logs go to ${SOAK_LOG_DIR:-target/soak}/<suite>.log.
set -uo pipefail
cd "$(dirname "$0")/.."

suites=("$@")
if [ ${#suites[@]} -eq 0 ]; then
    suites=(process_faults run_faults exactly_once storage_faults host_contention model nats_e2e fuzz release)
fi
logs="${SOAK_LOG_DIR:-target/soak}"
mkdir -p "$logs"
export OUTBOXD_FULL=1
profile=(--release)
if [ "${SOAK_RELEASE:-1}" = 0 ]; then
    profile=()
fi

summary=()
failed=0
run_suite() {
    local name="$1"
    shift
    local log="$logs/$name.log"
    local start=$SECONDS
    echo "== $name: $*"
    if "$@" >"$log" 2>&1; then
        status=ok
    else
        status=FAILED
        failed=1
    fi
    local took=$((SECONDS - start))
    if [ "$name" = fuzz ]; then
        # libFuzzer is chatty: each target's header, its final count, and
        # any crash with the input that caused it.
        grep -E '^(== |fuzz:)|^Done [0-9]+ runs|panicked at|SUMMARY:|Failing input|Test unit written' "$log" \
            | sed 's/^/   /' || true
    else
        # The figures: everything the tests print, without the harness's lines.
        grep -vE '^(running [0-9]+ tests?|test .* \.\.\. |test result:|successes:|failures:|$)' "$log" \
            | grep -vE '^ *(Compiling|Running|Finished|Blocking|Updating|Locking)' \
            | grep -vE '^(stack backtrace:| +[0-9]+: | +at )' | sed 's/^/   /' || true
        grep -E '^test result:' "$log" | sed 's/^/   /' || true
    fi
    summary+=("$(printf '%-16s %-7s %5ss  %s' "$name" "$status" "$took" "$log")")
}

# The arguments of `cargo test` for a suite: a file of a grouped test binary
# (tests/GROUP/SUITE.rs) is that binary's tests under `SUITE::`; anything
# else is a test binary of its own (process_faults, exactly_once, library).
suite_args() { # SUITE
    local f group
    for f in tests/*/"$1".rs; do
        if [ -e "$f" ] && [ "${f#tests/common/}" = "$f" ]; then
            group=${f#tests/}
            echo "--test ${group%%/*} -- $1::"
            return
        fi
    done
    echo "--test $1 --"
}

build_ok=1
if printf '%s\n' "${suites[@]}" | grep -qvE '^(fuzz|release)$'; then
    echo "== building the test binaries (${profile[*]:-debug})"
    if ! cargo test "${profile[@]}" --no-run >"$logs/build.log" 2>&1; then
        echo "build failed; see $logs/build.log"
        build_ok=0
        failed=1
    fi
fi

for s in "${suites[@]}"; do
    case "$s" in
        fuzz)
            secs="${FUZZ_SECONDS:-60}"
            if [ "$secs" = 0 ]; then
                summary+=("$(printf '%-16s %-7s' fuzz skipped) (FUZZ_SECONDS=0)")
            elif cargo +nightly --version >/dev/null 2>&1 && cargo +nightly fuzz --version >/dev/null 2>&1; then
                run_suite fuzz scripts/fuzz.sh "$secs"
            else
                summary+=("$(printf '%-16s %-7s' fuzz skipped) (needs the nightly toolchain and cargo-fuzz)")
            fi
            ;;
        release)
            # Its own build: the static arm64 binary (dist profile, cross).
            run_suite release cargo test --test binary -- --ignored --nocapture release::smoke_aarch64
            ;;
        *)
            if [ "$build_ok" = 1 ]; then
                # shellcheck disable=SC2046 # suite_args's words are separate arguments
                run_suite "$s" cargo test "${profile[@]}" $(suite_args "$s") --nocapture --test-threads=1
            else
                summary+=("$(printf '%-16s %-7s' "$s" 'not run') (build failed)")
            fi
            ;;
    esac
done

echo
echo "== soak summary (OUTBOXD_FULL=1, ${profile[*]:-debug})"
printf '%s\n' "${summary[@]}"
exit "$failed"
