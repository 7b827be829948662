"""Geometry: EXIF orientation, the DCT-domain shrink a JPEG can take, and the final resize.

Quality rules (tests/test_resize.py holds them):

* The final filter is LANCZOS (Pillow's is antialiased: its support grows with the shrink
  factor), so fine detail turns smooth, never into moire.
* A JPEG may be shrunk in the DCT domain first (1/2, 1/4, 1/8: libjpeg-turbo's SIMD scaled
  IDCTs), but only while the shrunk image keeps at least `DCT_HEADROOM` times the pixels the
  output needs along each axis. Shrinking further aliases visibly: a zone plate shrunk to 1x the
  target in the DCT domain scores 19-29 dB against a full-resolution LANCZOS, at 1.5x it scores
  36 dB or more and photos 47 dB or more.
* Big non-JPEG images are box-reduced by an integer factor first only while LANCZOS still has
  `REDUCING_GAP` times the target to work with (Pillow: indistinguishable from a full LANCZOS).
"""

from __future__ import annotations

import math

from PIL import Image

DCT_HEADROOM = 1.5
REDUCING_GAP = 3.0
LANCZOS = Image.Resampling.LANCZOS

# EXIF orientation -> the transpose that makes the image upright (as ImageOps.exif_transpose)
_ORIENT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def orient(im: Image.Image, orientation: int | None) -> Image.Image:
    t = _ORIENT.get(orientation or 1)
    return im.transpose(t) if t is not None else im


def swaps_axes(orientation: int | None) -> bool:
    return orientation in (5, 6, 7, 8)


def content_size(w: int, h: int, size: int, mode: str) -> tuple[int, int]:
    """The size the whole (upright) image is scaled to before padding or cropping."""
    if mode == "stretch":
        return size, size
    scale = size / (max(w, h) if mode == "pad" else min(w, h))
    return max(1, round(w * scale)), max(1, round(h * scale))


def dct_shrink(w: int, h: int, size: int, mode: str, orientation: int | None = None) -> int:
    """The largest JPEG DCT shrink (1, 2, 4 or 8) that keeps `DCT_HEADROOM` x the output's pixels.

    ``w``, ``h`` are the stored (not yet oriented) dimensions.
    """
    uw, uh = (h, w) if swaps_axes(orientation) else (w, h)
    cw, ch = content_size(uw, uh, size, mode)
    for f in (8, 4, 2):
        if math.ceil(uw / f) >= DCT_HEADROOM * cw and math.ceil(uh / f) >= DCT_HEADROOM * ch:
            return f
    return 1


def fit(im: Image.Image, size: int, mode: str, background: tuple[int, int, int]) -> Image.Image:
    """Resize an upright RGB image to ``size`` x ``size``: pad (letterbox), crop (centre) or stretch."""
    w, h = im.size
    if mode == "stretch":
        return _resize(im, (size, size))
    cw, ch = content_size(w, h, size, mode)
    if mode == "crop":
        # crop in source coordinates, resample only the part that is kept
        sx, sy = w / cw, h / ch
        left, top = (cw - size) // 2, (ch - size) // 2
        box = (left * sx, top * sy, (left + size) * sx, (top + size) * sy)
        return _resize(im, (size, size), box)
    scaled = _resize(im, (cw, ch))
    if (cw, ch) == (size, size):
        return scaled
    canvas = Image.new("RGB", (size, size), background)
    canvas.paste(scaled, ((size - cw) // 2, (size - ch) // 2))
    return canvas


def _resize(im: Image.Image, size: tuple[int, int], box=None) -> Image.Image:
    if box is None and im.size == size:
        return im
    return im.resize(size, LANCZOS, box=box, reducing_gap=REDUCING_GAP)
