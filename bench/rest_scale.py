"""The REST API at 10,000 or 100,000 devices: each read over real HTTP beside PostgreSQL alone.

    FERRY_DATABASE_URL=postgres://postgres@127.0.0.1:5432/ferry \\
        nice -n 19 .venv/bin/python bench/rest_scale.py --devices 100000

A scratch database of its own (<name>_bench_rest: created, migrated, dropped) is filled in
bulk SQL (bench/rest_fleet.py: devices with attributes, labels, versions, pins, last seen,
groups, an active release with per-device status rows, telemetry). The real WSGI app runs
under gunicorn (platform/ferry_cloud/gunicorn_conf.py, one worker; the API's rate limit off)
in a subprocess; this process sends each GET with the admin's real API token over one
keep-alive HTTP connection, one request at a time.

For each endpoint the SQL it runs is captured once in this process (the same request through
Django's test client, connection.queries): that count is the "queries" column, and the same
statements, with their literals, are then run on a plain psycopg connection (execute and
fetch every row) as the "PostgreSQL alone" column. The HTTP request and the PostgreSQL-alone
run alternate, endpoint after endpoint, --requests times, so the host's noise hits both
alike (a row slower than --slow-seconds stops after a few requests). Prints p50/p99 of
each, the gunicorn worker's CPU per request (user + system, from /proc: the figure the
host's load does not inflate), the queries per request and Ferry's overhead (p50 over
PostgreSQL alone's p50).

As Celery beat runs the release gate every 30 s in production, a ticker process keeps the
active release's pending/running split the way the gate's evaluation does
(releases.status_counts.release_split_keep, every --gate-seconds; the whole gate is not run,
as the fill's refusals would abort the release). A tree without that function has no ticker:
its detail computes the split inside a request.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlencode, urlparse

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]

from bench.scratch_database import scratch_database  # noqa: E402  (after the path setup)

GUNICORN_CONF = "platform/ferry_cloud/gunicorn_conf.py"
SLOW_SAMPLES = 3  # requests a row slower than --slow-seconds gets


def _endpoints(fleet, next_devices: str, next_telemetry: str) -> list[tuple[str, str]]:
    """(row name, path) of every read the bench times."""
    hour_ago = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    devices = "/api/v1/devices/"
    release = f"/api/v1/releases/{fleet.release_id}/"
    telemetry = f"/api/v1/devices/{fleet.busy_device_id}/telemetry/"
    return [
        ("devices, first page", devices),
        ("devices, next page (cursor)", next_devices),
        ("devices ?filter=hw == jetson", devices + "?" + urlencode({"filter": "hw == jetson"})),
        ("devices ?group= (static, 5 %)", devices + "?" + urlencode({"group": fleet.group_id})),
        ("devices ?version=", devices + "?" + urlencode({"version": fleet.version_id})),
        ("devices ?revoked=false", devices + "?revoked=false"),
        ("devices ?last_seen_after=1 h ago", devices + "?" + urlencode({"last_seen_after": hour_ago})),
        ("devices ?ordering=name", devices + "?ordering=name"),
        ("release detail", release),
        ("release devices ?state=failed", release + "devices/?state=failed"),
        ("releases list", "/api/v1/releases/"),
        ("device telemetry, first page", telemetry),
        ("device telemetry, next page", next_telemetry),
        # last: its seconds per request (every row built in Python) would otherwise stretch a
        # round past the release detail's kept split, so each detail request would recompute it
        ("release devices, first page", release + "devices/"),
    ]


# --- the server --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_gunicorn(data_dir: str, log: Path) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "platform")]),
        "FERRY_WEB_BIND": f"127.0.0.1:{port}",
        "FERRY_WEB_WORKERS": "1",
        "FERRY_WEB_THREADS": "2",
        "FERRY_WEB_KEEPALIVE": "60",
        "FERRY_API_RATE": "off",
        "FERRY_LOG_LEVEL": "INFO",  # production's: one structured line per request
        "FERRY_DATA_DIR": data_dir,
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # the config makes one of its own
    out = log.open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", GUNICORN_CONF], cwd=ROOT, env=env, stdout=out, stderr=out
    )
    deadline = time.monotonic() + 120  # a loaded host imports slowly
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/healthz")
            if connection.getresponse().status == 200:
                return process, port
        except OSError:
            if process.poll() is not None:
                break
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("gunicorn did not start:\n" + "\n".join(log.read_text().splitlines()[-15:]))


class Client:
    """One keep-alive connection; reopened if the server closed it."""

    def __init__(self, port: int, token: str) -> None:
        self._port = port
        self._headers = {"Authorization": f"Token {token}", "Accept": "application/json"}
        self._connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def get(self, path: str) -> tuple[int, bytes]:
        for attempt in (1, 2):
            try:
                self._connection.request("GET", path, headers=self._headers)
                response = self._connection.getresponse()
                return response.status, response.read()
            except (http.client.HTTPException, ConnectionError):
                self._connection.close()
                self._connection = http.client.HTTPConnection("127.0.0.1", self._port, timeout=120)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def _worker_pid(master: int) -> int:
    """gunicorn's one worker: the master's child."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.1)
    raise RuntimeError("gunicorn started no worker")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (the worker's, whatever the host's load)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_gate_ticker(scratch_url: str, data_dir: str, release_id: str, seconds: float) -> subprocess.Popen:
    """A process of its own, so its seconds of selection work hold no lock of this client's."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "platform")]),
        "FERRY_DATABASE_URL": scratch_url,
        "FERRY_DATA_DIR": data_dir,
    }
    argv = [sys.executable, __file__, "--gate-ticker", release_id, "--gate-seconds", str(seconds)]
    return subprocess.Popen(argv, cwd=ROOT, env=env)


def _gate_ticker(release_id: str, seconds: float) -> None:
    """Keep the release's split every ``seconds``, as the gate's evaluation does, until killed."""
    import django

    django.setup()
    try:
        from releases.status_counts import release_split_keep
    except ImportError:
        print("gate ticker: this tree has no release_split_keep; requests compute the split")
        return
    from releases.models import Release
    from releases.selectors import release_selection

    while True:
        start = time.monotonic()
        release = Release.objects.get(pk=release_id)
        release_split_keep(release=release, selection=release_selection(release))
        time.sleep(max(0.0, seconds - (time.monotonic() - start)))


# --- the SQL of each request, and PostgreSQL alone ---------------------------------------


def _captured_sql(token: str, path: str) -> list[str]:
    """The statements one GET runs, with their literals (the second of two: caches warm)."""
    from django.db import connection
    from django.test import Client as DjangoClient
    from django.test.utils import CaptureQueriesContext

    client = DjangoClient(HTTP_AUTHORIZATION=f"Token {token}")
    client.get(path)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(path)
    if response.status_code != 200:
        raise RuntimeError(f"{path}: {response.status_code} {response.content[:300]!r}")
    return [q["sql"] for q in queries.captured_queries]


def _pg_alone(pg, statements: list[str]) -> float:
    """Seconds to run the statements one after another and fetch every row."""
    start = time.perf_counter()
    with pg.cursor() as cursor:
        for sql in statements:
            cursor.execute(sql.encode())
            if cursor.description is not None:
                cursor.fetchall()
    return time.perf_counter() - start


# --- the run -----------------------------------------------------------------------------


def _next(client: Client, path: str) -> str:
    status, body = client.get(path)
    if status != 200:
        raise RuntimeError(f"{path}: {status} {body[:300]!r}")
    link = json.loads(body)["next"]
    parsed = urlparse(link)
    return f"{parsed.path}?{parsed.query}"


def _measure(args, fleet, port: int, scratch_url: str, worker: int) -> list[dict]:
    import psycopg

    client = Client(port, fleet.token)
    next_devices = _next(client, "/api/v1/devices/")
    next_telemetry = _next(client, f"/api/v1/devices/{fleet.busy_device_id}/telemetry/")
    endpoints = _endpoints(fleet, next_devices, next_telemetry)
    sql = {path: _captured_sql(fleet.token, path) for _, path in endpoints}
    from django.db import connections

    connections.close_all()  # the server's worker and the plain connection below only
    rows = {name: {"http": [], "pg": [], "cpu": 0.0, "bytes": 0, "results": 0} for name, _ in endpoints}
    with psycopg.connect(scratch_url, autocommit=True) as pg:
        for _name, path in endpoints:  # warm both sides: the worker's imports, PostgreSQL's cache
            client.get(path)
            _pg_alone(pg, sql[path])
        for _ in range(args.requests):
            for name, path in endpoints:
                if _too_slow(rows[name]["http"], args.slow_seconds):
                    continue  # its few samples tell; more would take the run's hour
                cpu, start = _cpu_seconds(worker), time.perf_counter()
                status, body = client.get(path)
                rows[name]["http"].append(time.perf_counter() - start)
                rows[name]["cpu"] += _cpu_seconds(worker) - cpu
                if status != 200:
                    raise RuntimeError(f"{path}: {status} {body[:300]!r}")
                rows[name]["bytes"] = len(body)
                rows[name]["results"] = len(json.loads(body).get("results", [None]))
                rows[name]["pg"].append(_pg_alone(pg, sql[path]))
    return [_summary(name, rows[name], sql[path]) for name, path in endpoints]


def _too_slow(samples: list[float], limit: float) -> bool:
    """A row whose median is past ``limit`` seconds after SLOW_SAMPLES requests is not sampled more."""
    return len(samples) >= SLOW_SAMPLES and statistics.median(samples) > limit


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _summary(name: str, row: dict, statements: list[str]) -> dict:
    http_p50 = statistics.median(row["http"]) * 1000
    pg_p50 = statistics.median(row["pg"]) * 1000
    return {
        "name": name,
        "p50_ms": http_p50,
        "p99_ms": _quantile(row["http"], 0.99) * 1000,
        "cpu_ms": row["cpu"] / len(row["http"]) * 1000,
        "requests": len(row["http"]),
        "queries": len(statements),
        "pg_p50_ms": pg_p50,
        "pg_p99_ms": _quantile(row["pg"], 0.99) * 1000,
        "ratio": http_p50 / pg_p50 if pg_p50 else float("nan"),
        "rows": row["results"],
        "kib": row["bytes"] / 1024,
    }


def _print(rows: list[dict], args, fill_seconds: float) -> None:
    print(
        f"\nREST at {args.devices:,} devices ({args.records} telemetry records each), "
        f"{args.requests} requests per row, one gunicorn worker, PostgreSQL; fill {fill_seconds:.0f} s"
    )
    print(
        f"| {'endpoint':<34} | requests | p50 ms | p99 ms | worker CPU ms | queries | PG alone p50 ms "
        "| PG alone p99 ms | Ferry / PG | rows | KiB |"
    )
    print(f"| {'-' * 34} | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['name']:<34} | {r['requests']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
            f"{r['cpu_ms']:.1f} | {r['queries']} | "
            f"{r['pg_p50_ms']:.2f} | {r['pg_p99_ms']:.2f} | {r['ratio']:.1f}x | "
            f"{r['rows']} | {r['kib']:.0f} |"
        )


def _run(args, url: str) -> None:
    import django

    with (
        scratch_database(url, "rest") as scratch,
        tempfile.TemporaryDirectory(prefix="ferry-bench-rest-") as data_dir,
    ):
        os.environ["FERRY_DATABASE_URL"] = scratch
        os.environ["FERRY_DATA_DIR"] = data_dir
        django.setup()
        from bench.rest_fleet import fill

        start = time.monotonic()
        fleet = fill(args.devices, args.records)
        fill_seconds = time.monotonic() - start
        log = Path(data_dir) / "gunicorn.log"
        server, port = _start_gunicorn(data_dir, log)
        ticker = _start_gate_ticker(scratch, data_dir, fleet.release_id, args.gate_seconds)
        try:
            if args.pid_file:  # for a profiler: the worker is the master's child
                Path(args.pid_file).write_text(str(server.pid))
            rows = _measure(args, fleet, port, scratch, _worker_pid(server.pid))
        finally:
            ticker.kill()
            ticker.wait(timeout=30)
            server.terminate()
            server.wait(timeout=30)
        if args.keep_log:
            Path(args.keep_log).write_text(log.read_text())
    _print(rows, args, fill_seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--records", type=int, default=5, help="telemetry records per device")
    parser.add_argument("--requests", type=int, default=30, help="timed requests per endpoint")
    parser.add_argument(
        "--slow-seconds",
        type=float,
        default=2.0,
        help=f"a row whose median passes this after {SLOW_SAMPLES} requests gets no more",
    )
    parser.add_argument("--pid-file", default="", help="write gunicorn's master pid here")
    parser.add_argument("--keep-log", default="", help="copy gunicorn's log here")
    parser.add_argument(
        "--gate-seconds", type=float, default=30.0, help="how often the ticker keeps the release's split"
    )
    parser.add_argument("--gate-ticker", default="", help=argparse.SUPPRESS)  # the ticker process
    args = parser.parse_args()
    url = os.environ.get("FERRY_DATABASE_URL", "")
    if not url:
        sys.exit("set FERRY_DATABASE_URL to a PostgreSQL database (a scratch copy is used)")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ferry_cloud.settings")
    os.environ.setdefault("FERRY_API_RATE", "off")
    os.environ.setdefault("FERRY_LOG_LEVEL", "WARNING")  # this process; the server logs at info
    if args.gate_ticker:
        _gate_ticker(args.gate_ticker, args.gate_seconds)
        return 0
    _run(args, url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
