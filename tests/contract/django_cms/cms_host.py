"""A Django CMS that knows nothing of outboxd: its models, its migrations,
its ORM, its default SQLite database (db.sqlite3 beside this file). Used by
tests/hosts/capture_django.rs, which copies this folder to a temporary one.

    python cms_host.py migrate   makemigrations + migrate (CMS_WITH_SUMMARY=1
                                 adds Page.summary: a table rebuild)
    python cms_host.py write     create, update and delete through the ORM
    python cms_host.py edit      one more update
    python cms_host.py pages N   creates N pages (one INSERT of many rows)
    python cms_host.py churn S SEED
                                 edits, deletes and creates pages through the
                                 ORM for S seconds (one transaction each)
    python cms_host.py contend N SEED
                                 N writes in transaction.atomic() blocks, each
                                 a read then a write, as a CMS's admin does;
                                 counts "database is locked" errors
                                 (CMS_SQLITE_RECOMMENDED=1: transaction_mode
                                 IMMEDIATE and timeout 5, see docs/capture.md)

Each prints a JSON report on stdout.
"""

import os
import random
import time

import json
import sys
from pathlib import Path

BASE = Path(__file__).resolve().parent
sys.path.insert(0, str(BASE))

import django  # noqa: E402
from django.conf import settings  # noqa: E402

OPTIONS = {}
if os.environ.get("CMS_SQLITE_RECOMMENDED"):
    # What docs/capture.md recommends for a Django site beside outboxd.
    OPTIONS = {"transaction_mode": "IMMEDIATE", "timeout": 5}

settings.configure(
    INSTALLED_APPS=["cms"],
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": BASE / "db.sqlite3",
            "OPTIONS": OPTIONS,
        }
    },
    DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    USE_TZ=True,
)
django.setup()

from django.core.management import call_command  # noqa: E402


def migrate():
    call_command("makemigrations", "cms", verbosity=0)
    call_command("migrate", verbosity=0)
    migrations = sorted(p.name for p in (BASE / "cms" / "migrations").glob("0*.py"))
    return {"migrations": migrations}


def write():
    from cms.models import Comment, Page

    page = Page.objects.create(slug="hello", title="Hello", body="First", status="draft")
    page.title = "Hello, world"
    page.status = "published"
    page.save()
    page.save()  # changes nothing: no event
    comment = Comment.objects.create(page=page, author="ann", body="Nice!")
    comment_id = comment.id
    comment.delete()
    bye = Page.objects.create(slug="bye", title="Bye")
    bye_id = bye.id
    bye.delete()
    return {"page": page.id, "comment": comment_id, "bye": bye_id}


def edit():
    from cms.models import Page

    page = Page.objects.get(slug="hello")
    page.title = "After the migration"
    page.save()
    return {"page": page.id}


def pages():
    from cms.models import Page

    n = int(sys.argv[2])
    Page.objects.bulk_create(
        [Page(slug=f"page-{i}", title=f"Page {i}", status="draft") for i in range(n)],
        batch_size=500,
    )
    return {"pages": Page.objects.count()}


def churn():
    """Edits, deletes and creates pages until the time is up; every
    operation is its own transaction, retried when the database is locked
    (a snapshot chunk holds the write lock for a moment)."""
    from django.db import OperationalError, transaction
    from cms.models import Page

    seconds, rng = float(sys.argv[2]), random.Random(int(sys.argv[3]))
    end = time.monotonic() + seconds
    counts = {"updated": 0, "deleted": 0, "created": 0, "locked": 0}
    ids = list(Page.objects.values_list("id", flat=True))
    n = 0
    while time.monotonic() < end:
        n += 1
        what = rng.random()
        try:
            with transaction.atomic():
                if what < 0.7 and ids:
                    page = Page.objects.filter(id=rng.choice(ids)).first()
                    if page is not None:
                        page.title = f"edit {n}"
                        page.status = rng.choice(["draft", "published"])
                        page.save()
                        counts["updated"] += 1
                elif what < 0.85 and ids:
                    victim = ids.pop(rng.randrange(len(ids)))
                    Page.objects.filter(id=victim).delete()
                    counts["deleted"] += 1
                else:
                    page = Page.objects.create(slug=f"new-{n}-{rng.random()}", title=f"new {n}")
                    ids.append(page.id)
                    counts["created"] += 1
        except OperationalError as e:
            if "locked" not in str(e):
                raise
            counts["locked"] += 1
        # Mostly a few tens of edits a second, as a busy admin would.
        time.sleep(rng.random() * 0.01)
    return counts


def contend():
    """N transactions, each reading a page then writing one, as an admin's
    save does; counts those Django fails with "database is locked"."""
    from django.db import OperationalError, transaction
    from cms.models import Page

    n, rng = int(sys.argv[2]), random.Random(int(sys.argv[3]))
    locked, done = 0, 0
    start = time.monotonic()
    for i in range(n):
        try:
            with transaction.atomic():
                count = Page.objects.count()
                if count and rng.random() < 0.6:
                    page = Page.objects.order_by("?").first()
                    page.title = f"contend {i}"
                    page.save()
                else:
                    Page.objects.create(slug=f"c-{os.getpid()}-{i}", title=f"contend {i}")
            done += 1
        except OperationalError as e:
            if "locked" not in str(e):
                raise
            locked += 1
    return {"ops": n, "done": done, "locked": locked, "seconds": time.monotonic() - start}


if __name__ == "__main__":
    commands = {
        "migrate": migrate,
        "write": write,
        "edit": edit,
        "pages": pages,
        "churn": churn,
        "contend": contend,
    }
    print(json.dumps(commands[sys.argv[1]]()))
