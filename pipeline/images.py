"""Decode, validate and normalise one image: bytes in, a 8-bit RGB image of the target size out.

Every check returns a quarantine reason or lets the image through. (Minimal first version; see
ARCHITECTURE.md for what the full one guarantees.)
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import numpy as np
import xxhash
from PIL import Image, ImageFile, ImageOps

from pipeline.perceptual import phash

Image.MAX_IMAGE_PIXELS = None  # we check --max-pixels ourselves, from the header, before decoding
ImageFile.LOAD_TRUNCATED_IMAGES = False

BACKGROUNDS = {"white": (255, 255, 255), "black": (0, 0, 0), "grey": (128, 128, 128), "gray": (128, 128, 128)}


@dataclass(frozen=True)
class ImageSettings:
    size: int = 512
    resize_mode: str = "pad"
    format: str = "jpg"
    quality: int = 90
    min_size: int = 32
    max_pixels: int = 178_956_970
    background: tuple[int, int, int] = (255, 255, 255)


@dataclass
class ImageOutcome:
    reason: str | None = None
    detail: str = ""
    width: int | None = None
    height: int | None = None
    content_hash: str | None = None
    phash: int | None = None
    data: bytes | None = None  # the encoded output image
    ext: str = ""
    notes: list[str] = field(default_factory=list)


def clean_image(data: bytes, s: ImageSettings) -> ImageOutcome:
    try:
        im = Image.open(io.BytesIO(data))
    except Exception as e:  # noqa: BLE001 - any failure to recognise the bytes is a verdict
        return ImageOutcome("unsupported_format", f"not a decodable image: {e}")
    w, h = im.size
    out = ImageOutcome(width=w, height=h)
    if w * h > s.max_pixels:
        out.reason, out.detail = "decompression_bomb", f"{w}x{h} = {w * h} pixels > --max-pixels {s.max_pixels}"
        return out
    if min(w, h) < s.min_size:
        out.reason, out.detail = "too_small", f"{w}x{h} is below --min-size {s.min_size}"
        return out
    try:
        im.load()
    except OSError as e:
        out.reason = "truncated" if "truncated" in str(e) else "corrupt"
        out.detail = str(e)
        return out
    rgb = to_rgb(ImageOps.exif_transpose(im), s.background)
    out.content_hash = pixel_hash(rgb)
    out.phash = phash(rgb)
    final = resize(rgb, s.size, s.resize_mode)
    out.data, out.ext = encode(final, s.format, s.quality), s.format
    return out


def to_rgb(im: Image.Image, background) -> Image.Image:
    if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
        rgba = im.convert("RGBA")
        base = Image.new("RGBA", rgba.size, background + (255,))
        return Image.alpha_composite(base, rgba).convert("RGB")
    return im.convert("RGB")


def pixel_hash(rgb: Image.Image) -> str:
    h = xxhash.xxh3_128()
    h.update(f"{rgb.width}x{rgb.height}".encode())
    h.update(rgb.tobytes())
    return h.hexdigest()


def resize(im: Image.Image, size: int, mode: str) -> Image.Image:
    if mode == "stretch":
        return im.resize((size, size), Image.Resampling.LANCZOS)
    if mode == "crop":
        return ImageOps.fit(im, (size, size), Image.Resampling.LANCZOS)
    return ImageOps.pad(im, (size, size), Image.Resampling.LANCZOS, color=(255, 255, 255))


def encode(im: Image.Image, fmt: str, quality: int) -> bytes:
    buf = io.BytesIO()
    if fmt == "jpg":
        im.save(buf, "JPEG", quality=quality, optimize=False)
    elif fmt == "png":
        im.save(buf, "PNG", compress_level=6)
    else:
        im.save(buf, "WEBP", quality=quality, method=4)
    return buf.getvalue()
