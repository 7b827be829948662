"""Bytes to text: is it text at all, and which encoding, decoded strictly or not at all.

`decode_bytes` tries, in order (each step a strict decode of the *whole* file):

1. a byte-order mark (UTF-32, UTF-8, UTF-16): the mark says the encoding;
2. UTF-16/32 without a mark, from the byte pattern (NUL bytes at one parity for mostly-ASCII
   text; for a short text of one alphabet, every other byte one or two of its block's high
   bytes, control bytes; for CJK text, which has no NULs, a strict decode whose characters are
   plausible);
3. binary content: NUL bytes and other control bytes make up a noticeable share;
4. HZ (7-bit GB2312 between "~{" and "~}", which UTF-8 would take for ASCII), then strict
   UTF-8 (the fast path: most files end here, at memory speed);
5. ISO-2022 (7-bit, escape sequences);
   For a legacy file up to `legacy.FLOOR_BYTES` long, chardet's reading of the whole file (the naive
   way) is the floor: it is taken when nothing in it is implausible for one language in one
   script (`plausibility.penalty_of`), else it is weighed against our own reading (steps 6-8), the more
   plausible taken, a tie going to chardet's unless it is a rare code page; a reading both
   chose that shows implausible letters gives way to a cleaner one in another code page of its
   script; and one whose letters beyond ASCII are those of a code page that only one language
   uses, in words shaped like that language's (Esperanto in ISO-8859-3), is taken over readings
   that make them other languages' letters (`legacy._told_by_its_words`). Every legacy reading gets a
   calibrated confidence (`legacy._calibrated`): below 0.7 in a rare code page, or below 0.3 for a
   short file's reading of ours, the file is refused;
6. a quick pass: chardet, asked only about the encodings today's legacy files are written in
   (Windows code pages, KOI8, the CJK multi-byte encodings), on 1 KB from the first non-ASCII
   byte (the ASCII before it says nothing about the encoding); its guess is kept only when the
   strict decode of the whole file shows none of the oddities of a wrong code page and no
   close rival (nor the ISO-8859 twin of a Windows code page) reads the bytes as other clean
   text. Most legacy files end here, at about half the cost of step 7;
7. otherwise the full detection: chardet over the ISO-8859 and regional code pages too, on
   4 KB (on up to 200 KB if unsure there), its guesses weighed by their oddities; if all look
   odd, or none decodes the whole file, chardet over every era (Mac, DOS, EBCDIC too); if
   still none decodes, a short list of multi-byte encodings;
8. a second opinion for a rare code page (Mac, DOS, regional: KZ-1048, HP Roman-8, ...), or for
   a reading chosen over chardet's first guess for looking less odd: chardet over every era on
   the file from its first byte (an XML or HTML declaration included). A different reading of
   its that is as plausible is taken; a rare code page it does not confirm is refused
   (``undecodable_text``): of a contest among look-alike code pages, a rare winner is more often
   a wrong guess than a real KZ-1048 file.

Nothing is ever decoded with ``errors="replace"`` or ``"ignore"``: bytes no candidate decodes
strictly are ``undecodable_text``.

This module holds the order and the steps that need no detection (byte-order marks, binary,
HZ, ISO-2022, UTF-8); the rest is a module per role beside it: `wide` (step 2), `legacy` (the
floor, siblings, words, confidence and refusal), `guesses` (steps 6-8: chardet's guesses
verified), `plausibility` and `alphabets` (how wrong a reading looks), `scripts` (letters and
their scripts), `codepages` (what is known of each code page), `decoded` (the answer).
"""

from __future__ import annotations

import codecs
import re

from pipeline.formats.vocabulary import Reason
from pipeline.media.text.decoded import Decoded
from pipeline.media.text.guesses import DETECT_WINDOW
from pipeline.media.text.legacy import detect
from pipeline.media.text.scripts import HAN, Lazy
from pipeline.media.text.wide import SNIFF_BYTES, utf16_32_by_nuls, utf16_by_high_bytes, utf16_without_nuls

# More than this share of control bytes (NUL included) in the sniffed bytes means binary.
MAX_CONTROL_SHARE = 0.01

_CONTROL_BYTES = bytes([*range(0x00, 0x09), *range(0x0E, 0x1B), *range(0x1C, 0x20), 0x7F])
_BOMS = (  # longest first: the UTF-32-LE mark starts with the UTF-16-LE one
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
)


def decode_bytes(data: bytes, window: int = DETECT_WINDOW) -> Decoded:
    """Decode ``data`` strictly, detecting its encoding. Never raises on any input."""
    for bom, enc in _BOMS:
        if data.startswith(bom):
            return _decode_with_bom(data, bom, enc)
    head = data[:SNIFF_BYTES]
    # (isascii first: a C check at memory speed, where searching for two bytes costs as much
    # as decoding the file, and most files are not ASCII)
    if head.isascii() and b"\x1b$" in head:  # ISO-2022: escapes, and SO/SI shifts for Korean, are control bytes
        iso = _iso2022(data)
        if iso is not None:
            return iso
    controls = len(head) - len(head.translate(None, _CONTROL_BYTES))
    if controls:
        # UTF-16/32 text has NULs and control-range bytes; it must be recognised before they are
        # taken for binary
        wide = utf16_32_by_nuls(data, head) if b"\x00" in head else None
        if wide is None and len(data) % 2 == 0:
            # (the high bytes first: a control byte at every other position is the stronger
            # evidence; U+3004 is a Cyrillic "а" read in the other byte order)
            wide = utf16_by_high_bytes(data) or utf16_without_nuls(data)
        if wide is not None:
            return wide
        if controls == len(head) or (controls >= 2 and controls / len(head) > MAX_CONTROL_SHARE):
            nuls = head.count(0)
            what = f"{nuls} NUL bytes, " if nuls else ""
            return Decoded(reason=Reason.BINARY_CONTENT,
                           detail=f"binary data: {what}{controls / len(head):.1%} control bytes in the first {len(head)} bytes")
    if head.isascii() and b"~{" in head:  # HZ: 7-bit GB2312 between "~{" and "~}", ASCII to UTF-8's eyes
        hz = _hz(data)
        if hz is not None:
            return hz
    try:
        return Decoded(data.decode("utf-8"), "utf-8", 1.0)
    except UnicodeDecodeError as e:
        utf8_error = e
    if not controls and len(data) % 2 == 0:
        wide = utf16_without_nuls(data)
        if wide is not None:
            return wide
    return detect(data, window, utf8_error)


def _decode_with_bom(data: bytes, bom: bytes, enc: str) -> Decoded:
    body = data[len(bom):]
    codec = "utf-8" if enc == "utf-8-sig" else enc
    try:
        text = body.decode(codec)
    except UnicodeDecodeError as e:
        return Decoded(encoding=enc, confidence=1.0, reason=Reason.UNDECODABLE_TEXT,
                       detail=f"starts with a {_bom_name(enc)} byte-order mark but is not valid {_bom_name(enc)}: "
                              f"{e.reason} at byte {e.start + len(bom)}")
    notes = [] if enc == "utf-8-sig" else [f"{_bom_name(enc)} with a byte-order mark"]
    return Decoded(text, enc, 1.0, notes=notes)


def _bom_name(enc: str) -> str:
    return {"utf-8-sig": "UTF-8"}.get(enc, enc.upper())


def _iso2022(data: bytes) -> Decoded | None:
    """7-bit ISO-2022 (Japanese e-mail, old Korean): escape sequences switch the character set."""
    for enc in ("iso2022_jp_2", "iso2022_jp_ext", "iso2022_kr"):
        try:
            text = data.decode(enc)
        except UnicodeDecodeError:
            continue
        if text.encode("ascii", "ignore") != text.encode("utf-8"):  # it really switched sets
            return Decoded(text, enc, 0.9)
    return None


def _hz(data: bytes) -> Decoded | None:
    """HZ (RFC 1843: Chinese e-mail and Usenet): GB2312 in 7 bits between "~{" and "~}". Taken
    only when every shifted run decodes to Chinese characters: ASCII that merely contains "~{"
    (a shell brace, TeX) either fails the strict decode or shows other characters."""
    try:
        text = data.decode("hz")
    except UnicodeDecodeError:
        return None
    runs = [run.encode("ascii").decode("hz") for run in _HZ_RUN.compiled.findall(data.decode("ascii"))]
    if not all(_HZ_PLAUSIBLE.compiled.fullmatch(run) for run in runs) or len(HAN.compiled.findall("".join(runs))) < 2:
        return None
    return Decoded(text, "hz", 0.99, notes=["HZ (7-bit GB2312 between ~{ and ~})"])


_HZ_RUN = Lazy(r"~\{.*?~\}", re.S)
# what GB2312 holds beyond ASCII: Han, CJK and full-width punctuation, kana, Greek, Cyrillic,
# box drawing; at least one Han character per run
_HZ_PLAUSIBLE = Lazy("[\u4e00-\u9fff\u3000-\u30ff\uff01-\uff5e\u2000-\u26ff"
                           "\u0391-\u03c9\u0401-\u0451\u00a4-\u00fc\\s]*", re.S)
