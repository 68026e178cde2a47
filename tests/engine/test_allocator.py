"""A Session keeps run-sized blocks in the heap: later runs touch no fresh pages.

Each case runs in a fresh interpreter, since glibc's thresholds are per process and adapt to
what the process has already freed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.engine.helpers import single_node_model, write_model_package

ROOT = Path(__file__).resolve().parents[2]

# What a run does to the allocator: a handful of ~1 MB activations, all freed at the end.
# Untuned, glibc hands the freed top of its heap back to the kernel after every such run.
PROBE = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    from engine import Session

    Session(sys.argv[1], threads=1)

    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def one_run():
        blocks = [np.ones(1 << 18, np.float32) for _ in range(8)]
        del blocks

    one_run(), one_run()
    before = faults()
    for _ in range(10):
        one_run()
    print((faults() - before) / 10)
    """
)


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    model, feeds = single_node_model("Relu", [np.ones((2, 3), np.float32)])
    return write_model_package(model, tmp_path_factory.mktemp("allocator") / "relu.ferry", feeds)


def faults_per_run(package: Path, tuning: str) -> float:
    env = {**os.environ, "FERRY_MALLOC_TUNING": tuning, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(package)], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc is what is tuned")
def test_runs_after_the_first_touch_no_fresh_pages(package):
    assert faults_per_run(package, "1") <= 8


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc is what is tuned")
def test_tuning_can_be_turned_off_and_then_every_run_faults_its_pages_again(package):
    # 8 MB freed per run: ~2,000 fresh 4 KB pages each time glibc gave them back
    assert faults_per_run(package, "0") >= 1000
