"""A reconnect storm against the trivial grpc.aio peer alone (no Django servicer, no database), or
with --gateway against ``manage.py gateway`` (a scratch PostgreSQL database of enrolled devices):
how many of --streams WatchHints streams (one mutual-TLS connection each, --in-flight handshakes
at once) end before the report and with which status, what the server's own metrics counted
(the gateway's ferry_gateway_rpcs_total for WatchHints: a status there was seen by its
handler), and the server's RSS, in a few minutes.  Then --waves release waves: every open
stream woken once (the gateway: one fleet-changed message on Redis, its hub's fan-out alone;
the peer: an asyncio.Event set), and how long after each wave's start the streams' hints arrived
(p50 / p99 / max, at the storm client; and server side, when each hint was handed to grpc).
--with-peer runs the same storm and waves against the trivial peer after the gateway, and
--before-tree another checkout's gateway before this one's, all in the same run.  A slow storm
on the peer alone: --peer-slow-ms blocks its loop that long per stream (calls queue in grpc).

    .venv/bin/python bench/fleet_storm.py --streams 10000 [--option grpc.some_arg=value ...]
    .venv/bin/python bench/fleet_storm.py --streams 2000 --peer-slow-ms 25 [--option ...]
    FERRY_DATABASE_URL=postgres://... REDIS_URL=redis://... .venv/bin/python bench/fleet_storm.py \
        --gateway --with-peer --waves 3 [--before-tree <checkout>]

It separates what grpc does to a storm from what the gateway does: bench/fleet_load.py's storm
runs the same client (bench/fleet_clients.py --storm) against the real gateway.  Certificates
come from a device CA made in a temporary data directory; device ids are random.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]

from bench.fleet_load import _rss_mb, _settled_rss  # noqa: E402  (after the path setup)
from bench.scratch_database import scratch_database  # noqa: E402

CLIENTS = str(ROOT / "bench" / "fleet_clients.py")


def _identities(count: int) -> list[tuple[str, str]]:
    from ferry_cloud.device_ca import device_ca

    from deploy.trust import certificates

    ca = device_ca()
    pems = []
    for _ in range(count):
        key = certificates.create_private_key()
        issued = certificates.sign_client_certificate(
            ca, certificates.create_csr(key), device_id=str(uuid.uuid4())
        )
        pems.append((key.decode(), issued.certificate_pem.decode()))
    return pems


def _option(text: str) -> list:
    name, _, value = text.partition("=")
    return [name, int(value) if value.lstrip("-").isdigit() else value]


def _start(command: list[str], spec: dict, marker: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    process.stdin.write(json.dumps(spec) + "\n")
    process.stdin.flush()
    line = process.stdout.readline()
    if marker not in line:
        process.kill()
        raise RuntimeError(f"did not start: {line!r}")
    return process, line


def _gateway(data_dir: str, tree: str) -> tuple[subprocess.Popen, str, int]:
    """``manage.py gateway`` (of ``tree``, default this checkout) serving the scratch database's
    enrolled devices; its process, address and metrics port."""
    from ferry_cloud.stack import free_port

    from bench import checkin_load

    metrics_port = free_port()
    env = {**os.environ, "FERRY_LOG_LEVEL": "WARNING", "FERRY_DATA_DIR": data_dir}
    env["FERRY_GATEWAY_WATCH_SECONDS"] = "3600"  # no stream reaches its lifetime in the run
    root = Path(tree).resolve() if tree else ROOT
    env["PYTHONPATH"] = f"{root}{os.pathsep}{root / 'platform'}"
    command = checkin_load._gateway_command(root)[:-2] + ["--metrics-port", str(metrics_port)]
    process, address = checkin_load._start(command, env, "listening on ")
    return process, address, metrics_port


def _watch_counts(metrics_port: int) -> dict[str, float]:
    """The gateway's WatchHints calls by status so far, from its Prometheus endpoint."""
    import requests

    text = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=120).text
    counts = {}
    for line in text.splitlines():
        if line.startswith("ferry_gateway_rpcs_total{") and 'method="AgentGateway/WatchHints"' in line:
            code = line.split('code="', 1)[1].split('"', 1)[0]
            counts[code] = float(line.split()[-1])
    return counts


def _peer(peer_spec: dict) -> tuple[subprocess.Popen, str]:
    server, line = _start([sys.executable, CLIENTS, "--trivial-streams"], peer_spec, "listening on ")
    return server, line.split("listening on ", 1)[1].split()[0]


def _peer_wave(server: subprocess.Popen) -> Callable[[], None]:
    def wave() -> None:
        server.stdin.write("wave\n")
        server.stdin.flush()

    return wave


def _peer_written(server: subprocess.Popen) -> list[dict]:
    """The peer's own account of each wave: when its hints were handed to grpc."""
    server.stdin.write("report\n")
    server.stdin.flush()
    return json.loads(server.stdout.readline())


def _hint_buckets(metrics_port: int) -> dict[float, float]:
    """The gateway's hint-delivery histogram: cumulative count per upper bound (seconds)."""
    import requests

    text = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=120).text
    prefix = "ferry_gateway_hint_delivery_seconds_bucket{"
    buckets = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[float(bound)] = float(line.split()[-1])
    return buckets


def _written(before: dict[float, float], after: dict[float, float]) -> dict:
    """One wave's hints handed to grpc, from two snapshots of the histogram: how many, and the
    bucket bounds under which half and 99 % of them were."""
    counts = {bound: after[bound] - before.get(bound, 0.0) for bound in sorted(after)}
    total = counts.get(float("inf"), 0.0)
    under = lambda share: next((b for b, c in counts.items() if c >= share * total), None)  # noqa: E731
    return {"handed": total, "p50_under_s": under(0.5), "p99_under_s": under(0.99)}


def _gateway_wave() -> Callable[[], None]:
    """One fleet-changed message on Redis for the scratch fleet's organisation: the hub's fan-out
    alone (what a release's commit publishes), without the release's own database work."""
    import redis
    from fleet.models import Device
    from gateway.redis_channel import CHANNEL

    organisation_id = Device.objects.values_list("organisation_id", flat=True).first()
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    return lambda: client.publish(CHANNEL, str(organisation_id))


def _storm_once(
    name: str,
    server: subprocess.Popen,
    address: str,
    identities: list,
    wave,
    args,
    ca_pem: str,
    metrics_port: int,
) -> dict:
    """The storm against one server, held, then --waves waves (each: every stream woken once)."""
    idle = _rss_mb(server.pid)
    storm_spec = {
        "ca_pem": ca_pem,
        "address": address,
        "identities": identities,
        "in_flight": args.in_flight,
        "settle_seconds": 1.0,
    }
    storm, called_line = _start([sys.executable, CLIENTS, "--storm"], storm_spec, "called")
    called = json.loads(called_line)
    held = _settled_rss(server.pid)
    time.sleep(args.hold)
    # before the storm ends: its teardown cancels every stream the handler is running
    handled = _watch_counts(metrics_port) if metrics_port else {}
    starts, written = [], []
    for _ in range(args.waves):
        before = _hint_buckets(metrics_port) if metrics_port else {}
        starts.append(time.time())
        wave()
        time.sleep(args.wave_seconds)
        if metrics_port:
            written.append(_written(before, _hint_buckets(metrics_port)))
    if not metrics_port:
        written = _peer_written(server)
    storm.stdin.write(json.dumps({"waves": starts}) + "\n")
    storm.stdin.flush()
    report = json.loads(storm.stdout.readline())
    storm.wait(timeout=120)
    return {
        "server": name,
        "streams": len(identities),
        "calls_seconds": round(called["seconds"], 1),
        "ended_before_report": report["ended"],
        "ended_at_seconds": report["ended_at"],
        "ended_placed_at_seconds": report["ended_placed_at"],
        "watch_calls_by_status_at_the_server": handled,
        "waves": report["waves"],
        "waves_handed_to_grpc": written,
        "rss_idle_mb": round(idle, 1),
        "rss_mb": round(held, 1),
        "kb_per_stream": round(1024 * (held - idle) / len(identities), 1),
    }


def _stop(server: subprocess.Popen) -> None:
    server.stdin.close()
    server.terminate()
    server.wait(timeout=60)


def run(args, data_dir: str) -> list[dict]:
    import django

    django.setup()
    from django.conf import settings
    from django.db import connections
    from ferry_cloud.device_ca import ensure_device_pki

    ensure_device_pki()  # the CA and the server's certificate, before they are read
    ca_pem = Path(settings.FERRY_DEVICE_CA_CERT_FILE).read_text()
    peer_spec = {
        "ca_pem": ca_pem,
        "key_pem": Path(settings.FERRY_GATEWAY_TLS_KEY_FILE).read_text(),
        "cert_pem": Path(settings.FERRY_GATEWAY_TLS_CERT_FILE).read_text(),
        "workers": 16,
        "options": [_option(o) for o in args.option],
        "slow_ms": args.peer_slow_ms,
    }
    rows = []
    if not args.gateway:
        identities = _identities(args.streams)
        server, address = _peer(peer_spec)
        try:
            rows.append(
                _storm_once(
                    "trivial grpc.aio", server, address, identities, _peer_wave(server), args, ca_pem, 0
                )
            )
        finally:
            _stop(server)
        return rows
    from bench import checkin_load

    identities = checkin_load._fleet(args.streams, args.streams)
    wave = _gateway_wave()
    connections.close_all()
    for tree in [args.before_tree, args.tree] if args.before_tree else [args.tree]:
        server, address, metrics_port = _gateway(data_dir, tree)
        try:
            name = f"gateway {tree}".strip()
            rows.append(_storm_once(name, server, address, identities, wave, args, ca_pem, metrics_port))
        finally:
            _stop(server)
    if args.with_peer:  # the same storm and waves against the trivial peer, same run, same identities
        server, address = _peer(peer_spec)
        try:
            rows.append(
                _storm_once(
                    "trivial grpc.aio", server, address, identities, _peer_wave(server), args, ca_pem, 0
                )
            )
        finally:
            _stop(server)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--in-flight", type=int, default=500, help="connections being set up at once")
    parser.add_argument(
        "--hold", type=float, default=30.0, help="seconds to hold the streams after RSS settles"
    )
    parser.add_argument("--option", action="append", default=[], help="a grpc server option name=value")
    parser.add_argument("--gateway", action="store_true", help="storm manage.py gateway instead of the peer")
    parser.add_argument(
        "--tree", default="", help="--gateway: the gateway of this checkout (e.g. before a change)"
    )
    parser.add_argument(
        "--before-tree", default="", help="--gateway: first the gateway of this checkout, same devices"
    )
    parser.add_argument("--waves", type=int, default=1, help="waves after the hold (a hint to every stream)")
    parser.add_argument("--wave-seconds", type=float, default=8.0, help="wait after each wave")
    parser.add_argument(
        "--peer-slow-ms", type=float, default=0.0, help="the peer blocks its loop this long per stream"
    )
    parser.add_argument(
        "--with-peer", action="store_true", help="--gateway: then the same storm on the trivial peer"
    )
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ferry_cloud.settings")
    with contextlib.ExitStack() as stack:
        data_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="ferry-storm-"))
        os.environ["FERRY_DATA_DIR"] = data_dir
        if args.gateway:
            url = os.environ.get("FERRY_DATABASE_URL", "")
            os.environ["FERRY_DATABASE_URL"] = stack.enter_context(scratch_database(url, "storm"))
        for row in run(args, data_dir):
            print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
