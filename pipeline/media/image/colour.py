"""Any decoded image -> 8-bit sRGB RGB, the colours a viewer would show.

* ICC profiles are honoured: an RGB image in another space (Display P3, Adobe RGB, ...) and a
  CMYK image with its press profile are converted to sRGB by LittleCMS (Pillow's ImageCms).
  sRGB profiles are recognised and skipped; a profile that cannot be read is noted and ignored.
* Transparency (alpha channels, palette and grey/RGB transparency keys) is composited on the
  background colour: transparent pixels become the background, not black. When the picture is
  drawn in the transparency in a colour the background would erase (white artwork on
  transparency under ``--background white``), it goes on the contrasting colour (black) instead,
  with a note: a blank square is nobody's intent.
* More than 8 bits a sample (16-bit, 32-bit integer and float grey) are scaled from the range
  the samples use, never clipped: `depth` says how (`decode` does it first, with what the file
  declares and ``--window``; an image handed here directly gets ``--window auto``).
"""

from __future__ import annotations

import hashlib
import io
import math
from collections import OrderedDict

import numpy as np
from PIL import Image

_TRANSFORMS: OrderedDict = OrderedDict()  # (profile sha1, mode) -> ImageCms transform, per worker
_MAX_TRANSFORMS = 16


def to_rgb(im: Image.Image, background: tuple[int, int, int], icc: bytes | None, notes: list[str]) -> Image.Image:
    """Return ``im`` as 8-bit RGB in sRGB, alpha composited on ``background``."""
    if im.mode.startswith("I;16") or im.mode in ("I", "F"):
        from pipeline.media.image.samples import Facts, reduce
        from pipeline.media.image.window import AUTO

        im = reduce(im, Facts(), AUTO, notes)[0]
    mode = im.mode
    if mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in im.info:
        return _composite(im, background, icc, notes)
    if mode in ("RGB", "CMYK"):
        return _convert_with_profile(im, icc, notes)
    if mode == "LAB":
        return _from_lab(im)
    # 1, L, P, YCbCr, HSV, RGBX: Pillow's conversions are exact. (A grey ICC profile is close
    # enough to sRGB's grey that it is not worth a transform.)
    return im.convert("RGB")


def _composite(im: Image.Image, background, icc: bytes | None, notes: list[str]) -> Image.Image:
    rgba = im.convert("RGBA")  # palettes, transparency keys and premultiplied modes included
    if icc and im.mode in ("RGB", "RGBA", "RGBa"):
        rgb = _convert_with_profile(rgba.convert("RGB"), icc, notes)
        rgba = Image.merge("RGBA", (*rgb.split(), rgba.getchannel("A")))
    alpha = rgba.getchannel("A")
    lo, hi = alpha.getextrema()
    if lo == 255:  # an alpha channel that is opaque everywhere
        return rgba.convert("RGB")
    out = _on(rgba, background)
    if flat(out) and not flat(alpha):
        # the picture is in the alpha channel and the background erases it: white artwork on a
        # transparent background, under --background white, would be a blank white square
        other = _contrasting(rgba, alpha)
        if other != tuple(background):
            alt = _on(rgba, other)
            if not flat(alt):
                notes.append(f"composited on {_hex(other)} instead of --background {_hex(background)}: the image is "
                             f"drawn in its transparency in a colour that would vanish on {_hex(background)}")
                return alt
    return out


# A picture whose every channel varies less than this (standard deviation, in 8-bit levels)
# is one flat colour to the eye and to a model: a white logo composited on white, a blank frame.
FLAT_STD = 1.0


def flat(im: Image.Image, histogram: list[int] | None = None) -> bool:
    """Every channel of ``im`` within about one level of its mean: (almost) no information.
    From Pillow's histogram (``histogram``: ``im.histogram()``, when the caller has it): one
    pass in C, no copy of the pixels. The standard deviation is ImageStat's, to the bit (the
    same exact integer sums, the same float formula), without its Python loops over the 256 bins
    (~0.3 ms an image, as much as decoding a small JPEG)."""
    hist = np.asarray(im.histogram() if histogram is None else histogram, dtype=np.int64).reshape(-1, 256)
    values = np.arange(256, dtype=np.int64)
    for n, s, s2 in zip(hist.sum(axis=1).tolist(), (hist @ values).tolist(), (hist @ (values * values)).tolist()):
        if math.sqrt((s2 - s**2.0 / n) / n) >= FLAT_STD:  # ImageStat's var, then stddev
            return False
    return True


def _on(rgba: Image.Image, background) -> Image.Image:
    base = Image.new("RGBA", rgba.size, (*background, 255))
    return Image.alpha_composite(base, rgba).convert("RGB")


def _contrasting(rgba: Image.Image, alpha: Image.Image) -> tuple[int, int, int]:
    """Black under light artwork, white under dark: from the mean colour of the pixels that are
    not transparent."""
    from PIL import ImageStat

    r, g, b = ImageStat.Stat(rgba.convert("RGB"), mask=alpha).mean
    return (0, 0, 0) if 0.299 * r + 0.587 * g + 0.114 * b >= 128 else (255, 255, 255)


def _hex(rgb) -> str:
    return "#" + "".join(f"{int(v):02x}" for v in rgb)


def _from_lab(im: Image.Image) -> Image.Image:
    from PIL import ImageCms

    lab_to_srgb = ImageCms.buildTransform(ImageCms.createProfile("LAB"), ImageCms.createProfile("sRGB"), "LAB", "RGB")
    return _applied(ImageCms.applyTransform(im, lab_to_srgb))


def _applied(out: Image.Image | None) -> Image.Image:
    """ImageCms.applyTransform's result: None only when it converts in place, which pipe never asks."""
    if out is None:
        raise AssertionError("ImageCms.applyTransform returned no image")
    return out


def _convert_with_profile(im: Image.Image, icc: bytes | None, notes: list[str]) -> Image.Image:
    """RGB or CMYK through the embedded profile to sRGB; without one, the plain conversion."""
    if icc:
        transform = _transform(icc, im.mode, notes)
        if transform is not None:
            try:
                return _apply(transform, im)
            except Exception as e:  # noqa: BLE001 - a profile LittleCMS rejects is noted, not fatal
                notes.append(f"ICC profile could not be applied ({e}); colours converted without it")
    elif im.mode == "CMYK":
        notes.append("CMYK without an ICC profile: converted with the plain formula")
    return im if im.mode == "RGB" else im.convert("RGB")


def _apply(transform, im: Image.Image) -> Image.Image:
    from PIL import ImageCms

    return _applied(ImageCms.applyTransform(im, transform))


def _transform(icc: bytes, mode: str, notes: list[str]):
    """A cached LittleCMS transform from ``icc`` to sRGB; None when sRGB already or unusable."""
    key = (hashlib.sha1(icc).digest(), mode)
    if key in _TRANSFORMS:
        _TRANSFORMS.move_to_end(key)
    else:
        _TRANSFORMS[key] = _build(icc, mode)
        if len(_TRANSFORMS) > _MAX_TRANSFORMS:
            _TRANSFORMS.popitem(last=False)
    transform, problem = _TRANSFORMS[key]
    if problem:
        notes.append(problem)
    return transform


def _build(icc: bytes, mode: str):
    """(transform or None, a note when the profile cannot be used)."""
    from PIL import ImageCms

    try:
        profile = ImageCms.ImageCmsProfile(io.BytesIO(icc))
        space = profile.profile.xcolor_space.strip()
        if space != mode:
            raise ValueError(f"a {space} profile on a {mode} image")
        if _is_srgb(profile):
            return None, ""
        return ImageCms.buildTransform(profile, _srgb(), mode, "RGB", renderingIntent=ImageCms.Intent.PERCEPTUAL), ""
    except Exception as e:  # noqa: BLE001 - unreadable or mismatched profiles are ignored, not fatal
        return None, f"unusable ICC profile ignored ({type(e).__name__}: {e})"


_SRGB = None


def _srgb():
    global _SRGB
    if _SRGB is None:
        from PIL import ImageCms

        _SRGB = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB"))
    return _SRGB


def _is_srgb(profile) -> bool:
    """Profiles that are sRGB by name (camera and OS sRGB profiles); converting them is a no-op."""
    p = profile.profile
    desc = f"{p.profile_description or ''} {p.model or ''}".lower()
    return "srgb" in desc or "iec61966-2" in desc or "iec 61966-2" in desc
