"""Ferry's control plane: Django project settings, URLs, the Celery app and process commands."""

from ferry_cloud.celery import app as celery_app

__all__ = ["celery_app"]
