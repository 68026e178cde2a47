"""What an idle ferry-agent costs a device: resident memory and CPU, measured from /proc.

Runs, one after the other, against a local gRPC control plane (bench/gateway.py) that
answers with a 30 s check-in interval (the production default):

  baseline  python -c "import grpc; sleep"     the floor any Python gRPC agent pays
  numpy     python importing grpc, numpy and the engine up front (what the idle agent defers)
  ferry     `ferry-agent run`, enrolled, no model yet (the issue's target: RSS <= 60 MB, CPU <= 1 %)
  ferry+model  the same agent after it installed a small classifier, 20 inferences/s

No peer agent (Mender, Telegraf) is installed on this machine, so the baselines stand in for
"a Python process doing nothing" and "the naive, eagerly importing agent".

    .venv/bin/python bench/agent_footprint.py [--seconds 30]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT), str(BENCH)]

from gateway import ORGANISATION_ID, BenchGateway, bundle, serve  # noqa: E402  (bench/ is not a package)

from converter import convert  # noqa: E402
from converter.samples import build_image_classifier  # noqa: E402
from deploy.package import SignedClaims, generate_keypair, sign_package  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(process: subprocess.Popen, seconds: float, warmup: float) -> tuple[float, float, float]:
    """(RSS MB at the end, peak RSS MB during the window, CPU % of one core over the window)."""
    time.sleep(warmup)
    if process.poll() is not None:
        raise RuntimeError(f"{process.args[:4]} exited with {process.returncode}")
    start_cpu, start = cpu_seconds(process.pid), time.monotonic()
    peak = 0.0
    while time.monotonic() - start < seconds:
        peak = max(peak, rss_mb(process.pid))
        time.sleep(0.5)
    cpu = 100 * (cpu_seconds(process.pid) - start_cpu) / (time.monotonic() - start)
    return rss_mb(process.pid), peak, cpu


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def python(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="measurement window per row")
    parser.add_argument("--warmup", type=float, default=5.0)
    args = parser.parse_args()

    keys = generate_keypair()
    gateway = BenchGateway(keys, interval=30)
    server, port = serve(gateway)
    rows: list[tuple[str, float, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="ferry-footprint-") as tmp:
        tmp = Path(tmp)
        for name, code in [
            ("baseline: python + grpc, sleeping", "import grpc, time; time.sleep(3600)"),
            (
                "python + grpc + numpy + engine, sleeping",
                "import grpc, numpy, engine, time; time.sleep(3600)",
            ),
        ]:
            process = python(code)
            try:
                rows.append((name, *measure(process, args.seconds, args.warmup)))
            finally:
                stop(process)

        agent_args = [sys.executable, "-m", "agent.cli", "run", "--gateway", f"127.0.0.1:{port}"]
        agent_args += [
            "--state-dir",
            str(tmp / "agent"),
            "--bundle",
            bundle(port),
            "--log-level",
            "WARNING",
        ]
        agent = subprocess.Popen(agent_args, cwd=ROOT)
        try:
            rows.append(
                ("ferry-agent idle, no model (30 s check-ins)", *measure(agent, args.seconds, args.warmup))
            )
            convert(build_image_classifier(seed=0), tmp / "u.ferry")
            sign_package(
                tmp / "u.ferry",
                tmp / "v1.ferry",
                keys.private_key,
                SignedClaims(organisation=ORGANISATION_ID),
            )
            gateway.publish(tmp / "v1.ferry", "v1")
            deadline = time.monotonic() + 60
            while not (tmp / "agent" / "current").is_symlink() and time.monotonic() < deadline:
                time.sleep(0.2)
            rows.append(
                ("ferry-agent, model loaded, 20 inferences/s", *measure(agent, args.seconds, args.warmup))
            )
        finally:
            stop(agent)
    server.stop(grace=None)

    print(
        f"\nagent footprint ({args.seconds:.0f} s window per row, {os.cpu_count()} cores, "
        f"Python {sys.version.split()[0]})"
    )
    print(f"{'process':<48} {'RSS MB':>8} {'peak MB':>8} {'CPU %':>7}")
    for name, rss, peak, cpu in rows:
        print(f"{name:<48} {rss:>8.1f} {peak:>8.1f} {cpu:>7.2f}")
    idle = rows[2]
    print(
        f"\ntarget: idle RSS <= 60 MB -> {idle[2]:.1f} MB peak ({'met' if idle[2] <= 60 else 'NOT met'}); "
        f"idle CPU <= 1 % -> {idle[3]:.2f} % ({'met' if idle[3] <= 1 else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
