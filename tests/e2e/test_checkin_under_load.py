"""Correctness under load, with real processes: bench/checkin_correctness.py, shortened.

The real gateway (PostgreSQL, Redis) answers a load generator's no-change check-ins from
memory as fast as they come while a release and then its rollback must reach every one of
20 simulated devices they target (and no other device), and every telemetry record the
gateway acknowledged must be stored exactly once.  The bench prints what failed; this test
asserts its verdict.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.services]


def test_a_release_and_its_rollback_reach_every_device_under_load_and_telemetry_is_stored_once():
    if not os.environ.get("FERRY_DATABASE_URL", "").startswith("postgres"):
        pytest.skip("the load run needs PostgreSQL")
    command = [sys.executable, "bench/checkin_correctness.py"]
    command += ["--seconds", "15", "--devices", "1000", "--identities", "50", "--cohort", "20"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "correctness: PASS" in run.stdout, run.stdout + run.stderr[-3000:]
    assert "release reached all in" in run.stdout and "rollback in never" not in run.stdout
