"""Decide what a file is from its first bytes (magic numbers), not its name.

`sniff(head, name)` returns one of three kinds:

* ``image``: an image container (or a file named like an image: the decoder then decides, so a
  Targa file, which has no magic, still works, and a text file named ``.png`` is quarantined);
* ``other``: a known non-image binary (archive, document, executable, media, OS junk);
* ``text``: anything else, a *candidate* text; the text stage decides from all its bytes
  whether it really is text (`binary_content` otherwise).
"""

from __future__ import annotations

import re

from pipeline.formats.vocabulary import Kind

HEAD_BYTES = 64

IMAGE_EXTENSIONS = {
    ".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".apng", ".gif", ".webp", ".bmp", ".dib", ".tif",
    ".tiff", ".ico", ".ppm", ".pgm", ".pbm", ".pnm", ".tga", ".psd", ".heic", ".heif", ".avif",
    ".jxl", ".jp2", ".j2k", ".qoi", ".dds", ".exr", ".pcx", ".sgi", ".im", ".xbm", ".icns",
}

# OS and tool junk recognised by name: never data, always reported.
JUNK_NAMES = {".ds_store", "thumbs.db", "desktop.ini", "ehthumbs.db", ".directory", "icon\r"}

_IMAGE_MAGIC = (
    (0, b"\xff\xd8\xff", "JPEG"),
    (0, b"\x89PNG\r\n\x1a\n", "PNG"),
    (0, b"GIF87a", "GIF"),
    (0, b"GIF89a", "GIF"),
    (0, b"II*\x00", "TIFF"),
    (0, b"MM\x00*", "TIFF"),
    (0, b"II+\x00", "BigTIFF"),
    (0, b"MM\x00+", "BigTIFF"),
    (0, b"8BPS", "PSD"),
    (0, b"qoif", "QOI"),
    (0, b"DDS ", "DDS"),
    (0, b"v/1\x01", "OpenEXR"),
    (0, b"\xff\x0a", "JPEG XL"),
    (0, b"\x00\x00\x00\x0cJXL \r\n\x87\n", "JPEG XL"),
    (0, b"\x00\x00\x00\x0cjP  \r\n\x87\n", "JPEG 2000"),
    (0, b"\xff\x4f\xff\x51", "JPEG 2000"),
    (0, b"icns", "ICNS"),
    (0, b"\x00\x00\x01\x00", "ICO"),
)
_NETPBM = re.compile(rb"^P[1-7][ \t\r\n]+(#[^\n]*\n\s*)*\d+[ \t\r\n]+\d+")
_HEIF_BRANDS = {b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"mif1", b"msf1", b"avif", b"avis"}

_OTHER_MAGIC = (
    (0, b"PK\x03\x04", "ZIP archive"),
    (0, b"PK\x05\x06", "ZIP archive"),
    (0, b"\x1f\x8b", "gzip archive"),
    (4, b"1AY&SY", "bzip2 archive"),
    (0, b"\xfd7zXZ\x00", "xz archive"),
    (0, b"7z\xbc\xaf\x27\x1c", "7-Zip archive"),
    (0, b"Rar!\x1a\x07", "RAR archive"),
    (0, b"\x28\xb5\x2f\xfd", "zstd archive"),
    (257, b"ustar", "tar archive"),
    (0, b"%PDF-", "PDF document"),
    (0, b"\x7fELF", "ELF executable"),
    (0, b"MZ", "Windows executable"),
    (0, b"\xcf\xfa\xed\xfe", "Mach-O executable"),
    (0, b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "OLE compound file (Thumbs.db, old Office)"),
    (0, b"\x00\x00\x00\x01Bud1", "macOS .DS_Store"),
    (0, b"\x00\x05\x16\x07", "AppleDouble resource fork (._ file)"),
    (0, b"\x00\x05\x16\x00", "AppleSingle file"),
    (0, b"SQLite format 3\x00", "SQLite database"),
    (0, b"PAR1", "Parquet file"),
    (0, b"\x93NUMPY", "NumPy array"),
    (0, b"\x80\x02", "Python pickle"),
    (0, b"\x80\x03", "Python pickle"),
    (0, b"\x80\x04", "Python pickle"),
    (0, b"\x80\x05", "Python pickle"),
    (0, b"ID3", "MP3 audio"),
    (0, b"OggS", "Ogg media"),
    (0, b"fLaC", "FLAC audio"),
    (0, b"\x1a\x45\xdf\xa3", "Matroska/WebM video"),
    (0, b"wOFF", "WOFF font"),
    (0, b"wOF2", "WOFF2 font"),
    (0, b"\x00\x01\x00\x00\x00", "TrueType font"),
)


def _riff(head: bytes) -> bool:
    """A RIFF container by its own structure, not its first four bytes alone (a Lithuanian caption
    "RIFF garso įrašas" starts with them too): the form type and the first chunk's ID are four
    characters, the chunk lies inside the RIFF's declared size, and the two sizes are binary
    little-endian numbers: a text's are four printable characters each, which no header of a
    chunk that starts within the first bytes has (0x20202020 is 539 MB)."""
    if len(head) < 20 or not (_FOURCC.fullmatch(head[8:12]) and _FOURCC.fullmatch(head[12:16])):
        return False
    riff_size, chunk_size = int.from_bytes(head[4:8], "little"), int.from_bytes(head[16:20], "little")
    if chunk_size + 8 > riff_size - 4:
        return False
    return not (_PRINTABLE.fullmatch(head[4:8]) and _PRINTABLE.fullmatch(head[16:20]))


_FOURCC = re.compile(rb"[\x20-\x7e]{4}")
_PRINTABLE = re.compile(rb"[\x20-\x7e\t\n\r\x80-\xff]{4}")


def sniff(head: bytes, name: str) -> tuple[Kind, str]:
    """Return ``(kind, format_name)`` from the first bytes of a file and its name."""
    lower = name.lower()
    ext = lower[lower.rfind(".") :] if "." in lower else ""
    if lower in JUNK_NAMES or lower.startswith("._"):
        if not any(head.startswith(m) for _, m, _f in _IMAGE_MAGIC[:3]):
            return Kind.OTHER, "OS metadata file"
    for offset, magic, fmt in _IMAGE_MAGIC:
        if head[offset : offset + len(magic)] == magic:
            if fmt == "ICO" and ext not in {".ico", ".cur"}:
                continue  # four bytes that common binaries start with too
            return Kind.IMAGE, fmt
    if head[:2] == b"BM" and head[6:10] == b"\0\0\0\0":  # reserved bytes: not a caption starting "BM"
        return Kind.IMAGE, "BMP"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return Kind.IMAGE, "WEBP"
    if head[4:8] == b"ftyp":
        if head[8:12] in _HEIF_BRANDS:
            return Kind.IMAGE, "HEIF/AVIF"
        return Kind.OTHER, "MP4/QuickTime video"
    if head[:4] == b"RIFF" and _riff(head):
        return Kind.OTHER, "RIFF media (WAV/AVI)"
    if _NETPBM.match(head) and (ext in IMAGE_EXTENSIONS or not ext):
        return Kind.IMAGE, "Netpbm"
    for offset, magic, fmt in _OTHER_MAGIC:
        if head[offset : offset + len(magic)] == magic:
            if magic[0] >= 0x20 and magic[:1] != b"%" and b"\0" not in head and len(magic) < 4:
                continue  # printable two/three-byte magic ("MZ", "ID3") in a file with no NUL: text
            return Kind.OTHER, fmt
    if ext in IMAGE_EXTENSIONS:
        return Kind.IMAGE, f"unknown (named {ext})"
    return Kind.TEXT, "text?"
