"""An image of more than 8 bits a sample, decoded by Pillow, made 8-bit by `depth` from all its bits.

Pillow keeps grey at full depth (modes I;16, I, F) but has no mode for 16-bit colour: a 16-bit
RGB(A) PNG or TIFF, or a 16-bit grey PNG with alpha, comes out of it as 8 bits a sample, the
high byte of each (12-bit content in 16 bits: values 0-15). The low bytes are had from a second
decode of the same file with the byte order of the tile swapped: the unpacker then takes the
other byte of each sample, and the decompression and unfiltering before it are the same. Both
passes together are the 16-bit samples, exactly; `depth.to_8bit` then scales them from the range
they use, and the image goes on as an 8-bit L, LA, RGB or RGBA image.

What the file declares about its samples (`depth.Declared`) comes from the PNG's IHDR and sBIT
(`containers.Checked`) or the TIFF's tags.
"""

from __future__ import annotations

import io
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from PIL import Image

from pipeline.media.image import depth
from pipeline.media.image.window import Window

_HIGH_GREY = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")
_NATIVE = "L" if sys.byteorder == "little" else "B"  # what a ";16N" raw mode means here


@dataclass
class Facts:
    """What `reduce` needs of the file beside the decoded image."""

    fmt: str = ""  # PNG, TIFF, ...
    data: bytes = b""  # the bytes Pillow decoded (for the low-byte pass)
    raw: str = ""  # the raw mode of its tile, before it was loaded (`raw_mode`)
    png_depth: int = 0
    png_color_type: int = -1
    png_sbit: bytes = b""


def reduce(im: Image.Image, facts: Facts, window: Window, notes: list[str],
           load: Callable[[Image.Image], object] = Image.Image.load) -> tuple[Image.Image, depth.Scaled | None]:
    """``im`` (loaded) as an 8-bit image scaled from the range its samples use, and what was
    done; an 8-bit image is returned as it is, with None. ``load`` decodes the second pass
    (the caller's way: libtiff's messages on stderr are the caller's to catch)."""
    if im.mode in _HIGH_GREY:
        return _grey(im, _declared(im, facts), window, notes)
    wide = _wide_colour(im, facts)
    if wide is None:
        return im, None
    declared = _declared(im, facts)
    try:
        values, alpha = _sixteen_bits(im, facts, wide, load)
    except Exception as e:  # noqa: BLE001 - the file decoded once: our second pass, not the file, failed
        notes.append(f"16-bit colour kept at Pillow's 8 bits (its low bytes could not be read: {type(e).__name__}: {e})")
        return im, None
    what = f"{declared.bits or 16}-bit {'grey' if values.ndim == 2 else 'RGB'}"
    out, scaled = depth.to_8bit(values, declared, window, what, notes)
    key = im.info.get("transparency")
    if alpha is None and isinstance(key, tuple) and values.ndim == 3:  # a 16-bit tRNS colour: matched on all 16 bits
        alpha = np.where((values == np.asarray(key[:3], values.dtype)).all(axis=2), 0, 65535).astype(np.uint16)
    return _image(out, None if alpha is None else depth.alpha_8bit(alpha), im.info), scaled


def _grey(im: Image.Image, declared: depth.Declared, window: Window, notes: list[str]):
    a = np.asarray(im)
    bits = declared.bits or (16 if im.mode.startswith("I;16") else 32 if im.mode == "F" else None)
    kind = {"float": "float ", "int": "signed "}.get(declared.kind, "" if bits else "integer ")
    what = f"{bits}-bit {kind}grey" if bits else f"{kind}grey"
    out, scaled = depth.to_8bit(a, declared, window, what, notes)
    key = im.info.get("transparency")
    alpha = None
    if isinstance(key, int) and not isinstance(key, bool):  # a tRNS grey key: matched on the samples themselves
        alpha = np.where(a == key, 0, 255).astype(np.uint8)
    return _image(out, alpha, im.info), scaled


def _image(values: np.ndarray, alpha: np.ndarray | None, info: dict) -> Image.Image:
    grey = values.ndim == 2
    if alpha is None:
        out = Image.fromarray(values, "L" if grey else "RGB")
    else:
        stacked = np.dstack([values, alpha])
        out = Image.fromarray(stacked, "LA" if grey else "RGBA")
    for k in ("icc_profile", "exif"):
        if k in info:
            out.info[k] = info[k]
    return out


# -- 16-bit colour: the second pass ------------------------------------------------------------

def raw_mode(im: Image.Image) -> str:
    """The raw mode of an opened, not yet loaded, image's tiles ("" when they differ or there are
    none): loading empties the tile list."""
    modes = {args[0] if isinstance(args, tuple) and args else args for args in (t.args for t in getattr(im, "tile", ()))}
    raw = modes.pop() if len(modes) == 1 else ""
    return raw if isinstance(raw, str) else ""


def _wide_colour(im: Image.Image, facts: Facts) -> str | None:
    """How to read ``im``'s 16 bits when it is 16-bit colour (or 16-bit grey with alpha) that
    Pillow cut to 8 bits: its tile's raw mode, or PLANES; else None."""
    if facts.fmt == "PNG" and not (facts.png_depth == 16 and facts.png_color_type in (2, 4, 6)):
        return None
    if facts.fmt not in ("PNG", "TIFF") or im.mode not in ("RGB", "RGBA"):
        return None
    tags = getattr(im, "tag_v2", None)
    if facts.fmt == "TIFF" and tags is not None and _first(tags.get(284)) == 2:
        bits, compression = tags.get(258) or (), _first(tags.get(259)) or 1
        classic = facts.data[2:4] in (b"*\0", b"\0*")  # tiff_plane writes classic TIFF, not BigTIFF
        return PLANES if set(bits) == {16} and compression not in _JPEG and classic else None
    raw = facts.raw
    if raw == "LA;16B" or raw[:-1] in _PAIRS and raw[-1:] in ("L", "B", "N"):
        return raw
    return None


# A TIFF with one plane a sample (PlanarConfiguration 2): Pillow unpacks its planes itself, 8 bits
# each whatever the raw mode says (and reads uncompressed 16-bit planes wrongly), so each plane is
# read as the 16-bit grey TIFF it is: the same strips, under a directory that says one sample
PLANES = "planes"
_JPEG = (6, 7, 34892)  # JPEG compressions: a plane is not a JPEG of its own


# raw modes Pillow cuts to 8 bits, by what comes before the byte order: the raw mode that gives
# the samples' high bytes in the same layout (premultiplied alpha is undone here, in 16 bits)
_PAIRS = {"RGB;16": "RGB;16", "RGBA;16": "RGBA;16", "RGBa;16": "RGBA;16", "RGBX;16": "RGBX;16", "LA;16B": "RGBA"}


def _sixteen_bits(im: Image.Image, facts: Facts, raw: str, load) -> tuple[np.ndarray, np.ndarray | None]:
    """The colour samples (H, W[, 3]) and the alpha (H, W) or None, all 16 bits."""
    if raw == PLANES:
        return _from_planes(im, facts, load)
    if raw == "LA;16B":  # grey + alpha: one pass with 8-bit RGBA reads each pixel's 4 bytes as they are
        b = _decode(im, facts, "RGBA", load).astype(np.uint16)
        return (b[..., 0] << 8) | b[..., 1], (b[..., 2] << 8) | b[..., 3]
    stem, order = raw[:-4], {"N": _NATIVE}.get(raw[-1], raw[-1])
    base = _PAIRS[raw[:-1]]
    high = np.asarray(im) if stem != "RGBa" else _decode(im, facts, f"{base}{order}", load)
    low = _decode(im, facts, f"{base}{'B' if order == 'L' else 'L'}", load)
    v = (high.astype(np.uint16) << 8) | low
    if im.mode == "RGB":
        return v[..., :3], None
    colour, alpha = v[..., :3], v[..., 3]
    return (_unpremultiplied(colour, alpha) if stem == "RGBa" else colour), alpha


def _unpremultiplied(colour: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Colours stored multiplied by their alpha (TIFF's associated alpha), divided back, in 16 bits."""
    a = alpha.astype(np.float64)[..., None]
    return np.where(a > 0, np.rint(colour * 65535.0 / np.maximum(a, 1)), 0).clip(0, 65535).astype(np.uint16)


def _decode(im: Image.Image, facts: Facts, raw: str, load) -> np.ndarray:
    """The same file decoded again, its tile's raw mode replaced by ``raw``."""
    again = Image.open(io.BytesIO(facts.data), formats=[facts.fmt])
    again.tile = [t._replace(args=(raw, *t.args[1:]) if isinstance(t.args, tuple) else raw) for t in again.tile]
    load(again)
    return np.asarray(again)


def _from_planes(im: Image.Image, facts: Facts, load) -> tuple[np.ndarray, np.ndarray | None]:
    planes = []
    for k in range(4 if im.mode == "RGBA" else 3):
        grey = Image.open(io.BytesIO(tiff_plane(facts.data, k)), formats=["TIFF"])
        load(grey)
        planes.append(np.asarray(grey).astype(np.uint16))
    v = np.dstack(planes)
    if im.mode == "RGB":
        return v, None
    associated = _first(getattr(im, "tag_v2", {}).get(338)) == 1  # ExtraSamples: premultiplied alpha
    return (_unpremultiplied(v[..., :3], v[..., 3]) if associated else v[..., :3]), v[..., 3]


def tiff_plane(data: bytes, plane: int) -> bytes:
    """A planar TIFF's ``plane``-th sample plane as a grey TIFF of its own: ``data`` with a new
    first directory appended (the strips, and every other value, stay where they are)."""
    e = "<" if data[:2] == b"II" else ">"
    at = struct.unpack(e + "I", data[4:8])[0]
    count = struct.unpack(e + "H", data[at : at + 2])[0]
    fields = {}
    for i in range(count):
        p = at + 2 + 12 * i
        tag, typ, n = struct.unpack(e + "HHI", data[p : p + 8])
        fields[tag] = (typ, n, data[p + 8 : p + 12])
    spp = _field_values(data, e, fields[277])[0]
    extra: dict[int, list[int]] = {277: [1], 262: [1], 284: [1], 258: [16]}
    if 339 in fields:
        extra[339] = [_field_values(data, e, fields[339])[plane]]
    for offs, sizes in ((273, 279), (324, 325)):
        if offs in fields:
            o, n = _field_values(data, e, fields[offs]), _field_values(data, e, fields[sizes])
            per = len(o) // spp
            extra[offs], extra[sizes] = o[plane * per : (plane + 1) * per], n[plane * per : (plane + 1) * per]
    fields.pop(338, None)  # ExtraSamples
    start = len(data) + (len(data) & 1)
    ifd_size = 2 + 12 * len(set(fields) | set(extra)) + 4
    spill, out = b"", struct.pack(e + "H", len(set(fields) | set(extra)))
    for tag in sorted(set(fields) | set(extra)):
        if tag not in extra:
            out += struct.pack(e + "HH", tag, fields[tag][0]) + struct.pack(e + "I", fields[tag][1]) + fields[tag][2]
            continue
        values = extra[tag]
        typ, fmt = (3, "H") if tag not in (273, 279, 324, 325) else (4, "I")
        packed = struct.pack(e + fmt * len(values), *values)
        if len(packed) <= 4:
            field = packed.ljust(4, b"\0")
        else:
            field = struct.pack(e + "I", start + ifd_size + len(spill))
            spill += packed
        out += struct.pack(e + "HHI", tag, typ, len(values)) + field
    out += b"\0\0\0\0"
    return data[:4] + struct.pack(e + "I", start) + data[8:] + b"\0" * (start - len(data)) + out + spill


_SIZES = {1: ("B", 1), 3: ("H", 2), 4: ("I", 4), 16: ("Q", 8)}


def _field_values(data: bytes, e: str, field: tuple[int, int, bytes]) -> list[int]:
    typ, n, raw = field
    fmt, size = _SIZES[typ]
    where = raw if size * n <= 4 else data[struct.unpack(e + "I", raw)[0] :]
    return list(struct.unpack(e + fmt * n, where[: size * n]))


# -- what the file declares -------------------------------------------------------------------

def _declared(im: Image.Image, facts: Facts) -> depth.Declared:
    if facts.fmt == "PNG":
        return _png(im, facts)
    tags = getattr(im, "tag_v2", None)
    if facts.fmt == "TIFF" and tags is not None:
        return _tiff(im, tags)
    return depth.Declared(kind="float" if im.mode == "F" else "uint", bits=16 if im.mode.startswith("I;16") else None)


def _png(im: Image.Image, facts: Facts) -> depth.Declared:
    d = depth.Declared(bits=facts.png_depth or None)
    colours = {0: 1, 2: 3, 3: 3, 4: 1, 6: 3}.get(facts.png_color_type, 0)
    sbit = facts.png_sbit[:colours]
    if sbit and all(0 < s <= facts.png_depth for s in sbit):
        d.significant = max(sbit)
    return d


_FORMATS = {1: "uint", 2: "int", 3: "float"}


def _tiff(im: Image.Image, tags) -> depth.Declared:
    bits = _first(tags.get(258))
    d = depth.Declared(kind=_FORMATS.get(int(_first(tags.get(339)) or 1), "uint"), bits=int(bits) if bits else None)
    named = []
    for tag, name, pick in ((340, "SMinSampleValue", min), (280, "MinSampleValue", min),
                            (341, "SMaxSampleValue", max), (281, "MaxSampleValue", max)):
        values = _numbers(tags.get(tag))
        if not values:
            continue
        if tag in (340, 280) and d.low is None:
            d.low = float(pick(values[:3]))
            named.append(name)
        elif tag in (341, 281) and d.high is None:
            d.high = float(pick(values[:3]))
            named.append(name)
    d.tags = "/".join(named)
    return d


def _first(v):
    if isinstance(v, tuple):
        return v[0] if v else None
    return v


def _numbers(v) -> list[float]:
    values = v if isinstance(v, tuple) else (v,) if v is not None else ()
    try:
        return [float(x) for x in values]
    except (TypeError, ValueError):
        return []
