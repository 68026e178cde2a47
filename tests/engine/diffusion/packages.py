"""Tiny diffusion packages for the tests: the layout of tiny.py converted, signed with a fresh
release key and unpacked through deploy.package's verify-then-unpack, as a device would."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from converter.diffusion.convert import DiffusionConversionReport, DiffusionOptions, convert_diffusion
from deploy.package import generate_keypair, verify_and_unpack
from tests.engine.diffusion import tiny

OPTIONS = dict(size=64, min_size=32, max_size=96, size_multiple=16, steps=4, accuracy_steps=4)


@dataclass
class TinyPackage:
    archive: Path
    directory: Path
    public_key: bytes
    private_key: bytes
    report: DiffusionConversionReport


def build(root: Path, weights: str = "fp32", layout: Path | None = None) -> TinyPackage:
    layout = layout or tiny.write_layout(root / "layout")
    keys = generate_keypair()
    archive = root / f"tiny-{weights}.ferry"
    report = convert_diffusion(
        layout, archive, options=DiffusionOptions(weights=weights, **OPTIONS), sign_key=keys.private_key
    )
    directory = root / f"unpacked-{weights}"
    verify_and_unpack(archive, directory, keys.public_key)
    return TinyPackage(archive, directory, keys.public_key, keys.private_key, report)
