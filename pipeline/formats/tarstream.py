"""The tar bytes of a shard, written and parsed by hand so both are deterministic and cheap.

Writing: every member is a plain USTAR header (fixed mtime, owner, group and mode, so the same
samples give the same bytes on any machine) followed by the data padded to 512 bytes; an archive
ends with two zero blocks and nothing else (no padding to tar's 10 KiB record: GNU tar, bsdtar,
Python's tarfile and webdataset all read it). The size of a sample on disk is therefore known
before it is written, which is what `--max-size` counts.

Parsing: `members` / `iter_members` read members from a byte range that starts at a sample's
first header (an offset from index.json), so a reader can start mid-shard without touching what
comes before. It is the reader's hot path: the range is never copied (data come back as views),
each header is unpacked in one call, and all checksums are verified at once in numpy.
"""

from __future__ import annotations

import struct
import tarfile
from collections.abc import Iterator

import numpy as np

BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)
END_OF_ARCHIVE = 2 * ZERO_BLOCK
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


def member_sizes(data_lens: np.ndarray) -> np.ndarray:
    """`member_size` of many members at once."""
    return BLOCK + (np.asarray(data_lens, dtype=np.int64) + BLOCK - 1) // BLOCK * BLOCK


def _tarfile_header(name: str, size: int) -> bytes:
    """The header as Python's tarfile writes it: what `header` must equal, byte for byte."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, MTIME, MODE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info.tobuf(format=tarfile.USTAR_FORMAT, encoding="ascii", errors="strict")


# Every header differs from this one only in its name, size and checksum fields: `header` fills
# those into a copy instead of going through TarInfo (10x faster; pipe shard writes a header per
# member, four per sample). Fields: name [0, 100), size [124, 136), checksum [148, 156).
_TEMPLATE = _tarfile_header("", 0)
_FIXED_SUM = sum(_TEMPLATE) - sum(_TEMPLATE[0:100]) - sum(_TEMPLATE[124:136]) - sum(_TEMPLATE[148:156]) + 8 * 32
_MAX_SIZE = 8**11  # the largest size USTAR's 11 octal digits hold, plus one


def header(name: str, size: int) -> bytes:
    raw = name.encode("ascii")
    if len(raw) > MAX_NAME:
        raise ValueError(f"tar member name longer than {MAX_NAME} bytes: {name}")
    if not 0 <= size < _MAX_SIZE:
        return _tarfile_header(name, size)  # tarfile says why it cannot be written
    size_field = b"%011o\0" % size
    checksum = _FIXED_SUM + sum(raw) + sum(size_field)  # the checksum field counts as 8 spaces
    return b"".join((raw, bytes(100 - len(raw)), _TEMPLATE[100:124], size_field, _TEMPLATE[136:148],
                     b"%06o\0 " % checksum, _TEMPLATE[156:]))


_TEMPLATE_ROW = np.frombuffer(_TEMPLATE, dtype=np.uint8)
_SIZE_SHIFTS = np.arange(10, -1, -1, dtype=np.int64) * 3  # 11 octal digits, most significant first
_SUM_SHIFTS = np.arange(5, -1, -1, dtype=np.int64) * 3  # 6 octal digits


def headers(names: list[str], sizes: np.ndarray) -> np.ndarray:
    """The headers of many members at once, one 512-byte row each, every row byte for byte
    `header(name, size)`: pipe shard writes three or four members a sample, and one header
    at a time in Python cost more than copying the sample's bytes."""
    sizes = np.asarray(sizes, dtype=np.int64)
    n = len(names)
    if n and max(map(len, names)) > MAX_NAME or len(sizes) and (sizes.min() < 0 or sizes.max() >= _MAX_SIZE):
        return np.frombuffer(b"".join(header(nm, int(sz)) for nm, sz in zip(names, sizes)), dtype=np.uint8).reshape(n, BLOCK)
    # a str name that is not ASCII raises here, as in `header`; a shorter one is padded with NULs
    rows = np.frombuffer(np.array(names, dtype=f"S{MAX_NAME}").tobytes(), dtype=np.uint8).reshape(n, MAX_NAME)
    return header_rows(rows, sizes)


def header_rows(name_rows: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """`headers` of names given as rows of the name field (``(n, MAX_NAME)`` uint8: the ASCII
    name, NUL-padded), as pipe shard assembles them from its key columns without a str per
    member. Sizes must fit the field (0 <= size < 8**11; `headers` checks that)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    out = np.empty((len(sizes), BLOCK), dtype=np.uint8)
    out[:] = _TEMPLATE_ROW
    out[:, :MAX_NAME] = name_rows
    out[:, 124:135] = (sizes[:, None] >> _SIZE_SHIFTS & 7) + ord("0")
    out[:, 135] = 0
    checksum = _FIXED_SUM + out[:, :MAX_NAME].sum(axis=1, dtype=np.int64) + out[:, 124:136].sum(axis=1, dtype=np.int64)
    out[:, 148:154] = (checksum[:, None] >> _SUM_SHIFTS & 7) + ord("0")
    out[:, 154:156] = (0, ord(" "))
    return out


def member(name: str, data: bytes) -> bytes:
    """The complete bytes of one member: header, data, zero padding."""
    return header(name, len(data)) + data + bytes(padded(len(data)) - len(data))


# the header fields a reader needs, unpacked in one call: name, size, checksum, magic, prefix
_HEADER = struct.Struct("100s24x12s12x8s101x5s83x155s")


def _number(field: bytes) -> int:
    """An octal number field: digits, padded with spaces or NULs (as tar writers do)."""
    try:
        return int(field.strip(b" \0") or b"0", 8)
    except ValueError:
        raise TarFormatError("damaged tar header (bad number field)") from None


def _name(name: bytes, prefix: bytes) -> bytes:
    """USTAR's name field up to its first NUL, with the prefix field joined when present."""
    nul = name.find(b"\0")
    if nul >= 0:
        name = name[:nul]
    if prefix[0]:
        name = prefix.split(b"\0", 1)[0] + b"/" + name
    return name


def iter_members(buf: bytes | memoryview, start: int = 0, end: int | None = None) -> Iterator[tuple[str, int, memoryview]]:
    """Yield (name, header offset, data) for each member in ``buf[start:end]``, in order; each
    data is a view into ``buf``, not a copy (see `members`)."""
    view = memoryview(buf).cast("B")
    for name, at, size in members(view, start, end):
        yield name, at, view[at + BLOCK : at + BLOCK + size]


def members(buf: bytes | memoryview, start: int = 0, end: int | None = None) -> list[tuple[str, int, int]]:
    """(name, header offset, data size) of each member in ``buf[start:end]``, in order.

    The reader's hot path, so one lean loop: ``buf`` is never copied, each header is unpacked
    in one call, and the checksums of all headers are verified together at the end (one numpy
    sum over every header block rather than a Python loop over 512 bytes each). A damaged
    header raises TarFormatError naming the member before anything is returned.
    """
    view = memoryview(buf).cast("B")
    end = len(view) if end is None else end
    out: list[tuple[str, int, int]] = []
    unpack, pos = _HEADER.unpack_from, start
    while pos < end:
        if end - pos < BLOCK:
            raise TarFormatError(_after("the shard ends inside a tar header", out))
        name, size, _, magic, prefix = unpack(view, pos)
        if magic != b"ustar":
            if view[pos : pos + BLOCK] == ZERO_BLOCK:
                break  # end-of-archive marker
            raise TarFormatError(_after("no tar header where one was expected (bad offset or damaged shard)", out))
        name, size = _name(name, prefix).decode("utf-8", "replace"), _number(size)
        if pos + BLOCK + size > end:
            raise TarFormatError(f"member {name} runs past the end of the data read")
        out.append((name, pos, size))
        pos += BLOCK + (size + BLOCK - 1) // BLOCK * BLOCK
    if out:
        _verify_checksums(view, start, out)
    return out


def _after(what: str, done: list) -> str:
    return f"{what}, after member {done[-1][0]}" if done else what


def _verify_checksums(view: memoryview, start: int, heads: list[tuple[str, int, int]]) -> None:
    """Every header's checksum at once: headers sit on the 512-byte grid that starts at ``start``."""
    grid = np.frombuffer(view, dtype=np.uint8, count=(len(view) - start) // BLOCK * BLOCK, offset=start).reshape(-1, BLOCK)
    rows = grid[[(at - start) // BLOCK for _, at, _ in heads]]
    bad = np.flatnonzero(_checksums(rows) != _octal_columns(rows[:, 148:156]))
    if len(bad):
        raise TarFormatError(f"damaged tar header of member {heads[int(bad[0])][0]} (checksum mismatch)")


def _checksums(rows: np.ndarray) -> np.ndarray:
    """USTAR checksums of header blocks (one per row): the byte sum with the checksum field as spaces."""
    # uint32: a header's byte sum is at most 512 * 255 (and summing in uint32 is twice as fast as in int64)
    return (rows.sum(axis=1, dtype=np.uint32) - rows[:, 148:156].sum(axis=1, dtype=np.uint32)).astype(np.int64) + 8 * 32


def _octal_columns(fields: np.ndarray) -> np.ndarray:
    """Octal number fields, one per row, parsed at once: digits count, spaces and NULs are
    padding; any other byte makes the value -1 (never a valid checksum)."""
    digit = (fields >= ord("0")) & (fields <= ord("7"))
    later: np.ndarray = np.cumsum(digit[:, ::-1], axis=1)[:, ::-1] - digit  # digits to the right of each column
    value = (np.where(digit, fields.astype(np.int64) - ord("0"), 0) << (3 * later)).sum(axis=1)
    value[~(digit | (fields == ord(" ")) | (fields == 0)).all(axis=1)] = -1
    return value
