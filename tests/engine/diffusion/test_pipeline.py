"""The pipeline end to end on the tiny package: against the same loop run by onnxruntime on the
source graphs, reproducible seeds, guidance batching, one graph resident at a time, progress per
step, and requests outside the package's limits refused with the reason."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from engine import Session
from engine.diffusion.errors import GenerationRequestError
from engine.diffusion.pipeline import DiffusionPipeline, GenerationRequest, to_uint8
from engine.diffusion.quality import psnr
from engine.diffusion.schedulers import NAMES, make_scheduler
from engine.diffusion.tokenizer import ClipTokenizer

PROMPT = "a red ferry on the sea"


def onnxruntime_image(layout: Path, request: GenerationRequest) -> np.ndarray:
    """diffusers' OnnxStableDiffusionPipeline loop, written out over onnxruntime sessions."""
    tokenizer = ClipTokenizer.from_directory(layout / "tokenizer")
    text = ort.InferenceSession(str(layout / "text_encoder" / "model.onnx"))
    ids = np.array([tokenizer.encode(request.negative_prompt), tokenizer.encode(request.prompt)], np.int32)
    context = text.run(["last_hidden_state"], {"input_ids": ids})[0]
    config = json.loads((layout / "scheduler" / "scheduler_config.json").read_text())
    scheduler = make_scheduler(request.scheduler, config, request.steps)
    rng = np.random.default_rng(request.seed)
    shape = (1, 4, request.height // 8, request.width // 8)
    latents = rng.standard_normal(shape, dtype=np.float32) * np.float32(scheduler.init_noise_sigma)
    unet = ort.InferenceSession(str(layout / "unet" / "model.onnx"))
    for i, t in enumerate(scheduler.timesteps):
        x = np.concatenate([scheduler.scale_model_input(latents, i)] * 2)
        out = unet.run(
            None, {"sample": x, "timestep": np.full(2, t, np.int64), "encoder_hidden_states": context}
        )[0]
        noise = out[:1] + np.float32(request.guidance_scale) * (out[1:] - out[:1])
        fresh = rng.standard_normal(latents.shape, dtype=np.float32) if scheduler.needs_noise else None
        latents = scheduler.step(noise, i, latents, fresh)
    vae = ort.InferenceSession(str(layout / "vae_decoder" / "model.onnx"))
    return to_uint8(vae.run(None, {"latent_sample": latents / np.float32(0.18215)})[0][0])


@pytest.mark.parametrize("scheduler", NAMES)
def test_matches_onnxruntime_loop(fp32_package, tiny_layout: Path, scheduler: str) -> None:
    request = GenerationRequest(
        PROMPT, width=64, height=48, steps=5, guidance_scale=6.0, seed=42, scheduler=scheduler
    )
    ours = DiffusionPipeline(fp32_package.directory).generate(request).image
    theirs = onnxruntime_image(tiny_layout, request)
    assert ours.shape == (48, 64, 3) and ours.dtype == np.uint8
    assert int(np.abs(ours.astype(int) - theirs).max()) <= 1
    assert ours.std() > 1  # a picture, not a flat field


def test_seeds_reproduce_and_differ(fp32_package) -> None:
    pipeline = DiffusionPipeline(fp32_package.directory, threads=1)
    # The package's first image on a device runs its first UNet step before the kernel search
    # has measured anything (numpy's kernels); later Sessions start on the kernels it chose,
    # whose float32 rounding may differ (a JIT GEGLU's GELU form: ~1e-6).  So the first image
    # of a seed is the same picture, and every one after it the same bytes (a release's health
    # check makes the first image on a device).
    cold = pipeline.generate(GenerationRequest(PROMPT, steps=3, seed=7, scheduler="euler_a"))
    first = pipeline.generate(GenerationRequest(PROMPT, steps=3, seed=7, scheduler="euler_a"))
    again = pipeline.generate(GenerationRequest(PROMPT, steps=3, seed=7, scheduler="euler_a"))
    other = pipeline.generate(GenerationRequest(PROMPT, steps=3, seed=8, scheduler="euler_a"))
    assert psnr(cold.image, first.image) > 50
    assert np.array_equal(first.image, again.image)
    assert psnr(first.image, other.image) < 40
    assert first.image.shape == (64, 64, 3)  # the package's default size


def test_guidance_one_runs_the_conditional_pass_alone(fp32_package) -> None:
    pipeline = DiffusionPipeline(fp32_package.directory)
    plain = pipeline.generate(GenerationRequest(PROMPT, steps=2, guidance_scale=1.0)).image
    guided = pipeline.generate(GenerationRequest(PROMPT, steps=2, guidance_scale=7.5)).image
    assert plain.shape == guided.shape and not np.array_equal(plain, guided)


def test_one_graph_resident_and_progress_per_step(fp32_package) -> None:
    seen: list[tuple[int, int, list[str]]] = []

    def progress(step: int, steps: int, seconds: float) -> None:
        gc.collect()
        # type(), not isinstance(): a lazy object (django.contrib.admin.site) raises on isinstance
        live = sorted(o.path.name for o in gc.get_objects() if type(o) is Session)
        seen.append((step, steps, live))
        assert seconds > 0

    gc.collect()
    result = DiffusionPipeline(fp32_package.directory).generate(GenerationRequest(PROMPT, steps=4), progress)
    assert [(s, n) for s, n, _ in seen] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert all(live == ["unet.ferry"] for _, _, live in seen)
    gc.collect()
    assert not [o for o in gc.get_objects() if type(o) is Session]
    figures = result.figures()
    assert len(result.step_seconds) == 4 and figures["seconds_per_step"] > 0
    assert figures["total_seconds"] >= sum(result.step_seconds) and figures["peak_rss_bytes"] > 0


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"width": 72}, "multiples of 16"),
        ({"height": 128}, "from 32 to 96"),
        ({"width": 16}, "from 32 to 96"),
        ({"steps": 0}, "steps"),
        ({"steps": 101}, "steps"),
        ({"guidance_scale": -1.0}, "guidance_scale"),
        ({"guidance_scale": float("nan")}, "guidance_scale"),
        ({"scheduler": "pndm"}, "not one of"),
        ({"seed": -1}, "seed"),
        ({"width": True}, "width"),
    ],
)
def test_requests_outside_the_limits_are_refused(fp32_package, change: dict, reason: str) -> None:
    pipeline = DiffusionPipeline(fp32_package.directory)
    with pytest.raises(GenerationRequestError, match=reason):
        pipeline.resolve(GenerationRequest(PROMPT, **change))
