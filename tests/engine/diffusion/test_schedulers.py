"""The schedulers against a plain per-element reference of their published update rules
(float64 scalars, written from the papers / k-diffusion, not from engine/diffusion), and against
diffusers' own schedulers when diffusers is installed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.diffusion.errors import SchedulerConfigError
from engine.diffusion.schedule import ScheduleConfig, alphas_cumprod
from engine.diffusion.schedulers import NAMES, make_scheduler

SD = {
    "_class_name": "PNDMScheduler",
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "num_train_timesteps": 1000,
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
    "clip_sample": False,
}
SHAPE = (1, 4, 3, 2)


def model(sample: np.ndarray, t: float) -> np.ndarray:
    """A stand-in for the UNet: smooth in the sample and the timestep."""
    return (0.3 * sample + np.sin(0.01 * t + np.arange(sample.size).reshape(sample.shape))).astype(np.float32)


def noises(count: int, seed: int = 7) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(count)]


def run_ferry(name: str, config: dict, steps: int, start: np.ndarray, noise: list[np.ndarray]) -> np.ndarray:
    scheduler = make_scheduler(name, config, steps)
    x = start * np.float32(scheduler.init_noise_sigma)
    for i, t in enumerate(scheduler.timesteps):
        out = model(scheduler.scale_model_input(x, i), float(t))
        x = scheduler.step(out, i, x, noise[i] if scheduler.needs_noise else None)
    return x


# -- the plain references: one element at a time, float64, from the papers ---------------------


def ref_ddim(config: dict, timesteps: list[int], start: np.ndarray) -> np.ndarray:
    ac = alphas_cumprod(ScheduleConfig.from_dict(config)).astype(np.float64)
    n = config["num_train_timesteps"]
    x = start.astype(np.float64).copy()
    for t in timesteps:
        eps = model(x.astype(np.float32), t).astype(np.float64)
        prev = t - n // len(timesteps)
        a_t, a_prev = ac[t], (ac[prev] if prev >= 0 else ac[0])
        for k in np.ndindex(x.shape):  # Song et al. eq. 12 with sigma_t = 0
            x0 = (x[k] - math.sqrt(1 - a_t) * eps[k]) / math.sqrt(a_t)
            x[k] = math.sqrt(a_prev) * x0 + math.sqrt(1 - a_prev) * eps[k]
    return x


def ref_euler_ancestral(sigmas: list[float], timesteps: list[float], start, noise) -> np.ndarray:
    x = start.astype(np.float64) * max(sigmas)  # k-diffusion: x = noise * sigma_max
    for i, t in enumerate(timesteps):
        s, s_next = sigmas[i], sigmas[i + 1]
        c_in = 1 / math.sqrt(s * s + 1)
        eps = model((x * c_in).astype(np.float32), t).astype(np.float64)
        up = min(s_next, math.sqrt(s_next**2 * (s**2 - s_next**2) / s**2))
        down = math.sqrt(s_next**2 - up**2)
        for k in np.ndindex(x.shape):
            denoised = x[k] - s * eps[k]
            d = (x[k] - denoised) / s
            x[k] = x[k] + d * (down - s) + noise[i][k] * up
    return x


def ref_dpmpp_2m(sigmas: list[float], timesteps: list[int], start: np.ndarray) -> np.ndarray:
    """k-diffusion's sample_dpmpp_2m in the variance-exploding space (x_ve = x_vp / alpha)."""
    x_ve = start.astype(np.float64) * math.sqrt(sigmas[0] ** 2 + 1)
    old = None
    for i, t in enumerate(timesteps):
        s, s_next = sigmas[i], sigmas[i + 1]
        eps = model((x_ve / math.sqrt(s * s + 1)).astype(np.float32), t).astype(np.float64)
        denoised = x_ve - s * eps
        if s_next == 0:
            x_ve = denoised
        else:
            h = math.log(s) - math.log(s_next)
            if old is None or i == len(timesteps) - 1:
                x_ve = (s_next / s) * x_ve - math.expm1(-h) * denoised
            else:
                h_last = math.log(sigmas[i - 1]) - math.log(s)
                r = h_last / h
                d = (1 + 1 / (2 * r)) * denoised - (1 / (2 * r)) * old
                x_ve = (s_next / s) * x_ve - math.expm1(-h) * d
        old = denoised
    return x_ve / math.sqrt(sigmas[-1] ** 2 + 1)


def test_timesteps_follow_the_spacings() -> None:
    assert list(make_scheduler("ddim", SD, 50).timesteps[[0, 1, -1]]) == [981, 961, 1]
    assert list(make_scheduler("dpmpp_2m", SD, 20).timesteps[[0, -1]]) == [999, 50]
    euler = make_scheduler("euler_a", SD, 20)
    assert euler.timesteps[0] == 999.0 and euler.timesteps[-1] == 0.0
    trailing = make_scheduler("ddim", {**SD, "timestep_spacing": "trailing"}, 10)
    assert list(trailing.timesteps[[0, -1]]) == [999, 99]
    assert euler.sigmas[-1] == 0 and euler.init_noise_sigma == pytest.approx(float(euler.sigmas[0]))


@pytest.mark.parametrize("steps", [1, 5, 12])
def test_ddim_matches_the_paper(steps: int) -> None:
    start = noises(1, 3)[0]
    ferry = run_ferry("ddim", SD, steps, start, [])
    timesteps = [int(t) for t in make_scheduler("ddim", SD, steps).timesteps]
    np.testing.assert_allclose(ferry, ref_ddim(SD, timesteps, start), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("steps", [2, 6, 20])
def test_euler_ancestral_matches_k_diffusion(steps: int) -> None:
    start, noise = noises(1, 4)[0], noises(steps, 5)
    scheduler = make_scheduler("euler_a", SD, steps)
    expected = ref_euler_ancestral(
        [float(s) for s in scheduler.sigmas], [float(t) for t in scheduler.timesteps], start, noise
    )
    np.testing.assert_allclose(run_ferry("euler_a", SD, steps, start, noise), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("steps", [1, 2, 5, 20])
def test_dpmpp_2m_matches_k_diffusion(steps: int) -> None:
    start = noises(1, 6)[0]
    scheduler = make_scheduler("dpmpp_2m", SD, steps)
    expected = ref_dpmpp_2m(
        [float(s) for s in scheduler.sigmas], [int(t) for t in scheduler.timesteps], start
    )
    np.testing.assert_allclose(run_ferry("dpmpp_2m", SD, steps, start, []), expected, rtol=1e-4, atol=1e-4)


def test_v_prediction_differs_and_stays_finite() -> None:
    start = noises(1, 8)[0]
    for name in NAMES:
        eps = run_ferry(name, SD, 4, start, noises(4))
        v = run_ferry(name, {**SD, "prediction_type": "v_prediction"}, 4, start, noises(4))
        assert np.isfinite(v).all() and not np.allclose(eps, v)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"beta_schedule": "sigmoid"}, "beta_schedule"),
        ({"prediction_type": "sample"}, "prediction_type"),
        ({"timestep_spacing": "karras"}, "timestep_spacing"),
        ({"rescale_betas_zero_snr": True}, "rescale_betas_zero_snr"),
        ({"use_karras_sigmas": True}, "use_karras_sigmas"),
        ({"beta_start": 0.5, "beta_end": 0.1}, "beta_start"),
    ],
)
def test_unsupported_configs_are_refused_by_name(change: dict, field: str) -> None:
    with pytest.raises(SchedulerConfigError, match=field):
        make_scheduler("ddim", {**SD, **change}, 10)


def test_bad_names_and_steps_are_refused() -> None:
    with pytest.raises(SchedulerConfigError, match="not one of"):
        make_scheduler("pndm", SD, 10)
    with pytest.raises(SchedulerConfigError, match="steps"):
        make_scheduler("ddim", SD, 0)


# -- against diffusers itself, when it is installed -------------------------------------------

CLASSES = {
    "ddim": "DDIMScheduler",
    "euler_a": "EulerAncestralDiscreteScheduler",
    "dpmpp_2m": "DPMSolverMultistepScheduler",
}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("prediction", ["epsilon", "v_prediction"])
@pytest.mark.parametrize("spacing", [None, "leading", "trailing", "linspace"])
def test_matches_diffusers(name: str, prediction: str, spacing: str | None) -> None:
    diffusers = pytest.importorskip("diffusers")
    torch = pytest.importorskip("torch")
    config = {**SD, "prediction_type": prediction}
    if spacing:
        config["timestep_spacing"] = spacing
    theirs = getattr(diffusers, CLASSES[name]).from_config(config)
    steps = 8
    theirs.set_timesteps(steps)
    ours = make_scheduler(name, config, steps)
    np.testing.assert_allclose(ours.timesteps, theirs.timesteps.numpy(), rtol=0, atol=1e-3)
    start = noises(1, 9)[0]
    generator = torch.Generator().manual_seed(11)
    x_theirs = torch.from_numpy(start) * theirs.init_noise_sigma
    x_ours = start * np.float32(ours.init_noise_sigma)
    noise_generator = torch.Generator().manual_seed(11)  # the same draws diffusers makes
    for i, t in enumerate(theirs.timesteps):
        out = model(theirs.scale_model_input(x_theirs, t).numpy(), float(t))
        x_theirs = theirs.step(torch.from_numpy(out), t, x_theirs, generator=generator).prev_sample
        noise = (
            torch.randn(SHAPE, generator=noise_generator, dtype=torch.float32).numpy()
            if ours.needs_noise
            else None
        )
        out = model(ours.scale_model_input(x_ours, i), float(ours.timesteps[i]))
        x_ours = ours.step(out, i, x_ours, noise)
        np.testing.assert_allclose(x_ours, x_theirs.numpy(), rtol=1e-4, atol=1e-4, err_msg=f"step {i}")
