#!/usr/bin/env python3
"""A Python producer that follows docs/sql-contract.md to the letter.

Usage: producer.py DB

Writes, each in its own transaction, a business row (table `orders`, made by
the test) together with an event:

  1. a full event: every optional column filled;
  2. a minimal event: event_id, event_type and payload only;
  3. a legacy event: no event_id at all;
  4. the full event's idempotency key again: ON CONFLICT DO NOTHING writes
     nothing, and the existing event id is looked up;
  5. a business row and an event in a transaction that is rolled back.

Prints one JSON object describing what it wrote, for tests/hosts/sql_contract.rs.
Standard library only (sqlite3, os, time, json).
"""

import json
import os
import sqlite3
import sys
import time

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

# "now" in INTEGER milliseconds since the Unix epoch, computed by SQLite.
NOW_MS = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"


def new_ulid():
    """A ULID: 48-bit millisecond timestamp + 80 random bits, Crockford base32."""
    ms = time.time_ns() // 1_000_000
    n = (ms << 80) | int.from_bytes(os.urandom(10), "big")
    return "".join(CROCKFORD[(n >> shift) & 31] for shift in range(125, -1, -5))


def now_ms():
    return time.time_ns() // 1_000_000


def connect(path):
    # isolation_level=None: no implicit BEGIN; transactions are explicit below.
    conn = sqlite3.connect(path, timeout=5.0, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 5000")
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if mode.lower() != "wal":
        raise SystemExit(f"journal_mode is {mode}, not wal")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


def transaction(conn, work):
    """Runs work(conn) inside BEGIN IMMEDIATE ... COMMIT, rolling back on error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = work(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


INSERT_FULL = f"""
INSERT INTO event_outbox (event_id, event_type, event_version, payload,
                          tenant_id, idempotency_key, ordering_key,
                          causation_id, correlation_id, occurred_at, available_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {NOW_MS})
ON CONFLICT DO NOTHING
"""


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: producer.py DB")
    conn = connect(sys.argv[1])
    report = {"sqlite_version": sqlite3.sqlite_version}

    # 1. Every optional column filled.
    full = {
        "event_id": new_ulid(),
        "event_type": "order.placed.v1",
        "tenant_id": "shop-7",
        "idempotency_key": "order-py-1-placed",
        "ordering_key": "order-py-1",
        "causation_id": "cmd-py-1",
        "correlation_id": "req-py-1",
        "occurred_at": now_ms(),
        "payload": {"order": "py-1", "total_cents": 1250, "note": "caf\u00e9 \u2615"},
    }

    def place_full(c):
        c.execute("INSERT INTO orders (ref, total_cents) VALUES (?, ?)", ("py-1", 1250))
        cur = c.execute(
            INSERT_FULL,
            (
                full["event_id"], full["event_type"], 1,
                json.dumps(full["payload"], ensure_ascii=False),
                full["tenant_id"], full["idempotency_key"], full["ordering_key"],
                full["causation_id"], full["correlation_id"], full["occurred_at"],
            ),
        )
        if cur.rowcount != 1:
            raise SystemExit(f"the full event was not inserted (rowcount {cur.rowcount})")

    transaction(conn, place_full)
    report["full"] = full

    # 2. The minimum a well-behaved producer writes.
    minimal = {"event_id": new_ulid(), "event_type": "order.placed.v1",
               "payload": {"order": "py-2"}}

    def place_minimal(c):
        c.execute("INSERT INTO orders (ref, total_cents) VALUES (?, ?)", ("py-2", 300))
        c.execute(
            "INSERT INTO event_outbox (event_id, event_type, payload) VALUES (?, ?, ?)",
            (minimal["event_id"], minimal["event_type"], json.dumps(minimal["payload"])),
        )

    transaction(conn, place_minimal)
    report["minimal"] = minimal

    # 3. A legacy producer: no event id.
    def place_legacy(c):
        c.execute("INSERT INTO orders (ref, total_cents) VALUES (?, ?)", ("py-3", 700))
        cur = c.execute(
            "INSERT INTO event_outbox (event_type, payload) VALUES (?, ?)",
            ("order.placed.v1", json.dumps({"order": "py-3"})),
        )
        return cur.lastrowid

    report["legacy_row_id"] = transaction(conn, place_legacy)

    # 4. The same (tenant, key) again: nothing is written; find the first event.
    def place_duplicate(c):
        cur = c.execute(
            INSERT_FULL,
            (
                new_ulid(), "order.placed.v1", 1, json.dumps({"order": "py-1", "retry": True}),
                full["tenant_id"], full["idempotency_key"], None, None, None, now_ms(),
            ),
        )
        if cur.rowcount != 0:
            raise SystemExit(f"the duplicate was inserted (rowcount {cur.rowcount})")
        return c.execute(
            "SELECT event_id FROM event_outbox WHERE tenant_id = ? AND idempotency_key = ?",
            (full["tenant_id"], full["idempotency_key"]),
        ).fetchone()[0]

    report["duplicate_of"] = transaction(conn, place_duplicate)

    # 5. A transaction that fails after writing both rows leaves neither.
    rolled_back = new_ulid()

    def place_and_fail(c):
        c.execute("INSERT INTO orders (ref, total_cents) VALUES (?, ?)", ("py-rollback", 1))
        c.execute(
            "INSERT INTO event_outbox (event_id, event_type, payload) VALUES (?, ?, ?)",
            (rolled_back, "order.placed.v1", json.dumps({"order": "py-rollback"})),
        )
        raise RuntimeError("payment declined")

    try:
        transaction(conn, place_and_fail)
        raise SystemExit("the failing transaction did not fail")
    except RuntimeError:
        pass
    report["rolled_back_event_id"] = rolled_back
    report["rolled_back_order"] = "py-rollback"
    report["orders"] = ["py-1", "py-2", "py-3"]

    conn.close()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
