"""What is known of the code pages themselves, before any file is read: which codec decodes what
chardet names, which code pages today's files are written in and which are rare, which are
multi-byte or EBCDIC; and where a file's bytes beyond ASCII begin. Facts every step of the legacy
detection (`guesses`, `legacy`) and the plausibility scores (`plausibility`) share."""

from __future__ import annotations

import codecs
import re

# Which codec really decodes what chardet names: supersets that hold every character of the
# named encoding plus the ones real files contain (GBK text routinely has characters outside
# GB2312; Shift_JIS files are written by Windows, with NEC/IBM extensions; ISO-8859-1 files have
# cp1252 quotes in 0x80-0x9F). Only true supersets: chardet's own `prefer_superset` also maps
# ISO-8859-2/5/7 to Windows code pages that put letters elsewhere, which would corrupt text.
SUPERSET = {
    "ascii": "cp1252",
    "iso8859-1": "cp1252",
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "big5": "big5hkscs",
    "shift_jis": "cp932",
    "shift_jis_2004": "cp932",
    "euc_kr": "cp949",
    "iso8859-9": "cp1254",
    "iso8859-11": "cp874",
    "tis-620": "cp874",
}
# Windows code pages and the ISO-8859 parts of the same alphabets, which put some letters
# elsewhere (cp1250 "ą" is ISO-8859-2 "ą" at another byte; cp1252 "¼" is ISO-8859-15 "Œ"). The
# quick pass knows only the Windows ones: a file whose bytes read differently in the ISO part is
# left to the full detection, which weighs both.
ISO_TWIN = {"cp1250": "iso8859-2", "cp1252": "iso8859-15", "cp1253": "iso8859-7", "cp1257": "iso8859-13"}
# What today's legacy files are written in: chardet's modern-web era (Windows code pages, KOI8,
# the CJK encodings of the web), and the ISO-8859 parts (`rare` says so for those by name).
COMMON = {"ascii", "cp874", "cp932", "cp949", "euc_jis_2004", "euc_jp", "euc_kr", "gb18030", "gb2312", "gbk", "big5",
          "big5hkscs", "cp950", "shift_jis", "shift_jis_2004", "tis-620", "koi8-r", "koi8-u",
          *(f"cp{n}" for n in range(1250, 1259))}
# The EBCDIC code pages (IBM mainframes): letters at 0x81-0xE9, so any run of high bytes decodes.
EBCDIC = {"cp037", "cp273", "cp424", "cp500", "cp875", "cp1026", "cp1140"}
# EBCDIC text has at least one space (0x40) per this many bytes.
EBCDIC_SPACE_SHARE = 20
# ISO-8859 parts hardly anyone wrote files in (Esperanto and Maltese, the Baltic and Nordic parts
# superseded by ISO-8859-13 and the Windows code pages, Celtic, Romanian), and HP Roman-8: as
# clean a reading in these as in another guess loses to the other one; their letters (ā, ŕ, ĝ, ć)
# are what a Western text read in them shows.
LESS_COMMON = {"iso8859-3", "iso8859-4", "iso8859-10", "iso8859-14", "iso8859-16", "hp-roman8"}
MULTIBYTE = {"gb18030", "big5hkscs", "cp932", "shift_jis_2004", "cp949", "euc_jis_2004", "euc_kr", "johab"}


def rare(codec: str) -> bool:
    """A code page outside chardet's modern-web era and the ISO-8859 parts: Mac, DOS, EBCDIC
    and regional ones (KZ-1048, PTCP154, HP Roman-8, ...), Johab."""
    try:
        name = codecs.lookup(codec).name
    except LookupError:
        return True
    return name not in COMMON and not name.startswith("iso8859-")


def known(codec: str) -> bool:
    try:
        codecs.lookup(codec)
        return True
    except LookupError:
        return False


def decodes(data: bytes, enc: str) -> bool:
    try:
        data.decode(enc)
        return True
    except (UnicodeDecodeError, LookupError):
        return False


def ebcdic_like(data: bytes) -> bool:
    """EBCDIC text has its letters at 0x81-0xE9 and its spaces at 0x40 ("@" in ASCII), and ASCII
    letters there are symbols: bytes with no such spaces, or with ASCII letters, are not EBCDIC."""
    n = len(data)
    if not n:
        return False
    letters = n - len(data.translate(None, _ASCII_LETTER_BYTES))
    return data.count(0x40) * EBCDIC_SPACE_SHARE >= n and letters * 10 < n


_ASCII_LETTER_BYTES = bytes([*range(0x41, 0x5B), *range(0x61, 0x7B)])


def first_high_byte(data: bytes) -> int:
    """Where the first byte beyond ASCII is (``len(data)`` if none): a search, where stripping
    the ASCII before it copied the rest of the file each time."""
    found = _HIGH_BYTE.search(data)
    return found.start() if found else len(data)


_HIGH_BYTE = re.compile(b"[\x80-\xff]")
