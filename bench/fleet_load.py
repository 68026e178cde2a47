"""Fleet load: the gateway's check-ins/s, telemetry records/s, latency and hint streams held, beside
a trivial gRPC server and PostgreSQL's own COPY rate, in one run (5-15 min at 10,000 devices).

    FERRY_DATABASE_URL=postgres://postgres@127.0.0.1:5432/ferry REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/fleet_load.py [--devices 10000] [--streams 10000] [--gateways 2]

A scratch database (<name>_bench_fleet: created, migrated, dropped) holds --devices enrolled
devices with real client certificates from the device CA (bench/checkin_load.py's fleet).
The gateway (``manage.py gateway`` on PostgreSQL and Redis; --gateways 2: two processes on one
port, SO_REUSEPORT) is pinned to core 0; every load generator is its own process pinned to core 1.

1. check-ins: bench/checkin_load.py's closed-loop callers (no-change check-ins) against the
   trivial gRPC server (same proto and mutual TLS, constant reply) and against the gateway;
2. telemetry: callers sending the agent's 500-record batches through the gateway (one device
   each), then each replays a batch: every acknowledged record must be stored exactly once;
   beside PostgreSQL's COPY and INSERT .. ON CONFLICT into a table of the same shape
   (bench/telemetry_ingest.py's ceiling rows);
3. hint streams: a reconnect storm of --streams WatchHints streams (one mTLS connection per
   device) while check-in callers measure latency; streams held, refused, the gateway's RSS;
   then a release to every device and its rollback: how many streams heard each, how soon,
   and a sample of devices checks in and is offered the release.

The host is shared and small: figures are ratios within this one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]

from bench import checkin_load, telemetry_ingest  # noqa: E402  (after the path setup)
from bench.scratch_database import scratch_database  # noqa: E402

CLIENTS = str(ROOT / "bench" / "fleet_clients.py")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _free_port() -> int:
    from ferry_cloud.stack import free_port

    return free_port()


class Gateways:
    """--gateways processes of manage.py gateway on one port, each with its metrics port."""

    def __init__(self, count: int, env: dict, data_dir: str) -> None:
        self.port, enrol_port = _free_port(), _free_port()
        self.metrics_ports = [_free_port() for _ in range(count)]
        env = {**env, "FERRY_GATEWAY_ENROL_ADDRESS": f"127.0.0.1:{enrol_port}", "FERRY_DATA_DIR": data_dir}
        pin = ["taskset", "-c", str(sorted(os.sched_getaffinity(0))[0])] if _two_cores() else []
        self.processes = []
        for metrics_port in self.metrics_ports:
            command = [*pin, sys.executable, str(ROOT / "manage.py"), "gateway"]
            command += ["--address", f"127.0.0.1:{self.port}", "--metrics-port", str(metrics_port)]
            process, _ = checkin_load._start(command, env, "listening on ")
            self.processes.append(process)
        self.address = f"127.0.0.1:{self.port}"

    def cpu(self) -> float:
        return sum(checkin_load._cpu_seconds(p.pid) for p in self.processes)

    def rss_mb(self) -> list[float]:
        return [_rss_mb(p.pid) for p in self.processes]

    def streams(self) -> list[int]:
        """Each process's open WatchHints streams, from its Prometheus gauge."""
        import requests

        held = []
        for port in self.metrics_ports:
            try:  # a gateway busy with a storm answers its metrics port late
                text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=60).text
            except requests.RequestException:
                text = ""
            line = next(
                (x for x in text.splitlines() if x.startswith("ferry_gateway_hint_streams_open ")), ""
            )
            held.append(int(float(line.split()[-1])) if line else 0)
        return held

    def stop(self) -> None:
        for process in self.processes:
            process.stdin.close()
            process.terminate()
        for process in self.processes:
            process.wait(timeout=60)


def _say(what: str) -> None:
    """Progress on stderr (a run takes minutes)."""
    print(f"[{time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def _two_cores() -> bool:
    return hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) >= 2


def _client(mode: str, spec: dict) -> dict:
    out = subprocess.run(
        [sys.executable, CLIENTS, mode], input=json.dumps(spec), capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


# --- 1. check-ins ------------------------------------------------------------------------------


def _check_ins(name: str, address: str, cpu, spec: dict) -> dict:
    load = dict(spec, address=address)
    checkin_load._run_load(dict(load, seconds=1.0))  # warm: connections, caches
    before = cpu()
    result = checkin_load._run_load(load)
    used = cpu() - before
    return {
        "name": name,
        "per_s": result["count"] / result["wall"],
        "p50_ms": result["p50_ms"],
        "p99_ms": result["p99_ms"],
        "cpu_us": 1e6 * used / max(result["count"], 1),
    }


# --- 2. telemetry ------------------------------------------------------------------------------


def _telemetry(gateways: Gateways, spec: dict, identities: list, args) -> dict:
    from telemetry.models import TelemetryRecord

    callers = identities[: args.telemetry_callers]
    load = {**spec, "address": gateways.address, "identities": callers, "seconds": args.seconds}
    before_rows, before_cpu = TelemetryRecord.objects.count(), gateways.cpu()
    result = _client("--telemetry", dict(load, first_seq=1))
    used = gateways.cpu() - before_cpu
    stored = TelemetryRecord.objects.count() - before_rows
    acknowledged = result["stored"] + result["replayed_stored"]
    return {
        "name": f"gateway telemetry ({len(callers)} callers)",
        "per_s": result["stored"] / result["wall"],
        "p50_ms": result["p50_ms"],
        "p99_ms": result["p99_ms"],
        "cpu_us": 1e6 * used / max(result["stored"], 1),
        "exactly_once": stored == acknowledged and result["replayed_stored"] == 0,
        "stored_rows": stored,
        "acknowledged": acknowledged,
    }


def _postgres_ceiling(devices: list) -> list[dict]:
    import json as _json

    texts = [_json.dumps(telemetry_ingest._payload(i)) for i in range(telemetry_ingest.BATCH)]
    rows = telemetry_ingest._postgres_rows(SimpleNamespace(records=40_000), devices, time.time(), texts)
    return [{"name": r["name"], "per_s": r["per_s"], "cpu_us": r["cpu_us"]} for r in rows]


# --- 3. hint streams ---------------------------------------------------------------------------


def _ready_version(org):
    """A converted model version to release (the converter's sample classifier)."""
    import io

    from registry.services import conversion_queue_register, conversion_run, model_create, version_upload

    from converter.samples import build_image_classifier

    conversion_queue_register(send=lambda job_id: None)  # converted right here, not by a worker
    data = build_image_classifier().SerializeToString()
    model = model_create(organisation=org, name="bench-classifier")
    version = version_upload(model=model, label="v1", stream=io.BytesIO(data), size=len(data))
    conversion_run(job_id=version.job.pk)
    version.refresh_from_db()
    return version


def _probe(spec: dict, address: str, identities: list, seconds: float) -> dict:
    """Check-in latency from a few callers (bench/checkin_load.py's load generator)."""
    return checkin_load._run_load(
        dict(spec, address=address, identities=identities, threads=2, seconds=seconds)
    )


def _wait_held(gateways: Gateways, streams: int, timeout: float) -> tuple[int, float]:
    started = time.monotonic()
    held = 0
    while time.monotonic() - started < timeout:
        held = sum(gateways.streams())
        if held >= streams:
            break
        time.sleep(0.5)
    return held, time.monotonic() - started


def _open_storm(address: str, ca_pem: str, identities: list, args) -> subprocess.Popen:
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    storm = subprocess.Popen([sys.executable, CLIENTS, "--storm"], cwd=ROOT, **pipes)
    spec = {
        "ca_pem": ca_pem,
        "address": address,
        "identities": identities,
        "in_flight": args.in_flight,
        "settle_seconds": 5.0,
    }
    storm.stdin.write(json.dumps(spec) + "\n")
    storm.stdin.flush()
    return storm


def _end_storm(storm: subprocess.Popen, waves: list[float]) -> dict:
    storm.stdin.write(json.dumps({"waves": waves}) + "\n")
    storm.stdin.flush()
    report = json.loads(storm.stdout.readline())
    storm.wait(timeout=120)
    return report


def _settled_rss(pid: int, timeout: float = 120.0) -> float:
    """RSS once it stops growing (the peer has no gauge of its open streams)."""
    last, started = _rss_mb(pid), time.monotonic()
    while time.monotonic() - started < timeout:
        time.sleep(3.0)
        now = _rss_mb(pid)
        if abs(now - last) < 0.01 * last:
            return now
        last = now
    return last


def _peer_streams(server: subprocess.Popen, address: str, ca_pem: str, identities: list, args) -> dict:
    """The same storm against the trivial grpc.aio server: the stack's own cost per open stream."""
    idle = _rss_mb(server.pid)
    storm = _open_storm(address, ca_pem, identities, args)
    called = json.loads(storm.stdout.readline())
    held = _settled_rss(server.pid)
    report = _end_storm(storm, [])
    return {
        "streams": len(identities),
        "rss_idle_mb": idle,
        "rss_mb": held,
        "calls_seconds": called["seconds"],
        "ended": report["ended"],
    }


def _storm(gateways: Gateways, spec: dict, identities: list, args, org) -> dict:
    from django.db import connections
    from releases.services import release_create, release_transition

    from agent.client import GatewayClient
    from deploy.proto import agent_pb2

    _say("converting the release's model")
    version = _ready_version(org)
    _say("check-in latency, quiet")
    probers = identities[-50:]
    rss_idle = gateways.rss_mb()
    quiet = _probe(spec, gateways.address, probers, args.probe_seconds)
    storm = subprocess.Popen(
        [sys.executable, CLIENTS, "--storm"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    storm_spec = {
        "ca_pem": spec["ca_pem"],
        "address": gateways.address,
        "identities": identities[: args.streams],
        "in_flight": args.in_flight,
        "settle_seconds": 5.0,
    }
    storm.stdin.write(json.dumps(storm_spec) + "\n")
    storm.stdin.flush()
    during: dict = {}
    prober = threading.Thread(
        target=lambda: during.update(_probe(spec, gateways.address, probers, args.probe_seconds))
    )
    prober.start()
    _say(f"storm of {args.streams} streams")
    called = json.loads(storm.stdout.readline())
    _say(f"storm: every call made after {called['seconds']:.1f} s")
    held, connect_seconds = _wait_held(gateways, args.streams, timeout=300)
    per_process, rss = gateways.streams(), gateways.rss_mb()
    prober.join()

    _say(f"{held} streams held; release, then rollback")
    release = release_create(organisation=org, version=version, name="wave", target={}, start=False)
    time.sleep(2.0)  # the draft's own hint (a saved Release row) is not the wave measured
    released_at = time.time()
    release_transition(release_id=release.pk, action="start")
    # the transition's own work, before its commit publishes the hint, is part of the wave's time
    transitions = [time.time() - released_at]
    time.sleep(3.0)
    ca = spec["ca_pem"].encode()
    offered = 0
    for key, cert in identities[:20]:  # the hint means "check in now": is the release there?
        client = GatewayClient(
            gateways.address, ca_pem=ca, key_pem=key.encode(), certificate_pem=cert.encode()
        )
        attributes = agent_pb2.DeviceAttributes(**checkin_load.ATTRIBUTES)
        offered += client.check_in(attributes, "", "").HasField("desired")
        client.close()
    rolled_back_at = time.time()
    release_transition(release_id=release.pk, action="rollback")
    transitions.append(time.time() - rolled_back_at)
    connections.close_all()
    report = _end_storm(storm, [released_at, rolled_back_at])
    return {
        "streams": args.streams,
        "held": held,
        "per_process": per_process,
        "connect_seconds": connect_seconds,
        "calls_seconds": called["seconds"],
        "ended": report["ended"],
        "rss_mb": rss,
        "rss_idle_mb": rss_idle,
        "quiet": quiet,
        "during": during,
        "waves": [dict(w, transition_s=t) for w, t in zip(report["waves"], transitions, strict=True)],
        "offered": offered,
    }


# --- the run -----------------------------------------------------------------------------------


def _run(args, data_dir: str) -> dict:
    import django

    django.setup()
    from accounts.services import organisation_ensure
    from django.conf import settings
    from django.db import connections
    from fleet.models import Device

    wanted = max(args.streams, args.identities + args.telemetry_callers) + 50
    _say(f"fleet: {args.devices} devices, {min(wanted, args.devices)} certificates")
    identities = checkin_load._fleet(args.devices, min(wanted, args.devices))
    org = organisation_ensure(name="Bench")
    devices = list(Device.objects.order_by("name")[: args.telemetry_callers])
    connections.close_all()
    ca_pem = Path(settings.FERRY_DEVICE_CA_CERT_FILE).read_text()
    spec = {"ca_pem": ca_pem, "identities": identities[: args.identities], "threads": args.threads}
    spec["seconds"] = args.seconds
    # streams live the whole run: a storm that takes minutes on a busy host must not see the first
    # streams reach their lifetime (and reopen) before the last ones are open
    env = {**os.environ, "FERRY_LOG_LEVEL": "WARNING", "FERRY_DATA_DIR": data_dir}
    env["FERRY_GATEWAY_WATCH_SECONDS"] = "3600"
    trivial_spec = {
        "ca_pem": ca_pem,
        "key_pem": Path(settings.FERRY_GATEWAY_TLS_KEY_FILE).read_text(),
        "cert_pem": Path(settings.FERRY_GATEWAY_TLS_CERT_FILE).read_text(),
        "workers": 16,
    }
    trivial, trivial_address = checkin_load._start(
        [sys.executable, str(ROOT / "bench" / "checkin_load.py"), "--trivial"],
        env,
        "listening on ",
        trivial_spec,
    )
    aio, aio_address = checkin_load._start(
        [sys.executable, CLIENTS, "--trivial-streams"], env, "listening on ", trivial_spec
    )
    gateways = Gateways(args.gateways, env, data_dir)
    result: dict = {}
    try:
        # the storm first, on a fresh gateway: its RSS is the streams' cost, not other phases'
        result["storm"] = _storm(gateways, spec, identities, args, org)
        if args.only != "storm":
            _say("check-ins")
            result["check_ins"] = [
                _check_ins("trivial gRPC (mTLS)", trivial_address, _cpu_of(trivial), spec),
                _check_ins("trivial grpc.aio, sync handler", aio_address, _cpu_of(aio), spec),
                _check_ins(f"gateway x{args.gateways} (PG, Redis)", gateways.address, gateways.cpu, spec),
            ]
        _say(f"the peer: the trivial grpc.aio server holding {args.peer_streams} streams")
        peers = identities[: args.peer_streams]
        result["peer_streams"] = _peer_streams(aio, aio_address, ca_pem, peers, args)
        if args.only != "storm":
            _say("telemetry")
            result["telemetry"] = _telemetry(gateways, spec, identities[args.identities :], args)
            result["ceiling"] = _postgres_ceiling(devices)
    finally:
        for process in (trivial, aio):
            process.stdin.close()
            process.terminate()
            process.wait(timeout=60)
        gateways.stop()
    return result


def _cpu_of(process: subprocess.Popen):
    return lambda: checkin_load._cpu_seconds(process.pid)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--streams", type=int, default=10_000, help="WatchHints streams in the storm")
    parser.add_argument("--gateways", type=int, default=1, help="gateway processes sharing one port")
    parser.add_argument("--identities", type=int, default=200, help="devices the check-in callers cycle over")
    parser.add_argument("--threads", type=int, default=8, help="closed-loop check-in callers")
    parser.add_argument("--telemetry-callers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=8.0, help="per check-in and telemetry row")
    parser.add_argument("--probe-seconds", type=float, default=20.0, help="check-in latency probe")
    parser.add_argument("--in-flight", type=int, default=500, help="storm connections being set up at once")
    parser.add_argument("--peer-streams", type=int, default=2000, help="streams held by the trivial peer")
    parser.add_argument("--only", choices=["all", "storm"], default="all")
    parser.add_argument("--json", default="", help="also write the figures to this file")
    args = parser.parse_args()
    url = os.environ.get("FERRY_DATABASE_URL", "")
    if not url or not os.environ.get("REDIS_URL"):
        sys.exit("set FERRY_DATABASE_URL (PostgreSQL; a scratch copy is used) and REDIS_URL")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ferry_cloud.settings")
    os.environ["FERRY_S3_BUCKET"] = ""  # the release's package in the scratch data directory
    with (
        scratch_database(url, "fleet") as scratch,
        tempfile.TemporaryDirectory(prefix="ferry-bench-fleet-") as data_dir,
    ):
        os.environ["FERRY_DATABASE_URL"] = scratch
        os.environ["FERRY_DATA_DIR"] = data_dir
        result = _run(args, data_dir)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    _print(result, args)
    return 0


def _print(result: dict, args) -> None:
    print(
        f"\nfleet load: {args.devices} devices, {args.gateways} gateway process(es) on core 0,"
        " load on core 1;"
        f" {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    _print_storm(result["storm"])
    peer = result["peer_streams"]
    per_stream = 1024 * (peer["rss_mb"] - peer["rss_idle_mb"]) / peer["streams"]
    s = result["storm"]
    gateway_per_stream = 1024 * (sum(s["rss_mb"]) - sum(s["rss_idle_mb"])) / max(s["held"], 1)
    print(
        f"RSS per open stream: gateway {gateway_per_stream:.0f} KB, trivial grpc.aio mTLS server"
        f" {per_stream:.0f} KB ({peer['streams']} streams,"
        f" {peer['rss_idle_mb']:.0f} -> {peer['rss_mb']:.0f} MB)"
    )
    if "check_ins" not in result:
        return
    print(f"{'row':<38} {'per s':>9} {'p50 ms':>8} {'p99 ms':>8} {'server CPU/op':>14}")
    rows = [*result["check_ins"], result["telemetry"], *result["ceiling"]]
    for r in rows:
        latency = (
            f"{r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f}" if r.get("p50_ms") is not None else f"{'':>8} {'':>8}"
        )
        print(f"{r['name']:<38} {r['per_s']:>9,.0f} {latency} {r['cpu_us']:>11.0f} us")
    trivial, aio, gateway = result["check_ins"]
    print(
        f"check-ins: {100 * gateway['per_s'] / trivial['per_s']:.0f}% of the trivial server's rate"
        f" ({100 * gateway['per_s'] / aio['per_s']:.0f}% of the trivial aio one's); "
        f"{1e6 / gateway['cpu_us']:,.0f} per gateway core-second"
    )
    t = result["telemetry"]
    copy = result["ceiling"][0]
    print(
        f"telemetry: {1e6 / t['cpu_us']:,.0f} records per gateway core-second; "
        f"{100 * t['per_s'] / copy['per_s']:.0f}% of PostgreSQL's COPY rate; "
        f"exactly once: {t['exactly_once']} ({t['stored_rows']} rows for {t['acknowledged']} acknowledged)"
    )


def _print_storm(s: dict) -> None:
    q, d = s["quiet"], s["during"]
    print(
        f"hint streams: {s['held']} of {s['streams']} held {s['per_process']}"
        f" after {s['connect_seconds']:.1f} s, refused/ended early: {s['ended'] or 'none'};"
        f" gateway RSS {', '.join(f'{m:.0f}' for m in s['rss_mb'])} MB"
        f" (idle before: {', '.join(f'{m:.0f}' for m in s['rss_idle_mb'])} MB)"
    )
    print(
        f"check-in latency p50/p99: {q['p50_ms']:.1f}/{q['p99_ms']:.1f} ms quiet, "
        f"{d['p50_ms']:.1f}/{d['p99_ms']:.1f} ms while the storm connects"
    )
    for name, wave in zip(("release", "rollback"), s["waves"], strict=True):
        if not wave["reached"]:
            print(f"{name}: no stream heard it")
            continue
        print(
            f"{name}: hint on {wave['reached']} of {wave['streams']} streams,"
            f" after p50 {wave['p50_ms']:.0f} ms, p99 {wave['p99_ms']:.0f} ms, max {wave['max_ms']:.0f} ms"
            f" (the transition itself, to its commit: {1e3 * wave.get('transition_s', 0):.0f} ms)"
        )
    print(f"release offered to {s['offered']} of 20 sampled devices checking in on the hint")


if __name__ == "__main__":
    sys.exit(main())
