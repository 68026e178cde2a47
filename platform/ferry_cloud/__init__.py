"""Ferry's control plane: Django project settings, URLs, the Celery app and process commands."""

from ferry_cloud.broker import register_transport

register_transport()  # before any broker URL is resolved, in every process that imports us

from ferry_cloud.celery import app as celery_app  # noqa: E402

__all__ = ["celery_app"]
