#!/usr/bin/env bash
# Peak RSS of `outboxd run` draining N events (default 1,000,000).
#
#   scripts/bench-rss.sh [path/to/outboxd]          # default: the static build, else target/release/outboxd
#   N=20000 scripts/bench-rss.sh target/release/outboxd    # smoke
#   RUN_ARGS='--config bench.toml' scripts/bench-rss.sh     # extra arguments after `run`
#
# Enqueues N events with plain SQL (the sqlite3 CLI) into a migrated database
# in a temp dir on disk, starts `outboxd --db DB run > /dev/null`, polls
# the pending count until it is 0 (confirmed by `outboxd status --json`), reads the process's peak
# resident set (VmHWM in /proc/PID/status), then sends SIGTERM and waits for
# a clean exit. Prints one Markdown table row. Needs sqlite3 and jq.
#
# The row also gives the largest anonymous part seen (RssAnon, sampled each
# second: the heap, SQLite's caches, stacks) and the file-backed part at the
# end (RssFile: the binary's and libc's code the kernel mapped). The
# file-backed part depends on how the binary sits in the page cache (a file
# just written is mapped in large folios, more of it at once), so the
# binary's cached pages are dropped before the run (dd iflag=nocache): every
# run then maps its code as after a reboot, and runs compare.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${1:-}
if [[ -z $bin ]]; then
    for b in target/x86_64-unknown-linux-musl/dist/outboxd target/x86_64-unknown-linux-gnu/dist/outboxd \
        "${CARGO_TARGET_DIR:-target}/release/outboxd"; do
        if [[ -x $b ]]; then bin=$b; break; fi
    done
fi
[[ -n $bin && -x $bin ]] || { echo "error: no outboxd binary; pass its path" >&2; exit 2; }
for tool in sqlite3 jq; do
    command -v "$tool" >/dev/null || { echo "error: $tool is needed (apt-get install $tool)" >&2; exit 2; }
done
n=${N:-1000000}
timeout_s=${TIMEOUT:-1800}

# A temp dir on disk: not /tmp when /tmp is a tmpfs.
base=${OUTBOXD_BENCH_DIR:-${TMPDIR:-/tmp}}
if [[ $(stat -f -c %T "$base") == tmpfs ]]; then base=$PWD; fi
dir=$(mktemp -d "$base/outboxd-rss.XXXXXX")
pid=
cleanup() {
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
    rm -rf "$dir"
}
trap cleanup EXIT
db=$dir/rss.db

"$bin" --db "$db" migrate >/dev/null
t0=$(date +%s.%N)
# Valid, unique ULIDs ('01J' + 23 digits: digits are Crockford base32), one
# transaction; timestamps come from the column defaults (now, in ms).
sqlite3 "$db" <<SQL
.output /dev/null
PRAGMA journal_mode = WAL;
PRAGMA synchronous = NORMAL;
BEGIN;
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < $n)
INSERT INTO event_outbox (event_id, event_type, event_version, payload)
SELECT printf('01J%023d', x), 'bench.rss.v1', 1, '{"i":' || x || '}' FROM c;
COMMIT;
PRAGMA wal_checkpoint(TRUNCATE);
SQL
t1=$(date +%s.%N)
echo "enqueued $n events in $(awk "BEGIN {print $t1 - $t0}") s" >&2

# Polling uses the cheap index-only count; `outboxd status` (which also
# counts every delivered row) confirms the end state once.
pending() {
    sqlite3 "$db" "PRAGMA busy_timeout = 5000; SELECT count(*) FROM event_outbox WHERE status = 'pending'" | tail -1
}
status_pending() {
    "$bin" --db "$db" status --json | jq '.counts.pending_due + .counts.pending_delayed + .counts.leased'
}

sync "$bin"
dd if="$bin" iflag=nocache count=0 status=none
start=$(date +%s.%N)
# shellcheck disable=SC2086
"$bin" --db "$db" run ${RUN_ARGS:-} >/dev/null 2>"$dir/run.log" &
pid=$!
hwm=0
anon=0
deadline=$(( $(date +%s) + timeout_s ))
while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "error: outboxd run exited early:" >&2; cat "$dir/run.log" >&2; exit 1
    fi
    h=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
    (( h > hwm )) && hwm=$h
    a=$(awk '/^RssAnon:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
    (( a > anon )) && anon=$a
    left=$(pending 2>/dev/null || echo -1)
    [[ $left == 0 ]] && break
    if (( $(date +%s) > deadline )); then echo "error: $left still pending after ${timeout_s}s" >&2; exit 1; fi
    sleep 1
done
[[ $(status_pending) == 0 ]] || { echo "error: outboxd status still shows pending events" >&2; exit 1; }
end=$(date +%s.%N)
h=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status")
(( h > hwm )) && hwm=$h
a=$(awk '/^RssAnon:/ {print $2}' "/proc/$pid/status")
(( a > anon )) && anon=$a
file=$(awk '/^RssFile:/ {print $2}' "/proc/$pid/status")
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=
delivered=$("$bin" --db "$db" status --json | jq '.counts.delivered')
secs=$(awk "BEGIN {print $end - $start}")
printf '| outboxd run, %s events | peak RSS %.1f MB (VmHWM %s kB) | anon at most %s kB, file %s kB | drained in %.1f s (%s delivered, %s dead) | exit %s after SIGTERM | load %s |\n' \
    "$n" "$(awk "BEGIN {print $hwm / 1024}")" "$hwm" "$anon" "$file" "$secs" "$delivered" \
    "$("$bin" --db "$db" status --json | jq '.counts.dead')" "$rc" "$(cut -d' ' -f1 /proc/loadavg)"
