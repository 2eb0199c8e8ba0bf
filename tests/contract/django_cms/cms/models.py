"""The CMS's models. CMS_WITH_SUMMARY=1 adds a field, which Django's
migration adds by rebuilding the table (NOT NULL with a default)."""

import os

from django.db import models


class Page(models.Model):
    slug = models.SlugField(unique=True)
    title = models.CharField(max_length=200)
    body = models.TextField(blank=True)
    status = models.CharField(max_length=20, default="draft")
    if os.environ.get("CMS_WITH_SUMMARY"):
        summary = models.CharField(max_length=200, default="")


class Comment(models.Model):
    page = models.ForeignKey(Page, on_delete=models.CASCADE)
    author = models.CharField(max_length=100)
    body = models.TextField()
