"""The tar bytes of a shard, written and parsed by hand so both are deterministic and cheap.

Writing: every member is a plain USTAR header (fixed mtime, owner, group and mode, so the same
samples give the same bytes on any machine) followed by the data padded to 512 bytes; an archive
ends with two zero blocks and nothing else (no padding to tar's 10 KiB record: GNU tar, bsdtar,
Python's tarfile and webdataset all read it). The size of a sample on disk is therefore known
before it is written, which is what `--max-size` counts.

Parsing: `iter_members` reads members from a byte range that starts at a sample's first header
(an offset from index.json), so a reader can start mid-shard without touching what comes before.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator

BLOCK = 512
END_OF_ARCHIVE = bytes(2 * BLOCK)
MTIME = 0  # 1970-01-01: fixed, so a rerun is byte-identical
MODE = 0o644
MAX_NAME = 100  # USTAR's name field; our member names are short ASCII (keys are capped)


class TarFormatError(ValueError):
    """The bytes are not the tar member a shard index promised."""


def padded(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK * BLOCK


def member_size(data_len: int) -> int:
    """Bytes one member takes in the archive: its header plus its data padded to a block."""
    return BLOCK + padded(data_len)


def header(name: str, size: int) -> bytes:
    if len(name.encode("ascii")) > MAX_NAME:
        raise ValueError(f"tar member name longer than {MAX_NAME} bytes: {name}")
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, MTIME, MODE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info.tobuf(format=tarfile.USTAR_FORMAT, encoding="ascii", errors="strict")


def member(name: str, data: bytes) -> bytes:
    """The complete bytes of one member: header, data, zero padding."""
    return header(name, len(data)) + data + bytes(padded(len(data)) - len(data))


def _octal(field: bytes) -> int:
    digits = field.rstrip(b"\0 ").lstrip(b" ")
    return int(digits or b"0", 8)


def parse_header(block: bytes) -> tuple[str, int]:
    """(name, data size) of a USTAR header block; TarFormatError when it is not one."""
    if len(block) < BLOCK:
        raise TarFormatError("the shard ends inside a tar header")
    if block[257:262] != b"ustar":
        raise TarFormatError("no tar header where one was expected (bad offset or damaged shard)")
    try:
        stored = _octal(block[148:156])
        size = _octal(block[124:136])
    except ValueError:
        raise TarFormatError("damaged tar header (bad number field)") from None
    computed = sum(block[:148]) + 8 * 32 + sum(block[156:BLOCK])
    if stored != computed:
        raise TarFormatError("damaged tar header (checksum mismatch)")
    name = block[0:100].split(b"\0", 1)[0]
    prefix = block[345:500].split(b"\0", 1)[0]
    full = (prefix + b"/" + name) if prefix else name
    return full.decode("utf-8", "replace"), size


def iter_members(buf: bytes | memoryview, start: int = 0, end: int | None = None) -> Iterator[tuple[str, int, memoryview]]:
    """Yield (name, header offset, data) for each member in ``buf[start:end]``, in order."""
    view = memoryview(buf)
    end = len(view) if end is None else end
    pos = start
    while pos < end:
        block = bytes(view[pos : pos + BLOCK])
        if block == bytes(BLOCK):
            return  # end-of-archive marker
        name, size = parse_header(block)
        data_at = pos + BLOCK
        if data_at + size > len(view):
            raise TarFormatError(f"member {name} runs past the end of the data read")
        yield name, pos, view[data_at : data_at + size]
        pos = data_at + padded(size)
