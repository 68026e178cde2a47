"""Image agreement: PSNR and SSIM of an image against a reference (uint8 RGB, same size).

SSIM is Wang et al. 2004's: an 11-tap Gaussian window (sigma 1.5), K1 = 0.01, K2 = 0.03, over
each channel at full resolution, averaged.  Used by the converter's accuracy report (a reduced
precision image against fp32, same seed) and the device's health check (a regenerated image
against the one recorded at conversion).
"""

from __future__ import annotations

import math

import numpy as np

PEAK = 255.0


def _pair(image: np.ndarray, reference: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if image.shape != reference.shape:
        raise ValueError(f"images differ in shape: {image.shape} against {reference.shape}")
    return image.astype(np.float64), reference.astype(np.float64)


def psnr(image: np.ndarray, reference: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB (inf for identical images)."""
    a, b = _pair(image, reference)
    mse = float(np.mean((a - b) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(PEAK**2 / mse)


def _gaussian(size: int = 11, sigma: float = 1.5) -> np.ndarray:
    x = np.arange(size) - (size - 1) / 2
    w = np.exp(-(x**2) / (2 * sigma**2))
    return w / w.sum()


def _filter(plane: np.ndarray, window: np.ndarray) -> np.ndarray:
    """Separable 'valid' filtering of a 2-D plane."""
    k = len(window)
    rows = sum(window[i] * plane[i : plane.shape[0] - k + 1 + i, :] for i in range(k))
    return sum(window[i] * rows[:, i : rows.shape[1] - k + 1 + i] for i in range(k))


def ssim(image: np.ndarray, reference: np.ndarray) -> float:
    """Mean structural similarity over the channels (1.0 for identical images)."""
    a, b = _pair(image, reference)
    if a.ndim == 2:
        a, b = a[..., None], b[..., None]
    size = min(11, a.shape[0], a.shape[1])
    window = _gaussian(size, 1.5 * size / 11)
    c1, c2 = (0.01 * PEAK) ** 2, (0.03 * PEAK) ** 2
    scores = []
    for ch in range(a.shape[2]):
        x, y = a[..., ch], b[..., ch]
        mx, my = _filter(x, window), _filter(y, window)
        sxx = _filter(x * x, window) - mx * mx
        syy = _filter(y * y, window) - my * my
        sxy = _filter(x * y, window) - mx * my
        num = (2 * mx * my + c1) * (2 * sxy + c2)
        den = (mx * mx + my * my + c1) * (sxx + syy + c2)
        scores.append(float(np.mean(num / den)))
    return float(np.mean(scores))
