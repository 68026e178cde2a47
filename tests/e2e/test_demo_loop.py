"""The walking skeleton end to end: `manage.py demo` with real processes (web, Celery worker,
gRPC gateway, three agents), on both profiles, then the database is checked record by record."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
import redis

from tests.e2e.helpers import manage_shell

ROOT = Path(__file__).resolve().parents[2]
EMBEDDED_UNSET = ("FERRY_DATABASE_URL", "REDIS_URL", "FERRY_S3_BUCKET", "FERRY_S3_ENDPOINT_URL")

pytestmark = pytest.mark.slow


def _demo(env: dict[str, str], duration: int) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "demo",
            "--duration",
            str(duration),
            "--no-live",
            "--http-port",
            "0",
            "--gateway-port",
            "0",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"demo failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _query(env: dict[str, str], code: str):
    """Run ORM code in a fresh process on the same settings as the stack; it calls result()."""
    return manage_shell(env, code, timeout=120)


COUNTS = """
import json
from fleet.models import Device
from telemetry.models import TelemetryRecord
result({str(d.pk): {"records": TelemetryRecord.objects.filter(device=d).count(),
                  "seqs": sorted(TelemetryRecord.objects.filter(device=d).values_list("seq", flat=True)),
                  "running": d.running_version.label if d.running_version else None}
                  for d in Device.objects.all()})
"""


def _agents(data_dir: Path) -> dict[str, dict]:
    """What each agent says about itself, read from its own files."""
    agents = {}
    for state_dir in sorted((data_dir / "demo" / "agents").iterdir()):
        credential = json.loads((state_dir / "credential.json").read_text())
        assert (state_dir / "credential.json").stat().st_mode & 0o777 == 0o600
        outbox = sqlite3.connect(state_dir / "outbox.sqlite")
        last_seq = outbox.execute("SELECT value FROM meta WHERE key='next_seq'").fetchone()[0] - 1
        pending = outbox.execute("SELECT COUNT(*) FROM records").fetchone()[0]
        outbox.close()
        running = json.loads((state_dir / "running.json").read_text())
        agents[credential["device_id"]] = {"last_seq": last_seq, "pending": pending, "running": running}
    return agents


def _check_fleet(env: dict[str, str], data_dir: Path) -> dict[str, dict]:
    agents = _agents(data_dir)
    assert len(agents) == 3
    db = _query(env, COUNTS)
    assert set(db) == set(agents)
    for device_id, agent in agents.items():
        assert agent["pending"] == 0, f"{device_id} still has telemetry in its outbox"
        assert agent["last_seq"] >= 3  # an activation and at least two metrics records
        assert db[device_id]["records"] == agent["last_seq"]  # every record, none twice
        assert db[device_id]["seqs"] == list(range(1, agent["last_seq"] + 1))
        assert db[device_id]["running"] == "v1"
    versions = {a["running"]["version_id"] for a in agents.values()}
    assert len(versions) == 1
    return agents


def _embedded_env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in EMBEDDED_UNSET}
    env["FERRY_DATA_DIR"] = str(data_dir)
    return env


def test_demo_on_embedded_defaults_twice(tmp_path: Path):
    env = _embedded_env(tmp_path / "data")
    first = _demo(env, duration=12)
    assert "login" in first.stdout and "admin /" in first.stdout
    assert (tmp_path / "data" / "ferry.sqlite3").exists()
    assert (tmp_path / "data" / "celery-broker.sqlite3").exists()  # the embedded broker carried the job
    before = _check_fleet(env, tmp_path / "data")
    _demo(env, duration=8)  # a second run reuses the database, the model and the enrolled agents
    after = _check_fleet(env, tmp_path / "data")
    assert set(after) == set(before)
    assert all(after[d]["last_seq"] > before[d]["last_seq"] for d in before)


@pytest.mark.services
def test_demo_on_postgres_redis_and_s3(tmp_path: Path, s3_server):
    database = f"ferry_e2e_{uuid.uuid4().hex[:8]}"
    admin_url = os.environ["FERRY_DATABASE_URL"].rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    bucket = f"ferry-e2e-{uuid.uuid4().hex[:8]}"
    import boto3

    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=bucket)
    redis_url = os.environ["REDIS_URL"].rsplit("/", 1)[0] + "/14"
    redis.Redis.from_url(redis_url).flushdb()
    env = {
        **os.environ,
        "FERRY_DATA_DIR": str(tmp_path / "data"),
        "REDIS_URL": redis_url,
        "FERRY_DATABASE_URL": os.environ["FERRY_DATABASE_URL"].rsplit("/", 1)[0] + f"/{database}",
        "FERRY_S3_BUCKET": bucket,
    }
    try:
        _demo(env, duration=12)
        _check_fleet(env, tmp_path / "data")
        assert not (tmp_path / "data" / "ferry.sqlite3").exists()
        keys = boto3.client("s3", endpoint_url=s3_server).list_objects_v2(Bucket=bucket)["Contents"]
        assert {k["Key"].split("/")[1] for k in keys} == {"onnx", "package"}
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
