"""A host that knows nothing of outboxd: it writes to its own tables with
Python's sqlite3 (the system's SQLite, 3.40 on Debian 12), and the capture
triggers outboxd installed turn its writes into events. Used by
tests/hosts/capture_hosts.rs.

    capture_host.py DB values          every kind of value, every statement shape
    capture_host.py DB writer N COUNT  one of several concurrent writers

Each prints JSON on stdout: `values` one report, `writer` one line per
committed change.
"""

import json
import random
import sqlite3
import sys


def connect(path):
    conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 30000")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


def values(path):
    """One insert per value, then the statement shapes hosts use."""
    conn = connect(path)
    kinds = [
        None,
        0,
        -(2**63),
        2**63 - 1,
        0.1,
        1e300,
        float("inf"),
        float("-inf"),
        "plain",
        "é “quoted” 日本 🎉",
        'back\\slash "quote"',
        "tab\tline\nreturn\r",
        b"\x00\xff blob",
        b"",
    ]
    # Text that is not UTF-8 (or holds NUL, or ESC): bound as bytes, cast.
    raw_text = [b"caf\xe9", b"nul\x00inside", b"esc \x1b[1m"]
    writes = 0
    for v in kinds:
        conn.execute("INSERT INTO things (v) VALUES (?)", (v,))
        writes += 1
    for b in raw_text:
        conn.execute("INSERT INTO things (v) VALUES (CAST(? AS TEXT))", (b,))
        writes += 1
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("UPDATE things SET v = 'updated' WHERE id <= 3")  # 3 rows
    conn.execute("INSERT OR REPLACE INTO things (id, v) VALUES (4, 'replaced')")  # d + c
    conn.execute(
        "INSERT INTO things (id, v) VALUES (5, 'upserted') "
        "ON CONFLICT (id) DO UPDATE SET v = excluded.v"
    )  # u
    conn.execute("INSERT OR IGNORE INTO things (id, v) VALUES (5, 'ignored')")  # nothing
    conn.execute("COMMIT")
    conn.execute("DELETE FROM things WHERE id > 10")  # bulk
    deleted = conn.execute("SELECT changes()").fetchone()[0]
    print(
        json.dumps(
            {
                "sqlite_version": sqlite3.sqlite_version,
                "inserts": writes,
                "deleted": deleted,
            }
        )
    )


def writer(path, n, count):
    """Random inserts, updates and deletes of this writer's own pages, one
    transaction each, logging every committed change."""
    conn = connect(path)
    rnd = random.Random(n)
    live = {}
    for i in range(count):
        action = rnd.random()
        conn.execute("BEGIN IMMEDIATE")
        if not live or action < 0.4:
            slug = f"w{n}-{i}"
            conn.execute(
                "INSERT INTO pages (slug, title, rev) VALUES (?, ?, 1)",
                (slug, f"page {i} of writer {n}"),
            )
            conn.execute(
                "INSERT INTO comments (page_slug, body) VALUES (?, ?)",
                (slug, f"first comment on {slug}"),
            )
            change = ("c", slug, 1)
            live[slug] = 1
        elif action < 0.85:
            slug = rnd.choice(sorted(live))
            live[slug] += 1
            conn.execute(
                "UPDATE pages SET rev = ?, title = ? WHERE slug = ?",
                (live[slug], f"revision {live[slug]}", slug),
            )
            change = ("u", slug, live[slug])
        else:
            slug = rnd.choice(sorted(live))
            conn.execute("DELETE FROM pages WHERE slug = ?", (slug,))
            change = ("d", slug, live.pop(slug))
        conn.execute("COMMIT")
        print(json.dumps({"op": change[0], "slug": change[1], "rev": change[2]}), flush=True)


if __name__ == "__main__":
    db, mode = sys.argv[1], sys.argv[2]
    if mode == "values":
        values(db)
    elif mode == "writer":
        writer(db, int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(f"unknown mode {mode}")
