"""The slim device install: packaging/agent in a fresh virtualenv, with the device lock's pins.

It must hold the agent, deploy and engine only (no Django, Celery, boto3 or onnx), stay under
120 MB of site-packages, and run: `ferry-agent --help`, then a real agent process from that
virtualenv enrols with the real gateway and checks in.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from accounts.services import organisation_ensure
from ferry_cloud.stack import free_port
from fleet.models import Device
from fleet.services import enrolment_bundle, enrolment_token_create
from gateway.hints import HintHub
from gateway.server import build_server
from telemetry.models import TelemetryRecord

from tests.agent.double import wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements-agent.lock"
DEVICE_PACKAGES = ("agent", "deploy", "engine")
# Top-level modules of the control plane and the converter that a device never gets.
FORBIDDEN = ("django", "rest_framework", "celery", "kombu", "boto3", "botocore", "onnx", "onnxruntime")
# The engine's optional JIT tier (extra `jit`): allowed to be missing, outside the size budget.
OPTIONAL = ("numba", "llvmlite")
BUDGET_BYTES = 120 * 1000 * 1000


def _lock_pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith(("#", "-")):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    return pins


def _site_packages_bytes(venv: Path) -> int:
    (site,) = (venv / "lib").glob("python3*/site-packages")
    return sum(p.lstat().st_size for p in site.rglob("*") if p.is_file() or p.is_symlink())


@pytest.fixture(scope="module")
def slim_venv(tmp_path_factory) -> Path:
    """A virtualenv with no pip of its own (the installer is not part of the install): this
    process's pip installs into it. --no-compile: a device compiles what it imports, at first
    import, instead of every test module of numpy."""
    venv = tmp_path_factory.mktemp("slim") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")),
            *("install", "--disable-pip-version-check", "-q", "--no-compile"),
            *("-r", str(LOCK), str(ROOT / "packaging" / "agent")),
        ],
        check=True,
        timeout=900,
        cwd=venv.parent,
    )
    # pip builds the local project in place: leave no stale copy of the sources in the tree
    shutil.rmtree(ROOT / "packaging" / "agent" / "build", ignore_errors=True)
    return venv


def _device_env() -> dict[str, str]:
    """A device's environment: no path into the repository, and bytecode written as it is
    imported (this host sets PYTHONDONTWRITEBYTECODE), so the measured size includes it."""
    hidden = ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "PYTHONDONTWRITEBYTECODE")
    return {k: v for k, v in os.environ.items() if k not in hidden}


def _run(venv: Path, code: str) -> str:
    """Python code in the slim virtualenv, away from the repository (so nothing imports from it)."""
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        cwd=venv.parent,
        capture_output=True,
        text=True,
        timeout=300,
        env=_device_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_device_distribution_pins_the_root_projects_base_dependencies():
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    device = tomllib.loads((ROOT / "packaging" / "agent" / "pyproject.toml").read_text())["project"]
    assert sorted(device["dependencies"]) == sorted(root["dependencies"])
    assert device["optional-dependencies"]["jit"] == root["optional-dependencies"]["jit"]
    assert device["scripts"]["ferry-agent"] == root["scripts"]["ferry-agent"]
    pins = _lock_pins()
    for requirement in root["dependencies"]:
        name, version = requirement.split("==")
        assert pins[name.split("[")[0].lower()] == version, requirement


def test_device_sources_never_import_the_control_plane():
    """Every import statement, lazy ones inside functions included, of agent/, deploy/, engine/."""
    offenders = []
    for package in DEVICE_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                offenders += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if _forbidden(n)]
    assert offenders == []


def _forbidden(module: str) -> bool:
    top = module.split(".")[0]
    return top in FORBIDDEN or top in ("ferry_cloud", "registry", "fleet", "releases", "converter")


def test_slim_install_holds_the_device_packages_only(slim_venv: Path):
    installed = json.loads(
        _run(
            slim_venv,
            "import json, importlib.metadata as m; "
            "print(json.dumps({d.metadata['Name'].lower().replace('_', '-'): d.version "
            "for d in m.distributions()}))",
        )
    )
    assert installed.pop("ferry-agent") == "0.1.0"
    assert installed == _lock_pins()  # exactly the lock: nothing more, nothing else

    probe = f"import importlib.util as u; print([m for m in {FORBIDDEN!r} if u.find_spec(m)])"
    assert _run(slim_venv, probe).strip() == "[]"

    # every module of the three packages imports there (the JIT kernels only where numba is)
    modules = _run(
        slim_venv,
        "import importlib, pkgutil\n"
        f"for top in {DEVICE_PACKAGES!r}:\n"
        "    package = importlib.import_module(top)\n"
        "    print(package.__file__)\n"
        "    for info in pkgutil.walk_packages(package.__path__, top + '.'):\n"
        "        try:\n"
        "            importlib.import_module(info.name)\n"
        "        except ModuleNotFoundError as exc:\n"
        f"            if exc.name not in {OPTIONAL!r}:\n"
        "                raise\n"
        "        print(info.name)\n",
    ).split()
    assert all("site-packages" in line for line in modules[:3] if line.endswith(".py")), modules[:3]
    assert "agent.cli" in modules and "deploy.package.verify" in modules and "engine.session" in modules

    size = _site_packages_bytes(slim_venv)
    print(f"slim install: {size / 1e6:.1f} MB of site-packages")
    assert size <= BUDGET_BYTES, f"{size / 1e6:.1f} MB"


def test_ferry_agent_help_runs_from_the_slim_install(slim_venv: Path):
    result = subprocess.run(
        [str(slim_venv / "bin" / "ferry-agent"), "--help"],
        cwd=slim_venv.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "run" in result.stdout and "status" in result.stdout


def test_slim_agent_enrols_and_checks_in_with_the_real_gateway(
    slim_venv: Path, transactional_db, settings, tmp_path: Path
):
    settings.FERRY_CHECKIN_INTERVAL_SECONDS = 1
    org = organisation_ensure(name="Slim")
    token = enrolment_token_create(organisation=org, labels={"install": "slim"}).token
    port, enrol_port = free_port(), free_port()
    hub = HintHub(poll_seconds=0.5)
    server, _ = build_server(f"127.0.0.1:{port}", workers=4, hub=hub, enrol_address=f"127.0.0.1:{enrol_port}")
    server.start()
    state_dir = tmp_path / "agent"
    log = tmp_path / "agent.log"
    args = [str(slim_venv / "bin" / "ferry-agent"), "run", "--gateway", f"127.0.0.1:{port}"]
    bundle = enrolment_bundle(
        token=token, gateway_address=f"127.0.0.1:{port}", enrol_address=f"127.0.0.1:{enrol_port}"
    )
    args += ["--state-dir", str(state_dir), "--bundle", bundle, "--name", "slim-1"]
    args += ["--metrics-interval", "0.5", "--upload-interval", "0.3"]
    with open(log, "ab") as out:
        agent = subprocess.Popen(args, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, env=_device_env())

    def alive() -> None:
        assert agent.poll() is None, f"agent exited {agent.returncode}:\n{log.read_text()[-3000:]}"

    try:
        device = wait_for(
            lambda: alive() or Device.objects.filter(organisation=org, name="slim-1").first(), 60, "enrolment"
        )
        assert device.labels["install"] == "slim"
        # A check-in, counted by the gateway itself (last_seen_at cannot tell: the fast path
        # renews it at most once a minute, LAST_SEEN_RESOLUTION, and enrolment just stamped it).
        check_ins_before = _check_ins()
        wait_for(lambda: alive() or _check_ins() > check_ins_before, 30, "a check-in")
        records = TelemetryRecord.objects.filter(device_id=device.pk)
        wait_for(lambda: alive() or records.exists(), 30, "telemetry")
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0, log.read_text()[-3000:]
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        server.stop(grace=None)
        hub.stop()
    # What the device holds after running: the install plus what its imports compiled.
    size = _site_packages_bytes(slim_venv)
    print(f"slim install after a run: {size / 1e6:.1f} MB of site-packages")
    assert size <= BUDGET_BYTES, f"{size / 1e6:.1f} MB"


def _check_ins() -> float:
    """Successful check-ins this process's gateway answered (offered a package or not)."""
    from prometheus_client import REGISTRY  # noqa: PLC0415

    return sum(
        REGISTRY.get_sample_value("ferry_gateway_check_ins_total", {"offered": offered}) or 0.0
        for offered in ("yes", "no")
    )
