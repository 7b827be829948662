"""Perceptual image hashes, and the pixel-level check that confirms a near duplicate.

`phash` is the classic 64-bit DCT hash: grey, 32x32, 2-D DCT, the 8x8 lowest frequencies
compared with their median. Robust to re-encoding, scaling and small brightness changes; the
Hamming distance between hashes says how alike two images look. It only proposes candidates:
distinct images that merely look alike (handwritten digits, icons, gradients) often have close
hashes, so every candidate is confirmed on pixels (`same_picture`).

The pixel check works on the cleaned outputs (``CLEAN_DIR/data/...``), reduced to about 128 px
(`load_view`): the part of the output that shows the input (`content_box`, without padding) is
registered (a crop of up to `MAX_CROP` per side: the best few per axis from row and column
intensity profiles, the best pair of those on 2-D thumbnails), then compared as 16x16 thumbnails:
the grey structure must correlate (`MIN_CORRELATION`) and the colours must agree up to one overall
brightness gain (`MAX_RMSE`, `GAIN_RANGE`). Flat images have no structure to correlate; they must
have the same colour.

Thresholds were chosen on generated data (see tests/pipeline/similarity/test_near_images.py): re-encoding at JPEG
quality 40, scaling to 60%, cropping 2% and brightening 8% pass; distinct same-class digits,
icons, gradients and flat colours do not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO

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
    # the median of the 63 AC terms is the middle one (np.median: the same value, 5x slower,
    # and its first call imports numpy.ma)
    bits = low > np.partition(low[1:], 31)[31]
    return int(np.packbits(bits).view(">u8")[0])


# --- pixel-level confirmation ---------------------------------------------------------------

VIEW = 128  # side of the reduced output the check works on
PROFILE = 128  # samples in the row/column intensity profiles used for registration
THUMB = 16  # side of the thumbnails compared
MAX_CROP = 0.02  # registration tries crops of 0 to 2% per side, in steps of CROP_STEP
CROP_STEP = 0.005
MIN_CORRELATION = 0.95  # grey structure, after registration
MAX_RMSE = 8.0  # RGB levels (0-255), after one brightness gain
GAIN_RANGE = (0.8, 1.25)  # brightening or darkening by up to ~20%
FLAT_STD = 1.5  # grey levels: below this a thumbnail has no structure (a flat colour)
FLAT_COLOUR = 3.0  # flat images: per-channel mean difference allowed
_GREY = np.array([0.299, 0.587, 0.114], dtype=np.float32)
_GRID = np.arange(0, MAX_CROP + 1e-9, CROP_STEP)
_XS = (np.arange(PROFILE) + 0.5) / PROFILE
_CROP_LO, _CROP_HI = (g.ravel() for g in np.meshgrid(_GRID, _GRID, indexing="ij"))  # every (lo, hi) pair
_CROP_POS = (_CROP_LO[:, None] + _XS[None, :] * (1 - _CROP_LO - _CROP_HI)[:, None]) * PROFILE - 0.5


@dataclass
class View:
    """A cleaned image, reduced, with the box (in its pixels) that shows the input."""

    img: Image.Image
    box: tuple[float, float, float, float]
    xprof: np.ndarray  # mean grey per column of the box, PROFILE samples
    yprof: np.ndarray  # mean grey per row


def content_box(img: Image.Image, width: int, height: int, mode: str) -> tuple[float, float, float, float]:
    """The part of a cleaned output (``img``) that shows the input of ``width`` x ``height``.

    pad letterboxes the input: the box excludes the padding. An input rotated by its EXIF
    orientation has its sides swapped: of the two candidate boxes, the one whose outside is a
    flat colour (padding) is it.
    """
    W, H = img.size
    if mode != "pad" or not width or not height:
        return (0.0, 0.0, float(W), float(H))
    if width == height:
        return _fit_box(W, H, 1, 1)
    a, b = _fit_box(W, H, width, height), _fit_box(W, H, height, width)
    return a if _outside_std(img, a) <= _outside_std(img, b) else b


def _fit_box(W: int, H: int, w: int, h: int) -> tuple[float, float, float, float]:
    s = min(W / w, H / h)
    cw, ch = w * s, h * s
    x0, y0 = (W - cw) / 2, (H - ch) / 2
    return (x0, y0, x0 + cw, y0 + ch)


def _outside_std(img: Image.Image, box) -> float:
    g = np.asarray(img.convert("L"), dtype=np.float32)
    x0, y0, x1, y1 = (int(round(v)) for v in box)
    mask = np.ones(g.shape, dtype=bool)
    mask[y0 + 1 : y1 - 1, x0 + 1 : x1 - 1] = False  # a pixel of slack for resampling at the edge
    outside = g[mask]
    return float(outside.std()) if outside.size else 0.0


def load_view(path: str | IO[bytes], width: int | None, height: int | None, mode: str) -> View | None:
    """Open a cleaned output for pixel comparison; None when it cannot be read."""
    try:
        with Image.open(path) as im:
            im.draft("RGB", (VIEW, VIEW))  # JPEG: decode at 1/2, 1/4 or 1/8 size directly
            img = im.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError):
        return None
    if max(img.size) > VIEW:
        img.thumbnail((VIEW, VIEW), Image.Resampling.BOX)
    box = content_box(img, width or 0, height or 0, mode)
    grey = _grey(_resample(img, box, PROFILE))
    return View(img, box, grey.mean(axis=0), grey.mean(axis=1))


def _resample(img: Image.Image, box, n: int) -> np.ndarray:
    return np.asarray(img.resize((n, n), Image.Resampling.BOX, box=box), dtype=np.float32)


def _grey(rgb: np.ndarray) -> np.ndarray:
    return rgb @ _GREY


def _z(v: np.ndarray) -> np.ndarray:
    s = v.std()
    return (v - v.mean()) / s if s > 1e-3 else v - v.mean()


def _register(pa: np.ndarray, pb: np.ndarray, top: int = 6) -> list[tuple[str, float, float]]:
    """Which profile is a crop of the other, and by how much on each side: the ``top`` best
    (a|b, lo, hi), best first. Every (lo, hi) crop of the grid is tried at once, as rows."""
    za, zb = _z(pa), _z(pb)
    idx = np.arange(PROFILE)
    scored = []
    for side, src, dst in (("a", pa, zb), ("b", pb, za)):
        warped = np.interp(_CROP_POS.ravel(), idx, src).reshape(_CROP_POS.shape)
        err = ((_z_rows(warped) - dst) ** 2).mean(axis=1)
        for e, lo, hi in zip(err.tolist(), _CROP_LO.tolist(), _CROP_HI.tolist()):
            scored.append((round(e, 9), lo + hi, side, lo, hi))  # ties: the smaller crop
    scored.sort()
    return [(side, lo, hi) for _e, _t, side, lo, hi in scored[:top]]


def _z_rows(m: np.ndarray) -> np.ndarray:
    centred = m - m.mean(axis=1, keepdims=True)
    s = centred.std(axis=1, keepdims=True)
    return np.where(s > 1e-3, centred / np.maximum(s, 1e-12), centred)


def _shrink(box, lo: float, hi: float, axis: int):
    x0, y0, x1, y1 = box
    if axis == 0:
        w = x1 - x0
        return (x0 + lo * w, y0, x1 - hi * w, y1)
    h = y1 - y0
    return (x0, y0 + lo * h, x1, y1 - hi * h)


def compare(a: View, b: View) -> tuple[float, float, float, bool]:
    """(grey correlation, RGB RMSE after the best gain, gain, flat) of two registered views.

    Registration: the best few crops per axis from the 1-D profiles (a profile averages many
    rows, so on its own it can miss), then the combination whose 2-D thumbnails correlate best.
    When either is flat (no structure), correlation means nothing: it is 1.0 when both are
    flat, else 0.0, and the RMSE is the largest difference of the channel means."""
    best: tuple[float, np.ndarray, np.ndarray, float, float] | None = None
    # many crop combinations leave one side's box as it was: resample it once, and centre its
    # grey and take its spread (`_correlation`'s per-side work) once
    thumbs: dict = {}

    def thumb(view: View, box) -> tuple[np.ndarray, np.ndarray, float]:
        k = (id(view), box)
        if k not in thumbs:
            t = _resample(view.img, box, THUMB)
            g = _grey(t)
            z = g - g.mean()
            thumbs[k] = (t, z, float(z.std()))
        return thumbs[k]

    rys = _register(a.yprof, b.yprof)  # once, not once per rx: the same answer
    for rx in _register(a.xprof, b.xprof):
        for ry in rys:
            ba, bb = a.box, b.box
            for axis, (side, lo, hi) in enumerate((rx, ry)):
                if side == "a":
                    ba = _shrink(ba, lo, hi, axis)
                else:
                    bb = _shrink(bb, lo, hi, axis)
            (ta, za, sa), (tb, zb, sb) = thumb(a, ba), thumb(b, bb)
            corr = _correlation(za, sa, zb, sb)
            if best is None or corr > best[0]:
                best = (corr, ta, tb, sa, sb)
    if best is None:  # _register offers crops on every axis (the uncropped one among them)
        raise ValueError("compare: registration found no crop to try")
    corr, ta, tb, sa, sb = best
    flat = sa <= FLAT_STD or sb <= FLAT_STD
    gain = float((ta * tb).sum() / max(float((ta * ta).sum()), 1e-6))
    rmse = float(np.sqrt(((tb - gain * ta) ** 2).mean()))
    if flat:  # compare the colours themselves
        rmse = float(np.abs(ta.mean(axis=(0, 1)) - tb.mean(axis=(0, 1))).max())
        corr = 1.0 if sa <= FLAT_STD and sb <= FLAT_STD else 0.0
    return corr, rmse, gain, flat


def _correlation(za: np.ndarray, sa: float, zb: np.ndarray, sb: float) -> float:
    """Correlation of two centred greys with spreads ``sa``, ``sb``; -1 when either is flat."""
    return float((za * zb).mean() / (sa * sb)) if sa > FLAT_STD and sb > FLAT_STD else -1.0


def same_picture(a: View, b: View) -> tuple[bool, str]:
    """Whether two views show the same picture; with the numbers, for the manifest's detail."""
    corr, rmse, gain, flat = compare(a, b)
    if flat:
        ok = corr == 1.0 and rmse <= FLAT_COLOUR
    else:
        ok = corr >= MIN_CORRELATION and rmse <= MAX_RMSE and GAIN_RANGE[0] <= gain <= GAIN_RANGE[1]
    return ok, f"pixel correlation {corr:.3f}, colour difference {rmse:.1f}"
