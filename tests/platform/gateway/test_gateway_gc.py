"""The gateway command's garbage-collection tuning, in a process of its own (it freezes the heap)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from gateway.management.commands.gateway import GC_THRESHOLDS

PROBE = """
import django, gc, json
django.setup()
from gateway.management.commands.gateway import _tune_garbage_collection
_tune_garbage_collection()
print(json.dumps({"threshold": gc.get_threshold(), "frozen": gc.get_freeze_count()}))
"""


def test_the_gateway_freezes_its_startup_heap_and_collects_young_objects_less_often():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "ferry_cloud.settings"}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    tuned = json.loads(out.stdout.strip().splitlines()[-1])
    assert tuple(tuned["threshold"]) == GC_THRESHOLDS
    assert GC_THRESHOLDS[0] > 700  # Python's default: the point is fewer young collections
    assert tuned["frozen"] > 50_000  # Django, the models and grpc, left out of later collections
