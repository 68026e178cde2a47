"""A Celery worker SIGKILLed mid-conversion, on the embedded broker and on Redis: after a restart
the job re-runs from its row and the version ends `ready`, once, within 30 s."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import redis
from ferry_cloud.stack import Stack

from tests.e2e.helpers import manage_shell, own_database

ROOT = Path(__file__).resolve().parents[2]
RECOVERY_SECONDS = 30

pytestmark = pytest.mark.slow

MIGRATE = "from django.core.management import call_command; call_command('migrate', verbosity=0); result({})"

# A model whose conversion takes seconds (54 MB of MatMuls, int8 with an accuracy budget), so the
# worker can be killed while it runs; uploaded through the registry's service, which enqueues it.
UPLOAD = """
import io, json
import numpy as np
from onnx import TensorProto, helper, numpy_helper
from accounts.services import organisation_ensure
from registry.services import model_create, version_upload
rng, nodes, weights, x = np.random.default_rng(0), [], [], "x"
for i in range(6):
    w = (rng.standard_normal((1536, 1536)) / 40).astype(np.float32)
    weights.append(numpy_helper.from_array(w, f"w{i}"))
    nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"]))
    nodes.append(helper.make_node("Relu", [f"h{i}"], [f"r{i}"]))
    x = f"r{i}"
graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1536])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["N", 1536])], weights)
data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
org = organisation_ensure(name="Crash")
model = model_create(organisation=org, name="slow-mlp")
version = version_upload(model=model, label="v1", stream=io.BytesIO(data), size=len(data),
                         options={"quantize": "int8", "accuracy_budget": 0.99999})
result({"version": str(version.pk), "job": version.job.pk})
"""

JOB = """
import json
from registry.models import Artifact, ConversionJob
job = ConversionJob.objects.select_related("version").get(pk={job})
result({{"status": job.status, "version_status": job.version.status,
        "attempts": job.attempts, "log": [line["message"] for line in job.log],
        "packages": Artifact.objects.filter(kind="package").count()}})
"""


def _shell(env: dict[str, str], code: str) -> dict:
    return manage_shell({**os.environ, **env}, code, timeout=180)


@pytest.fixture(params=["embedded", "redis"])
def profile(request, tmp_path: Path):
    """Embedded: SQLite database and broker in the data dir. Redis: PostgreSQL and Redis."""
    data = tmp_path / "data"
    env = {
        "FERRY_DATA_DIR": str(data),
        "FERRY_S3_BUCKET": "",
        "FERRY_RELEASE_KEY_FILE": str(data / "release.key"),
        "FERRY_REQUEUE_INTERVAL_SECONDS": "5",
        "FERRY_LOG_FORMAT": "console",
    }
    if request.param == "embedded":
        yield {**env, "FERRY_DATABASE_URL": f"sqlite:///{data / 'ferry.sqlite3'}", "REDIS_URL": ""}
        return
    redis.Redis.from_url(os.environ["REDIS_URL"]).flushdb()
    with own_database("ferry_crash") as database_url:
        yield {**env, "FERRY_DATABASE_URL": database_url}


def _wait_job(env: dict[str, str], job: int, done, timeout: float, stack: Stack, what: str) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stack.check_alive()
        state = _shell(env, JOB.format(job=job))
        if done(state):
            return state
    raise AssertionError(f"timed out waiting for {what}; logs in {stack.log_dir}: {state}")


def test_a_worker_killed_mid_conversion_recovers_after_restart(profile, tmp_path: Path):
    _shell(profile, MIGRATE)
    stack = Stack(log_dir=tmp_path / "logs", env=profile)
    worker_args = [sys.executable, "-m", "celery", "-A", "ferry_cloud", "worker", "--pool", "solo"]
    worker = stack.spawn("worker", [*worker_args, "--loglevel", "INFO"])
    try:
        job = _shell(profile, UPLOAD)["job"]
        _wait_job(profile, job, lambda s: s["status"] == "running", 120, stack, "the conversion to start")
        worker.kill()  # SIGKILL: no shutdown handler, the message stays unacknowledged
        worker.wait()
        stack.processes.clear()
        killed = _shell(profile, JOB.format(job=job))
        assert killed["status"] == "running" and killed["version_status"] != "ready", killed

        restarted = time.monotonic()
        stack.spawn("worker", [*worker_args, "--loglevel", "INFO"])
        state = _wait_job(
            profile, job, lambda s: s["status"] in ("succeeded", "failed"), 120, stack, "the re-run"
        )
        took = time.monotonic() - restarted
        print(f"conversion ready {took:.1f} s after the worker restarted")  # for the operator's notes
        assert state["status"] == "succeeded" and state["version_status"] == "ready", state
        assert took <= RECOVERY_SECONDS, f"ready {took:.1f} s after the restart"
        assert state["attempts"] == 2, state
        assert state["packages"] == 1, state  # the re-run stored no second package
        assert "re-enqueued: its worker restarted" in state["log"], state["log"]
    finally:
        stack.stop(timeout=10)
