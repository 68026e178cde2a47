"""Start and stop the control plane's processes (web, worker, beat, gateway) and agents,
and drive the REST API.

Used by `manage.py demo` and by the end-to-end tests, so both run the very same
processes and make the very same calls an operator or a fleet-automation script would.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests
from django.conf import settings

from deploy.trust.bundle import EnrolmentBundle, encode_bundle
from ferry_cloud.broker import broker_prepare
from ferry_cloud.celery import app as celery_app
from ferry_cloud.device_ca import ensure_pki_files

MANAGE = str(settings.REPO_ROOT / "manage.py")
CONTROL_PLANE = ("web", "gateway", "worker", "beat")
PR_SET_PDEATHSIG = 1  # prctl(2)


def _die_with(parent: int) -> Callable[[], None] | None:
    """A preexec function asking Linux to SIGTERM the child when ``parent`` dies (even by SIGKILL),
    so a killed demo or test leaves no orphans. None where prctl does not exist."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork, not after
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def _terminate(processes: list[tuple[str, subprocess.Popen]], deadline: float) -> dict[str, int]:
    """SIGTERM them all, wait until the deadline, then SIGKILL each straggler's process group."""
    for _, process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    codes = {}
    for name, process in processes:
        try:
            codes[name] = process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            codes[name] = process.wait()
    return codes


PKI_FILES = {
    "FERRY_DEVICE_CA_CERT_FILE": "ca.pem",
    "FERRY_DEVICE_CA_KEY_FILE": "ca.key",
    "FERRY_GATEWAY_TLS_CERT_FILE": "gateway.pem",
    "FERRY_GATEWAY_TLS_KEY_FILE": "gateway.key",
}


class RestError(Exception):
    """A REST call the control plane refused; the message holds the status and the body."""


class RestClient:
    """The control plane's REST API with a token, as a fleet-automation script uses it."""

    def __init__(self, base: str, token: str) -> None:
        self.base = base
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Token {token}"

    def call(self, method: str, path: str, **kwargs) -> dict | list:
        response = self.session.request(method, f"{self.base}/api/v1/{path}", timeout=30, **kwargs)
        if response.status_code >= 400:
            raise RestError(f"{method} {path}: {response.status_code} {response.text[:500]}")
        return response.json()


def free_port(preferred: int = 0, host: str = "127.0.0.1") -> int:
    """preferred if it is free, otherwise any free port."""
    for port in (preferred, 0) if preferred else (0,):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port")


def wait_for_port(
    port: int, timeout: float, host: str = "127.0.0.1", process: subprocess.Popen | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(
                f"{process.args[:4]} exited with {process.returncode} before listening on {port}"
            )
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout:.0f} s")


@dataclass
class Stack:
    """Child processes with their logs in log_dir; stopped in reverse order of start."""

    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    processes: list[tuple[str, subprocess.Popen]] = field(default_factory=list)
    enrol_port: int = 0  # the gateway's enrolment port, once started

    def prepare_pki(self) -> Path:
        """The stack's dev CA and gateway certificate under its data dir's pki/, generated if
        missing, and named in the children's environment; returns the CA certificate's path."""
        data_dir = Path(
            self.env.get("FERRY_DATA_DIR") or os.environ.get("FERRY_DATA_DIR") or settings.DATA_DIR
        )
        paths = {
            name: Path(self.env.get(name) or data_dir / "pki" / file) for name, file in PKI_FILES.items()
        }
        ensure_pki_files(
            ca_cert=paths["FERRY_DEVICE_CA_CERT_FILE"],
            ca_key=paths["FERRY_DEVICE_CA_KEY_FILE"],
            server_cert=paths["FERRY_GATEWAY_TLS_CERT_FILE"],
            server_key=paths["FERRY_GATEWAY_TLS_KEY_FILE"],
            names=["localhost", "127.0.0.1"],
        )
        self.env.update({name: str(path) for name, path in paths.items()})
        return paths["FERRY_DEVICE_CA_CERT_FILE"]

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{name}.log", "ab") as log:  # the child keeps its own descriptor
            process = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                cwd=settings.REPO_ROOT,
                start_new_session=True,  # Ctrl-C reaches only us; we stop children in order
                preexec_fn=_die_with(os.getpid()),  # and if we are killed, they go too
            )
        self.processes.append((name, process))
        return process

    def start_control_plane(self, http_port: int, gateway_port: int) -> None:
        """Also generates the dev device CA and gateway certificate (prepare_pki) if missing, and
        gives the gateway a free enrolment port (enrol_port)."""
        broker_prepare(celery_app)  # tables and queues exist before worker, beat and web race for them
        self.prepare_pki()  # before any process could race to create it
        self.enrol_port = free_port()
        self.env["FERRY_GATEWAY_ENROL_ADDRESS"] = f"127.0.0.1:{self.enrol_port}"
        # what the REST API puts in enrolment bundles
        self.env["FERRY_GATEWAY_PUBLIC_ADDRESS"] = f"127.0.0.1:{gateway_port}"
        self.env["FERRY_GATEWAY_PUBLIC_ENROL_ADDRESS"] = f"127.0.0.1:{self.enrol_port}"
        web = self.spawn("web", [sys.executable, MANAGE, "runserver", f"127.0.0.1:{http_port}", "--noreload"])
        gateway = self.spawn(
            "gateway", [sys.executable, MANAGE, "gateway", "--address", f"127.0.0.1:{gateway_port}"]
        )
        celery = [sys.executable, "-m", "celery", "-A", "ferry_cloud"]
        self.spawn("worker", [*celery, "worker", "--pool", "solo", "--loglevel", "INFO"])
        # exactly one beat per deployment: it schedules the releases' health-gate evaluation
        self.spawn("beat", [*celery, "beat", "--loglevel", "INFO"])
        wait_for_port(http_port, 60, process=web)
        wait_for_port(gateway_port, 60, process=gateway)
        wait_for_port(self.enrol_port, 60, process=gateway)

    def start_agent(
        self,
        name: str,
        gateway_port: int,
        state_dir: Path,
        token: str,
        labels: dict[str, str],
        extra: list[str] | None = None,
    ) -> subprocess.Popen:
        address = f"127.0.0.1:{gateway_port}"
        args = [sys.executable, "-m", "agent.cli", "run", "--gateway", address]
        args += ["--state-dir", str(state_dir), "--name", name]
        if token:
            args += ["--bundle", self.bundle(token, gateway_port)]
        args += [arg for k, v in labels.items() for arg in ("--label", f"{k}={v}")]
        return self.spawn(name, args + (extra or []))

    def bundle(self, token: str, gateway_port: int) -> str:
        """The enrolment bundle an operator would paste: addresses, token, and the stack's CA."""
        ca_pem = self.prepare_pki().read_bytes()  # already there once the control plane runs
        return encode_bundle(
            EnrolmentBundle(
                gateway=f"127.0.0.1:{gateway_port}",
                enrol=f"127.0.0.1:{self.enrol_port}",
                token=token,
                ca_pem=ca_pem,
            )
        )

    def check_alive(self) -> None:
        for name, process in self.processes:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}; see {self.log_dir / name}.log")

    def stop(self, timeout: float = 8.0) -> dict[str, int]:
        """Stop every child within ``timeout`` seconds: SIGTERM the agents first (they flush
        telemetry to a gateway that is still up), then the control plane all at once; SIGKILL
        the process group of whatever is still running at its share of the deadline."""
        deadline = time.monotonic() + timeout
        agents = [(n, p) for n, p in self.processes if n not in CONTROL_PLANE]
        others = [(n, p) for n, p in self.processes if n in CONTROL_PLANE]
        codes = _terminate(agents, time.monotonic() + timeout / 2)
        codes.update(_terminate(others, deadline))
        self.processes.clear()
        order = [*reversed(agents), *reversed(others)]  # as they were stopped
        return {name: codes[name] for name, _ in order if name in codes}
