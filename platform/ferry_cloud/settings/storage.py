"""Model and package storage: local files by default, S3 (django-storages) when configured."""

from __future__ import annotations

import os

from .base import DATA_DIR

# --- Storage: local files by default, S3 (boto3 via django-storages) when configured --------
MEDIA_ROOT = DATA_DIR / "media"
if os.environ.get("FERRY_S3_BUCKET"):
    _default_storage = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": os.environ["FERRY_S3_BUCKET"],
            "endpoint_url": os.environ.get("FERRY_S3_ENDPOINT_URL") or None,
            "region_name": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
            "file_overwrite": False,
            "default_acl": None,
        },
    }
else:
    _default_storage = {"BACKEND": "django.core.files.storage.FileSystemStorage"}
STORAGES = {
    "default": _default_storage,
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
