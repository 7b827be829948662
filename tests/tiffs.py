"""`tiff(...)`: a TIFF written tag by tag, the kinds scientific cameras and odd writers make.

Pillow writes only the TIFFs it can read back in its own modes (no 16-bit RGB, no 12-bit, no
extra samples, no SMinSampleValue); microscopes, X-ray and CT detectors, and GIS tools write all of
those. This writer puts any samples (any numpy integer or float type, or packed 12-bit) in strips,
chunky or planar, raw or deflated, with any tags added or replaced, so a test can build the file
it means (a sample table, a missing strip, a byte count that lies) and nothing else.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

# TIFF field types: SHORT, LONG, RATIONAL, DOUBLE (the ones the tags below need)
SHORT, LONG, DOUBLE = 3, 4, 12
_PACK = {SHORT: "H", LONG: "I", DOUBLE: "d"}
_SIZE = {SHORT: 2, LONG: 4, DOUBLE: 8}
_FORMAT = {"u": 1, "i": 2, "f": 3}


def pack12(values: np.ndarray) -> bytes:
    """Rows of 12-bit samples packed big-endian, two samples in three bytes, each row padded to a byte."""
    out = bytearray()
    for row in values.reshape(values.shape[0], -1).astype(np.uint16):
        bits = "".join(f"{int(v):012b}" for v in row)
        bits += "0" * (-len(bits) % 8)
        out += int(bits, 2).to_bytes(len(bits) // 8, "big") if bits else b""
    return bytes(out)


def tiff(pixels: np.ndarray, photometric: int | None = None, *, bits: int | None = None, planar: int = 1,
         deflate: bool = False, rows_per_strip: int | None = None, extra_samples: tuple[int, ...] | None = None,
         tags: dict[int, tuple[int, tuple]] | None = None, strips=None, order: str = "<") -> bytes:
    """A TIFF of ``pixels`` (H, W) or (H, W, S).

    ``photometric``: 1 (grey, the default for one sample) or 2 (RGB, the default for 3+);
    ``bits``: 12 packs uint16 samples into 12 bits, else the dtype's size; samples beyond the
    photometric's are extra samples (``extra_samples``: their kinds, 0 unspecified by default);
    ``tags``: {tag: (type, values)} added or replacing the writer's; ``strips``: a function
    (offsets, byte counts) -> (offsets, byte counts) to damage or drop strips."""
    a = pixels if pixels.ndim == 3 else pixels[..., None]
    h, w, spp = a.shape
    photometric = photometric if photometric is not None else (2 if spp >= 3 else 1)
    bits = bits or a.dtype.itemsize * 8
    rows = rows_per_strip or h
    planes = [a[..., i : i + 1] for i in range(spp)] if planar == 2 else [a]
    chunks = []
    for plane in planes:
        for top in range(0, h, rows):
            part = plane[top : top + rows]
            raw = pack12(part) if bits == 12 else part.astype(part.dtype.newbyteorder(order)).tobytes()
            chunks.append(zlib.compress(raw) if deflate else raw)
    base = 8
    offsets, at = [], base
    for c in chunks:
        offsets.append(at)
        at += len(c)
    counts = [len(c) for c in chunks]
    if strips is not None:
        offsets, counts = strips(offsets, counts)
    colour = 3 if photometric == 2 else 1
    entries = {
        256: (LONG, (w,)), 257: (LONG, (h,)), 258: (SHORT, (bits,) * spp), 259: (SHORT, (8 if deflate else 1,)),
        262: (SHORT, (photometric,)), 273: (LONG, tuple(offsets)), 277: (SHORT, (spp,)), 278: (LONG, (rows,)),
        279: (LONG, tuple(counts)), 284: (SHORT, (planar,)), 339: (SHORT, (_FORMAT[a.dtype.kind],) * spp),
    }
    if spp > colour:
        entries[338] = (SHORT, extra_samples or (0,) * (spp - colour))
    entries.update(tags or {})
    return _assemble(b"".join(chunks), entries, order)


def _assemble(body: bytes, entries: dict[int, tuple[int, tuple]], order: str) -> bytes:
    head = (b"II*\0" if order == "<" else b"MM\0*")
    ifd_at = 8 + len(body) + (len(body) & 1)
    n = len(entries)
    spill_at = ifd_at + 2 + 12 * n + 4
    ifd, spill = struct.pack(order + "H", n), b""
    for tag in sorted(entries):
        typ, values = entries[tag]
        packed = struct.pack(order + _PACK[typ] * len(values), *values)
        if len(packed) <= 4:
            field = packed.ljust(4, b"\0")
        else:
            field = struct.pack(order + "I", spill_at + len(spill))
            spill += packed + b"\0" * (len(packed) & 1)
        ifd += struct.pack(order + "HHI", tag, typ, len(values)) + field
    ifd += b"\0\0\0\0"
    return head + struct.pack(order + "I", ifd_at) + body + b"\0" * (len(body) & 1) + ifd + spill
