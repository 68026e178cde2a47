"""One tiny fp32 diffusion package (signed, unpacked as a device would) per module."""

from __future__ import annotations

import pytest

from tests.engine.diffusion import packages


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> packages.TinyPackage:
    return packages.build(tmp_path_factory.mktemp("tiny-diffusion"), "fp32")
