"""Perceptual image hashes for near-duplicate search.

`phash` is the classic 64-bit DCT hash: grey, 32x32, 2-D DCT, the 8x8 lowest frequencies
(without DC) compared with their median. Robust to re-encoding, scaling and small brightness
changes; Hamming distance between hashes measures how alike two images look.
"""

from __future__ import annotations

import numpy as np
from PIL import Image


def _dct_matrix(n: int) -> np.ndarray:
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    m = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * np.sqrt(2 / n)
    m[0] /= np.sqrt(2)
    return m


_D32 = _dct_matrix(32)


def phash(im: Image.Image) -> int:
    """64-bit perceptual hash of an image (any mode)."""
    grey = np.asarray(im.convert("L").resize((32, 32), Image.Resampling.BOX), dtype=np.float64)
    coeffs = _D32 @ grey @ _D32.T
    low = coeffs[:8, :8].flatten()
    bits = low > np.median(low[1:])
    return int(np.packbits(bits).view(">u8")[0])


def hamming(a: int, b: int) -> int:
    return (a ^ b).bit_count()
