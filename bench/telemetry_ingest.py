"""Telemetry ingest: Ferry's records/s beside PostgreSQL's own ceilings, in one run (~1-2 min).

    FERRY_DATABASE_URL=postgres://postgres@127.0.0.1:5432/ferry .venv/bin/python bench/telemetry_ingest.py

Uses a scratch database of its own (<name>_bench_telemetry, created, migrated and dropped),
so it never touches the one the URL names. Each row of the table stores the same number of
fresh records (agent-shaped metrics, 500 per batch, the agent's upload size) from several
devices, one batch per call, and prints wall-clock records/s and this process's CPU per
record (PostgreSQL runs in its own processes; on a 2-core machine it takes the other core):

- ``before``: the previous service (existence query + bulk_create(ignore_conflicts)), for
  the before/after comparison in the same run;
- ``service``: telemetry.services.telemetry_ingest (COPY into staging + INSERT ... ON
  CONFLICT DO NOTHING RETURNING), records already validated;
- ``validate+service``: the gateway's work without gRPC: schema.validate_record of each
  record's JSON, then the service;
- ``gateway process``: the real gRPC gateway (manage.py gateway, its own process) called
  with the agent's GatewayClient, batch by batch; its CPU column is the gateway process's;
- ``pg COPY`` and ``pg INSERT..ON CONFLICT``: psycopg straight into a table of the same
  shape (COPY with no dedupe; INSERT ... SELECT FROM unnest(arrays) ON CONFLICT DO NOTHING
  with server-side binding), the stack's own ceiling.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]

from bench.scratch_database import scratch_database  # noqa: E402  (after the path setup)

BATCH = 500


def _payload(i: int) -> dict:
    """A metrics record as the agent sends it (agent/daemon.py record_metrics)."""
    return {
        "inferences": 600 + i % 7,
        "errors": 0,
        "latency_ms_p50": 1.25,
        "latency_ms_p95": 2.5,
        "latency_ms_histogram": {"le_1": 200, "le_2": 380, "le_5": 20},
        "top1_histogram": {"3": 310, "7": 290},
        "cpu_percent": 23.5,
        "cpu_seconds_total": 1234.5,
        "rss_bytes": 48_000_000,
        "disk_free_bytes": 9_000_000_000,
        "version": "7",
        "restarts": 0,
        "restarts_total": 1,
        "activations_ok": 0,
        "activations_failed": 0,
        "update_state": "idle",
        "outbox_pending": 3,
        "outbox_dropped_total": 0,
    }


def _measure(name: str, total: int, run: Callable[[int], None]) -> dict:
    """run(batch_index) for total // BATCH batches; wall and process CPU around all of them."""
    batches = total // BATCH
    run(-1)  # warm-up: connections, caches, prepared plans
    wall, cpu = time.perf_counter(), time.process_time()
    for index in range(batches):
        run(index)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    records = batches * BATCH
    return {"name": name, "records": records, "per_s": records / wall, "cpu_us": 1e6 * cpu / records}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=40_000, help="records per row of the table")
    parser.add_argument("--devices", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1, help="gateway rows: measured this many times each")
    parser.add_argument("--before-tree", default="", help="also measure the gateway of this checkout")
    parser.add_argument("--gateway-only", action="store_true", help="only the gateway rows")
    args = parser.parse_args()
    url = os.environ.get("FERRY_DATABASE_URL", "")
    if not url:
        sys.exit("set FERRY_DATABASE_URL to a PostgreSQL database (a scratch copy is used)")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ferry_cloud.settings")
    with scratch_database(url, "telemetry") as scratch:
        os.environ["FERRY_DATABASE_URL"] = scratch
        rows = _run(args)
    _print(rows, args)


def _run(args) -> list[dict]:
    import django

    django.setup()
    import logging

    logging.disable(logging.INFO)  # the gateway's per-call log lines are not what we measure
    from accounts.services import organisation_ensure
    from django.core.management import call_command
    from django.db import connection
    from fleet.services import device_enrol, enrolment_token_create
    from telemetry.models import TelemetryRecord
    from telemetry.schema import validate_record
    from telemetry.services import telemetry_ingest

    call_command("migrate", verbosity=0)
    org = organisation_ensure(name="Bench")
    devices = [
        device_enrol(
            token=enrolment_token_create(organisation=org).token, name=f"d{i}", attributes={}, labels={}
        ).device
        for i in range(args.devices)
    ]
    now = time.time()
    texts = [json.dumps(_payload(i)) for i in range(BATCH)]
    payloads = [_payload(i) for i in range(BATCH)]
    seq_base = {"n": 0}

    def next_batch(index: int):
        """(device, first seq) for a batch no row has stored yet: each row uses its own seq range."""
        device = devices[(index + 1) % len(devices)]
        first = seq_base["n"] + (index + 1) * BATCH + 1
        return device, first

    from telemetry.services import IncomingRecord

    def before(index: int) -> None:
        device, first = next_batch(index)
        records = [IncomingRecord(first + i, "metrics", now, "7", payloads[i]) for i in range(BATCH)]
        _old_ingest(TelemetryRecord, device, records)

    def service(index: int) -> None:
        device, first = next_batch(index)
        records = [IncomingRecord(first + i, "metrics", now, "7", payloads[i]) for i in range(BATCH)]
        telemetry_ingest(device=device, records=records)

    def validated(index: int) -> None:
        device, first = next_batch(index)
        records = [
            validate_record(
                seq=first + i, kind="metrics", timestamp=now, version_id="7", payload_json=texts[i]
            )
            for i in range(BATCH)
        ]
        telemetry_ingest(device=device, records=records)

    rows = []
    for name, run in (
        ("before (bulk_create)", before),
        ("service", service),
        ("validate+service", validated),
    ):
        if args.gateway_only:
            break
        seq_base["n"] += 10_000_000
        rows.append(_measure(name, args.records, run))
    rows += _gateway_rows(args, org, now, texts, seq_base)
    stored_rows = len(rows)
    connection.close()
    if not args.gateway_only:
        rows += _postgres_rows(args, devices, now, texts)
    stored = TelemetryRecord.objects.count()
    expected = sum(r["records"] + BATCH * r.get("runs", 1) for r in rows[:stored_rows])
    if stored != expected:
        print(f"warning: {stored} rows stored, expected {expected}", file=sys.stderr)
    return rows


def _old_ingest(model, device, records) -> None:
    """The service before this change, kept here for the before/after comparison."""
    from django.db import transaction

    with transaction.atomic():
        seqs = {r.seq for r in records}
        existing = set(model.objects.filter(device=device, seq__in=seqs).values_list("seq", flat=True))
        model.objects.bulk_create(
            [
                model(
                    device=device,
                    seq=r.seq,
                    kind=r.kind,
                    timestamp=datetime.fromtimestamp(r.timestamp, tz=UTC),
                    version_id=r.version_id,
                    payload=r.payload,
                )
                for r in records
                if r.seq not in existing
            ],
            ignore_conflicts=True,
        )


def _process_cpu_seconds(pid: int) -> float:
    """utime + stime of another process (Linux /proc), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _gateway_rows(args, org, now: float, texts: list[str], seq_base: dict) -> list[dict]:
    """This checkout's gateway, and --before-tree's when given, --rounds times each, alternating
    (a neighbour's load hits both alike); per gateway the median round, runs counted."""
    trees = [("gateway process (gRPC)", ROOT)]
    if args.before_tree:
        tree = Path(args.before_tree).resolve()
        trees.append((f"gateway at {tree.name} (before)", tree))
    runs: dict[str, list[dict]] = {}
    for _ in range(args.rounds):
        for name, tree in trees:
            seq_base["n"] += 10_000_000
            runs.setdefault(name, []).append(_gateway_row(args, org, now, texts, seq_base["n"], tree, name))
    rows = []
    for measured in runs.values():
        median = sorted(measured, key=lambda r: r["cpu_us"])[len(measured) // 2]
        records = sum(r["records"] for r in measured)
        rows.append(dict(median, records=records, runs=len(measured)))
    return rows


def _gateway_row(
    args, org, now: float, texts: list[str], seq_base: int, tree: Path = ROOT, name: str = ""
) -> dict:
    """The real gateway (manage.py gateway of ``tree``) in its own process; CPU is that process's."""
    import subprocess

    from django.conf import settings
    from ferry_cloud.device_ca import device_ca
    from fleet.models import Device

    from agent.client import GatewayClient
    from deploy.proto import agent_pb2
    from deploy.trust import certificates

    gateway = subprocess.Popen(
        [
            sys.executable,
            str(tree / "manage.py"),
            "gateway",
            "--address",
            "127.0.0.1:0",
            "--metrics-port",
            "0",
        ],
        cwd=tree,
        env={
            **os.environ,
            "FERRY_LOG_LEVEL": "WARNING",
            "PYTHONPATH": f"{tree}{os.pathsep}{tree / 'platform'}",
            "FERRY_DATA_DIR": str(settings.DATA_DIR),  # this checkout's device CA, for every tree
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = gateway.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"the gateway did not start: {line!r}")
        # a device with a certificate from the deployment's CA, as enrolment would give it
        device = Device.objects.create(organisation=org, name="g", attributes={"hardware": "bench"})
        key = certificates.create_private_key()
        issued = certificates.sign_client_certificate(
            device_ca(), certificates.create_csr(key), device_id=str(device.pk)
        )
        client = GatewayClient(
            line.split("listening on ", 1)[1].split()[0],  # "gateway listening on H:P (mutual TLS)"
            ca_pem=Path(settings.FERRY_DEVICE_CA_CERT_FILE).read_bytes(),
            key_pem=key,
            certificate_pem=issued.certificate_pem,
        )

        def call(index: int) -> None:
            first = seq_base + (index + 1) * BATCH + 1
            batch = agent_pb2.TelemetryBatch(
                records=[
                    agent_pb2.TelemetryRecord(
                        seq=first + i, kind="metrics", timestamp=now, version_id="7", payload_json=texts[i]
                    )
                    for i in range(BATCH)
                ]
            )
            ack = client._stub.ReportTelemetry(batch, timeout=60)  # identity: the certificate
            assert len(ack.stored_seqs) == BATCH, (len(ack.stored_seqs), ack.rejected[:1])

        call(-1)  # warm-up outside the measurement
        batches = args.records // BATCH
        wall, cpu = time.perf_counter(), _process_cpu_seconds(gateway.pid)
        for index in range(batches):
            call(index)
        wall, cpu = time.perf_counter() - wall, _process_cpu_seconds(gateway.pid) - cpu
        records = batches * BATCH
        return {
            "name": name or "gateway process (gRPC)",
            "records": records,
            "per_s": records / wall,
            "cpu_us": 1e6 * cpu / records,
        }
    finally:
        gateway.terminate()
        gateway.wait(timeout=30)


def _postgres_rows(args, devices, now: float, texts: list[str]) -> list[dict]:
    import psycopg

    table = "bench_telemetry_ceiling"
    ts = datetime.fromtimestamp(now, tz=UTC)
    with psycopg.connect(os.environ["FERRY_DATABASE_URL"]) as conn:
        conn.execute(f"CREATE TABLE {table} (LIKE telemetry_telemetryrecord INCLUDING ALL)")
        conn.commit()
        columns = "device_id, seq, kind, timestamp, version_id, payload, received_at"

        def copy(index: int) -> None:
            device = devices[(index + 1) % len(devices)].pk
            first = 1 + (index + 1) * BATCH
            with conn.cursor() as cur, cur.copy(f"COPY {table} ({columns}) FROM STDIN") as out:
                for i in range(BATCH):
                    out.write_row((device, first + i, "metrics", ts, "7", texts[i], ts))
            conn.commit()

        def upsert(index: int) -> None:
            device = devices[(index + 1) % len(devices)].pk
            first = 10_000_000 + (index + 1) * BATCH
            seqs = list(range(first, first + BATCH))
            conn.execute(
                f"INSERT INTO {table} ({columns}) "
                "SELECT %s, s, 'metrics', %s, '7', p::jsonb, %s "
                "FROM unnest(%s::bigint[], %s::text[]) AS u(s, p) "
                "ON CONFLICT (device_id, seq) DO NOTHING",
                (device, ts, ts, seqs, texts),
            )
            conn.commit()

        rows = [_measure("pg COPY (no dedupe)", args.records, copy)]
        rows.append(_measure("pg INSERT..ON CONFLICT (unnest)", args.records, upsert))
        conn.execute(f"DROP TABLE {table}")
        conn.commit()
    return rows


def _print(rows: list[dict], args) -> None:
    print(f"\ntelemetry ingest, {BATCH} records per batch, {args.devices} devices, PostgreSQL")
    print(f"{'path':36} {'records':>8} {'records/s':>10} {'CPU µs/record':>14} {'records/s/core':>15}")
    for r in rows:
        per_core = 1e6 / r["cpu_us"] if r["cpu_us"] else float("inf")
        print(
            f"{r['name']:36} {r['records']:>8} {r['per_s']:>10,.0f} {r['cpu_us']:>14.1f} {per_core:>15,.0f}"
        )
    print(
        f"\n{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}. records/s: wall clock. CPU: this"
        " process only (PostgreSQL's backends are not in it); records/s/core = 1e6 / CPU µs, what one"
        " core of the Ferry process would ingest if PostgreSQL kept up (for the gateway row: the"
        " gateway process's CPU)."
    )


if __name__ == "__main__":
    main()
