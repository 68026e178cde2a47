"""Model and package storage: local files by default, S3 (django-storages) when configured."""

from __future__ import annotations

import os
from pathlib import Path

from .base import DATA_DIR
from .security import PRODUCTION

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

# --- Static files: collected into STATIC_ROOT (at image build) and served by whitenoise --------
STATIC_ROOT = Path(os.environ.get("FERRY_STATIC_ROOT", DATA_DIR / "static"))
if PRODUCTION:
    # Content-hashed names (cached forever by browsers) and pre-compressed copies; needs
    # `collectstatic` to have run, since a name missing from the manifest is an error.
    _static_storage = "whitenoise.storage.CompressedManifestStaticFilesStorage"
else:
    # The demo and the tests never run collectstatic: plain names, and whitenoise serves the
    # apps' own static folders through the finders.
    _static_storage = "django.contrib.staticfiles.storage.StaticFilesStorage"
    # Made empty here, as the data directory is: whitenoise warns at every start without it.
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)
WHITENOISE_USE_FINDERS = not PRODUCTION
STORAGES = {
    "default": _default_storage,
    "staticfiles": {"BACKEND": _static_storage},
}
