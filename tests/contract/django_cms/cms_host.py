"""A Django CMS that knows nothing of outboxd: its models, its migrations,
its ORM, its default SQLite database (db.sqlite3 beside this file). Used by
tests/hosts/capture_django.rs, which copies this folder to a temporary one.

    python cms_host.py migrate   makemigrations + migrate (CMS_WITH_SUMMARY=1
                                 adds Page.summary: a table rebuild)
    python cms_host.py write     create, update and delete through the ORM
    python cms_host.py edit      one more update

Each prints a JSON report on stdout.
"""

import json
import sys
from pathlib import Path

BASE = Path(__file__).resolve().parent
sys.path.insert(0, str(BASE))

import django  # noqa: E402
from django.conf import settings  # noqa: E402

settings.configure(
    INSTALLED_APPS=["cms"],
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": BASE / "db.sqlite3",
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


if __name__ == "__main__":
    print(json.dumps({"migrate": migrate, "write": write, "edit": edit}[sys.argv[1]]()))
