"""A reconnect storm against the trivial grpc.aio peer alone (no Django servicer, no database): how
many of --streams WatchHints streams (one mutual-TLS connection each, --in-flight handshakes at
once) are held, how many end and with which status, and the peer's RSS, in a few minutes.

    .venv/bin/python bench/fleet_storm.py --streams 10000 [--option grpc.some_arg=value ...]

It separates what grpc does to a storm from what the gateway does: bench/fleet_load.py's storm
runs the same client (bench/fleet_clients.py --storm) against the real gateway.  Certificates
come from a device CA made in a temporary data directory; device ids are random.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]

from bench.fleet_load import _rss_mb, _settled_rss  # noqa: E402  (after the path setup)

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


def run(args) -> dict:
    import django

    django.setup()
    from django.conf import settings

    identities = _identities(args.streams)
    ca_pem = Path(settings.FERRY_DEVICE_CA_CERT_FILE).read_text()
    peer_spec = {
        "ca_pem": ca_pem,
        "key_pem": Path(settings.FERRY_GATEWAY_TLS_KEY_FILE).read_text(),
        "cert_pem": Path(settings.FERRY_GATEWAY_TLS_CERT_FILE).read_text(),
        "workers": 16,
        "options": [_option(o) for o in args.option],
    }
    peer, line = _start([sys.executable, CLIENTS, "--trivial-streams"], peer_spec, "listening on ")
    address = line.split("listening on ", 1)[1].split()[0]
    try:
        idle = _rss_mb(peer.pid)
        storm_spec = {
            "ca_pem": ca_pem,
            "address": address,
            "identities": identities,
            "in_flight": args.in_flight,
            "settle_seconds": 1.0,
        }
        storm, called_line = _start([sys.executable, CLIENTS, "--storm"], storm_spec, "called")
        called = json.loads(called_line)
        held = _settled_rss(peer.pid)
        time.sleep(args.hold)
        storm.stdin.write(json.dumps({"waves": []}) + "\n")
        storm.stdin.flush()
        report = json.loads(storm.stdout.readline())
        storm.wait(timeout=120)
    finally:
        peer.stdin.close()
        peer.terminate()
        peer.wait(timeout=60)
    return {
        "streams": args.streams,
        "options": peer_spec["options"],
        "calls_seconds": round(called["seconds"], 1),
        "ended_before_report": report["ended"],
        "rss_idle_mb": round(idle, 1),
        "rss_mb": round(held, 1),
        "kb_per_stream": round(1024 * (held - idle) / args.streams, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--in-flight", type=int, default=500, help="connections being set up at once")
    parser.add_argument(
        "--hold", type=float, default=30.0, help="seconds to hold the streams after RSS settles"
    )
    parser.add_argument("--option", action="append", default=[], help="a grpc server option name=value")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ferry_cloud.settings")
    with tempfile.TemporaryDirectory(prefix="ferry-storm-") as data_dir:
        os.environ["FERRY_DATA_DIR"] = data_dir
        print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
