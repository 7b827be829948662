"""Geometry: EXIF orientation, the DCT-domain shrink a JPEG can take, and the final resize.

Quality rules (tests/pipeline/media/image/test_resize.py holds them):

* The final filter is Lanczos-3, antialiased (its support grows with the shrink factor), so
  fine detail turns smooth, never into moire. It runs in fast_image_resize (the Rust crate,
  through cykooz-resizer: the same convolution as Pillow's LANCZOS, with SIMD, 5-7x faster;
  outputs agree with Pillow's to 54-56 dB and are bit-identical with AVX2, SSE4.1 or no SIMD).
* A JPEG may be shrunk in the DCT domain first (libjpeg-turbo scales by any M/8), but only
  while the shrunk image keeps at least `DCT_HEADROOM` times the pixels the output needs along
  each axis. Shrinking further aliases visibly: a zone plate shrunk to 1x the target in the
  DCT domain scores 19-29 dB against a full-resolution LANCZOS, at 1.5x it scores 36 dB or
  more and photos 47 dB or more. Among the factors the rule allows, `dct_scale` takes the one
  with the least decode + resize work (`DECODE_COST`).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

DCT_HEADROOM = 1.5
# Time of a libjpeg-turbo decode scaled by M/8, relative to the full decode of the same file,
# and of the Lanczos resize per source pixel, relative to a full decode per pixel. Measured
# (CPU time, best of 12) on camera-like JPEGs of 2048x1536 and 1024x768 (the two agreed to
# within 0.05): 1/8 is DC only, 1/4 and 1/2 have SIMD IDCTs, 3/8, 5/8, 3/4 and 7/8 plain C ones
# that cost more than the full (SIMD) decode. Entropy decoding (~0.6) is paid at every scale.
DECODE_COST = {1: 0.60, 2: 0.70, 3: 0.87, 4: 0.80, 5: 1.27, 6: 1.50, 7: 1.85, 8: 1.00}
RESIZE_COST = 0.55

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


def dct_scale(w: int, h: int, size: int, mode: str, orientation: int | None = None) -> int:
    """The JPEG DCT scale M (the image is decoded at M/8) that keeps `DCT_HEADROOM` x the
    output's pixels on each axis, and among those the cheapest to decode and resize.

    ``w``, ``h`` are the stored (not yet oriented) dimensions; libjpeg's scaled size is
    ceil(w * M / 8) x ceil(h * M / 8).
    """
    uw, uh = (h, w) if swaps_axes(orientation) else (w, h)
    cw, ch = content_size(uw, uh, size, mode)
    allowed = [m for m in range(1, 9)
               if -(-uw * m // 8) >= DCT_HEADROOM * cw and -(-uh * m // 8) >= DCT_HEADROOM * ch]
    if not allowed:
        return 8
    return min(allowed, key=lambda m: (DECODE_COST[m] + RESIZE_COST * (m / 8) ** 2, m))


def scaled_size(w: int, h: int, m: int) -> tuple[int, int]:
    """The size libjpeg-turbo decodes a ``w`` x ``h`` JPEG to at scale ``m``/8."""
    return -(-w * m // 8), -(-h * m // 8)


def fit(im: Image.Image, size: int, mode: str, background: tuple[int, int, int]) -> Image.Image:
    """Resize an upright RGB image to ``size`` x ``size``: pad (letterbox), crop (centre) or stretch."""
    return fit_and_picture(im, size, mode, background)[0]


def fit_and_picture(im: Image.Image | np.ndarray, size: int, mode: str,
                    background: tuple[int, int, int]) -> tuple[Image.Image, Image.Image | None]:
    """`fit`, and the whole picture as it was scaled on the way (pad: before the bars; stretch:
    the output itself; crop: None, only the part that is kept is resampled). ``im``: an upright
    RGB image, or its pixels as an (H, W, 3) uint8 array (resized without a Pillow copy first)."""
    w, h = _size(im)
    if mode == "stretch":
        out = _resize(im, (size, size))
        return out, out
    cw, ch = content_size(w, h, size, mode)
    if mode == "crop":
        # crop in source coordinates, resample only the part that is kept
        sx, sy = w / cw, h / ch
        left, top = (cw - size) // 2, (ch - size) // 2
        box = (left * sx, top * sy, (left + size) * sx, (top + size) * sy)
        return _resize(im, (size, size), box), None
    scaled = _resize(im, (cw, ch))
    if (cw, ch) == (size, size):
        return scaled, scaled
    canvas = Image.new("RGB", (size, size), background)
    canvas.paste(scaled, ((size - cw) // 2, (size - ch) // 2))
    return canvas, scaled


def _size(im: Image.Image | np.ndarray) -> tuple[int, int]:
    return (im.shape[1], im.shape[0]) if isinstance(im, np.ndarray) else im.size


_FIR = None


def _resize(im: Image.Image | np.ndarray, size: tuple[int, int], box=None) -> Image.Image:
    """Lanczos-3 resize of an RGB image or (H, W, 3) uint8 array (``box``: the source region, as
    in Pillow's resize), to an RGB image.

    An array is resized as 3-byte pixels straight into the output's buffer; an image as Pillow
    keeps it (4 bytes a pixel). The convolution is the same per channel, so the two give the same
    bytes (tests/pipeline/media/image/test_resize.py); the array saves making a Pillow copy of the
    decoded picture first (~0.3 ms of a 2048x1536 JPEG's ~12 ms; its own copy for Rust costs half that)."""
    if box is None and _size(im) == size:
        return Image.fromarray(im, "RGB") if isinstance(im, np.ndarray) else im
    global _FIR
    from cykooz_resizer import CropBox, FilterType, ResizeAlg, ResizeOptions, Resizer

    if _FIR is None:
        _FIR = Resizer(), ResizeAlg.convolution(FilterType.lanczos3)
    resizer, lanczos = _FIR
    opts = ResizeOptions(resize_alg=lanczos)
    if box is not None:
        opts.crop_box = CropBox(box[0], box[1], box[2] - box[0], box[3] - box[1])
    if isinstance(im, np.ndarray):
        return _resize_array(resizer, im, size, opts)
    out = Image.new(im.mode, size, None)  # not initialised: the resize writes every pixel
    resizer.resize_pil(im, out, opts)
    return out


def _resize_array(resizer, pixels: np.ndarray, size: tuple[int, int], opts) -> Image.Image:
    from cykooz_resizer import ImageData, PixelType

    h, w = pixels.shape[:2]
    src = ImageData(w, h, PixelType.U8x3, pixels.tobytes())  # (it takes bytes: one copy)
    dst = ImageData(size[0], size[1], PixelType.U8x3)
    resizer.resize(src, dst, opts)
    return Image.frombuffer("RGB", size, dst.get_buffer(), "raw", "RGB", 0, 1)
