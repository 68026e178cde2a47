"""A Ferry diffusion package's files, and reading its description (``diffusion.json``).

Files (all at the package's top level; the container forbids directories):
- ``diffusion.json``: what the pipeline needs beside the graphs (``DiffusionSpec``);
- ``text_encoder.ferry``, ``unet.ferry``, ``vae_decoder.ferry``: each an ordinary Ferry package
  (graph.json + weights.bin) that ``engine.Session`` maps in place from the unpacked file;
- ``tokenizer.json`` (CLIP's BPE for ``tokenizers``), ``scheduler_config.json`` (diffusers'
  shape), ``accuracy.json`` (the conversion's report), ``selftest.npy`` (the image a 2-step
  generation from a fixed seed gave at conversion; the device's health check regenerates it).
The manifest's metadata says ``kind: "diffusion"``.  The outer package's signature covers every
file, the nested graphs included, so they are not hashed again at load.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine.diffusion.errors import DiffusionPackageError

KIND = "diffusion"
SPEC = "diffusion.json"
TOKENIZER = "tokenizer.json"
SCHEDULER = "scheduler_config.json"
ACCURACY = "accuracy.json"
SELFTEST_IMAGE = "selftest.npy"
GRAPHS = ("text_encoder", "unet", "vae_decoder")
SPEC_VERSION = 1


@dataclass(frozen=True)
class SelfTest:
    """The health check's generation: a 2-step image from a fixed seed, recorded at conversion."""

    prompt: str = "a red ferry on the sea"
    seed: int = 0
    steps: int = 2
    guidance_scale: float = 7.5
    size: int = 64
    scheduler: str = "ddim"
    min_psnr: float = 35.0  # the regenerated image against the recorded one, in dB


@dataclass(frozen=True)
class DiffusionSpec:
    graphs: dict[str, str]
    latent_channels: int
    vae_scale_factor: int
    scaling_factor: float
    text_width: int
    max_length: int
    pad_token: str
    default_size: int
    min_size: int
    max_size: int
    size_multiple: int
    default_steps: int = 20
    max_steps: int = 100
    guidance_scale: float = 7.5
    scheduler: str = "dpmpp_2m"
    precision: str = "fp32"
    selftest: SelfTest = field(default_factory=SelfTest)
    version: int = SPEC_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = SPEC) -> DiffusionSpec:
        if not isinstance(data, dict):
            raise DiffusionPackageError(f"{where}: must hold a JSON object")
        if data.get("version") != SPEC_VERSION:
            raise DiffusionPackageError(
                f"{where}: version {data.get('version')!r} is not {SPEC_VERSION}; update the agent to run it"
            )
        try:
            spec = cls(**{**data, "selftest": SelfTest(**data.get("selftest", {}))})
        except TypeError as exc:
            raise DiffusionPackageError(f"{where}: {exc}") from exc
        spec.check(where)
        return spec

    def check(self, where: str = SPEC) -> None:
        if sorted(self.graphs) != sorted(GRAPHS) or not all(
            isinstance(v, str) and "/" not in v for v in self.graphs.values()
        ):
            raise DiffusionPackageError(f"{where}: 'graphs' must name the files of {', '.join(GRAPHS)}")
        ints = {
            "latent_channels": self.latent_channels,
            "vae_scale_factor": self.vae_scale_factor,
            "size_multiple": self.size_multiple,
            "min_size": self.min_size,
            "max_size": self.max_size,
            "default_size": self.default_size,
            "max_length": self.max_length,
            "max_steps": self.max_steps,
        }
        bad = [k for k, v in ints.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1]
        if bad:
            raise DiffusionPackageError(f"{where}: {', '.join(bad)} must be positive integers")
        if not self.min_size <= self.default_size <= self.max_size:
            raise DiffusionPackageError(f"{where}: need min_size <= default_size <= max_size")
        if self.size_multiple % self.vae_scale_factor:
            raise DiffusionPackageError(f"{where}: size_multiple must be a multiple of vae_scale_factor")


def read_spec(directory: str | Path) -> DiffusionSpec:
    """The spec of an unpacked diffusion package; its graph files must be there."""
    path = Path(directory) / SPEC
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DiffusionPackageError(f"{path}: not a readable diffusion description ({exc})") from exc
    spec = DiffusionSpec.from_dict(data, str(path))
    for name, file in spec.graphs.items():
        if not (Path(directory) / file).is_file():
            raise DiffusionPackageError(f"{directory}: the {name} graph {file} is missing")
    return spec


def is_diffusion_package(directory: str | Path) -> bool:
    """Whether an unpacked package's manifest says ``kind: "diffusion"``."""
    try:
        manifest = json.loads((Path(directory) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and (manifest.get("metadata") or {}).get("kind") == KIND
