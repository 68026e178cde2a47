"""The Celery app: `celery -A ferry_cloud worker` runs conversion jobs."""

import os

from celery import Celery

from ferry_cloud.observability import celery_signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ferry_cloud.settings")

app = Celery("ferry_cloud")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# request ids into task headers, one structured log line per task, Ferry's logging in the worker
celery_signals.connect()
