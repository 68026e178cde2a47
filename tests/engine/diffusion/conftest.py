"""One tiny layout and its fp32 package per test session (converting takes seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.diffusion import packages, tiny


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-diffusion")


@pytest.fixture(scope="session")
def tiny_layout(tiny_root: Path) -> Path:
    return tiny.write_layout(tiny_root / "layout")


@pytest.fixture(scope="session")
def fp32_package(tiny_root: Path, tiny_layout: Path) -> packages.TinyPackage:
    return packages.build(tiny_root, "fp32", tiny_layout)
