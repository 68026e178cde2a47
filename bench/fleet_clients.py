"""The load generator's two clients for bench/fleet_load.py, each run as its own process pinned to
the core the gateway does not have:

- ``--storm``: a reconnect storm, one WatchHints stream per device identity (grpc.aio, one mTLS
  channel per device, as many devices would open), all at once; every hint's arrival time is
  kept, and on the parent's REPORT line (the wall-clock start of each wave: a release, then its
  rollback) it prints, per wave, how many streams heard it and how long after its start;
- ``--telemetry``: closed-loop callers, one device identity each, sending the agent's 500-record
  batches; each caller replays its last batch once (it must come back as duplicates).

Both read a JSON spec on stdin and print JSON lines on stdout.  ``--trivial-streams`` is the
peer of the storm: a grpc.aio server with the same proto and mutual TLS whose WatchHints waits
(the stack's own cost of an open stream) and sends every open stream a Hint on a "wave" line on
its stdin (the stack's own release wave), and whose CheckIn is a constant reply from a
synchronous handler in grpc.aio's migration thread pool (what the gateway's aio server adds to
a call), pinned to the gateway's core.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]

from bench.checkin_load import _pin, mtls_server_credentials  # noqa: E402  (after the path setup)
from bench.telemetry_ingest import BATCH, _payload  # noqa: E402

STREAM_TIMEOUT_SECONDS = 900.0


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    ordered = sorted(values)
    at = lambda q: 1e3 * ordered[min(len(ordered) - 1, int(len(ordered) * q))]  # noqa: E731
    return {"p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": 1e3 * ordered[-1]}


# --- the reconnect storm ---------------------------------------------------------------------


async def _storm(spec: dict) -> None:
    import grpc

    from deploy.proto import agent_pb2, agent_pb2_grpc

    ca = spec["ca_pem"].encode()
    arrivals: list[list[float]] = [[] for _ in spec["identities"]]
    ended: Counter = Counter()
    gate = asyncio.Semaphore(spec["in_flight"])  # calls being set up at once (TLS handshakes)
    channels, calls = [], []
    ended_at: list[float] = []  # seconds after the storm's start at which a stream ended early
    placed_at: list[float] = []  # ... and at which it had been placed

    async def watch(i: int, key: str, cert: str) -> None:
        credentials = grpc.ssl_channel_credentials(ca, key.encode(), cert.encode())
        channel = grpc.aio.secure_channel(spec["address"], credentials)
        channels.append(channel)
        async with gate:
            await channel.channel_ready()
        call = agent_pb2_grpc.AgentGatewayStub(channel).WatchHints(
            agent_pb2.WatchRequest(), timeout=STREAM_TIMEOUT_SECONDS
        )
        placed = time.monotonic() - started
        calls.append(call)
        while True:  # as the agent does: a stream that reached its lifetime is reopened
            try:
                async for _hint in call:
                    arrivals[i].append(time.time())
                ended["OK (reopened)"] += 1
            except grpc.aio.AioRpcError as exc:
                # the details say who ended it (grpc core's words, or the gateway's), the time when
                ended[f"{exc.code().name}: {(exc.details() or '')[:70]}"] += 1
                ended_at.append(round(time.monotonic() - started, 1))
                placed_at.append(round(placed, 1))
                return
            call = agent_pb2_grpc.AgentGatewayStub(channel).WatchHints(
                agent_pb2.WatchRequest(), timeout=STREAM_TIMEOUT_SECONDS
            )

    started = time.monotonic()
    tasks = [asyncio.create_task(watch(i, k, c)) for i, (k, c) in enumerate(spec["identities"])]
    while sum(1 for c in channels) < len(tasks) or len(calls) < len(tasks):
        await asyncio.sleep(0.1)
    print(json.dumps({"called": len(calls), "seconds": time.monotonic() - started}), flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    waves = json.loads(line)["waves"]
    await asyncio.sleep(spec["settle_seconds"])
    report = {
        "ended": dict(ended),
        "ended_at": _spread(ended_at),
        "ended_placed_at": _spread(placed_at),
        "waves": [_wave(arrivals, waves, w) for w in range(len(waves))],
    }
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for channel in channels:
        await channel.close()
    print(json.dumps(report), flush=True)


def _spread(seconds: list[float]) -> dict:
    """When the early ends came: first, median and last, in seconds after the storm's start."""
    if not seconds:
        return {}
    ordered = sorted(seconds)
    return {"first": ordered[0], "median": ordered[len(ordered) // 2], "last": ordered[-1]}


def _wave(arrivals: list[list[float]], waves: list[float], index: int) -> dict:
    """Per stream, the first hint at or after the wave's start (and before the next wave's)."""
    start = waves[index]
    end = waves[index + 1] if index + 1 < len(waves) else float("inf")
    latencies = []
    for times in arrivals:
        first = next((t for t in times if start <= t < end), None)
        if first is not None:
            latencies.append(first - start)
    return {"reached": len(latencies), "streams": len(arrivals), **_percentiles(latencies)}


# --- telemetry callers -----------------------------------------------------------------------


def _telemetry(spec: dict) -> dict:
    from agent.client import GatewayClient
    from deploy.proto import agent_pb2

    texts = [json.dumps(_payload(i)) for i in range(BATCH)]
    now = time.time()
    ca = spec["ca_pem"].encode()
    stop = time.monotonic() + spec["seconds"]
    results: list[dict] = [{} for _ in spec["identities"]]

    def batch(first: int) -> agent_pb2.TelemetryBatch:
        records = [
            agent_pb2.TelemetryRecord(seq=first + i, kind="metrics", timestamp=now, payload_json=texts[i])
            for i in range(BATCH)
        ]
        return agent_pb2.TelemetryBatch(records=records)

    def work(index: int, key: str, cert: str) -> None:
        client = GatewayClient(
            spec["address"], ca_pem=ca, key_pem=key.encode(), certificate_pem=cert.encode()
        )
        stored, duplicates, latencies, first = 0, 0, [], spec["first_seq"]
        while time.monotonic() < stop:
            started = time.perf_counter()
            ack = client._stub.ReportTelemetry(batch(first), timeout=60)
            latencies.append(time.perf_counter() - started)
            stored += len(ack.stored_seqs)
            duplicates += len(ack.duplicate_seqs)
            first += BATCH
        replay = client._stub.ReportTelemetry(batch(first - BATCH), timeout=60)  # exactly once
        client.close()
        results[index] = {
            "stored": stored,
            "duplicates": duplicates,
            "replayed_stored": len(replay.stored_seqs),
            "replayed_duplicates": len(replay.duplicate_seqs),
            "latencies": latencies,
        }

    threads = [threading.Thread(target=work, args=(i, k, c)) for i, (k, c) in enumerate(spec["identities"])]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    latencies = [x for r in results for x in r["latencies"]]
    return {
        "stored": sum(r["stored"] for r in results),
        "duplicates": sum(r["duplicates"] for r in results),
        "replayed_stored": sum(r["replayed_stored"] for r in results),
        "replayed_duplicates": sum(r["replayed_duplicates"] for r in results),
        "wall": wall,
        "batches": len(latencies),
        **_percentiles(latencies),
    }


# --- the peer: a trivial grpc.aio server holding streams ---------------------------------------


async def _trivial_streams(spec: dict) -> None:
    from concurrent import futures

    import grpc

    from deploy.proto import agent_pb2, agent_pb2_grpc

    slow = spec.get("slow_ms", 0) / 1e3
    wave = {"event": asyncio.Event(), "at": 0.0}  # set (and replaced) by a "wave" line on stdin
    written: list[list[float]] = []  # per wave: seconds from its start to each hint handed to grpc

    class Waiting(agent_pb2_grpc.AgentGatewayServicer):
        def CheckIn(self, request, context):  # noqa: N802 (gRPC's name)
            return agent_pb2.CheckInResponse(checkin_interval_seconds=30)

        async def WatchHints(self, request, context):  # noqa: N802 (gRPC's name)
            # as the gateway's: an async generator waiting on a future, a Hint per wake-up
            if slow:  # a loop this busy per call (fleet_storm.py --peer-slow-ms): a slow storm
                time.sleep(slow)
            while True:
                await wave["event"].wait()
                written[-1].append(time.monotonic() - wave["at"])  # as the gateway's histogram
                yield agent_pb2.Hint(reason="release changed")

    server = grpc.aio.server(
        migration_thread_pool=futures.ThreadPoolExecutor(max_workers=spec["workers"]),
        options=[tuple(option) for option in spec.get("options", ())],  # bench/fleet_storm.py varies them
    )
    agent_pb2_grpc.add_AgentGatewayServicer_to_server(Waiting(), server)
    credentials = mtls_server_credentials(spec)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    print(f"trivial streams listening on 127.0.0.1:{port}", flush=True)
    # until stdin closes; each "wave" line wakes every open stream once (the peer's release wave)
    while line := await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline):
        if line.strip() == "wave":
            woken, wave["event"], wave["at"] = wave["event"], asyncio.Event(), time.monotonic()
            written.append([])
            woken.set()
        elif line.strip() == "report":  # each wave's hints as written, server side
            print(json.dumps([_percentiles(w) for w in written]), flush=True)
    await server.stop(None)


def main() -> int:
    if sys.argv[1:] == ["--trivial-streams"]:
        _pin(0)
        asyncio.run(_trivial_streams(json.loads(sys.stdin.readline())))
        return 0
    _pin(1)
    if sys.argv[1:] == ["--storm"]:
        spec = json.loads(sys.stdin.readline())
        asyncio.run(_storm(spec))
        return 0
    if sys.argv[1:] == ["--telemetry"]:
        print(json.dumps(_telemetry(json.loads(sys.stdin.read()))))
        return 0
    sys.exit(f"usage: {os.path.basename(__file__)} --storm|--telemetry (a spec on stdin)")


if __name__ == "__main__":
    sys.exit(main())
