"""Builders for nasty image files, the kinds real datasets and decoder test suites hold.

* `png(...)`: a PNG written chunk by chunk (any colour type and bit depth, tRNS, extra chunks),
  and `png_chunks` / `png_chunk` to damage one: PngSuite's x*.png files are made this way.
* JPEG damage in the entropy-coded data: `jpeg_scan` finds it; `zero_run`, `flip_bytes`,
  `cut_scan`, `truncate` damage it; `junk_before` puts bytes before a header marker.
* `exif_rotated(upright, orientation)`: the file a camera writes for an image that shows as
  ``upright`` once its EXIF orientation is applied.
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image

# -- PNG ------------------------------------------------------------------------------------

PNG_SIG = b"\x89PNG\r\n\x1a\n"


def png_chunk(ctype: bytes, data: bytes, crc: int | None = None) -> bytes:
    c = zlib.crc32(ctype + data) if crc is None else crc
    return struct.pack(">I", len(data)) + ctype + data + struct.pack(">I", c)


def png(pixels: np.ndarray, color_type: int, bit_depth: int = 8, extra: list[bytes] = (), after: list[bytes] = (),
        palette: np.ndarray | None = None, trns: bytes | None = None) -> bytes:
    """A PNG from an (H, W[, C]) array of samples, big-endian at 16 bits, no interlace."""
    h, w = pixels.shape[:2]
    if bit_depth == 16:
        rows = pixels.astype(">u2").reshape(h, -1)
        raw = b"".join(b"\0" + r.tobytes() for r in rows)
    elif bit_depth == 8:
        rows = pixels.astype(np.uint8).reshape(h, -1)
        raw = b"".join(b"\0" + r.tobytes() for r in rows)
    else:  # 1, 2, 4 bits: pack samples into bytes
        per = 8 // bit_depth
        raw = b""
        for r in pixels.reshape(h, -1):
            padded = np.concatenate([r, np.zeros(-len(r) % per, r.dtype)]).reshape(-1, per).astype(np.uint16)
            shifts = np.arange(per - 1, -1, -1) * bit_depth
            raw += b"\0" + (padded << shifts).sum(1).astype(np.uint8).tobytes()
    out = PNG_SIG + png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 0))
    out += b"".join(extra)
    if palette is not None:
        out += png_chunk(b"PLTE", np.asarray(palette, np.uint8).tobytes())
    if trns is not None:
        out += png_chunk(b"tRNS", trns)
    out += png_chunk(b"IDAT", zlib.compress(raw))
    out += b"".join(after)
    return out + png_chunk(b"IEND", b"")


def png_chunks(data: bytes) -> list[tuple[bytes, int, int]]:
    """(type, offset of the chunk, length of its data) for every chunk."""
    pos, out = 8, []
    while pos + 8 <= len(data):
        length = struct.unpack(">I", data[pos : pos + 4])[0]
        out.append((data[pos + 4 : pos + 8], pos, length))
        pos += 12 + length
    return out


def png_replace_crc(data: bytes, ctype: bytes, crc: int = 0xDEADBEEF) -> bytes:
    for t, pos, length in png_chunks(data):
        if t == ctype:
            end = pos + 8 + length
            return data[:end] + struct.pack(">I", crc) + data[end + 4 :]
    raise ValueError(ctype)


def png_without(data: bytes, ctype: bytes) -> bytes:
    for t, pos, length in png_chunks(data):
        if t == ctype:
            return data[:pos] + data[pos + 12 + length :]
    raise ValueError(ctype)


# -- JPEG -----------------------------------------------------------------------------------

def jpeg_bytes(arr_or_img, **save) -> bytes:
    im = arr_or_img if isinstance(arr_or_img, Image.Image) else Image.fromarray(arr_or_img)
    buf = io.BytesIO()
    im.save(buf, "JPEG", **save)
    return buf.getvalue()


def jpeg_scan(data: bytes) -> tuple[int, int]:
    """(start, end) of the first scan's entropy-coded data (after the SOS header, before EOI)."""
    sos = data.index(b"\xff\xda")
    start = sos + 2 + struct.unpack(">H", data[sos + 2 : sos + 4])[0]
    return start, data.rindex(b"\xff\xd9")


def zero_run(data: bytes, at: float = 0.3, n: int = 256) -> bytes:
    """Zero ``n`` bytes of the scan starting at fraction ``at`` of it (a disk or transfer error)."""
    s, e = jpeg_scan(data)
    p = s + int((e - s) * at)
    return data[:p] + bytes(n) + data[p + n :]


def flip_bytes(data: bytes, at: tuple[float, ...] = (0.3, 0.5, 0.7), mask: int = 0x5A) -> bytes:
    """XOR a few scan bytes (bit rot); never creates or breaks a marker (0xFF, stuffed 0xFF00)."""
    s, e = jpeg_scan(data)
    b = bytearray(data)
    for f in at:
        p = s + int((e - s) * f)
        while b[p] ^ mask == 0xFF or b[p] == 0xFF or b[p - 1] == 0xFF:
            p += 1
        b[p] ^= mask
    return bytes(b)


def cut_scan(data: bytes, at: float = 0.5) -> bytes:
    """The scan stops at fraction ``at`` and the file still ends with EOI (a bad copy)."""
    s, e = jpeg_scan(data)
    return data[: s + int((e - s) * at)] + b"\xff\xd9"


def truncate(data: bytes, at: float = 0.5) -> bytes:
    return data[: int(len(data) * at)]


def junk_before(data: bytes, marker: int, junk: bytes = b"\x00junk!") -> bytes:
    """Insert bytes right before the first ``0xFF marker`` of the header."""
    p = data.index(bytes((0xFF, marker)))
    return data[:p] + junk + data[p:]


# -- EXIF orientation -----------------------------------------------------------------------

# the transpose a viewer applies for each orientation, and its inverse (what the camera stored)
VIEW = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
        5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
        8: Image.Transpose.ROTATE_90}
STORE = {**VIEW, 6: Image.Transpose.ROTATE_90, 8: Image.Transpose.ROTATE_270}


def exif_rotated(upright: Image.Image, orientation: int, fmt: str = "JPEG", **save) -> bytes:
    stored = upright.transpose(STORE[orientation]) if orientation in STORE else upright
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    stored.save(buf, fmt, exif=exif.tobytes(), **save)
    return buf.getvalue()
