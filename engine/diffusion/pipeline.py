"""The text-to-image pipeline: prompt -> CLIP tokens -> text encoder -> UNet loop with
classifier-free guidance -> VAE decoder -> an RGB image.

Each graph is an ``engine.Session`` loaded only while it runs (text encoder, then the UNet for
every step, then the VAE decoder), so the process holds one graph's weights and working set at
a time.  With ``keep_sessions=True`` the three Sessions stay loaded and planned after their first
use, so later images skip each graph's load, first (unplanned) run and planning, at the cost of
holding all three graphs' weights and plans at once (``release()`` drops them).  The
unconditional and conditional passes run as one batch of 2.  The seed fixes the starting
latents and every noise draw, so the same request gives the same image.
"""

from __future__ import annotations

import gc
import json
import math
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.diffusion.errors import DiffusionPackageError, GenerationRequestError
from engine.diffusion.package import SCHEDULER, TOKENIZER, DiffusionSpec, read_spec
from engine.diffusion.schedule import ScheduleConfig
from engine.diffusion.schedulers import NAMES, make_scheduler
from engine.diffusion.tokenizer import load_package_tokenizer
from engine.session import Session

# progress(step, steps, seconds of that step), after each UNet step
Progress = Callable[[int, int, float], None]
MAX_SEED = 2**63 - 1
MAX_GUIDANCE = 50.0


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str
    negative_prompt: str = ""
    width: int | None = None  # None: the package's default size
    height: int | None = None
    steps: int | None = None
    guidance_scale: float | None = None
    seed: int = 0
    scheduler: str | None = None


@dataclass
class GenerationResult:
    image: np.ndarray  # uint8 [height, width, 3]
    seed: int
    steps: int
    scheduler: str
    step_seconds: list[float] = field(default_factory=list)
    encode_seconds: float = 0.0
    decode_seconds: float = 0.0
    total_seconds: float = 0.0
    peak_rss_bytes: int = 0

    def figures(self) -> dict[str, Any]:
        per_step = sum(self.step_seconds) / len(self.step_seconds) if self.step_seconds else None
        return {
            "steps": self.steps,
            "seconds_per_step": round(per_step, 4) if per_step is not None else None,
            "encode_seconds": round(self.encode_seconds, 4),
            "decode_seconds": round(self.decode_seconds, 4),
            "total_seconds": round(self.total_seconds, 4),
            "peak_rss_bytes": self.peak_rss_bytes,
        }


class DiffusionPipeline:
    """An unpacked diffusion package (engine/diffusion/package.py), ready to generate."""

    def __init__(
        self,
        directory: str | Path,
        threads: int | None = None,
        jit: bool | None = None,
        keep_sessions: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.keep_sessions = keep_sessions
        self._kept: dict[str, Session] = {}
        self.spec: DiffusionSpec = read_spec(self.directory)
        self.threads, self.jit = threads, jit
        self.tokenizer = load_package_tokenizer(
            self.directory / TOKENIZER, self.spec.max_length, self.spec.pad_token
        )
        try:
            raw = json.loads((self.directory / SCHEDULER).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DiffusionPackageError(f"{self.directory / SCHEDULER}: unreadable ({exc})") from exc
        self.schedule = ScheduleConfig.from_dict(raw)

    def _session(self, graph: str) -> Session:
        if graph in self._kept:
            return self._kept[graph]
        path = self.directory / self.spec.graphs[graph]
        session = Session(path, threads=self.threads, jit=self.jit, verify=False)
        if self.keep_sessions:
            self._kept[graph] = session
        return session

    def release(self) -> None:
        """Drop the Sessions kept by ``keep_sessions`` (the next image loads them again)."""
        self._kept.clear()
        gc.collect()

    def _done_with(self, graph: str) -> None:
        """Between graphs: unless kept, the Session just used is garbage; collect it now so the
        next graph's weights do not stack on top of it."""
        if graph not in self._kept:
            gc.collect()

    def resolve(self, request: GenerationRequest) -> GenerationRequest:
        """The request with the package's defaults filled in, or GenerationRequestError saying why not."""
        spec = self.spec
        width = spec.default_size if request.width is None else request.width
        height = spec.default_size if request.height is None else request.height
        for name, value in (("width", width), ("height", height)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise GenerationRequestError(f"{name} must be an integer")
            if not spec.min_size <= value <= spec.max_size or value % spec.size_multiple:
                raise GenerationRequestError(
                    f"{name}={value}: this model makes sizes from {spec.min_size} to {spec.max_size} "
                    f"in multiples of {spec.size_multiple}"
                )
        steps = spec.default_steps if request.steps is None else request.steps
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= spec.max_steps:
            raise GenerationRequestError(f"steps={steps!r} must be an integer from 1 to {spec.max_steps}")
        guidance = spec.guidance_scale if request.guidance_scale is None else request.guidance_scale
        if isinstance(guidance, bool) or not isinstance(guidance, int | float) or not math.isfinite(guidance):
            raise GenerationRequestError("guidance_scale must be a number")
        if not 0 <= guidance <= MAX_GUIDANCE:
            raise GenerationRequestError(f"guidance_scale={guidance} must be in [0, {MAX_GUIDANCE}]")
        scheduler = request.scheduler or spec.scheduler
        if scheduler not in NAMES:
            raise GenerationRequestError(f"scheduler {scheduler!r} is not one of {', '.join(NAMES)}")
        seed = request.seed
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
            raise GenerationRequestError(f"seed must be an integer from 0 to {MAX_SEED}")
        if not isinstance(request.prompt, str) or not isinstance(request.negative_prompt, str):
            raise GenerationRequestError("prompt and negative_prompt must be strings")
        return GenerationRequest(
            request.prompt, request.negative_prompt, width, height, steps, float(guidance), seed, scheduler
        )

    def generate(self, request: GenerationRequest, progress: Progress | None = None) -> GenerationResult:
        request = self.resolve(request)
        started = time.perf_counter()
        guided = request.guidance_scale > 1.0  # diffusers' rule: guidance 1 is the plain model
        prompts = [request.negative_prompt, request.prompt] if guided else [request.prompt]
        context = self.encode(prompts)
        encoded = time.perf_counter()
        rng = np.random.default_rng(request.seed)
        scheduler = make_scheduler(request.scheduler, self.schedule, request.steps)
        shape = (
            1,
            self.spec.latent_channels,
            request.height // self.spec.vae_scale_factor,
            request.width // self.spec.vae_scale_factor,
        )
        latents = rng.standard_normal(shape, dtype=np.float32) * np.float32(scheduler.init_noise_sigma)
        result = GenerationResult(np.zeros(0, np.uint8), request.seed, request.steps, request.scheduler)
        latents = self._denoise(latents, context, scheduler, request.guidance_scale, rng, result, progress)
        decoding = time.perf_counter()
        result.image = self.decode(latents)
        finished = time.perf_counter()
        result.encode_seconds = encoded - started
        result.decode_seconds = finished - decoding
        result.total_seconds = finished - started
        result.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return result

    def encode(self, prompts: list[str]) -> np.ndarray:
        """The text encoder's last hidden state for each prompt, stacked [len(prompts), L, D]."""
        session = self._session("text_encoder")
        spec = _input(session, None)
        ids = np.array([self.tokenizer.encode(p) for p in prompts], dtype=np.dtype(spec.dtype))
        batch = spec.shape[0] if spec.shape else None
        if isinstance(batch, int):  # a graph exported for one prompt at a time
            parts = [self._hidden(session, spec.name, ids[i : i + batch]) for i in range(0, len(ids), batch)]
            hidden = np.concatenate(parts)
        else:
            hidden = self._hidden(session, spec.name, ids)
        del session
        self._done_with("text_encoder")
        return hidden

    @staticmethod
    def _hidden(session: Session, name: str, ids: np.ndarray) -> np.ndarray:
        outputs = session.run({name: ids})
        hidden = outputs.get("last_hidden_state", next(iter(outputs.values())))
        return np.ascontiguousarray(hidden, dtype=np.float32)

    def _denoise(
        self,
        latents: np.ndarray,
        context: np.ndarray,
        scheduler: Any,
        guidance: float,
        rng: np.random.Generator,
        result: GenerationResult,
        progress: Progress | None,
    ) -> np.ndarray:
        session = self._session("unet")
        sample_in = _input(session, "sample")
        time_in = _input(session, "timestep")
        context_in = _input(session, "encoder_hidden_states")
        batch = context.shape[0]
        count = time_in.shape[0] if time_in.shape and isinstance(time_in.shape[0], int) else batch
        steps = len(scheduler.timesteps)
        for i, t in enumerate(scheduler.timesteps):
            began = time.perf_counter()
            model_input = scheduler.scale_model_input(latents, i)
            if batch > 1:
                model_input = np.concatenate([model_input] * batch)
            feeds = {
                sample_in.name: model_input,
                time_in.name: np.full((count,), t, dtype=np.dtype(time_in.dtype)),
                context_in.name: context,
            }
            noise = next(iter(session.run(feeds).values()))
            if batch > 1:
                uncond, cond = noise[:1], noise[1:]
                noise = uncond + np.float32(guidance) * (cond - uncond)
            fresh = rng.standard_normal(latents.shape, dtype=np.float32) if scheduler.needs_noise else None
            latents = scheduler.step(noise, i, latents, fresh)
            result.step_seconds.append(time.perf_counter() - began)
            if progress is not None:
                progress(i + 1, steps, result.step_seconds[-1])
        del session
        self._done_with("unet")
        return latents

    def decode(self, latents: np.ndarray) -> np.ndarray:
        """The VAE decoder's image of ``latents`` as uint8 [height, width, 3]."""
        session = self._session("vae_decoder")
        spec = _input(session, "latent_sample")
        scaled = (latents / np.float32(self.spec.scaling_factor)).astype(np.float32)
        decoded = next(iter(session.run({spec.name: scaled}).values()))
        del session
        self._done_with("vae_decoder")
        return to_uint8(decoded[0])


def to_uint8(chw: np.ndarray) -> np.ndarray:
    """A decoder output in [-1, 1], channels first -> uint8 height x width x 3 (as diffusers rounds)."""
    image = np.clip(chw.astype(np.float32) / 2 + 0.5, 0, 1)
    return np.ascontiguousarray((image.transpose(1, 2, 0) * 255).round().astype(np.uint8))


def _input(session: Session, name: str | None) -> Any:
    """The graph input called ``name`` (the first input when None)."""
    if name is None:
        return session.inputs[0]
    for spec in session.inputs:
        if spec.name == name:
            return spec
    raise DiffusionPackageError(
        f"{session.path.name}: has no input {name!r} (it has {[s.name for s in session.inputs]})"
    )
