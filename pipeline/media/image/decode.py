"""Bytes -> an upright 8-bit sRGB image, or a `Reject` with the reason.

The order is what makes the verdicts right and the work cheap:

1. `containers.identify`: the format from the magic bytes (a name is only a hint).
2. The container's structure (`containers.check`, `jpeg.read_header`): truncation, bad CRCs,
   harmless oddities repaired in a copy and noted.
3. The size from the header: `decompression_bomb` (over --max-pixels) and `too_small` are
   decided before a single pixel is decoded.
4. A full decode: JPEGs strictly by libjpeg-turbo, shrunk in the DCT domain when the output
   allows it (`resize.dct_scale`); everything else by Pillow, first frame only. Any exception a
   decoder raises becomes a reason here; none escapes.
5. More than 8 bits a sample made 8 from the range the samples use (`samples`, `depth`:
   ``--window``), then colour (`colour.to_rgb`) and EXIF orientation (`resize.orient`).
"""

from __future__ import annotations

import io
import logging
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from PIL import Image, ImageFile

from pipeline.formats.vocabulary import Reason
from pipeline.media.image import colour, containers, jpeg, samples
from pipeline.media.image.depth import Scaled
from pipeline.media.image.resize import dct_scale, orient, scaled_size
from pipeline.media.image.window import AUTO, Window
from pipeline.media.reject import Reject

if TYPE_CHECKING:
    import numpy as np

Image.MAX_IMAGE_PIXELS = None  # --max-pixels is checked here, from the header, before decoding
ImageFile.LOAD_TRUNCATED_IMAGES = False
# Pillow logs what it raises anyway ("More samples per pixel than can be decoded"); the raised
# error becomes the file's detail, the log line would only scribble over the progress bar
logging.getLogger("PIL").addHandler(logging.NullHandler())
logging.getLogger("PIL").propagate = False

NO_DECODER = {"HEIC": "HEIC/HEIF (install pillow-heif to read it)", "HEIF": "HEIF (install pillow-heif to read it)",
              "JPEG XL": "JPEG XL (no decoder installed)"}
PIL_FORMATS = {"PNG": "PNG", "GIF": "GIF", "WEBP": "WEBP", "TIFF": "TIFF", "BigTIFF": "TIFF", "BMP": "BMP",
               "AVIF": "AVIF", "JPEG2000": "JPEG2000"}


@dataclass
class Target:
    """What the caller needs: the output geometry (for the DCT shrink) and the limits."""

    size: int = 512
    mode: str = "pad"
    min_size: int = 32
    max_pixels: int = 178_956_970
    background: tuple[int, int, int] = (255, 255, 255)
    window: Window = AUTO  # how more than 8 bits a sample become 8 (`depth`)


@dataclass
class Decoded:
    width: int = 0  # as stored in the file (before orientation)
    height: int = 0
    format: str = ""
    pixels: np.ndarray | None = None  # the upright RGB pixels as an (H, W, 3) uint8 array, when the decoder gave one
    notes: list[str] = field(default_factory=list)
    depth: Scaled | None = None  # how a source of more than 8 bits a sample was made 8-bit
    _image: Image.Image | None = field(default=None, repr=False)

    @property
    def image(self) -> Image.Image | None:
        """Upright RGB; smaller than width x height after a DCT shrink. A JPEG that colour and
        orientation leave as decoded has only ``pixels`` until this is asked for: its resize
        reads them directly (`resize.fit_and_picture`), and the Pillow copy of a 1024x768
        picture (~0.3 ms, 2.5% of a camera JPEG's work) is made only where something needs it."""
        if self._image is None and self.pixels is not None:
            self._image = Image.fromarray(self.pixels, "RGB")
        return self._image

    @image.setter
    def image(self, im: Image.Image | None) -> None:
        self._image = im


def decode(data: bytes, t: Target, d: Decoded | None = None) -> Decoded:
    """Fill ``d`` (width/height as soon as the header gives them) or raise `Reject`."""
    d = d if d is not None else Decoded()
    fmt = containers.identify(data)
    d.format = fmt
    if not fmt:
        damaged = containers.damaged_signature(data)
        if damaged:
            raise Reject(Reason.CORRUPT, f"{damaged}: not decodable")
    if fmt in NO_DECODER:
        raise Reject(Reason.UNSUPPORTED_FORMAT, f"{NO_DECODER[fmt]}: no decoder for this image format")
    if fmt.startswith("ISO-BMFF"):
        raise Reject(Reason.UNSUPPORTED_FORMAT, f"{fmt}: not an image format pipe decodes")
    if fmt == "JPEG":
        return _decode_jpeg(data, t, d)
    checked = containers.check(fmt, data)
    d.notes += checked.notes
    if checked.frames and checked.frames > 1:
        d.notes.append(f"animated ({checked.frames} frames): the first frame is used")
    return _decode_pillow(checked, fmt, t, d)


def _check_size(d: Decoded, t: Target) -> None:
    w, h = d.width, d.height
    if w * h > t.max_pixels:
        raise Reject(Reason.DECOMPRESSION_BOMB, f"{w}x{h} = {w * h} pixels > --max-pixels {t.max_pixels} (from the header)")
    if min(w, h) < t.min_size:
        raise Reject(Reason.TOO_SMALL, f"{w}x{h}: the short side is below --min-size {t.min_size}")


# -- JPEG -----------------------------------------------------------------------------------

def _decode_jpeg(data: bytes, t: Target, d: Decoded) -> Decoded:
    h = jpeg.read_header(data)
    d.notes += h.notes
    d.width, d.height = h.width, h.height
    _check_size(d, t)
    orientation = _exif_orientation(h.exif, d.notes) if h.exif else None
    m = dct_scale(h.width, h.height, t.size, t.mode, orientation)
    arr = jpeg.decode(h, *scaled_size(h.width, h.height, m))
    if h.components == 3 and not h.icc and orientation in (None, 1):
        d.pixels = arr  # sRGB, upright, as decoded: nothing for colour or orientation to do
        return d
    if h.components == 1:
        im = Image.fromarray(arr[:, :, 0], "L")
    elif h.components == 3:
        im = Image.fromarray(arr, "RGB")
    else:
        if jpeg.cmyk_is_inverted(h):
            arr = 255 - arr
        im = Image.frombytes("CMYK", (arr.shape[1], arr.shape[0]), arr.tobytes())
    d.image = orient(colour.to_rgb(im, t.background, h.icc, d.notes), orientation)
    if d.image is im and im.mode == "RGB":
        d.pixels = arr  # untouched by colour or orientation: hash it without another copy
    return d


def _exif_orientation(exif: bytes, notes: list[str]) -> int | None:
    try:
        with warnings.catch_warnings(record=True):
            value = Image.Exif()
            value.load(exif)
            o = value.get(0x0112)
    except Exception as e:  # noqa: BLE001 - damaged EXIF: no orientation, the pixels are fine
        notes.append(f"unreadable EXIF data ignored ({type(e).__name__})")
        return None
    return _valid_orientation(o, notes)


def _valid_orientation(o, notes: list[str]) -> int | None:
    if o is None:
        return None
    if isinstance(o, int) and 1 <= o <= 8:
        return o
    notes.append(f"invalid EXIF orientation {o!r} ignored")
    return None


# -- everything else, through Pillow --------------------------------------------------------

def _decode_pillow(checked: containers.Checked, fmt: str, t: Target, d: Decoded) -> Decoded:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        im = _open(checked.data, fmt)
        d.width, d.height = im.size
        d.format = fmt or (im.format or "")
        _check_size(d, t)
        raw = samples.raw_mode(im)
        try:
            if fmt in ("TIFF", "BigTIFF"):
                _load_tiff(im, d.notes)
            else:
                im.load()
        except Reject:
            raise
        except Exception as e:  # noqa: BLE001 - every decoder failure is a verdict
            raise Reject(*_classify(e, fmt or im.format or "")) from None
        orientation = _pil_orientation(im, d.notes)
        icc = im.info.get("icc_profile")
        facts = samples.Facts(PIL_FORMATS.get(fmt, fmt), checked.data, raw, checked.png_depth, checked.png_color_type,
                              checked.png_sbit)
        im8, d.depth = samples.reduce(im, facts, t.window, d.notes, load=_load_again)
        if im8 is im and fmt == "PNG" and "transparency" in im.info:
            _fix_png_transparency_key(im, checked)
        rgb = colour.to_rgb(im8, t.background, icc, d.notes)
    for w in caught:
        d.notes.append(f"decoder warning: {w.message}")
    d.image = orient(rgb, orientation)
    return d


def _load_tiff(im: Image.Image, notes: list[str]) -> None:
    """libtiff reports some damage (a broken deflate strip) only on stderr, and Pillow then
    returns the image with the rest of the strip black: listen to stderr while it decodes."""
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            im.load()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        sink.seek(0)
        said = sink.read(4096).decode("utf-8", "replace").strip()
    for line in filter(None, (x.strip() for x in said.splitlines())):
        if "warning" in line.lower():
            notes.append(f"libtiff: {line}")
        else:
            raise Reject(Reason.CORRUPT, f"damaged image data (TIFF, libtiff: {line})")


def _load_again(im: Image.Image) -> None:
    """`samples.reduce`'s second decode of a file already decoded once: libtiff's messages, said
    the first time, are muted."""
    if im.format == "TIFF":
        _load_tiff(im, [])
    else:
        im.load()


def _fix_png_transparency_key(im: Image.Image, checked: containers.Checked) -> None:
    """Pillow keeps a PNG's tRNS colour key at the file's bit depth while it scales the pixels:
    a 2-bit grey key of 3 must match pixel 255. (16-bit keys are matched on all 16 bits, by
    `samples.reduce`.)"""
    key = im.info["transparency"]
    depth, ctype = checked.png_depth, checked.png_color_type
    if ctype == 0 and depth < 8 and isinstance(key, int):
        im.info["transparency"] = key * 255 // (2**depth - 1)


def _open(data: bytes, fmt: str) -> Image.Image:
    Image.init()
    if fmt in PIL_FORMATS and PIL_FORMATS[fmt] not in Image.OPEN:
        raise Reject(Reason.UNSUPPORTED_FORMAT, f"{fmt}: this Pillow build has no decoder for it")
    try:
        return Image.open(io.BytesIO(data), formats=[PIL_FORMATS[fmt]] if fmt in PIL_FORMATS else None)
    except Image.UnidentifiedImageError:
        pass
    except Exception as e:  # noqa: BLE001
        raise Reject(*_classify(e, fmt)) from None
    if fmt in PIL_FORMATS:
        # Pillow hides its plugin's reason behind "cannot identify": ask the plugin itself
        factory = Image.OPEN[PIL_FORMATS[fmt]][0]
        try:
            factory(io.BytesIO(data), "")  # the empty name Image.open gives an in-memory file
        except Exception as e:  # noqa: BLE001
            raise Reject(*_classify(e, fmt)) from None
        raise Reject(Reason.CORRUPT, f"{fmt} file Pillow cannot open")
    raise Reject(Reason.UNSUPPORTED_FORMAT, describe_non_image(data))


def _classify(e: BaseException, fmt: str) -> tuple[Reason, str]:
    msg = str(e) or type(e).__name__
    low = msg.lower()
    what = f"{fmt or 'image'}: {msg}"
    if isinstance(e, MemoryError) or "decompressed data too large" in low or "too much memory" in low:
        return Reason.DECOMPRESSION_BOMB, f"{what} (decompressed metadata or pixels exceed the safe limit)"
    if "truncated" in low or isinstance(e, EOFError) or "premature end" in low or "not enough data" in low:
        return Reason.TRUNCATED, f"the file ends before the image data does ({what})"
    if any(s in low for s in ("unknown pixel mode", "not supported", "unsupported", "not available", "cannot handle",
                              "unknown raw mode", "unrecognized mode", "no decoder")):
        return Reason.UNSUPPORTED_FORMAT, f"{what} (a variant Pillow cannot decode)"
    return Reason.CORRUPT, f"damaged image data ({what})"


def _pil_orientation(im: Image.Image, notes: list[str]) -> int | None:
    try:
        o = im.getexif().get(0x0112)
    except Exception as e:  # noqa: BLE001
        notes.append(f"unreadable EXIF data ignored ({type(e).__name__})")
        return None
    return _valid_orientation(o, notes)


def describe_non_image(data: bytes) -> str:
    """Why a file named like an image is not one: what its content looks like instead."""
    head = data[:512].lstrip()
    low = head[:256].lower()
    if low.startswith((b"<!doctype html", b"<html")) or b"<html" in low or b"<body" in low:
        kind = "an HTML page"
    elif low.startswith(b"<?xml") or low.startswith(b"<svg") or b"<svg" in low:
        kind = "XML/SVG text (vector images are not decoded)"
    elif low.startswith((b"{", b"[")):
        kind = "JSON text"
    elif head and sum(32 <= b < 127 or b in (9, 10, 13) for b in head) / len(head) > 0.95:
        kind = "text"
    else:
        kind = f"no image format pipe knows (starts with {data[:8].hex()})"
    return f"named like an image, but the content is {kind}"
