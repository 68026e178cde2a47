"""Production serving: the compose file, the production settings, and gunicorn for real.

Docker itself does not run here, so the compose file is checked as data and the commands
its healthchecks and setup run are executed against real servers; gunicorn runs with the
very config module the image uses, against the test database.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import requests
import yaml
from accounts.services import organisation_ensure, user_ensure_admin
from django.db import connection
from django.urls import NoReverseMatch, reverse
from ferry_cloud.device_ca import ensure_device_pki
from ferry_cloud.stack import free_port, wait_for_port
from gateway.tls import server_credentials
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
GUNICORN_CONF = "platform/ferry_cloud/gunicorn_conf.py"
FERRY_PROCESSES = ("setup", "web", "gateway", "worker", "beat")


def _secret_key() -> str:
    return secrets.token_urlsafe(50)


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _manage(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _production_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {"FERRY_ENV": "production", "FERRY_DATA_DIR": str(tmp_path / "data"), **extra}
    env.setdefault("FERRY_SECRET_KEY", _secret_key())
    return env


# --- docker/compose.yaml and the Dockerfile, as data -------------------------------------------


def test_compose_runs_each_role_in_production_with_healthchecks():
    compose = _compose()
    services = compose["services"]
    assert {"postgres", "redis", "s3", *FERRY_PROCESSES} <= set(services)
    for name in FERRY_PROCESSES:
        service = services[name]
        assert service["build"]["target"] == "platform", name
        env = service["environment"]
        assert env["FERRY_ENV"] == "production", name
        # compose refuses to start without the key (the ${VAR:?message} form), never a default
        assert re.fullmatch(r"\$\{FERRY_SECRET_KEY:\?.+\}", env["FERRY_SECRET_KEY"]), name
        assert env["FERRY_DATABASE_URL"].startswith("postgres://"), name
        assert env["REDIS_URL"].startswith("redis://"), name
        assert env["FERRY_S3_BUCKET"] and "FERRY_S3_ENDPOINT_URL" in env, name
        assert env["FERRY_RELEASE_KEY_FILE"] == "/run/secrets/release_key", name
        depends = service["depends_on"]
        assert depends["redis"]["condition"] == "service_healthy", name
        if name != "setup":
            assert depends["setup"]["condition"] == "service_completed_successfully", name
    for name in ("postgres", "redis", "s3", "web", "gateway", "worker"):
        assert services[name]["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name
    for name in ("web", "gateway", "worker"):
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert services[name]["depends_on"]["s3"]["condition"] == "service_healthy"

    web = services["web"]
    assert web["command"] == ["gunicorn", "-c", GUNICORN_CONF]
    assert (ROOT / GUNICORN_CONF).is_file()
    assert web["environment"]["PROMETHEUS_MULTIPROC_DIR"]
    assert "/readyz" in " ".join(web["healthcheck"]["test"])
    assert "gateway.health" in " ".join(
        services["gateway"]["healthcheck"]["test"]
    )  # grpc.health.v1 over mTLS
    assert services["gateway"]["command"][:3] == ["python", "manage.py", "gateway"]
    assert services["worker"]["command"][4:6] == ["ferry_cloud", "worker"]
    assert services["beat"]["command"][4:6] == ["ferry_cloud", "beat"]
    assert "deploy" not in services["beat"], "exactly one beat: never replicated"
    assert services["agent"]["build"]["target"] == "agent"
    # the development server belongs to the demo only
    assert "runserver" not in COMPOSE.read_text() and "runserver" not in DOCKERFILE.read_text()


def test_dockerfile_copies_what_exists_and_collects_static_at_build():
    text = DOCKERFILE.read_text()
    assert {"base", "agent", "platform"} == set(re.findall(r"^FROM \S+ AS (\w+)$", text, re.M))
    ignored = [
        line
        for line in (ROOT / "docker" / "Dockerfile.dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        for source in line.split()[:-1]:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            assert not any(fnmatch.fnmatch(source, pattern) for pattern in ignored), source
    assert {".venv*", "var", "docker/release.key"} <= set(ignored)  # no local state in the context
    assert "collectstatic --noinput" in text
    assert "FERRY_ENV=production" in text and "USER ferry" in text


def _healthcheck_code(service: str) -> str:
    test = _compose()["services"][service]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"], test
    return test[3]


def test_gateway_healthcheck_speaks_grpc_health():
    """The gateway's healthcheck, run as compose would, against a real gRPC health service."""
    port = free_port()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    ensure_device_pki()  # the probe, run with this process's settings, mints its certificate from it
    server.add_secure_port(f"127.0.0.1:{port}", server_credentials(require_client_certificate=True))
    server.start()
    code = _healthcheck_code("gateway").replace("127.0.0.1:50051", f"127.0.0.1:{port}")
    try:
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert subprocess.run([sys.executable, "-c", code], timeout=30).returncode == 0
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert subprocess.run([sys.executable, "-c", code], timeout=30).returncode != 0
    finally:
        server.stop(grace=None)
    # nothing listening: unhealthy, within the healthcheck's timeout
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30).returncode != 0


@pytest.fixture
def own_s3_server(tmp_path: Path):
    """An S3 server (moto) of this test's own, on a free port: nothing else can stop it."""
    port = free_port()
    with open(tmp_path / "moto.log", "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_port(port, 60, process=process)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_setup_creates_the_bucket_once(own_s3_server: str):
    """setup's bucket step against a real S3 server: creates it, and a rerun is harmless."""
    import boto3

    s3_server = own_s3_server
    command = _compose()["services"]["setup"]["command"][2]
    code = re.search(r'python -c "(.+?)"; fi', command, re.S).group(1)
    bucket = f"ferry-setup-{secrets.token_hex(4)}"
    env = {**os.environ, "FERRY_S3_BUCKET": bucket, "FERRY_S3_ENDPOINT_URL": s3_server}
    for _ in range(2):
        assert subprocess.run([sys.executable, "-c", code], env=env, timeout=60).returncode == 0
    s3 = boto3.client("s3", endpoint_url=s3_server)
    assert bucket in {b["Name"] for b in s3.list_buckets()["Buckets"]}


# --- settings in production mode ------------------------------------------------------------------

_DUMP = """
import json, django
django.setup()
from django.conf import settings as s
print(json.dumps({k: getattr(s, k, None) for k in (
    "DEBUG", "ALLOWED_HOSTS", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SESSION_COOKIE_HTTPONLY",
    "CSRF_COOKIE_HTTPONLY", "SESSION_COOKIE_SAMESITE", "CSRF_COOKIE_SAMESITE", "SECURE_PROXY_SSL_HEADER",
    "SECURE_HSTS_SECONDS", "SECURE_SSL_REDIRECT", "STORAGES", "MIDDLEWARE")}))
"""


def _settings_in(env: dict[str, str]) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", _DUMP],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "ferry_cloud.settings", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FERRY_SECRET_KEY": ""}, "FERRY_SECRET_KEY is required when FERRY_ENV=production"),
        ({"FERRY_SECRET_KEY": "short"}, "FERRY_SECRET_KEY is too weak"),
        ({"FERRY_DEBUG_WEB": "1"}, "FERRY_DEBUG_WEB=1 is refused"),
        ({"FERRY_ENV": "prod"}, "FERRY_ENV='prod'"),
        ({"FERRY_HSTS_PRELOAD": "maybe"}, "FERRY_HSTS_PRELOAD='maybe'"),
        ({"FERRY_HSTS_SECONDS": "1y"}, "FERRY_HSTS_SECONDS='1y'"),
    ],
)
def test_settings_refuse_to_load_insecurely(tmp_path: Path, env: dict[str, str], message: str):
    environment = {**os.environ, **_production_env(tmp_path), **env}
    if not environment["FERRY_SECRET_KEY"]:
        del environment["FERRY_SECRET_KEY"]
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr, result.stderr[-2000:]


def test_production_settings_are_secure_and_development_keeps_working(tmp_path: Path):
    production = _settings_in(_production_env(tmp_path, FERRY_ALLOWED_HOSTS="ferry.example.com"))
    assert production["DEBUG"] is False
    assert production["ALLOWED_HOSTS"] == ["ferry.example.com"]
    assert production["SESSION_COOKIE_SECURE"] and production["CSRF_COOKIE_SECURE"]
    assert production["SESSION_COOKIE_HTTPONLY"] and production["CSRF_COOKIE_HTTPONLY"]
    assert production["SESSION_COOKIE_SAMESITE"] == production["CSRF_COOKIE_SAMESITE"] == "Lax"
    assert production["SECURE_PROXY_SSL_HEADER"] is None  # opt-in only
    assert production["SECURE_HSTS_SECONDS"] == 0 and production["SECURE_SSL_REDIRECT"] is False
    backend = production["STORAGES"]["staticfiles"]["BACKEND"]
    assert backend == "whitenoise.storage.CompressedManifestStaticFilesStorage"
    middleware = production["MIDDLEWARE"]
    security = middleware.index("django.middleware.security.SecurityMiddleware")
    assert middleware[security + 1] == "whitenoise.middleware.WhiteNoiseMiddleware"

    behind_proxy = _settings_in(
        _production_env(
            tmp_path, FERRY_TRUST_X_FORWARDED_PROTO="1", FERRY_HSTS_SECONDS="3600", FERRY_SSL_REDIRECT="1"
        )
    )
    assert behind_proxy["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert behind_proxy["SECURE_HSTS_SECONDS"] == 3600 and behind_proxy["SECURE_SSL_REDIRECT"] is True

    # the demo's plain-HTTP console keeps its cookies, on the key generated per data directory
    development = _settings_in({"FERRY_DATA_DIR": str(tmp_path / "dev"), "FERRY_SECRET_KEY": ""})
    assert development["SESSION_COOKIE_SECURE"] is False and "testserver" in development["ALLOWED_HOSTS"]
    assert (tmp_path / "dev" / "secret_key").is_file()


def test_django_deploy_check_passes_with_https_switched_on(tmp_path: Path):
    env = _production_env(
        tmp_path,
        FERRY_SSL_REDIRECT="1",
        FERRY_HSTS_SECONDS="31536000",
        FERRY_HSTS_INCLUDE_SUBDOMAINS="1",
        FERRY_HSTS_PRELOAD="1",
    )
    result = _manage(["check", "--deploy", "--fail-level", "WARNING"], env)
    assert result.returncode == 0, result.stdout + result.stderr


# --- gunicorn with the image's config module, for real ----------------------------------------------


def _database_url() -> str:
    """The test database (pytest-django's) as a URL the gunicorn workers can open."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _wait(predicate, timeout: float, what: str, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}\n{log.read_text(errors='replace')[-3000:]}")


def test_gunicorn_serves_static_files_and_the_api_and_stops_cleanly(transactional_db, tmp_path: Path):
    static_root = tmp_path / "static"
    env = _production_env(
        tmp_path,
        FERRY_STATIC_ROOT=str(static_root),
        FERRY_DATABASE_URL=_database_url(),
        FERRY_ALLOWED_HOSTS="127.0.0.1",
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus"),
        # Local files: the suite's S3 server may belong to another session on this host, and
        # /readyz (run below as the healthcheck) would report it if it went away mid-test.
        FERRY_S3_BUCKET="",
    )
    collected = _manage(["collectstatic", "--noinput", "-v", "0"], env)
    assert collected.returncode == 0, collected.stderr[-3000:]
    manifest = json.loads((static_root / "staticfiles.json").read_text())["paths"]
    source = "rest_framework/css/bootstrap.min.css"
    assert source in manifest

    org = organisation_ensure(name="Gunicorn")
    _, token = user_ensure_admin(organisation=org, username="ops", password="correct horse battery")

    port = free_port()
    log = tmp_path / "gunicorn.log"
    env.update(FERRY_WEB_BIND=f"127.0.0.1:{port}", FERRY_WEB_WORKERS="2", FERRY_WEB_THREADS="2")
    with open(log, "ab") as out:
        master = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", GUNICORN_CONF],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for_port(port, 60, process=master)
        base = f"http://127.0.0.1:{port}"

        # whitenoise: the hashed name, compressed on request, cached for good; the plain name too
        hashed = requests.get(f"{base}/static/{manifest[source]}", headers={"Accept-Encoding": "gzip"})
        assert hashed.status_code == 200
        assert hashed.headers.get("Content-Encoding") == "gzip"
        assert "immutable" in hashed.headers.get("Cache-Control", "")
        assert hashed.content == (static_root / manifest[source]).read_bytes()
        assert requests.get(f"{base}/static/{source}").status_code == 200

        # the API through Django, with a token from the test database
        models = requests.get(f"{base}/api/v1/models/", headers={"Authorization": f"Token {token}"})
        assert models.status_code == 200, models.text[:500]
        assert models.json() == []  # this organisation has no models yet
        assert requests.get(f"{base}/api/v1/models/").status_code == 401

        try:
            reverse("readyz")
        except NoReverseMatch:
            pass
        else:  # the web healthcheck, run as compose runs it
            code = _healthcheck_code("web").replace("127.0.0.1:8000", f"127.0.0.1:{port}")
            check = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
            assert check.returncode == 0, check.stderr[-2000:]

        # a worker dies: child_exit marks it dead for Prometheus, and a new one takes its place
        workers = _wait(lambda: len(_children(master.pid)) == 2 and _children(master.pid), 30, "workers", log)
        live_gauge = tmp_path / "prometheus" / f"gauge_livesum_{workers[0]}.db"
        live_gauge.write_bytes(b"")
        os.kill(workers[0], signal.SIGKILL)
        _wait(lambda: not live_gauge.exists(), 30, "child_exit to remove the dead worker's gauge", log)
        _wait(lambda: len(set(_children(master.pid)) - {workers[0]}) == 2, 30, "a replacement worker", log)
        assert requests.get(f"{base}/static/{source}").status_code == 200

        master.send_signal(signal.SIGTERM)
        assert master.wait(timeout=60) == 0
    finally:
        if master.poll() is None:
            os.killpg(master.pid, signal.SIGKILL)
            master.wait()
    output = log.read_text(errors="replace")
    assert "Traceback" not in output, output[-3000:]
    # no access log from gunicorn: request lines come from the app's own structured log
    assert not re.search(r'"GET /static/[^"]* HTTP/1\.1" 200', output), output[-3000:]


def test_gateway_healthcheck_against_the_gateway_process(transactional_db, tmp_path: Path):
    """compose's gateway command in production mode on the test database; its healthcheck
    passes once the gateway's health service says SERVING."""
    port = free_port()
    env = _production_env(tmp_path, FERRY_DATABASE_URL=_database_url(), FERRY_S3_BUCKET="")
    env["FERRY_GATEWAY_ENROL_ADDRESS"] = f"127.0.0.1:{free_port()}"
    # production generates no PKI on its own: compose's setup runs device_pki first
    pki = subprocess.run(
        [sys.executable, "manage.py", "device_pki"], cwd=ROOT, env={**os.environ, **env}, capture_output=True
    )
    assert pki.returncode == 0 and b"device CA sha256" in pki.stdout, pki.stderr[-2000:]
    command = _compose()["services"]["gateway"]["command"]
    assert command[-2:] == ["--address", "0.0.0.0:50051"]
    log = tmp_path / "gateway.log"
    with open(log, "ab") as out:
        gateway = subprocess.Popen(
            [sys.executable, *command[1:-1], f"127.0.0.1:{port}"],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    code = _healthcheck_code("gateway").replace("127.0.0.1:50051", f"127.0.0.1:{port}")
    try:
        wait_for_port(port, 60, process=gateway)

        def passes() -> bool:
            probe_env = {**os.environ, **env}  # the probe reads the gateway's PKI files, as in its container
            check = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, timeout=30, env=probe_env
            )
            return check.returncode == 0

        _wait(passes, 60, "the gateway's healthcheck to pass", log)
        gateway.send_signal(signal.SIGTERM)
        assert gateway.wait(timeout=30) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        if gateway.poll() is None:
            os.killpg(gateway.pid, signal.SIGKILL)
            gateway.wait()
