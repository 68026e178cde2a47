"""From the measured per-core figures to a fleet of 1M and 10M devices, on paper.

    .venv/bin/python bench/fleet_extrapolate.py [--measured fleet.json] [--devices 1000000 10000000]

--measured names files bench/fleet_load.py --json writes (a later file's figures win);
without them the figures below (the README's Scaling table, measured on a busy 2-core host)
are used.  For each fleet size it prints the gateway processes needed (CPU for check-ins and
telemetry, memory for one hint stream per device), PostgreSQL's write rate beside its COPY
rate, Redis' memory for the hint path, the S3 egress of one release, and which resource runs
out first.

Every device checks in every --checkin-interval seconds, uploads one telemetry record every
--telemetry-interval seconds (the agent records metrics every 5 s and uploads in batches; the
default here is a fleet setting of one record a minute), and holds one WatchHints stream.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

# bench/fleet_load.py on a busy 2-core host (see the README's Scaling section)
DEFAULTS = {
    "checkin_cpu_us": 1000.0,  # gateway CPU per no-change check-in (aio gateway, fast path)
    "telemetry_cpu_us": 54.0,  # gateway CPU per telemetry record (500-record batches)
    "stream_kb": 94.0,  # gateway RSS per open WatchHints stream (mutual TLS connection)
    "idle_rss_mb": 151.0,  # a gateway process before any stream
    # PostgreSQL COPY into the telemetry table's shape, one session, on a quiet host (the fleet
    # issue's figure; the busy host of the README's table measured 5,756)
    "copy_rows_per_s": 43_000.0,
}
CORE_BUDGET = 0.6  # plan gateway cores at 60 % busy: room for storms and release waves
PROCESS_MEMORY_MB = 1024.0  # a gateway process's memory budget
LAST_SEEN_RESOLUTION_SECONDS = 60.0  # fleet.services writes last_seen_at at most this often
REDIS_SUBSCRIBER_KB = 64.0  # one pub/sub connection per gateway process (buffers included)
HINT_BYTES = 40  # one published organisation id on the fleet-changed channel


@dataclass(frozen=True)
class Fleet:
    devices: int
    checkin_interval: float
    telemetry_interval: float
    package_mb: float


def _measured(paths: list[str]) -> dict:
    """Per-core figures from bench/fleet_load.py --json files (a later one's figures win), else
    the defaults."""
    figures = dict(DEFAULTS)
    for path in paths:
        _read(figures, json.loads(Path(path).read_text()))
    return figures


def _read(figures: dict, run: dict) -> None:
    if "check_ins" in run:
        figures["checkin_cpu_us"] = run["check_ins"][-1]["cpu_us"]
        figures["telemetry_cpu_us"] = run["telemetry"]["cpu_us"]
        figures["copy_rows_per_s"] = run["ceiling"][0]["per_s"]
    storm = run["storm"]
    held = max(storm["held"], 1)
    figures["idle_rss_mb"] = sum(storm["rss_idle_mb"]) / len(storm["rss_idle_mb"])
    figures["stream_kb"] = 1024 * (sum(storm["rss_mb"]) - sum(storm["rss_idle_mb"])) / held


def plan(fleet: Fleet, m: dict) -> dict:
    check_ins = fleet.devices / fleet.checkin_interval
    records = fleet.devices / fleet.telemetry_interval
    cpu_cores = (check_ins * m["checkin_cpu_us"] + records * m["telemetry_cpu_us"]) / 1e6
    by_cpu = math.ceil(cpu_cores / CORE_BUDGET)
    streams_per_process = int((PROCESS_MEMORY_MB - m["idle_rss_mb"]) * 1024 / m["stream_kb"])
    by_memory = math.ceil(fleet.devices / streams_per_process)
    last_seen = fleet.devices / LAST_SEEN_RESOLUTION_SECONDS
    pg_writes = records + last_seen
    processes = max(by_cpu, by_memory)
    egress_tb = fleet.devices * fleet.package_mb / 1e6
    return {
        "check_ins_per_s": check_ins,
        "records_per_s": records,
        "gateway_cores": cpu_cores,
        "processes_by_cpu": by_cpu,
        "processes_by_memory": by_memory,
        "processes": processes,
        "streams_per_process": streams_per_process,
        "pg_rows_per_s": pg_writes,
        "pg_copy_sessions": pg_writes / m["copy_rows_per_s"],
        "last_seen_per_s": last_seen,
        "redis_mb": processes * REDIS_SUBSCRIBER_KB / 1024,
        "hint_fanout_bytes": processes * HINT_BYTES,
        "egress_tb": egress_tb,
        "egress_hours_10gbps": egress_tb * 8e12 / 10e9 / 3600,
        "bottleneck": _bottleneck(fleet, m, pg_writes, by_cpu, by_memory),
    }


def _bottleneck(fleet: Fleet, m: dict, pg_writes: float, by_cpu: int, by_memory: int) -> str:
    """The resource that does not scale out by adding gateway processes, once it is the limit."""
    if pg_writes > m["copy_rows_per_s"]:
        return (
            f"PostgreSQL writes: {pg_writes:,.0f} rows/s is {pg_writes / m['copy_rows_per_s']:.1f}x what one"
            " session COPYs; one primary takes the telemetry only partitioned (by time, then by"
            " organisation) or moved to a column store, and last_seen_at must be batched in Redis"
        )
    if by_memory > by_cpu:
        return (
            f"gateway memory: {by_memory} processes to hold one mutual-TLS stream per device"
            f" ({m['stream_kb']:.0f} KB each) against {by_cpu} for the CPU"
        )
    return f"gateway CPU: {by_cpu} processes; check-ins dominate ({m['checkin_cpu_us']:.0f} us each)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", nargs="*", default=[], help="bench/fleet_load.py --json files")
    parser.add_argument("--devices", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--checkin-interval", type=float, default=30.0)
    parser.add_argument("--telemetry-interval", type=float, default=60.0, help="s per record per device")
    parser.add_argument("--package-mb", type=float, default=20.0)
    args = parser.parse_args()
    m = _measured(args.measured)
    print(
        f"per core, measured: check-in {m['checkin_cpu_us']:.0f} us, telemetry record"
        f" {m['telemetry_cpu_us']:.1f} us, hint stream {m['stream_kb']:.0f} KB, idle process"
        f" {m['idle_rss_mb']:.0f} MB, PostgreSQL COPY {m['copy_rows_per_s']:,.0f} rows/s"
    )
    for devices in args.devices:
        fleet = Fleet(devices, args.checkin_interval, args.telemetry_interval, args.package_mb)
        _print(fleet, plan(fleet, m))


def _print(fleet: Fleet, p: dict) -> None:
    print(f"\n{fleet.devices:,} devices (check-in every {fleet.checkin_interval:.0f} s):")
    print(
        f"  gateway: {p['check_ins_per_s']:,.0f} check-ins/s + {p['records_per_s']:,.0f} records/s ="
        f" {p['gateway_cores']:,.1f} cores -> {p['processes']} processes"
        f" ({p['processes_by_cpu']} for CPU at {CORE_BUDGET:.0%}, {p['processes_by_memory']} for streams at"
        f" {p['streams_per_process']:,} per {PROCESS_MEMORY_MB:.0f} MB process)"
    )
    print(
        f"  PostgreSQL: {p['pg_rows_per_s']:,.0f} rows/s written ({p['records_per_s']:,.0f} telemetry +"
        f" {p['last_seen_per_s']:,.0f} last_seen_at), {p['pg_copy_sessions']:.1f}x one session's COPY rate"
    )
    print(
        f"  Redis: {p['redis_mb']:.1f} MB for {p['processes']} hint subscriptions; a release hint is one"
        f" publish, {p['hint_fanout_bytes']:,} bytes out (streams live in the gateways, not in Redis)"
    )
    print(
        f"  S3: {p['egress_tb']:,.1f} TB egress per release of {fleet.package_mb:.0f} MB"
        f" ({p['egress_hours_10gbps']:,.1f} h at 10 Gbit/s; a CDN or phased rollout spreads it)"
    )
    print(f"  next bottleneck: {p['bottleneck']}")


if __name__ == "__main__":
    main()
