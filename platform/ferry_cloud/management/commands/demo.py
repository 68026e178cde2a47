"""`manage.py demo` (what `make demo` runs): the whole loop on one machine.

Control plane (web, Celery worker, gRPC gateway) + an image classifier uploaded
through the REST API, converted by the worker, released to three real agent
processes that report telemetry; a live summary until Ctrl-C (or --duration).
"""

from __future__ import annotations

import io
import os
import secrets
import signal
import time
from pathlib import Path

from accounts.services import organisation_ensure, user_ensure_admin
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from rich.console import Console
from rich.live import Live
from rich.table import Table

from converter.samples import build_image_classifier
from ferry_cloud.stack import RestClient, RestError, Stack, free_port

MODEL = "demo-classifier"
LABEL = "v1"
AGENTS = 3
FLEET_LABELS = {"fleet": "demo"}


class Command(BaseCommand):
    help = "Run the whole Ferry loop locally: control plane, worker, gateway and three agents."

    def add_arguments(self, parser):
        parser.add_argument("--http-port", type=int, default=int(os.environ.get("FERRY_HTTP_PORT", 8000)))
        parser.add_argument(
            "--gateway-port", type=int, default=int(os.environ.get("FERRY_GATEWAY_PORT", 50051))
        )
        parser.add_argument(
            "--duration", type=float, default=0, help="stop after this many seconds (0: Ctrl-C)"
        )
        parser.add_argument(
            "--no-live", action="store_true", help="print summaries as lines, not a live screen"
        )

    def handle(self, *args, http_port, gateway_port, duration, no_live, **options):
        console = Console()
        demo_dir = settings.DATA_DIR / "demo"
        call_command("migrate", verbosity=0)
        org = organisation_ensure(name="Demo")
        password = _demo_password(demo_dir)
        _, api_token = user_ensure_admin(organisation=org, username="admin", password=password)
        http_port, gateway_port = free_port(http_port), free_port(gateway_port)
        base = f"http://127.0.0.1:{http_port}"
        stack = Stack(
            log_dir=demo_dir / "logs",
            env={
                "FERRY_CHECKIN_INTERVAL_SECONDS": "3",
                "FERRY_GATE_INTERVAL_SECONDS": "5",
                "FERRY_LOG_FORMAT": "console",  # the demo's logs are read by people
            },
        )
        signal.signal(signal.SIGINT, _interrupt)
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            console.print(
                f"starting web :{http_port}, gateway :{gateway_port} and a Celery worker "
                f"(logs in {stack.log_dir})"
            )
            stack.start_control_plane(http_port, gateway_port)
            api = RestClient(base, api_token)
            version = _ensure_version(api, console)
            _ensure_release(api, version)
            _start_agents(api, stack, demo_dir, gateway_port)
            console.print(
                f"\n[bold]console[/] {base}/   [bold]login[/] admin / {password}   "
                f"[bold]API[/] {base}/api/docs/   (Ctrl-C stops everything)\n"
            )
            _watch(api, stack, console, duration, live=not no_live and console.is_terminal)
        except RestError as exc:
            raise CommandError(str(exc)) from None
        except KeyboardInterrupt:
            pass  # Ctrl-C or SIGTERM, at whatever step we were: stop everything below
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not cut the stop short
                signal.signal(signum, signal.SIG_IGN)
            console.print("stopping agents, then gateway, beat, worker and web ...")
            codes = stack.stop()
            console.print("stopped: " + ", ".join(f"{n} ({c})" for n, c in codes.items()))


def _interrupt(signum, frame) -> None:
    """SIGINT and SIGTERM interrupt whatever the demo waits on (start-up, conversion, the watch)."""
    raise KeyboardInterrupt


def _demo_password(demo_dir: Path) -> str:
    """One password per data directory, so a second run logs in the same way."""
    demo_dir.mkdir(parents=True, exist_ok=True)
    path = demo_dir / "admin-password"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(12))
        path.chmod(0o600)
    return path.read_text().strip()


def _ensure_version(api: RestClient, console: Console) -> dict:
    models = {m["name"]: m for m in api.call("GET", "models/?limit=500")["results"]}
    model = models.get(MODEL) or api.call("POST", "models/", json={"name": MODEL})
    existing = {v["label"]: v for v in model["versions"]}
    if LABEL in existing and existing[LABEL]["status"] != "failed":
        version_id = existing[LABEL]["id"]
    else:
        label = LABEL if LABEL not in existing else f"{LABEL}-{int(time.time())}"
        buf = io.BytesIO(build_image_classifier().SerializeToString())
        files = {"file": (f"{MODEL}.onnx", buf, "application/octet-stream")}
        version_id = api.call("POST", f"models/{model['id']}/versions/", files=files, data={"label": label})[
            "id"
        ]
        console.print(f"uploaded {MODEL}:{label} through the REST API; the worker converts it ...")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        version = api.call("GET", f"versions/{version_id}/")
        if version["status"] == "ready":
            console.print(
                f"converted: package {version['package_sha256'][:12]} ({version['package_size']} bytes)"
            )
            return version
        if version["status"] == "failed":
            raise CommandError(f"conversion failed: {version['job']['error']}")
        time.sleep(0.5)
    raise CommandError("the conversion did not finish in 300 s; see the worker log")


def _ensure_release(api: RestClient, version: dict) -> None:
    if api.call("GET", f"releases/?state=active&version={version['id']}&limit=1")["results"]:
        return
    api.call(
        "POST",
        "releases/",
        json={
            "name": f"{MODEL} {version['label']} to the demo fleet",
            "version": version["id"],
            "target": {"labels": FLEET_LABELS, "percentage": 100},
            "start": True,
            "allow_empty": True,  # the demo's agents enrol right after
        },
    )


def _start_agents(api: RestClient, stack: Stack, demo_dir: Path, gateway_port: int) -> None:
    for i in range(1, AGENTS + 1):
        state_dir = demo_dir / "agents" / f"agent-{i}"
        enrolled = (state_dir / "credential.json").exists()
        token = (
            "" if enrolled else api.call("POST", "enrolment-tokens/", json={"labels": FLEET_LABELS})["token"]
        )
        stack.start_agent(
            f"agent-{i}",
            gateway_port,
            state_dir,
            token,
            FLEET_LABELS,
            extra=["--metrics-interval", "2", "--upload-interval", "1"],
        )


def _summary_table(summary: dict) -> Table:
    table = Table(title="Ferry demo fleet", expand=False)
    table.add_column("version")
    table.add_column("devices", justify="right")
    for row in summary["devices_per_version"]:
        table.add_row(row["version"] or "(none yet)", str(row["devices"]))
    rates = summary["rates"]
    p50 = rates["latency_ms_p50"]
    table.caption = (
        f"{rates['inferences_per_second']:.1f} inferences/s · p50 "
        f"{'–' if p50 is None else f'{p50:.2f} ms'} · "
        f"{sum(summary['telemetry_records_per_device'].values())} telemetry records"
    )
    return table


def _watch(api: RestClient, stack: Stack, console: Console, duration: float, live: bool) -> None:
    ends = time.monotonic() + duration if duration else float("inf")
    if live:
        with Live(console=console, refresh_per_second=2) as screen:
            while time.monotonic() < ends:
                time.sleep(1.0)
                stack.check_alive()
                screen.update(_summary_table(api.call("GET", "fleet/summary/")))
        return
    while time.monotonic() < ends:
        time.sleep(5.0)
        stack.check_alive()
        summary = api.call("GET", "fleet/summary/")
        console.print(_summary_table(summary))
