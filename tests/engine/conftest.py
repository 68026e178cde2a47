"""Engine tests keep the kernel-choice cache in a temporary folder, never in ~/.cache."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    mp = pytest.MonkeyPatch()
    mp.setenv("FERRY_KERNEL_CACHE", str(tmp_path_factory.mktemp("kernel-cache")))
    yield
    mp.undo()
