"""Engine tests keep the kernel-choice cache in a temporary folder, never in ~/.cache, and
numba's compiled kernels there too unless FERRY_JIT_CACHE names a folder (CI may keep one
between runs: numba keys its cache on the kernels' source, so a stale entry is never used)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    mp = pytest.MonkeyPatch()
    mp.setenv("FERRY_KERNEL_CACHE", str(tmp_path_factory.mktemp("kernel-cache")))
    if not os.environ.get("FERRY_JIT_CACHE"):
        mp.setenv("FERRY_JIT_CACHE", str(tmp_path_factory.mktemp("jit-cache")))
    yield
    mp.undo()
