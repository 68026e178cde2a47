"""PNG without Pillow: an 8-bit RGB image as filter-0 rows in one zlib stream."""

from __future__ import annotations

import struct
import zlib

import numpy as np

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def encode_png(image: np.ndarray, level: int = 6) -> bytes:
    """The PNG of a uint8 [height, width, 3] array."""
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"encode_png wants uint8 [height, width, 3], got {image.dtype} {image.shape}")
    height, width, _ = image.shape
    # every row starts with its filter byte (0: none), then the row's RGB bytes
    rows = np.zeros((height, 1 + width * 3), np.uint8)
    rows[:, 1:] = image.reshape(height, width * 3)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        SIGNATURE
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(rows.tobytes(), level))
        + _chunk(b"IEND", b"")
    )
