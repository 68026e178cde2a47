"""The converter works fully offline and reaches for nothing outside itself: no sockets, no
DNS, no subprocesses (MNN's Python converter installs packages and uploads usage data)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest

from converter.samples import build_image_classifier

ROOT = Path(__file__).resolve().parents[2]

# Runs `ferry convert` in a fresh interpreter with an audit hook that fails the process on
# any network or process-spawning event, from the first import on.
GUARDED = textwrap.dedent(
    """
    import os, sys
    FORBIDDEN = ("socket.", "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "urllib.", "http.")

    def hook(event, args):
        if event.startswith(FORBIDDEN):
            os.write(2, f"forbidden: {event} {args!r}\\n".encode())
            os._exit(3)

    sys.addaudithook(hook)
    from converter.cli import main
    sys.exit(main(sys.argv[1:]))
    """
)


@pytest.fixture
def source(tmp_path) -> Path:
    path = tmp_path / "model.onnx"
    onnx.save(build_image_classifier(), path)
    return path


def run_guarded(prefix: list[str], source: Path, dst: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            *prefix,
            sys.executable,
            "-c",
            GUARDED,
            "convert",
            str(source),
            "-o",
            str(dst),
            "--quantize",
            "int8",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_conversion_opens_no_socket_and_spawns_nothing(source, tmp_path):
    done = run_guarded([], source, tmp_path / "m.ferry")
    assert done.returncode == 0, done.stderr
    assert "forbidden" not in done.stderr
    assert (tmp_path / "m.ferry").stat().st_size > 0


def network_namespace_available() -> bool:
    unshare = shutil.which("unshare")
    return bool(unshare) and subprocess.run([unshare, "-rn", "true"], capture_output=True).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not network_namespace_available(), reason="no unprivileged network namespaces here")
def test_conversion_with_networking_disabled(source, tmp_path):
    """In a network namespace with no interfaces up (not even loopback)."""
    done = run_guarded(["unshare", "-rn"], source, tmp_path / "m.ferry")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "m.ferry").stat().st_size > 0
