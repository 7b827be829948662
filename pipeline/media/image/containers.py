"""What an image file is, and whether its container is whole, before any pixel is decoded.

`identify` names the format from the magic bytes. `check` walks the container (PNG chunks, GIF
blocks, RIFF/WebP chunks, TIFF strips, ISO-BMFF boxes) without decompressing anything and
decides what decoders are lax about:

* a file that ends before its container does (a chunk, block, box or strip runs past the end;
  PNG without IEND; GIF without its trailer) is ``truncated``;
* a critical PNG chunk with a bad CRC, an IHDR with impossible values, a PNG with no IDAT, a
  damaged signature (a PNG sent through a text-mode transfer) is ``corrupt``;
* harmless oddities are kept and noted: bytes after the end of the image, an ancillary PNG
  chunk with a bad CRC or compressed by an unknown method (dropped from the copy that is
  decoded, as libpng does), a TIFF whose strips are absent where no pixel needs them, or whose
  uncompressed strip's byte count is larger than the file while the pixels it holds are all there.

Returns the bytes to decode (the input, or a repaired copy) and the notes.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

from pipeline.formats.vocabulary import Reason
from pipeline.media.reject import Reject

PNG_SIG = b"\x89PNG\r\n\x1a\n"
ISOBMFF_BRANDS = {
    b"avif": "AVIF", b"avis": "AVIF",
    b"heic": "HEIC", b"heix": "HEIC", b"hevc": "HEIC", b"hevx": "HEIC", b"heim": "HEIC", b"heis": "HEIC",
    b"mif1": "HEIF", b"msf1": "HEIF", b"jxl ": "JPEG XL",
}


@dataclass
class Checked:
    data: bytes
    notes: list[str] = field(default_factory=list)
    frames: int | None = None  # when the container says (GIF, APNG): the first one is used
    png_depth: int = 0  # PNG bit depth and colour type, from IHDR
    png_color_type: int = -1
    png_sbit: bytes = b""  # PNG sBIT: significant bits of each channel, when the file says


def identify(data: bytes) -> str:
    """The image format from the first bytes: a name, or "" when none is recognised."""
    head = data[:64]
    if head[:2] == b"\xff\xd8":
        return "JPEG"
    if head[:8] == PNG_SIG:
        return "PNG"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "TIFF"
    if head[:4] in (b"II+\x00", b"MM\x00+"):
        return "BigTIFF"
    if head[:2] == b"BM":
        return "BMP"
    if head[4:8] == b"ftyp":
        return _isobmff_brand(data)
    if head[:12] == b"\x00\x00\x00\x0cjP  \r\n\x87\n" or head[:4] == b"\xff\x4f\xff\x51":
        return "JPEG2000"
    if head[:2] == b"\xff\x0a" or head[:12] == b"\x00\x00\x00\x0cJXL \r\n\x87\n":
        return "JPEG XL"
    return ""


def _isobmff_brand(data: bytes) -> str:
    size = int.from_bytes(data[:4], "big")
    brands = [data[8:12]] + [data[i : i + 4] for i in range(16, min(size, 64), 4)]
    for b in brands:  # AVIF first: an AVIF lists mif1 too
        if ISOBMFF_BRANDS.get(b) == "AVIF":
            return "AVIF"
    for b in brands:
        if b in ISOBMFF_BRANDS:
            return ISOBMFF_BRANDS[b]
    return "ISO-BMFF (" + data[8:12].decode("latin-1") + ")"


_SIGNATURES = (("PNG", PNG_SIG), ("GIF", b"GIF87a"), ("GIF", b"GIF89a"))


def damaged_signature(data: bytes) -> str:
    """Name the format of a file whose magic bytes are damaged but recognisable, else "".

    Only long signatures with one wrong byte, or a damaged signature next to an intact
    structure (PNG's IHDR, WebP's VP8 chunk, JPEG's JFIF/Exif segment), count: text that
    happens to look similar never does.
    """
    head = data[:64]
    ihdr = head.find(b"IHDR")
    if head[1:4] == b"PNG" and ihdr >= 8:
        tail = head[4 : ihdr - 4]  # what stands between "PNG" and the IHDR chunk's length
        if set(tail) <= {0x0D, 0x0A, 0x1A} and 0x1A in tail:
            return "PNG (signature damaged by a text-mode transfer: line endings changed)"
        return "PNG (damaged signature)"
    if ihdr == 12:
        return "PNG (damaged signature)"
    for name, sig in _SIGNATURES:
        if sum(a != b for a, b in zip(head, sig)) == 1 and len(head) >= len(sig):
            return f"{name} (damaged signature)"
    if (head[:4] == b"RIFF") != (head[8:12] == b"WEBP") and head[12:15] == b"VP8":
        return "WebP (damaged header)"
    if head[6:10] in (b"JFIF", b"Exif") and sum(a != b for a, b in zip(head[:4], b"\xff\xd8\xff\xe0")) <= 2:
        return "JPEG (damaged start-of-image marker)"
    return ""


def check(fmt: str, data: bytes) -> Checked:
    walker = {"PNG": _png, "GIF": _gif, "WEBP": _webp, "TIFF": _tiff, "AVIF": _boxes, "JPEG2000": _jp2}.get(fmt)
    return walker(data) if walker else Checked(data)


# -- PNG ------------------------------------------------------------------------------------

_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}


def _png(data: bytes) -> Checked:
    c = Checked(data)
    pos, n = 8, len(data)
    drop: list[tuple[int, int]] = []  # ancillary chunks with a bad CRC, left out of the decoded copy
    seen_idat = False
    first = True
    while True:
        if pos + 8 > n:
            raise Reject(Reason.TRUNCATED, "the file ends before the PNG's IEND chunk" if seen_idat else
                         "the file ends before the PNG's image data")
        length = int.from_bytes(data[pos : pos + 4], "big")
        ctype = data[pos + 4 : pos + 8]
        name = ctype.decode("latin-1")
        if length > 0x7FFFFFFF or not ctype.isalpha():
            raise Reject(Reason.CORRUPT, f"invalid PNG chunk header at byte {pos} ({ctype!r}, length {length})")
        end = pos + 12 + length
        if end > n:
            raise Reject(Reason.TRUNCATED, f"the file ends inside the PNG chunk {name}")
        crc = int.from_bytes(data[end - 4 : end], "big")
        critical = ctype[0] < 0x60  # upper-case first letter
        if zlib.crc32(data[pos + 4 : end - 4]) != crc:
            if critical:
                raise Reject(Reason.CORRUPT, f"bad CRC in the PNG chunk {name}: its data is damaged")
            c.notes.append(f"bad CRC in the ancillary PNG chunk {name} (chunk ignored)")
            drop.append((pos, end))
        elif ctype in _COMPRESSED and _png_unknown_method(data[pos + 8 : end - 4]):
            c.notes.append(f"the ancillary PNG chunk {name} is compressed by an unknown method (chunk ignored)")
            drop.append((pos, end))
        elif ctype == b"sBIT":
            c.png_sbit = data[pos + 8 : end - 4]
        if first and ctype == b"CgBI":
            raise Reject(Reason.UNSUPPORTED_FORMAT, "Apple-optimised PNG (CgBI chunk, from an iOS app bundle): "
                         "not a standard PNG; convert it with a CgBI-aware tool")
        if first:
            if ctype != b"IHDR" or length != 13:
                raise Reject(Reason.CORRUPT, "PNG does not start with an IHDR chunk")
            c.png_depth, c.png_color_type = _png_ihdr(data[pos + 8 : pos + 21])
            first = False
        if ctype == b"IDAT":
            seen_idat = True
        elif ctype == b"acTL" and length >= 8:
            c.frames = int.from_bytes(data[pos + 8 : pos + 12], "big")
        elif ctype == b"IEND":
            if not seen_idat:
                raise Reject(Reason.CORRUPT, "PNG without image data (no IDAT chunk)")
            if end < n:
                c.notes.append(f"{n - end} bytes after the PNG's IEND chunk (ignored)")
            break
        pos = end
    if drop:
        parts, at = [], 0
        for a, b in drop:
            parts.append(data[at:a])
            at = b
        parts.append(data[at:])
        c.data = b"".join(parts)
    return c


# ancillary chunks whose data is "keyword, NUL, compression method, zlib data": a method other
# than 0 (deflate, the only one PNG defines) cannot be read, and Pillow refuses the whole file for
# it; libpng ignores the chunk (a benign error), and so do we: it holds a colour profile or text,
# never pixels
_COMPRESSED = (b"iCCP", b"zTXt")


def _png_unknown_method(chunk: bytes) -> bool:
    nul = chunk.find(b"\0")
    return 0 <= nul < len(chunk) - 1 and chunk[nul + 1] != 0


def _png_ihdr(ihdr: bytes) -> tuple[int, int]:
    w, h, depth, ctype, comp, filt, interlace = struct.unpack(">IIBBBBB", ihdr)
    if w == 0 or h == 0 or w > 0x7FFFFFFF or h > 0x7FFFFFFF:
        raise Reject(Reason.CORRUPT, f"PNG header gives an impossible size {w}x{h}")
    if depth not in _PNG_DEPTHS.get(ctype, ()):
        raise Reject(Reason.CORRUPT, f"PNG header: colour type {ctype} with bit depth {depth} does not exist")
    if comp or filt or interlace > 1:
        raise Reject(Reason.CORRUPT, "PNG header: unknown compression, filter or interlace method")
    return depth, ctype


# -- GIF ------------------------------------------------------------------------------------

def _gif(data: bytes) -> Checked:
    c = Checked(data)
    n = len(data)
    if n < 13:
        raise Reject(Reason.TRUNCATED, "the file ends inside the GIF header")
    flags = data[10]
    pos = 13 + (3 * 2 ** ((flags & 7) + 1) if flags & 0x80 else 0)
    frames = 0
    while True:
        if pos >= n:
            raise Reject(Reason.TRUNCATED, f"the file ends before the GIF's trailer (after {frames} complete frame(s))")
        block = data[pos]
        if block == 0x3B:  # trailer
            if pos + 1 < n:
                c.notes.append(f"{n - pos - 1} bytes after the GIF trailer (ignored)")
            break
        if block == 0x21:  # extension: label, then sub-blocks
            pos = _gif_subblocks(data, pos + 2, frames)
        elif block == 0x2C:  # image descriptor, optional local colour table, LZW code size, sub-blocks
            if pos + 10 > n:
                raise Reject(Reason.TRUNCATED, "the file ends inside a GIF image descriptor")
            lflags = data[pos + 9]
            pos += 10 + (3 * 2 ** ((lflags & 7) + 1) if lflags & 0x80 else 0)
            pos = _gif_subblocks(data, pos + 1, frames)
            frames += 1
        else:
            if frames:  # garbage where the next block should be: decoders stop at the last frame
                c.notes.append(f"unknown GIF block 0x{block:02x} after frame {frames} (rest ignored)")
                break
            raise Reject(Reason.CORRUPT, f"unknown GIF block 0x{block:02x} before any image")
    c.frames = frames
    if frames == 0:
        raise Reject(Reason.CORRUPT, "GIF without any image")
    return c


def _gif_subblocks(data: bytes, pos: int, frames: int) -> int:
    n = len(data)
    while True:
        if pos >= n:
            raise Reject(Reason.TRUNCATED, f"the file ends inside GIF frame {frames + 1}" if frames == 0 else
                         f"the file ends inside GIF frame {frames + 1} (after {frames} complete frame(s))")
        size = data[pos]
        pos += 1 + size
        if size == 0:
            return pos


# -- WebP (RIFF) ----------------------------------------------------------------------------

def _webp(data: bytes) -> Checked:
    c = Checked(data)
    n = len(data)
    if n < 12:
        raise Reject(Reason.TRUNCATED, "the file ends inside the WebP header")
    riff_end = 8 + int.from_bytes(data[4:8], "little")
    if riff_end > n:
        raise Reject(Reason.TRUNCATED, f"the file ends {riff_end - n} bytes before the WebP data does")
    if riff_end < n:
        c.notes.append(f"{n - riff_end} bytes after the WebP data (ignored)")
    pos = 12
    frames = 0
    while pos + 8 <= riff_end:
        size = int.from_bytes(data[pos + 4 : pos + 8], "little")
        end = pos + 8 + size + (size & 1)
        if pos + 8 + size > riff_end:
            raise Reject(Reason.CORRUPT, f"WebP chunk {data[pos:pos + 4]!r} runs past the end of the RIFF data")
        frames += data[pos : pos + 4] == b"ANMF"
        pos = end
    c.frames = frames or None
    return c


# -- TIFF -----------------------------------------------------------------------------------

_TIFF_TYPES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 16: 8}


def _tiff(data: bytes) -> Checked:
    """First IFD: every strip or tile it points to must lie inside the file."""
    c = Checked(data)
    n = len(data)
    if n < 8:
        raise Reject(Reason.TRUNCATED, "the file ends inside the TIFF header")
    e = "<" if data[:2] == b"II" else ">"
    ifd = struct.unpack(e + "I", data[4:8])[0]
    if ifd + 2 > n:
        raise Reject(Reason.TRUNCATED, "the TIFF directory lies past the end of the file")
    count = struct.unpack(e + "H", data[ifd : ifd + 2])[0]
    if ifd + 2 + 12 * count > n:
        raise Reject(Reason.TRUNCATED, "the file ends inside the TIFF directory")
    tags = {}
    for i in range(count):
        at = ifd + 2 + 12 * i
        tag, typ, cnt = struct.unpack(e + "HHI", data[at : at + 8])
        if tag in _TIFF_LAYOUT:
            tags[tag] = _tiff_values(data, e, typ, cnt, at + 8)
    compression = tags.get(259, [1])[:1]
    for offs, sizes in ((273, 279), (324, 325)):
        if offs in tags and sizes in tags:
            unused = _tiff_unused_planes(tags, len(tags[offs]))
            for i, (o, s) in enumerate(zip(tags[offs], tags[sizes])):
                if s == 0 and i in unused:  # an extra sample's plane left out: no pixel of the image needs it
                    continue
                if s == 0:
                    raise Reject(Reason.CORRUPT, f"TIFF strip/tile {i} has no bytes (a sparse file, or a writer that "
                                                 "stopped): the pixels it holds cannot be read")
                if o + s > n:
                    s = _tiff_overlong(tags, i, o, s, n, c) if offs == 273 and compression == [1] else s
                if o + s > n:
                    raise Reject(Reason.TRUNCATED, f"the file ends {o + s - n} bytes before the TIFF image data does")
                if compression in ([8], [32946]):
                    _inflate_whole(data[o : o + s], f"TIFF strip/tile {i}")
    return c


# Compression, Strip/Tile Offsets and ByteCounts; the size of a strip: width, length, bits a
# sample, samples a pixel, rows a strip, planar configuration; the samples' meaning: photometric
# interpretation, extra samples
_TIFF_LAYOUT = (259, 273, 279, 324, 325, 256, 257, 258, 277, 278, 284, 262, 338)
_TIFF_COLOURS = {2: 3, 5: 4, 6: 3, 8: 3, 9: 3, 10: 3}  # photometric -> colour samples (else 1: grey, palette)


def _tiff_unused_planes(tags: dict, strips: int) -> range:
    """Strips of a planar TIFF that hold samples no reader shows: extra samples of unspecified
    meaning (ExtraSamples 0) after the colours and any alpha. Chunky TIFFs: none."""
    spp = (tags.get(277) or [1])[0]
    if (tags.get(284) or [1])[0] != 2 or spp <= 1 or strips % spp:
        return range(0)
    used = _TIFF_COLOURS.get((tags.get(262) or [1])[0], 1)
    for kind in tags.get(338, []):
        if kind not in (1, 2):  # not an alpha
            break
        used += 1
    return range(strips // spp * min(used, spp), strips)


def _tiff_overlong(tags: dict, i: int, offset: int, count: int, n: int, c: Checked) -> int:
    """The bytes an uncompressed strip really needs when its byte count runs past the end of the
    file: some writers put a wrong count there (the whole image's, or garbage), and readers
    (libtiff, Pillow) read only the rows the image has. A strip whose rows are all in the file
    is whole: noted, not truncated."""
    width, length = tags.get(256, [0])[:1], tags.get(257, [0])[:1]
    bits, spp = tags.get(258, [1]), (tags.get(277) or [1])[0]
    rows = min((tags.get(278) or [length[0] if length else 0])[0], length[0] if length else 0)
    if not (width and length and bits and rows):
        return count
    planar = (tags.get(284) or [1])[0] == 2
    row_bytes = (width[0] * bits[0] * (1 if planar else spp) + 7) // 8
    strips_per_plane = -(-length[0] // rows)
    own = min(rows, length[0] - (i % strips_per_plane) * rows)
    need = own * row_bytes
    if offset + need <= n < offset + count:
        c.notes.append(f"TIFF strip {i} says {count} bytes, more than the file holds; the {need} bytes its "
                       f"{own} rows take are all there")
        return need
    return count


def _inflate_whole(stream: bytes, what: str) -> None:
    """libtiff stops inflating once it has its pixels and never reaches zlib's checksum, so a
    damaged deflate strip can decode to garbage in silence: inflate it whole here."""
    z = zlib.decompressobj()
    try:
        while True:
            out = z.decompress(stream, 1 << 20)  # bounded output: a bomb strip costs no memory
            stream = z.unconsumed_tail
            if z.eof or (not out and not stream):
                break
    except zlib.error as err:
        raise Reject(Reason.CORRUPT, f"damaged {what}: zlib says {err}") from None
    if not z.eof:
        raise Reject(Reason.CORRUPT, f"damaged {what}: its deflate stream does not end")


def _tiff_values(data: bytes, e: str, typ: int, cnt: int, at: int) -> list[int]:
    size = _TIFF_TYPES.get(typ, 0)
    if typ not in (3, 4, 16) or cnt > 1 << 20:
        return []
    where = at if size * cnt <= 4 else struct.unpack(e + "I", data[at : at + 4])[0]
    if where + size * cnt > len(data):
        raise Reject(Reason.TRUNCATED, "the TIFF strip table lies past the end of the file")
    fmt = {3: "H", 4: "I", 16: "Q"}[typ]
    return list(struct.unpack(f"{e}{cnt}{fmt}", data[where : where + size * cnt]))


# -- ISO-BMFF (AVIF/HEIF) and JPEG 2000 boxes -----------------------------------------------

def _boxes(data: bytes, start: int = 0) -> Checked:
    c = Checked(data)
    pos, n = start, len(data)
    while pos + 8 <= n:
        size = int.from_bytes(data[pos : pos + 4], "big")
        header = 8
        if size == 1:
            if pos + 16 > n:
                raise Reject(Reason.TRUNCATED, "the file ends inside a box header")
            size, header = int.from_bytes(data[pos + 8 : pos + 16], "big"), 16
        elif size == 0:  # runs to the end of the file
            return c
        if size < header:
            raise Reject(Reason.CORRUPT, f"box {data[pos + 4:pos + 8]!r} has an impossible size {size}")
        if pos + size > n:
            box = data[pos + 4 : pos + 8].decode("latin-1")
            raise Reject(Reason.TRUNCATED, f"the file ends {pos + size - n} bytes before its {box!r} box does")
        pos += size
    if pos != n:
        raise Reject(Reason.TRUNCATED, "the file ends inside a box header")
    return c


def _jp2(data: bytes) -> Checked:
    if data[:4] == b"\xff\x4f\xff\x51":  # a bare codestream: it must end with EOC
        if not data.rstrip(b"\x00").endswith(b"\xff\xd9"):
            raise Reject(Reason.TRUNCATED, "the JPEG 2000 codestream has no end marker (EOC)")
        return Checked(data)
    return _boxes(data)
