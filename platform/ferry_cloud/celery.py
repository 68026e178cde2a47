"""The Celery app: `celery -A ferry_cloud worker` runs conversion jobs."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ferry_cloud.settings")

app = Celery("ferry_cloud")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
