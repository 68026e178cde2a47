"""The noise schedule shared by every scheduler: betas, the cumulative alphas, and which training
timesteps a run of N inference steps visits.

The config has the shape of diffusers' ``scheduler_config.json`` (beta_start, beta_end,
beta_schedule, num_train_timesteps, prediction_type, timestep_spacing, steps_offset, ...), so a
package carries the file its model was exported with.  Fields this runtime does not implement
(trained betas, zero-SNR rescaling, thresholding, Karras sigmas) are refused by name rather than
ignored: ignoring one would produce plausible but wrong images.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.diffusion.errors import SchedulerConfigError

BETA_SCHEDULES = ("linear", "scaled_linear", "squaredcos_cap_v2")
PREDICTION_TYPES = ("epsilon", "v_prediction")
SPACINGS = ("linspace", "leading", "trailing")
# Flags whose non-default value changes the maths; refused rather than silently dropped.
UNSUPPORTED_FLAGS = {
    "trained_betas": None,
    "rescale_betas_zero_snr": False,
    "thresholding": False,
    "use_karras_sigmas": False,
    "use_exponential_sigmas": False,
    "use_beta_sigmas": False,
    "use_lu_lambdas": False,
    "use_flow_sigmas": False,
}


@dataclass(frozen=True)
class ScheduleConfig:
    num_train_timesteps: int = 1000
    beta_start: float = 0.00085
    beta_end: float = 0.012
    beta_schedule: str = "scaled_linear"
    prediction_type: str = "epsilon"
    timestep_spacing: str | None = None  # None: the scheduler's own default (as diffusers)
    steps_offset: int = 0
    set_alpha_to_one: bool = False  # DDIM: the last step's "previous" alpha
    clip_sample: bool = False  # DDIM: clip the predicted x0
    clip_sample_range: float = 1.0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScheduleConfig:
        """A config from scheduler_config.json's object; unknown keys are ignored (they are
        diffusers bookkeeping such as ``_class_name``), unsupported maths is refused."""
        if not isinstance(data, dict):
            raise SchedulerConfigError("scheduler_config.json must hold a JSON object")
        for key, default in UNSUPPORTED_FLAGS.items():
            if data.get(key, default) not in (default, None):
                raise SchedulerConfigError(f"scheduler_config.json: {key}={data[key]!r} is not supported")
        fields = {f: data[f] for f in cls.__dataclass_fields__ if f in data and data[f] is not None}
        try:
            config = cls(**fields)
            config.check()
        except (TypeError, ValueError) as exc:
            raise SchedulerConfigError(f"scheduler_config.json: {exc}") from exc
        return config

    def check(self) -> None:
        if not isinstance(self.num_train_timesteps, int) or not 2 <= self.num_train_timesteps <= 100_000:
            raise ValueError(f"num_train_timesteps={self.num_train_timesteps!r} must be an int in [2, 1e5]")
        if self.beta_schedule not in BETA_SCHEDULES:
            raise ValueError(f"beta_schedule={self.beta_schedule!r} is not one of {BETA_SCHEDULES}")
        if self.prediction_type not in PREDICTION_TYPES:
            raise ValueError(
                f"prediction_type={self.prediction_type!r} is not one of {', '.join(PREDICTION_TYPES)}"
            )
        if self.timestep_spacing is not None and self.timestep_spacing not in SPACINGS:
            raise ValueError(f"timestep_spacing={self.timestep_spacing!r} is not one of {SPACINGS}")
        if not 0 < float(self.beta_start) < float(self.beta_end) < 1:
            raise ValueError(f"need 0 < beta_start ({self.beta_start}) < beta_end ({self.beta_end}) < 1")

    def spacing(self, default: str) -> str:
        return self.timestep_spacing or default


def betas(config: ScheduleConfig) -> np.ndarray:
    """The training betas, float32 (as diffusers keeps them)."""
    n = config.num_train_timesteps
    if config.beta_schedule == "linear":
        return np.linspace(config.beta_start, config.beta_end, n, dtype=np.float32)
    if config.beta_schedule == "scaled_linear":  # Stable Diffusion's
        return (np.linspace(config.beta_start**0.5, config.beta_end**0.5, n, dtype=np.float32) ** 2).astype(
            np.float32
        )

    def alpha_bar(t: float) -> float:  # Nichol & Dhariwal's cosine schedule
        return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

    return np.array(
        [min(1 - alpha_bar((i + 1) / n) / alpha_bar(i / n), 0.999) for i in range(n)], dtype=np.float32
    )


def alphas_cumprod(config: ScheduleConfig) -> np.ndarray:
    """prod_{s<=t} (1 - beta_s), float32."""
    return np.cumprod(1.0 - betas(config).astype(np.float64)).astype(np.float32)


def check_steps(steps: int, config: ScheduleConfig) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= config.num_train_timesteps:
        raise SchedulerConfigError(
            f"steps={steps!r} must be an int in [1, num_train_timesteps={config.num_train_timesteps}]"
        )
