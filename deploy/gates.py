"""Health gates: the release's devices against the devices still on the previous version.

Pure arithmetic over plain figures; the control plane gathers the figures from its
telemetry and the simulation in bench/ makes them up.

The release's cohort is the devices this release selected in the phases reached so far,
and only their telemetry on the release's version; a selected device that has not reported
yet is *pending*, not healthy. While no selected device has reported, the gate neither
passes nor fails: it is pending and the release waits. A device pinned to another version is
not the release's (the release does not assign it): the control plane leaves it out of the
cohort and out of the baseline, so its restarts or errors count against nobody.

A selected device that refused or failed the update (its agent says so at check-in: a
package signed for another device class, a failed health check, ...) is a failure, counted
in ``devices_refused`` with its reason codes; its refusal is evidence enough, so the gate
is not pending while one exists.

Inference error rate = errors / (errors + inferences): the agent's metrics payload counts
a successful inference in ``inferences`` and a failed one in ``errors`` only (see
agent/inference.py), so the attempts are their sum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields

from deploy.errors import PolicyError

ON_FAILURE = ("pause", "abort")


@dataclass(frozen=True)
class CohortFigures:
    """Telemetry of one group of devices over the gate's window."""

    devices_reporting: int = 0
    activations: int = 0
    activation_failures: int = 0
    inferences: int = 0
    errors: int = 0
    latency_ms_p95: float | None = None  # the median of the devices' p95 figures
    restarts: int = 0
    top1_histogram: Mapping[str, int] = field(default_factory=dict)
    devices_pending: int = 0  # selected devices with no report in the window yet
    records_skipped: int = 0  # malformed records left out (a field that is not a number)
    devices_refused: int = 0  # selected devices that refused, failed or rolled back the update
    refusal_reasons: Mapping[str, int] = field(default_factory=dict)  # reason code -> devices

    @property
    def activation_failure_rate(self) -> float:
        return self.activation_failures / self.activations if self.activations else 0.0

    @property
    def error_rate(self) -> float:
        """Failed share of attempted inferences: `inferences` counts successes only."""
        attempts = self.errors + self.inferences
        return self.errors / attempts if attempts else 0.0


@dataclass(frozen=True)
class GateThresholds:
    """Per-release limits; None switches a check off."""

    max_activation_failure_rate: float | None = 0.05
    max_error_rate: float | None = 0.02
    max_latency_p95_ratio: float | None = 1.5
    max_restarts_per_device: float | None = 1.0
    max_drift: float | None = None  # total variation distance of the top-1 class histograms, 0..1
    on_failure: str = "pause"

    def __post_init__(self) -> None:
        if self.on_failure not in ON_FAILURE:
            raise PolicyError(f"gate on_failure must be 'pause' or 'abort', got {self.on_failure!r}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "on_failure" or value is None:
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise PolicyError(f"gate {f.name} must be a number >= 0 or null, got {value!r}")

    @classmethod
    def from_dict(cls, data: dict | None) -> GateThresholds:
        data = data or {}
        if not isinstance(data, dict):
            raise PolicyError("a gate must be an object of thresholds")
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise PolicyError(
                f"unknown gate field(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}"
            )
        return cls(**data)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GateResult:
    passed: bool
    failures: tuple[str, ...]
    figures: dict
    pending: bool = False  # no selected device reported yet: neither healthy nor failing

    def as_dict(self) -> dict:
        return {
            "passed": self.passed,
            "pending": self.pending,
            "failures": list(self.failures),
            "figures": self.figures,
        }


def drift(release: Mapping[str, int], baseline: Mapping[str, int]) -> float | None:
    """Total variation distance between two class histograms (0 same, 1 disjoint); None if either is empty."""
    total_r, total_b = sum(release.values()), sum(baseline.values())
    if total_r <= 0 or total_b <= 0:
        return None
    classes = set(release) | set(baseline)
    return 0.5 * sum(abs(release.get(c, 0) / total_r - baseline.get(c, 0) / total_b) for c in classes)


def refusal_failure(figures: CohortFigures) -> str:
    """The gate failure that names how many devices refused or failed, and why."""
    reasons = ", ".join(f"{code or 'unknown'}: {n}" for code, n in sorted(figures.refusal_reasons.items()))
    return f"{figures.devices_refused} device(s) refused or failed the update" + (
        f" ({reasons})" if reasons else ""
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def evaluate_gate(
    thresholds: GateThresholds, release: CohortFigures, baseline: CohortFigures | None
) -> GateResult:
    """Whether the release's devices are as healthy as the thresholds ask.

    Ratios against the baseline are skipped while the baseline has no figure (a new
    fleet, or every device already moved): there is nothing to compare with then. With no
    reporting device the result is pending (passed is False, no failure): no data is not
    evidence of health.
    """
    failures: list[str] = []
    latency_ratio = None
    if baseline and release.latency_ms_p95 is not None and baseline.latency_ms_p95:
        latency_ratio = release.latency_ms_p95 / baseline.latency_ms_p95
    restarts_per_device = release.restarts / release.devices_reporting if release.devices_reporting else 0.0
    drift_value = drift(release.top1_histogram, baseline.top1_histogram) if baseline else None
    checks = [
        ("activation failure rate", release.activation_failure_rate, thresholds.max_activation_failure_rate),
        ("inference error rate", release.error_rate, thresholds.max_error_rate),
        ("p95 latency ratio", latency_ratio, thresholds.max_latency_p95_ratio),
        ("restarts per device", restarts_per_device, thresholds.max_restarts_per_device),
        ("output drift", drift_value, thresholds.max_drift),
    ]
    if release.devices_refused:
        failures.append(refusal_failure(release))
    for name, value, limit in checks:
        if value is not None and limit is not None and value > limit:
            failures.append(f"{name} {value:.4g} > {limit:.4g}")
    figures = {
        "devices_reporting": release.devices_reporting,
        "devices_pending": release.devices_pending,
        "records_skipped": release.records_skipped,
        "devices_refused": release.devices_refused,
        "refusal_reasons": dict(release.refusal_reasons),
        "baseline_devices_reporting": baseline.devices_reporting if baseline else 0,
        "activation_failure_rate": _round(release.activation_failure_rate),
        "error_rate": _round(release.error_rate),
        "baseline_error_rate": _round(baseline.error_rate) if baseline else None,
        "latency_ms_p95": _round(release.latency_ms_p95),
        "baseline_latency_ms_p95": _round(baseline.latency_ms_p95) if baseline else None,
        "latency_p95_ratio": _round(latency_ratio),
        "restarts_per_device": _round(restarts_per_device),
        "drift": _round(drift_value),
    }
    pending = release.devices_reporting == 0 and not release.devices_refused
    return GateResult(
        passed=not failures and not pending, failures=tuple(failures), figures=figures, pending=pending
    )
