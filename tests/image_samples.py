"""Images for near-duplicate tests: photo-like pictures and their edited copies, and sets of
distinct pictures that merely look alike (digits, icons, flat colours, gradients)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw, ImageEnhance, ImageFont


def natural(seed: int, w: int = 640, h: int = 480) -> Image.Image:
    """Coloured 1/f noise: the amplitude spectrum of real photographs (detail at every scale)."""
    rng = np.random.default_rng(seed)
    fy, fx = np.fft.fftfreq(h)[:, None], np.fft.rfftfreq(w)[None, :]
    f = np.sqrt(fx ** 2 + fy ** 2)
    f[0, 0] = 1
    chans = [np.fft.irfft2((rng.normal(size=f.shape) + 1j * rng.normal(size=f.shape)) / f, s=(h, w)) for _ in range(3)]
    x = np.stack(chans, -1)
    x = (x - x.mean()) / x.std() * 50 + 128
    return Image.fromarray(np.clip(x, 0, 255).astype(np.uint8))


def digit(rng: np.random.Generator, d: int, size: int = 64) -> Image.Image:
    """A white digit on black, MNIST-like: every call a different hand. The glyph gets a random
    position, size, slant and stroke, then an elastic distortion (Simard et al. 2003, the
    classic model of handwriting variation), so two calls never give the same shape."""
    im = Image.new("L", (size, size))
    font = ImageFont.load_default(size=int(size * rng.uniform(0.6, 0.8)))
    ImageDraw.Draw(im).text((size / 2 + rng.uniform(-4, 4), size / 2 + rng.uniform(-4, 4)), str(d), fill=255,
                            font=font, anchor="mm", stroke_width=int(rng.integers(0, 3)), stroke_fill=255)
    im = im.rotate(rng.uniform(-12, 12), resample=Image.Resampling.BILINEAR)
    return Image.fromarray(_elastic(np.asarray(im, dtype=np.float32), rng, strength=size / 24)).convert("RGB")


def _elastic(a: np.ndarray, rng: np.random.Generator, strength: float) -> np.ndarray:
    """Displace every pixel along a smooth random field (a 4x4 grid of offsets, interpolated)."""
    h, w = a.shape
    field = [np.asarray(Image.fromarray(rng.normal(0, strength, (4, 4)).astype(np.float32), "F")
                        .resize((w, h), Image.Resampling.BICUBIC)) for _ in range(2)]
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    sy, sx = np.clip(y + field[0], 0, h - 1.001), np.clip(x + field[1], 0, w - 1.001)
    y0, x0 = sy.astype(int), sx.astype(int)
    fy, fx = sy - y0, sx - x0
    out = (a[y0, x0] * (1 - fy) * (1 - fx) + a[y0 + 1, x0] * fy * (1 - fx)
           + a[y0, x0 + 1] * (1 - fy) * fx + a[y0 + 1, x0 + 1] * fy * fx)
    return np.clip(out, 0, 255).astype(np.uint8)


def icon(rng: np.random.Generator, size: int = 64) -> Image.Image:
    """A flat shape (disc, square, triangle, star) in a random colour on white."""
    im = Image.new("RGB", (size, size), (255, 255, 255))
    draw = ImageDraw.Draw(im)
    colour = tuple(int(c) for c in rng.integers(0, 200, 3))
    m = rng.uniform(8, 16)
    x0, y0 = m + rng.uniform(-4, 4), m + rng.uniform(-4, 4)
    x1, y1 = size - m + rng.uniform(-4, 4), size - m + rng.uniform(-4, 4)
    kind = int(rng.integers(0, 4))
    if kind == 0:
        draw.ellipse((x0, y0, x1, y1), fill=colour)
    elif kind == 1:
        draw.rectangle((x0, y0, x1, y1), fill=colour)
    elif kind == 2:
        draw.polygon([(size / 2, y0), (x1, y1), (x0, y1)], fill=colour)
    else:
        draw.regular_polygon((size / 2, size / 2, (x1 - x0) / 2), 5, rotation=rng.uniform(0, 72), fill=colour)
    return im


def flat(rng: np.random.Generator, size: int = 64) -> Image.Image:
    return Image.new("RGB", (size, size), tuple(int(c) for c in rng.integers(0, 256, 3)))


def gradient(rng: np.random.Generator, size: int = 64) -> Image.Image:
    a, b = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    t = np.linspace(0, 1, size)
    row = a[None, :] * (1 - t[:, None]) + b[None, :] * t[:, None]
    arr = np.repeat(row[None], size, 0) if rng.random() < 0.5 else np.repeat(row[:, None], size, 1)
    return Image.fromarray(arr.astype(np.uint8))


LOOKALIKES = {"digits": lambda rng, i: digit(rng, i % 10), "same_digit": lambda rng, i: digit(rng, 4),
              "icons": lambda rng, i: icon(rng), "flat": lambda rng, i: flat(rng), "gradients": lambda rng, i: gradient(rng)}


def encode(im: Image.Image, fmt: str = "JPEG", **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def reencoded(im: Image.Image, quality: int = 40) -> Image.Image:
    return Image.open(io.BytesIO(encode(im, quality=quality))).convert("RGB")


def scaled(im: Image.Image, factor: float = 0.6) -> Image.Image:
    return im.resize((round(im.width * factor), round(im.height * factor)), Image.Resampling.LANCZOS)


def cropped(im: Image.Image, share: float = 0.02, centred: bool = True) -> Image.Image:
    """Cut ``share`` of each dimension: half from each side, or all from the right and bottom."""
    dx, dy = round(im.width * share), round(im.height * share)
    if centred:
        return im.crop((dx // 2, dy // 2, im.width - (dx - dx // 2), im.height - (dy - dy // 2)))
    return im.crop((0, 0, im.width - dx, im.height - dy))


def brightened(im: Image.Image, factor: float = 1.08) -> Image.Image:
    return ImageEnhance.Brightness(im).enhance(factor)


EDITS = {"jpeg_q40": reencoded, "scaled_60": scaled, "cropped_2_centre": cropped,
         "cropped_2_corner": lambda im: cropped(im, centred=False), "brightened_8": brightened}


def transparent_logo(colour, size=(300, 200), shape: int = 0) -> bytes:
    """Artwork drawn in ``colour`` on a fully transparent background, anti-aliased edges and all."""
    im = Image.new("RGBA", (size[0] * 2, size[1] * 2), (*colour, 0))
    d = ImageDraw.Draw(im)
    w, h = im.size
    if shape == 0:
        d.ellipse((w * 0.2, h * 0.2, w * 0.6, h * 0.8), fill=(*colour, 255))
        d.rectangle((w * 0.65, h * 0.3, w * 0.9, h * 0.5), fill=(*colour, 255))
    else:
        d.polygon([(w * 0.1, h * 0.9), (w * 0.5, h * 0.1), (w * 0.9, h * 0.9)], fill=(*colour, 255))
    im = im.resize(size, Image.Resampling.LANCZOS)  # soft, partly transparent edges
    return png(im)


def png(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()
