"""No-change check-ins: the real gateway beside a trivial gRPC server, in one run (~3 min).

    FERRY_DATABASE_URL=postgres://postgres@127.0.0.1:5432/ferry REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/checkin_load.py

A scratch database of its own (<name>_bench_checkin: created, migrated, dropped) holds
--devices enrolled devices (bulk-created rows); --identities of them get real client
certificates from the control plane's device CA.  Processes:

- the server: ``manage.py gateway`` (PostgreSQL), or a trivial synchronous gRPC server with
  the same proto, the same mutual TLS and thread pool, answering every CheckIn with a constant
  reply (the stack's own ceiling), or the gateway's own server (gateway.server.build_server:
  its interceptors and thread pool) with a constant CheckIn (``--floor``: what the servicer's
  check-in stands on); pinned to core 0 when there are two or more;
- the load generator: this script again (``--load``), pinned to core 1, --threads closed-loop
  callers cycling over the identities, one long-lived mTLS channel per identity, each sending
  the no-change check-in an idle agent sends (same attributes, nothing running, no update);
  then --rate check-ins/s offered in open loop to the trivial server and the gateway (p50/p99
  counted from each call's scheduled start).

Gateway rows: as configured (REDIS_URL set: a no-change check-in is answered from memory,
gateway/checkin_fast.py), the same gateway without REDIS_URL (no fleet generation, so every
answer is computed and the device row read and written as before any cache), and with
--before-tree another checkout's gateway (e.g. ``git archive main | tar -x -C /tmp/before``)
in the same run.  No release is live in the scratch fleet, so the computed row is a lower
bound of what a computed answer costs.

bench/checkin_correctness.py runs a release and its rollback under this load, and checks
telemetry is stored exactly once (prints PASS or FAIL).

Prints check-ins/s, p50/p99 latency and the server process's CPU per check-in.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]

from bench.scratch_database import scratch_database  # noqa: E402  (after the path setup)

ATTRIBUTES = {"hardware": "bench", "os": "linux", "agent_version": "bench"}
# the optional rows beside the trivial threaded server and the gateway (--only picks some)
ROWS = ("trivial-aio", "uncached", "floor")


def _pin(core: int) -> None:
    """Pin this process to one core when there are two (the other belongs to the peer process)."""
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[core]})


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux /proc), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- the load generator (its own process) ---------------------------------------------------


def _load(spec: dict) -> dict:
    """Closed loop (``threads`` callers back to back), or open loop when spec has ``rate``: calls
    scheduled every 1/rate s over the callers, latency counted from the scheduled start (a
    late start is part of it: no coordinated omission)."""
    from agent.client import GatewayClient
    from deploy.proto import agent_pb2

    _pin(1)
    ca = spec["ca_pem"].encode()
    clients = [
        GatewayClient(spec["address"], ca_pem=ca, key_pem=k.encode(), certificate_pem=c.encode())
        for k, c in spec["identities"]
    ]
    attributes = agent_pb2.DeviceAttributes(**ATTRIBUTES)
    for client in clients:  # connect (TLS handshake) outside the measurement
        client.check_in(attributes, "", "")
    threads = spec["threads"]
    rate = spec.get("rate") or 0.0
    latencies: list[list[float]] = [[] for _ in range(threads)]
    offers = [0] * threads  # answers carrying (or confirming) an assignment: none in a no-change run
    errors = [0] * threads
    started = time.monotonic()
    stop = started + spec["seconds"]

    def work(i: int) -> None:
        n = i
        while True:
            due = started + n / rate if rate else time.monotonic()
            if due >= stop:
                return
            if rate and due > time.monotonic():
                time.sleep(due - time.monotonic())
            client = clients[n % len(clients)]
            n += threads
            begun = time.perf_counter() - (max(0.0, time.monotonic() - due) if rate else 0.0)
            try:
                reply = client.check_in(attributes, "", "")
            except Exception:  # counted: a refused or dropped call is a finding, not a crash
                errors[i] += 1
                continue
            latencies[i].append(time.perf_counter() - begun)
            offers[i] += reply.HasField("desired") or reply.desired_unchanged

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.monotonic() - started
    for client in clients:
        client.close()
    every = sorted(x for part in latencies for x in part) or [0.0]
    return {
        "count": sum(len(part) for part in latencies),
        "wall": wall,
        "p50_ms": 1e3 * every[len(every) // 2],
        "p99_ms": 1e3 * every[min(len(every) - 1, int(len(every) * 0.99))],
        "offers": sum(offers),
        "errors": sum(errors),
    }


# --- the trivial server (its own process) ----------------------------------------------------


def mtls_server_credentials(spec: dict):
    """The trivial servers' mutual TLS: the gateway's key and certificate, client certificates
    required and checked against the fleet's CA, as the gateway does."""
    import grpc  # noqa: PLC0415

    return grpc.ssl_server_credentials(
        [(spec["key_pem"].encode(), spec["cert_pem"].encode())],
        root_certificates=spec["ca_pem"].encode(),
        require_client_auth=True,
    )


def _trivial(spec: dict) -> None:
    import grpc

    from deploy.proto import agent_pb2, agent_pb2_grpc

    _pin(0)

    class Trivial(agent_pb2_grpc.AgentGatewayServicer):
        def CheckIn(self, request, context):
            return agent_pb2.CheckInResponse(checkin_interval_seconds=30)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=spec["workers"]))
    agent_pb2_grpc.add_AgentGatewayServicer_to_server(Trivial(), server)
    credentials = mtls_server_credentials(spec)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    print(f"trivial listening on 127.0.0.1:{port}", flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    server.stop(grace=None)


def _trivial_aio(spec: dict) -> None:
    """The trivial server on grpc.aio (the gateway's server kind): an async CheckIn returning a
    constant, no interceptor: the ceiling of an event-loop gRPC server in Python."""
    import asyncio

    import grpc

    from deploy.proto import agent_pb2, agent_pb2_grpc

    _pin(0)

    class Trivial(agent_pb2_grpc.AgentGatewayServicer):
        async def CheckIn(self, request, context):  # noqa: N802 (gRPC's name)
            return agent_pb2.CheckInResponse(checkin_interval_seconds=30)

    async def serve() -> None:
        server = grpc.aio.server()
        agent_pb2_grpc.add_AgentGatewayServicer_to_server(Trivial(), server)
        credentials = mtls_server_credentials(spec)
        port = server.add_secure_port("127.0.0.1:0", credentials)
        await server.start()
        print(f"trivial-aio listening on 127.0.0.1:{port}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await server.stop(grace=None)

    asyncio.run(serve())


def _floor(spec: dict) -> None:
    """The gateway's own server (gateway.server.build_server: its event loop, interceptors,
    enrolment port and health service) with a CheckIn that returns a constant: the floor a
    check-in of the real servicer stands on."""
    import django

    _pin(0)
    django.setup()
    from gateway import server as gateway_server
    from gateway.watch import AioGatewayServicer

    from deploy.proto import agent_pb2

    class Floor(AioGatewayServicer):
        async def CheckIn(self, request, context):  # noqa: N802 (gRPC's name)
            return agent_pb2.CheckInResponse(checkin_interval_seconds=30)

    gateway_server.AioGatewayServicer = Floor  # this process only: it serves nothing else
    server, port = gateway_server.build_server("127.0.0.1:0")
    server.start()
    print(f"floor listening on 127.0.0.1:{port}", flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    server.stop(grace=None)


# --- the run ---------------------------------------------------------------------------------


def _fleet(devices: int, identities: int) -> list[tuple[str, str]]:
    """Bulk-created device rows; (key, certificate) PEMs for the first `identities` of them."""
    from accounts.services import organisation_ensure
    from django.core.management import call_command
    from django.utils import timezone
    from ferry_cloud.device_ca import device_ca
    from fleet.models import Device

    from deploy.trust import certificates

    call_command("migrate", verbosity=0)
    org = organisation_ensure(name="Bench")
    now = timezone.now()
    rows = Device.objects.bulk_create(
        [
            Device(organisation=org, name=f"d{i:06d}", attributes=ATTRIBUTES, last_seen_at=now)
            for i in range(devices)
        ],
        batch_size=2000,
    )
    ca = device_ca()
    pems = []
    for device in rows[:identities]:
        key = certificates.create_private_key()
        issued = certificates.sign_client_certificate(
            ca, certificates.create_csr(key), device_id=str(device.pk)
        )
        pems.append((key.decode(), issued.certificate_pem.decode()))
    return pems


def _start(
    command: list[str], env: dict, marker: str, spec: dict | None = None
) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    if spec is not None:
        process.stdin.write(json.dumps(spec) + "\n")
        process.stdin.flush()
    line = process.stdout.readline()
    if marker not in line:
        process.kill()
        raise RuntimeError(f"the server did not start: {line!r}")
    return process, line.split(marker, 1)[1].split()[0]


def _row(name: str, server: subprocess.Popen, address: str, spec: dict) -> dict:
    """Drive the server from the load generator's process; the server's CPU over the run."""
    load = dict(spec, address=address)
    warm = dict(load, seconds=1.0)
    _run_load(warm)
    cpu = _cpu_seconds(server.pid)
    result = _run_load(load)
    cpu = _cpu_seconds(server.pid) - cpu
    return {
        "name": name,
        "per_s": result["count"] / result["wall"],
        "p50_ms": result["p50_ms"],
        "p99_ms": result["p99_ms"],
        "cpu_us": 1e6 * cpu / max(result["count"], 1),
        "offers": result.get("offers", 0),
        "errors": result.get("errors", 0),
    }


def _run_load(spec: dict) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--load"],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def _gateway_command(root: Path = ROOT) -> list[str]:
    """`manage.py gateway` of a source tree, pinned to the first core when there are two."""
    pin = (
        ["taskset", "-c", str(sorted(os.sched_getaffinity(0))[0])]
        if len(os.sched_getaffinity(0)) >= 2
        else []
    )
    command = [*pin, sys.executable, str(root / "manage.py"), "gateway", "--address", "127.0.0.1:0"]
    return [*command, "--metrics-port", "0"]


def _run(args, data_dir: str) -> list[dict]:
    import django

    django.setup()
    from django.conf import settings
    from django.db import connections

    identities = _fleet(args.devices, args.identities)
    connections.close_all()
    ca_pem = Path(settings.FERRY_DEVICE_CA_CERT_FILE).read_text()
    spec = {"ca_pem": ca_pem, "identities": identities, "threads": args.threads, "seconds": args.seconds}
    env = {**os.environ, "FERRY_LOG_LEVEL": "WARNING", "FERRY_DATA_DIR": data_dir}
    servers: dict[str, tuple[str, subprocess.Popen, str]] = {}  # key -> (row name, process, address)
    trivial_spec = {
        "ca_pem": ca_pem,
        "key_pem": Path(settings.FERRY_GATEWAY_TLS_KEY_FILE).read_text(),
        "cert_pem": Path(settings.FERRY_GATEWAY_TLS_CERT_FILE).read_text(),
        "workers": 16,  # gateway.server.build_server's default
    }
    only = set((getattr(args, "only", "") or ",".join(ROWS)).split(","))
    try:
        process, address = _start([sys.executable, __file__, "--trivial"], env, "listening on ", trivial_spec)
        servers["trivial"] = ("trivial gRPC (mTLS)", process, address)
        if "trivial-aio" in only:
            command = [sys.executable, __file__, "--trivial-aio"]
            process, address = _start(command, env, "listening on ", trivial_spec)
            servers["trivial-aio"] = ("trivial grpc.aio (mTLS)", process, address)
        if "uncached" in only:
            # without REDIS_URL there is no fleet generation, so this one computes every answer
            uncached_env = {k: v for k, v in env.items() if k != "REDIS_URL"}
            process, address = _start(_gateway_command(), uncached_env, "listening on ")
            servers["uncached"] = ("gateway, computed (no Redis)", process, address)
        before = getattr(args, "before_tree", "")
        if before:  # the same run, another checkout's gateway (e.g. main before this change)
            tree = Path(before).resolve()
            before_env = dict(env, PYTHONPATH=f"{tree}{os.pathsep}{tree / 'platform'}")
            process, address = _start(_gateway_command(tree), before_env, "listening on ")
            servers["before"] = (f"gateway at {tree.name} (before)", process, address)
        if "floor" in only and getattr(args, "floor", True):
            process, address = _start([sys.executable, __file__, "--floor"], env, "listening on ", {})
            servers["floor"] = ("gateway server, constant CheckIn", process, address)
        process, address = _start(_gateway_command(), env, "listening on ")
        servers["gateway"] = ("gateway (mTLS, PG)", process, address)
        if getattr(args, "pids", ""):  # for a profiler: which process is which
            Path(args.pids).write_text(json.dumps({k: v[1].pid for k, v in servers.items()}))
        rows: dict[str, list[dict]] = {}
        for _ in range(args.rounds):  # alternate, so a neighbour's load hits all alike
            for key, (name, process, address) in servers.items():
                rows.setdefault(key, []).append(_row(name, process, address, spec))
        rate = getattr(args, "rate", 0.0)
        if rate:  # open loop: latency at an offered rate, the trivial server and this gateway
            offered = dict(spec, rate=rate, threads=max(args.threads, 32))
            for key in ("trivial", "gateway"):
                name, process, address = servers[key]
                rows[f"{key}@rate"] = [_row(f"{name} @{rate:.0f}/s", process, address, offered)]
    finally:
        for _, process, _ in servers.values():
            process.stdin.close()
            process.terminate()
            process.wait(timeout=30)
    return [_median(runs) for runs in rows.values()]


def _median(runs: list[dict]) -> dict:
    best = sorted(runs, key=lambda r: r["per_s"])[len(runs) // 2]
    return dict(best, per_s=statistics.median(r["per_s"] for r in runs))


def main() -> int:
    if sys.argv[1:] == ["--load"]:
        print(json.dumps(_load(json.loads(sys.stdin.read()))))
        return 0
    if sys.argv[1:] == ["--trivial"]:
        _trivial(json.loads(sys.stdin.readline()))
        return 0
    if sys.argv[1:] == ["--trivial-aio"]:
        _trivial_aio(json.loads(sys.stdin.readline()))
        return 0
    if sys.argv[1:] == ["--floor"]:
        sys.stdin.readline()
        _floor({})
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument(
        "--identities", type=int, default=200, help="client certificates the load cycles over"
    )
    parser.add_argument("--threads", type=int, default=8, help="closed-loop callers in the load generator")
    parser.add_argument("--seconds", type=float, default=8.0, help="per row and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--rate", type=float, default=1000.0, help="offered check-ins/s of the latency rows (0: none)"
    )
    parser.add_argument("--before-tree", default="", help="also run the gateway of this checkout")
    parser.add_argument(
        "--only", default="", help=f"optional rows to run, comma-separated, of {','.join(ROWS)}"
    )
    parser.add_argument("--pids", default="", help="write the servers' process ids (JSON) to this file")
    args = parser.parse_args()
    url = os.environ.get("FERRY_DATABASE_URL", "")
    if not url:
        sys.exit("set FERRY_DATABASE_URL to a PostgreSQL database (a scratch copy is used)")
    if not os.environ.get("REDIS_URL"):
        sys.exit("set REDIS_URL: the gateway's fleet generation lives in Redis")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ferry_cloud.settings")
    with (
        scratch_database(url, "checkin") as scratch,
        tempfile.TemporaryDirectory(prefix="ferry-bench-checkin-") as data_dir,
    ):
        os.environ["FERRY_DATABASE_URL"] = scratch
        os.environ["FERRY_DATA_DIR"] = data_dir
        rows = _run(args, data_dir)
    _print(rows, args)
    return 0


def _print(rows: list[dict], args) -> None:
    print(
        f"\nno-change check-ins, {args.devices} devices, {args.identities} mTLS identities, "
        f"{args.threads} callers, {args.seconds:.0f} s x {args.rounds} rounds"
    )
    header = f"{'server':<34} {'check-ins/s':>12} {'p50 ms':>8} {'p99 ms':>8} {'server CPU/check-in':>20}"
    print(header + f" {'errors':>7}")
    for r in rows:
        latency = f"{r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f}"
        errors = r.get("errors", 0)
        print(f"{r['name']:<34} {r['per_s']:>12.0f} {latency} {r['cpu_us']:>17.0f} us {errors:>7}")
    trivial = rows[0]
    floor = next((r for r in rows if r["name"].startswith("gateway server")), None)
    for r in rows[1:]:
        if "/s" in r["name"]:
            continue  # an offered-rate row: its latency is the figure
        of_floor = ""
        if floor is not None and r is not floor:
            of_floor = f", {100 * r['per_s'] / floor['per_s']:.0f}% of the gateway server's floor"
        share = f"{100 * r['per_s'] / trivial['per_s']:.0f}% of the trivial server's rate{of_floor}"
        print(f"{r['name']}: {share}; {1e6 / r['cpu_us']:.0f} check-ins per core-second of its own")


if __name__ == "__main__":
    sys.exit(main())
