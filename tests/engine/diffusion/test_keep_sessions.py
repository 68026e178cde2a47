"""keep_sessions: the three graphs' Sessions stay loaded across images (same images, the same
Session objects reused), and release() drops them; the default still loads one graph at a time."""

from __future__ import annotations

import gc

import numpy as np

from engine import Session
from engine.diffusion.pipeline import DiffusionPipeline, GenerationRequest

REQUEST = GenerationRequest(
    "a red ferry on the sea", width=64, height=48, steps=3, guidance_scale=5.0, seed=9
)


def _live_sessions() -> list[str]:
    gc.collect()
    return sorted(
        o.path.name for o in gc.get_objects() if issubclass(type(o), Session)
    )  # type(): lazy objects lie


def _assert_same_image(image: np.ndarray, expected: np.ndarray) -> None:
    difference = np.abs(image.astype(np.int16) - expected.astype(np.int16))
    assert difference.max() <= 1, difference.max()
    assert np.count_nonzero(difference) <= difference.size // 1000


def test_kept_sessions_are_reused_and_give_the_same_image(fp32_package) -> None:
    plain = DiffusionPipeline(fp32_package.directory).generate(REQUEST).image
    assert _live_sessions() == []
    pipe = DiffusionPipeline(fp32_package.directory, keep_sessions=True)
    first = pipe.generate(REQUEST).image
    kept = dict(pipe._kept)
    assert sorted(kept) == ["text_encoder", "unet", "vae_decoder"]
    second = pipe.generate(REQUEST).image
    assert all(pipe._kept[name] is session for name, session in kept.items())
    # Each Session measures its own kernel candidates (numpy or JIT), which agree within float
    # tolerance, so two Sessions' images may differ by a rounding step in a rare pixel.
    _assert_same_image(first, plain)
    _assert_same_image(second, plain)
    del kept
    assert len(_live_sessions()) == 3
    pipe.release()
    assert _live_sessions() == []


def test_default_keeps_no_session_between_graphs(fp32_package) -> None:
    live: list[list[str]] = []
    pipe = DiffusionPipeline(fp32_package.directory)
    pipe.generate(REQUEST, progress=lambda step, steps, seconds: live.append(_live_sessions()))
    assert all(names == ["unet.ferry"] for names in live)
    assert pipe._kept == {} and _live_sessions() == []
