"""Ferry's own samplers, written from their published update rules:

- DDIM (Song et al. 2020, eq. 12), deterministic at eta=0;
- Euler ancestral (Karras et al. 2022's Euler step on the sigma ODE with k-diffusion's ancestral
  noise split: sigma_up for fresh noise, sigma_down for the deterministic part);
- DPM-Solver++ 2M (Lu et al. 2022, multistep second order, midpoint form, first order on the
  first and last steps).

Each follows diffusers' conventions (timestep spacing, the sigmas a run visits, the model-input
scaling, the first/last-step special cases), so for the same config, model outputs and noise
they give diffusers' samples within float tolerance (tests/engine/diffusion checks both that
and a plain per-element reference of the update rules).  Coefficients are computed in float64
from the float32 schedule; samples stay float32.

A scheduler is driven by index: ``timesteps[i]`` is what the UNet is told, the sample is
scaled by ``scale_model_input(sample, i)`` before the UNet, and ``step(output, i, sample,
noise)`` returns the next sample.  Samplers that add fresh noise (Euler ancestral, DDIM with
eta > 0) say so with ``needs_noise``; the pipeline draws it from the request's seeded generator.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.diffusion.errors import SchedulerConfigError
from engine.diffusion.schedule import ScheduleConfig, alphas_cumprod, check_steps

NAMES = ("ddim", "euler_a", "dpmpp_2m")
DEFAULT = "dpmpp_2m"


class Scheduler:
    name = ""
    needs_noise = False
    default_spacing = "linspace"

    def __init__(self, config: ScheduleConfig, steps: int) -> None:
        check_steps(steps, config)
        self.config = config
        self.steps = steps
        self.spacing = config.spacing(self.default_spacing)
        self.alphas_cumprod = alphas_cumprod(config)
        self.init_noise_sigma = 1.0
        self.timesteps = np.zeros(0)

    def scale_model_input(self, sample: np.ndarray, index: int) -> np.ndarray:
        return sample

    def step(
        self, model_output: np.ndarray, index: int, sample: np.ndarray, noise: np.ndarray | None = None
    ) -> np.ndarray:
        raise NotImplementedError

    def _need(self, noise: np.ndarray | None, sample: np.ndarray) -> np.ndarray:
        if noise is None or noise.shape != sample.shape:
            raise ValueError(f"{self.name} needs noise of the sample's shape {sample.shape} at each step")
        return noise

    def _sigmas(self, timesteps: np.ndarray) -> np.ndarray:
        """sqrt((1 - abar) / abar) interpolated at the (possibly fractional) timesteps, then 0."""
        ac = self.alphas_cumprod.astype(np.float64)
        table = ((1 - ac) / ac) ** 0.5
        sigmas = np.interp(timesteps.astype(np.float64), np.arange(len(table)), table)
        return np.concatenate([sigmas, [0.0]]).astype(np.float32)


def _spaced(spacing: str, n_train: int, count: int, offset: int) -> np.ndarray:
    """``count`` descending training timesteps by diffusers' three spacings (float64)."""
    if spacing == "linspace":
        return np.linspace(0, n_train - 1, count)[::-1].copy()
    if spacing == "leading":
        return (np.arange(0, count) * (n_train // count)).round()[::-1].astype(np.float64) + offset
    return np.round(np.arange(n_train, 0, -n_train / count)).astype(np.float64) - 1  # trailing


class DDIM(Scheduler):
    name = "ddim"
    default_spacing = "leading"

    def __init__(self, config: ScheduleConfig, steps: int, eta: float = 0.0) -> None:
        super().__init__(config, steps)
        n = config.num_train_timesteps
        spaced = _spaced(self.spacing, n, steps, config.steps_offset)
        if self.spacing == "linspace":
            spaced = spaced.round()
        self.timesteps = spaced.astype(np.int64)
        self.eta = float(eta)
        self.needs_noise = self.eta > 0
        self.final_alpha = 1.0 if config.set_alpha_to_one else float(self.alphas_cumprod[0])

    def step(
        self, model_output: np.ndarray, index: int, sample: np.ndarray, noise: np.ndarray | None = None
    ) -> np.ndarray:
        t = int(self.timesteps[index])
        prev = t - self.config.num_train_timesteps // self.steps
        a_t = float(self.alphas_cumprod[t])
        a_prev = float(self.alphas_cumprod[prev]) if prev >= 0 else self.final_alpha
        b_t = 1.0 - a_t
        x0, eps = _x0_and_eps(self.config.prediction_type, model_output, sample, a_t**0.5, b_t**0.5)
        if self.config.clip_sample:
            r = self.config.clip_sample_range
            x0 = np.clip(x0, -r, r)
        variance = ((1 - a_prev) / b_t) * (1 - a_t / a_prev)
        std = self.eta * variance**0.5
        direction = (1 - a_prev - std**2) ** 0.5
        out = np.float32(a_prev**0.5) * x0 + np.float32(direction) * eps
        if self.eta > 0:
            out += np.float32(std) * self._need(noise, sample)
        return out.astype(np.float32, copy=False)


def _x0_and_eps(
    prediction: str, output: np.ndarray, sample: np.ndarray, alpha: float, sigma: float
) -> tuple[np.ndarray, np.ndarray]:
    """The predicted clean sample and noise from the model's output (VP parametrisation)."""
    a, s = np.float32(alpha), np.float32(sigma)
    if prediction == "epsilon":
        return (sample - s * output) / a, output
    return a * sample - s * output, a * output + s * sample  # v-prediction


class EulerAncestral(Scheduler):
    name = "euler_a"
    needs_noise = True

    def __init__(self, config: ScheduleConfig, steps: int) -> None:
        super().__init__(config, steps)
        spaced = _spaced(self.spacing, config.num_train_timesteps, steps, config.steps_offset)
        self.sigmas = self._sigmas(spaced)
        self.timesteps = spaced.astype(np.float32)
        top = float(self.sigmas.max())
        self.init_noise_sigma = top if self.spacing in ("linspace", "trailing") else (top**2 + 1) ** 0.5

    def scale_model_input(self, sample: np.ndarray, index: int) -> np.ndarray:
        sigma = float(self.sigmas[index])
        return (sample / np.float32((sigma**2 + 1) ** 0.5)).astype(np.float32, copy=False)

    def step(
        self, model_output: np.ndarray, index: int, sample: np.ndarray, noise: np.ndarray | None = None
    ) -> np.ndarray:
        sigma, sigma_next = float(self.sigmas[index]), float(self.sigmas[index + 1])
        if self.config.prediction_type == "epsilon":
            x0 = sample - np.float32(sigma) * model_output
        else:
            x0 = model_output * np.float32(-sigma / (sigma**2 + 1) ** 0.5) + sample / np.float32(sigma**2 + 1)
        sigma_up = (sigma_next**2 * (sigma**2 - sigma_next**2) / sigma**2) ** 0.5
        sigma_down = max(sigma_next**2 - sigma_up**2, 0.0) ** 0.5
        derivative = (sample - x0) / np.float32(sigma)
        out = sample + derivative * np.float32(sigma_down - sigma)
        out += self._need(noise, sample) * np.float32(sigma_up)
        return out.astype(np.float32, copy=False)


class DPMSolverPP2M(Scheduler):
    name = "dpmpp_2m"

    def __init__(self, config: ScheduleConfig, steps: int) -> None:
        super().__init__(config, steps)
        n = config.num_train_timesteps
        if self.spacing == "linspace":
            spaced = np.linspace(0, n - 1, steps + 1).round()[::-1][:-1].copy()
        elif self.spacing == "leading":
            ratio = n // (steps + 1)
            spaced = (np.arange(0, steps + 1) * ratio).round()[::-1][:-1].astype(np.float64)
            spaced += config.steps_offset
        else:
            spaced = _spaced("trailing", n, steps, 0)
        self.timesteps = spaced.astype(np.int64)
        self.sigmas = self._sigmas(self.timesteps)
        self._previous: np.ndarray | None = None  # the last step's x0 prediction
        self._taken = 0

    @staticmethod
    def _alpha_sigma_lambda(sigma: float) -> tuple[float, float, float]:
        alpha = 1.0 / (sigma**2 + 1) ** 0.5
        sigma_t = sigma * alpha
        lam = math.log(alpha) - math.log(sigma_t) if sigma_t > 0 else math.inf
        return alpha, sigma_t, lam

    def step(
        self, model_output: np.ndarray, index: int, sample: np.ndarray, noise: np.ndarray | None = None
    ) -> np.ndarray:
        if index != self._taken:
            raise ValueError(f"dpmpp_2m steps must run in order (got {index}, want {self._taken})")
        alpha_s, sigma_s, lam_s = self._alpha_sigma_lambda(float(self.sigmas[index]))
        alpha_t, sigma_t, lam_t = self._alpha_sigma_lambda(float(self.sigmas[index + 1]))
        x0, _ = _x0_and_eps(self.config.prediction_type, model_output, sample, alpha_s, sigma_s)
        last = index == len(self.timesteps) - 1
        previous, self._previous = self._previous, x0
        self._taken += 1
        if math.isinf(lam_t):  # sigma 0: the step lands on the x0 prediction
            return x0.astype(np.float32, copy=False)
        h = lam_t - lam_s
        decay = alpha_t * math.expm1(-h)  # alpha_t (e^-h - 1)
        if previous is None or last:  # first order (DPM-Solver++ 1 = DDIM)
            out = np.float32(sigma_t / sigma_s) * sample - np.float32(decay) * x0
            return out.astype(np.float32, copy=False)
        _, _, lam_prev = self._alpha_sigma_lambda(float(self.sigmas[index - 1]))
        r0 = (lam_s - lam_prev) / h
        d1 = np.float32(1.0 / r0) * (x0 - previous)
        out = np.float32(sigma_t / sigma_s) * sample - np.float32(decay) * x0 - np.float32(0.5 * decay) * d1
        return out.astype(np.float32, copy=False)


def make_scheduler(name: str, config: ScheduleConfig | dict[str, Any], steps: int) -> Scheduler:
    """A fresh scheduler (they hold per-run state) for ``steps`` inference steps."""
    if isinstance(config, dict):
        config = ScheduleConfig.from_dict(config)
    if name == "ddim":
        return DDIM(config, steps)
    if name == "euler_a":
        return EulerAncestral(config, steps)
    if name == "dpmpp_2m":
        return DPMSolverPP2M(config, steps)
    raise SchedulerConfigError(f"scheduler {name!r} is not one of {', '.join(NAMES)}")
