"""Builders for nasty test inputs: images in every mode, broken files, texts in many encodings."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image


def noise_rgb(w: int, h: int, seed: int = 0) -> np.ndarray:
    """Smooth random colours (compresses like a photo, unlike white noise)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(max(2, h // 16), max(2, w // 16), 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(small).resize((w, h), Image.Resampling.BICUBIC))


def image_bytes(arr_or_img, fmt: str = "JPEG", **save) -> bytes:
    im = arr_or_img if isinstance(arr_or_img, Image.Image) else Image.fromarray(arr_or_img)
    buf = io.BytesIO()
    im.save(buf, fmt, **save)
    return buf.getvalue()


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def photo(path: Path, w: int = 320, h: int = 240, seed: int = 0, fmt: str = "JPEG", **save) -> Path:
    return write(path, image_bytes(noise_rgb(w, h, seed), fmt, **save))
