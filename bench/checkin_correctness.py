"""Correctness under load (``bench/checkin_correctness.py``, ~1.5 min): while the real
gateway serves no-change check-ins as fast as a load generator sends them, a release and then
its rollback must reach every simulated device they target (and no other), and every
telemetry record the gateway acknowledged must be stored exactly once.

A scratch database (<name>_bench_correct) holds --devices bulk-created devices; --identities of
them, outside the release's target, are the load generator's (bench/checkin_load.py's --load: closed
loop, counting every answer that carries an assignment, which must be none).  --cohort devices
labelled ``cohort=bench`` are simulated here, one thread each, as an agent would act:

- check in every --interval seconds (jittered) reporting the version they run and the counter
  of the assignment they hold (held_assignment_counter);
- verify an offered assignment (signature, device, organisation, counter above the last) and
  "install" it at once: from the next check-in they report its version;
- report a batch of telemetry records after every check-in, and every third time the previous
  batch again (a lost acknowledgement), keeping each sequence number the gateway acknowledged
  (stored or duplicate).

The run: every simulated device reports v1; release v2 to the cohort; wait until all run v2;
roll the release back; wait until all run v1 again; keep the load on until --seconds; then
compare the telemetry table with the acknowledgements.  Prints one ``correctness: PASS`` or
``correctness: FAIL`` line (exit status 0 or 1) and what it saw.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]
COHORT = {"cohort": "bench"}
REACH_TIMEOUT_SECONDS = 30.0


@dataclass
class SimDevice:
    """One simulated agent: what it runs and holds, and the telemetry the gateway acknowledged."""

    device_id: str
    organisation_id: str
    key_pem: str
    certificate_pem: str
    running: str
    counter: int = 0
    sha256: str = ""
    seq: int = 0
    acked: set[int] = field(default_factory=set)
    sent: set[int] = field(default_factory=set)
    versions: list[str] = field(default_factory=list)  # every version it switched to, in order
    errors: list[str] = field(default_factory=list)


def _versions(org):
    """Two converted versions of one model (same signature, other weights)."""
    import onnx
    from registry.services import conversion_run, model_create, version_upload

    from converter.samples import build_image_classifier

    model = model_create(organisation=org, name="bench-classifier")
    versions = []
    for label, seed in (("v1", 1), ("v2", 2)):
        data = onnx.ModelProto.SerializeToString(build_image_classifier(seed=seed))
        version = version_upload(model=model, label=label, stream=io.BytesIO(data), size=len(data))
        conversion_run(job_id=version.job.pk)
        version.refresh_from_db()
        if version.status != version.Status.READY:
            raise RuntimeError(f"{label} did not convert: {version.job.error}")
        versions.append(version)
    return versions


def _cohort(org, count: int, running: str) -> list[SimDevice]:
    from ferry_cloud.device_ca import device_ca
    from fleet.models import Device

    from bench.checkin_load import ATTRIBUTES
    from deploy.trust import certificates

    ca = device_ca()
    sims = []
    for i in range(count):
        device = Device.objects.create(
            organisation=org, name=f"sim{i:04d}", attributes=ATTRIBUTES, labels=COHORT
        )
        key = certificates.create_private_key()
        issued = certificates.sign_client_certificate(
            ca, certificates.create_csr(key), device_id=str(device.pk)
        )
        sims.append(
            SimDevice(str(device.pk), str(org.pk), key.decode(), issued.certificate_pem.decode(), running)
        )
    return sims


def _simulate(sim: SimDevice, address: str, ca_pem: str, interval: float, stop: threading.Event) -> None:
    from ferry_cloud.release_key import trusted_public_keys

    from agent.client import GatewayClient
    from agent.outbox import OutboxRecord
    from bench.checkin_load import ATTRIBUTES
    from deploy.proto import agent_pb2
    from deploy.trust.assignment import blob_sha256, verify_assignment

    keys = trusted_public_keys()
    client = GatewayClient(
        address,
        ca_pem=ca_pem.encode(),
        key_pem=sim.key_pem.encode(),
        certificate_pem=sim.certificate_pem.encode(),
    )
    attributes = agent_pb2.DeviceAttributes(**ATTRIBUTES)
    rng = random.Random(sim.device_id)
    previous: list[OutboxRecord] = []
    batches = 0
    try:
        while not stop.wait(interval * rng.uniform(0.5, 1.5)):
            try:
                reply = client.check_in(attributes, sim.running, "", held_assignment_counter=sim.counter)
                if reply.HasField("desired"):
                    offer = reply.desired
                    assignment = verify_assignment(
                        offer.assignment,
                        offer.assignment_signature,
                        keys,
                        device_id=sim.device_id,
                        organisation_id=sim.organisation_id,
                        last_counter=sim.counter,
                        last_sha256=sim.sha256,
                        now=time.time(),
                    )
                    sim.counter, sim.sha256 = assignment.counter, blob_sha256(offer.assignment)
                    if assignment.version_id != sim.running:
                        sim.running = assignment.version_id  # installed at once: reported from now on
                        sim.versions.append(assignment.version_id)
                batch = [
                    OutboxRecord(sim.seq + n, "metrics", time.time(), "", {"inferences": sim.seq + n})
                    for n in range(1, 6)
                ]
                sim.seq += len(batch)
                batches += 1
                records = previous + batch if batches % 3 == 0 else batch  # a replayed batch now and then
                sim.sent.update(r.seq for r in records)
                ack = client.report(records)
                sim.acked.update(ack.stored_seqs)
                sim.acked.update(ack.duplicate_seqs)
                previous = batch
            except Exception as exc:  # recorded: an error is a finding of this run
                sim.errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
    finally:
        client.close()


def _wait_until(sims: list[SimDevice], version: str, timeout: float) -> float | None:
    """Seconds until every simulated device runs version; None if some never did."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if all(s.running == version for s in sims):
            return time.monotonic() - started
        time.sleep(0.1)
    return None


def _telemetry_findings(sims: list[SimDevice]) -> list[str]:
    from django.db.models import Count
    from telemetry.models import TelemetryRecord

    findings = []
    for sim in sims:
        rows = TelemetryRecord.objects.filter(device_id=sim.device_id)
        stored = set(rows.values_list("seq", flat=True))
        twice = rows.values("seq").annotate(n=Count("id")).filter(n__gt=1).count()
        if twice:
            findings.append(f"device {sim.device_id}: {twice} sequence numbers stored more than once")
        if sim.acked - stored:
            findings.append(f"device {sim.device_id}: {len(sim.acked - stored)} acknowledged records missing")
        if stored - sim.sent:
            findings.append(f"device {sim.device_id}: {len(stored - sim.sent)} stored records never sent")
    return findings


def run(args, data_dir: str) -> bool:
    """The whole run in this (migrated, django.setup) process; prints the result line."""
    from accounts.services import organisation_ensure
    from django.conf import settings
    from django.db import connections
    from releases.services import release_create, release_transition

    from bench import checkin_load

    began = time.monotonic()
    identities = checkin_load._fleet(args.devices, args.identities)  # the load's (no label)
    fleet_seconds = time.monotonic() - began
    org = organisation_ensure(name="Bench")
    v1, v2 = _versions(org)
    sims = _cohort(org, args.cohort, str(v1.pk))
    print(
        f"set up in {time.monotonic() - began:.0f} s (migrated database and fleet {fleet_seconds:.0f} s)",
        file=sys.stderr,
    )
    connections.close_all()
    ca_pem = Path(settings.FERRY_DEVICE_CA_CERT_FILE).read_text()
    env = {**os.environ, "FERRY_LOG_LEVEL": "WARNING", "FERRY_DATA_DIR": data_dir}
    gateway, address = checkin_load._start(checkin_load._gateway_command(), env, "listening on ")
    stop = threading.Event()
    load_result: dict = {}
    spec = {"ca_pem": ca_pem, "identities": identities, "threads": args.threads, "seconds": args.seconds}
    loader = threading.Thread(
        target=lambda: load_result.update(checkin_load._run_load(dict(spec, address=address))), name="load"
    )
    threads = [
        threading.Thread(target=_simulate, args=(s, address, ca_pem, args.interval, stop), name=f"sim-{i}")
        for i, s in enumerate(sims)
    ]
    started = time.monotonic()
    findings: list[str] = []
    reached = back = None
    try:
        loader.start()
        for t in threads:
            t.start()
        time.sleep(3 * args.interval)  # every simulated device has reported v1
        release = release_create(
            organisation=org, version=v2, name="bench", target={"labels": COHORT}, start=True
        )
        reached = _wait_until(sims, str(v2.pk), REACH_TIMEOUT_SECONDS)
        if reached is None:
            findings.append(
                f"the release reached {sum(s.running == str(v2.pk) for s in sims)} of {len(sims)}"
            )
        release_transition(release_id=release.pk, action="rollback", reason="bench")
        back = _wait_until(sims, str(v1.pk), REACH_TIMEOUT_SECONDS)
        if back is None:
            findings.append(
                f"the rollback reached {sum(s.running == str(v1.pk) for s in sims)} of {len(sims)}"
            )
        loader.join()  # the load runs its --seconds
        stop.set()
        for t in threads:
            t.join()
    finally:
        stop.set()
        gateway.stdin.close()
        gateway.terminate()
        gateway.wait(timeout=30)
    elapsed = time.monotonic() - started
    findings += _telemetry_findings(sims)
    findings += [f"device {s.device_id}: {s.errors[0]} ({len(s.errors)} errors)" for s in sims if s.errors]
    if not load_result:
        findings.append("the load generator failed")
    if load_result.get("offers"):
        findings.append(
            f"{load_result['offers']} answers to devices outside the target carried an assignment"
        )
    if load_result.get("errors"):
        findings.append(f"{load_result['errors']} load check-ins failed")
    wrong = [s for s in sims if s.versions != [str(v2.pk), str(v1.pk)]]
    if wrong:
        findings.append(f"{len(wrong)} devices switched in another order, e.g. {wrong[0].versions}")
    acked = sum(len(s.acked) for s in sims)
    per_s = load_result.get("count", 0) / max(load_result.get("wall", 1.0), 1e-9)
    p99 = load_result.get("p99_ms", 0.0)
    print(
        f"\n{len(sims)} simulated devices + {args.identities} load identities of {args.devices} devices, "
        f"{elapsed:.0f} s: load {per_s:.0f} no-change check-ins/s (p99 {p99:.1f} ms); "
        f"release reached all in {_seconds(reached)}, rollback in {_seconds(back)}; "
        f"{acked} telemetry records acknowledged"
    )
    for finding in findings[:20]:
        print(f"  - {finding}")
    print(f"correctness: {'FAIL' if findings else 'PASS'}")
    return not findings


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--identities", type=int, default=200, help="certificates the load cycles over")
    parser.add_argument("--threads", type=int, default=8, help="closed-loop callers in the load generator")
    parser.add_argument("--seconds", type=float, default=60.0, help="the whole run, load included")
    parser.add_argument("--cohort", type=int, default=50, help="simulated devices targeted")
    parser.add_argument("--interval", type=float, default=1.0, help="their check-in interval")
    return parser.parse_args()


def main() -> int:
    from bench.scratch_database import scratch_database

    args = _arguments()

    url = os.environ.get("FERRY_DATABASE_URL", "")
    if not url or not os.environ.get("REDIS_URL"):
        sys.exit("set FERRY_DATABASE_URL (PostgreSQL; a scratch copy is used) and REDIS_URL")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ferry_cloud.settings")
    os.environ["FERRY_S3_BUCKET"] = ""  # packages as local files in the scratch data directory
    import tempfile

    with (
        scratch_database(url, "correct") as scratch,
        tempfile.TemporaryDirectory(prefix="ferry-bench-correct-") as data_dir,
    ):
        os.environ["FERRY_DATABASE_URL"] = scratch
        os.environ["FERRY_DATA_DIR"] = data_dir
        import django

        django.setup()
        ok = run(args, data_dir)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
