"""Look at one output file's bytes: an image's size, mode and decodability; a text's encoding.

Shared by the clean-dir and shard-dir checks. Fast mode reads image headers only; deep mode
decodes every pixel, a JPEG strictly as `pipe clean` does (`pipeline/media/image/jpeg.py`: Pillow swallows
libjpeg's "Corrupt JPEG data" warnings, so damaged entropy-coded data would pass). Nothing here
raises on bad data: problems come back as strings.
"""

from __future__ import annotations

import io
import unicodedata
from dataclasses import dataclass

import xxhash
from PIL import Image

Image.MAX_IMAGE_PIXELS = None  # outputs were size-checked by pipe clean; a bomb here shows as a size violation


@dataclass
class ImageFacts:
    width: int | None = None
    height: int | None = None
    mode: str | None = None
    format: str | None = None
    error: str | None = None
    """Why the image could not be opened or (when decoded) decoded; None when it was fine."""
    decoded: bool = False
    """True when every pixel was decoded (deep mode, or to compute the perceptual hash)."""
    phash: int | None = None
    exact: str | None = None
    """Exact-duplicate key: a hash of the decoded pixels when decoded fully, else of the file bytes."""


def inspect_image(data: bytes, deep: bool = False, want_phash: bool = False) -> ImageFacts:
    """Size and mode from the header; with ``deep`` a full decode; with ``want_phash`` a perceptual hash.

    The hash needs pixels but not all of them: without ``deep`` a JPEG is decoded at reduced scale
    (libjpeg's DCT scaling), many times faster than a full decode.
    """
    f = ImageFacts(exact=xxhash.xxh3_128_hexdigest(data))
    try:
        im = Image.open(io.BytesIO(data))
        f.width, f.height = im.size
        f.mode, f.format = im.mode, im.format
    except Exception as e:  # noqa: BLE001 - any failure to open is a finding about this file
        f.error = f"cannot open as an image: {e}"
        return f
    if not (deep or want_phash):
        return f
    if deep and data[:2] == b"\xff\xd8":
        f.error = strict_jpeg_problem(data)  # the pixels below still feed the hashes (leakage, duplicates)
    try:
        if not deep:
            im.draft("L", (64, 64))  # JPEG only; other formats ignore it and decode fully
        im.load()
        f.decoded = True
    except Exception as e:  # noqa: BLE001 - truncated data, bad Huffman codes, decoder errors
        f.error = f.error or f"does not decode: {e}"
        return f
    if deep:
        f.exact = xxhash.xxh3_128_hexdigest(im.convert("RGB").tobytes())
    if want_phash:
        f.phash = content_phash(im)
    return f


def strict_jpeg_problem(data: bytes) -> str | None:
    """Why `pipe clean` would quarantine this JPEG ("corrupt: ...", "truncated: ..."), or None.

    The same header walk and strict full-size libjpeg-turbo decode `pipe clean` uses
    (`jpeg.read_header`, `jpeg.decode`), so a check and a clean agree on what is damaged.
    """
    from pipeline.media.image import jpeg
    from pipeline.media.reject import Reject

    try:
        jpeg.decode(jpeg.read_header(data))
    except Reject as r:
        return f"{r.reason}: {r.detail}"
    except Exception as e:  # noqa: BLE001 - a decoder error no Reject covers is still a finding
        return f"does not decode: {e}"
    return None


def content_phash(im: Image.Image) -> int:
    """Perceptual hash of the picture without the letterbox bars `pipe clean --resize-mode pad` adds,
    so two different pictures padded the same way do not look alike through their bars."""
    import numpy as np

    from pipeline.similarity.perceptual import phash

    grey = np.asarray(im.convert("L"), dtype=np.int16)
    return phash(Image.fromarray(trim_uniform_borders(grey).astype(np.uint8)))


def trim_uniform_borders(grey, tol: int = 12):
    """The array without its outer rows and columns that are all the corner colour (within ``tol``)."""
    import numpy as np

    corners = [grey[0, 0], grey[0, -1], grey[-1, 0], grey[-1, -1]]
    off = np.abs(grey - int(np.median(corners))) > tol
    rows, cols = np.nonzero(off.any(axis=1))[0], np.nonzero(off.any(axis=0))[0]
    if not len(rows) or rows[-1] - rows[0] < 7 or cols[-1] - cols[0] < 7:
        return grey  # (nearly) uniform: nothing to trim to
    return grey[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]


def text_problem(data: bytes) -> str | None:
    """Why ``data`` is not clean output text (UTF-8, no BOM, NFC, \\n newlines, no control chars), or None."""
    if data.startswith(b"\xef\xbb\xbf"):
        return "starts with a UTF-8 byte-order mark"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start})"
    if "\r" in text:
        return "has \\r line endings"
    bad = next((ch for ch in text if ch not in "\n\t" and unicodedata.category(ch) == "Cc"), None)
    if bad is not None:
        return f"has the control character U+{ord(bad):04X}"
    if not unicodedata.is_normalized("NFC", text):
        return "not in Unicode NFC"
    return None
