"""UTF-16 and UTF-32 without a byte-order mark (Windows "Unicode text" exports), told before the
control bytes they contain are taken for binary: by where the NUL bytes sit for mostly-ASCII
text, by how plausible the decoded characters are for CJK text, which has no NULs."""

from __future__ import annotations

import re
import unicodedata

from pipeline.media.text.alphabets import foreign_letters
from pipeline.media.text.decoded import Decoded
from pipeline.media.text.scripts import SCRIPT_TAGS, Lazy, script_count

# Bytes inspected for the binary and UTF-16/32 byte-pattern checks.
SNIFF_BYTES = 65536
# Characters looked at when judging how plausible a decode is.
PLAUSIBLE_CHARS = 4096
# Below this many code units, text read as UTF-16 without a byte-order mark must keep to one
# script throughout (`_one_script_throughout`): a legacy text this short passes the shares.
SHORT_UTF16_CHARS = 64
# Likely scripts for the letters of a text read as UTF-16 without a byte-order mark.
_PLAUSIBLE_UTF16 = ((0x0020, 0x024F), (0x0300, 0x06FF), (0x0900, 0x0E7F),
                    (0x1E00, 0x1EFF), (0x2000, 0x206F), (0x3000, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF),
                    (0xAC00, 0xD7A3), (0xFF00, 0xFFEF))


def utf16_32_by_nuls(data: bytes, head: bytes) -> Decoded | None:
    """UTF-16/32 without a byte-order mark, told by where the NUL bytes sit.

    ASCII and Latin text in UTF-16-LE has a NUL in (nearly) every odd byte and none in the even
    ones; UTF-32 has two or three NULs in every four bytes. Binary data has NULs everywhere.
    """
    n = len(head) - len(head) % 4
    if n < 4:
        return None
    lanes = [head[i:n:4].count(0) / (n // 4) for i in range(4)]
    candidates = []
    if len(data) % 4 == 0:
        if lanes[3] == 1.0 and lanes[2] > 0.9 and lanes[0] < 0.05:
            candidates.append("utf-32-le")
        if lanes[0] == 1.0 and lanes[1] > 0.9 and lanes[3] < 0.05:
            candidates.append("utf-32-be")
    if len(data) % 2 == 0:
        even, odd = (lanes[0] + lanes[2]) / 2, (lanes[1] + lanes[3]) / 2
        if odd > 0.05 and even < odd / 3:  # (CJK characters such as U+5F00 put a NUL at the other parity)
            candidates.append("utf-16-le")
        if even > 0.05 and odd < even / 3:
            candidates.append("utf-16-be")
    for enc in candidates:
        try:
            text = data.decode(enc)
        except UnicodeDecodeError:
            continue
        if not _plausible_text(text[:SNIFF_BYTES // 2], 0.0):
            continue  # e.g. an array of small 16-bit integers: binary after all
        return Decoded(text, enc, 0.9, notes=[f"{enc.upper()} without a byte-order mark (from the byte pattern)"])
    return None


# The high bytes of UTF-16 code units in the blocks of the alphabets (Latin Extended, combining
# marks, Greek, Cyrillic, Armenian, Hebrew, Arabic, Syriac, Thaana; Indic to Thai and Lao; Latin
# Extended Additional, as Vietnamese writes it): control bytes, which legacy text never has at
# every other position. (0x09, 0x0A and 0x0D are also tab and line breaks: one of the others must
# be there too.)
_ALPHABET_HIGH = frozenset([*range(0x01, 0x08), *range(0x09, 0x0F), 0x1E])
_LINE_CONTROLS = frozenset([0x09, 0x0A, 0x0D])
# Kana code units (U+3041-U+30FF) a short Japanese text read as UTF-16 must show, without the
# punctuation `_plausible_text` asks of longer text: their high byte 0x30 is the digit "0" in a
# legacy text, where it is never a Shift_JIS or EUC-JP trail byte.
MIN_KANA = 2
# Text longer than this has spaces (NULs at one parity: `utf16_32_by_nuls`); without any, it is
# more likely 16-bit numbers than text.
SHORT_ALPHABET_BYTES = 1024


def _letters_assigned(text: str) -> bool:
    """Mostly letters, every character assigned, all of one language's alphabet
    (`foreign_letters`): 16-bit readings in one block (a 10-bit sensor's values 768-1023 are
    U+0300-U+03FF, 1024-1279 the whole Cyrillic block) hit unassigned code points, combining marks
    and the letters of many languages at once."""
    cats = [unicodedata.category(ch) for ch in text if not ch.isspace()]
    return "Cn" not in cats and 2 * sum(1 for c in cats if c.startswith("L")) >= len(cats) and not foreign_letters(text)


def utf16_by_high_bytes(data: bytes) -> Decoded | None:
    """Short UTF-16 text of one alphabet without a byte-order mark, and often without a space
    ("Προτείνει", "الأڤستانية"): no NULs to go by, and too few characters for the shares
    `_plausible_text` counts. Every other byte is then one or two high bytes of its script's
    block (Greek 0x03, Cyrillic 0x04, Hebrew 0x05, Arabic 0x06, Thai 0x0E; 0x00 for ASCII), control
    bytes that a text in a legacy code page never has at every other position; the characters
    must then keep to one script throughout."""
    if len(data) % 2 or not 4 <= len(data) <= SHORT_ALPHABET_BYTES:
        return None
    for enc, lane in (("utf-16-le", data[1::2]), ("utf-16-be", data[0::2])):
        high = set(lane) - {0}
        if not high or len(high) > 2 or not high <= _ALPHABET_HIGH or high <= _LINE_CONTROLS:
            continue
        try:
            text = data.decode(enc)
        except UnicodeDecodeError:
            continue
        if _plausible_text(text, 0.0) and _one_script_throughout(text) and _letters_assigned(text):
            return Decoded(text, enc, 0.8, notes=[f"{enc.upper()} without a byte-order mark (from the byte pattern)"])
    return None


def utf16_without_nuls(data: bytes) -> Decoded | None:
    """UTF-16 CJK text without a byte-order mark: no NULs, so judge the decoded characters.

    A legacy multi-byte text misread as UTF-16 gives code units scattered over the whole range
    (surrogates, private use, unassigned, many unrelated blocks); real UTF-16 text stays in a
    few scripts plus punctuation and spaces.
    """
    sample = data[: min(len(data), 2 * PLAUSIBLE_CHARS) & ~1]
    # every break `_plausible_text` asks for (1 in 80 characters, and a character is at most 4
    # bytes) has a byte 0x00, 0x30 or 0xFF: without enough of those no decode can pass, and
    # most legacy texts are told so by three byte counts instead of two decodes
    if 320 * (sample.count(0) + sample.count(0x30) + sample.count(0xFF)) < len(sample):
        return None
    best = None
    for enc in ("utf-16-le", "utf-16-be"):
        head = sample[:512].decode(enc, "surrogatepass")
        if len(_IMPLAUSIBLE_CHAR.compiled.findall(head)) > len(head) // 2:
            continue  # a legacy text read as UTF-16 fails in its first characters: no need to decode 8 KB
        try:
            text = sample.decode(enc)
        except UnicodeDecodeError:
            continue
        # no NULs to go by: a Shift_JIS or GBK text read as UTF-16 is all "CJK" too, but without
        # the ideographic punctuation real prose has every sentence or so
        if len(text) >= 8 and _plausible_text(text, 1 / 80) and script_count(text) <= 3 \
                and (len(data) >= 2 * SHORT_UTF16_CHARS or _one_script_throughout(text)) \
                or _short_japanese(text):
            best = enc
            break
    if best is None:
        return None
    try:
        text = data.decode(best)
    except UnicodeDecodeError:
        return None
    return Decoded(text, best, 0.8, notes=[f"{best.upper()} without a byte-order mark (from the characters)"])


def _short_japanese(text: str) -> bool:
    """A short Japanese text without punctuation ("標準出力に書き込めません"): its kana say so
    (`MIN_KANA`), and all its characters are Japanese."""
    return (len(_KANA.compiled.findall(text)) >= MIN_KANA and _plausible_text(text, 0.0)
            and _one_script_throughout(text))


def _one_script_throughout(text: str) -> bool:
    """A short text read as BOM-less UTF-16 gives too few characters for the shares `_plausible_text`
    counts to mean anything (one break in eleven characters passes): ask for all its letters in one
    writing system (Japanese kanji and kana together) and no invisible format characters. A Latin
    text in a legacy code page read so pairs its letters into ideographs, and a letter before a
    space into U+2061-U+207A (invisible operators, bidi controls, superscripts)."""
    if any(unicodedata.category(ch) == "Cf" for ch in text):
        return False
    return len({SCRIPT_TAGS[ord(ch)] for ch in text} - {" "}) <= 1


def _plausible_text(text: str, min_breaks: float) -> bool:
    """Nearly all characters from common scripts, and at least ``min_breaks`` (a share of the
    characters) of spaces or CJK punctuation between them: prose has them every few words."""
    text = text[:PLAUSIBLE_CHARS]
    if not text:
        return False
    most = 0.02 * len(text)
    if len(_IMPLAUSIBLE_CHAR.compiled.findall(text, 0, 256)) > most:
        return False  # a legacy text read as UTF-16 fails in its first characters, at a 16th of the cost
    odd = len(_IMPLAUSIBLE_CHAR.compiled.findall(text))
    breaks = len(_BREAK_CHAR.findall(text))
    return odd <= most and breaks >= min_breaks * len(text)


_KANA = Lazy("[\u3041-\u30ff]")
_IMPLAUSIBLE_CHAR = Lazy("[^\t\n\r" + "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in _PLAUSIBLE_UTF16) + "]")
# Spaces and the punctuation of East Asian prose: the ideographic space, comma and full stop,
# brackets and quotation marks, and the full-width and half-width forms of ASCII punctuation
# (full-width digits too: "ウィンドウ１０に切り替え" has no other).
# Not the rest of U+3000-U+303F (iteration and repeat marks, Hangzhou numerals): "10" read as
# UTF-16-LE is U+3031, so a digit pair in a legacy text would pass for a sentence break.
_BREAK_CHAR = re.compile("[\t\n \u3000-\u3004\u3008-\u3011\u3014-\u301f"
                         "\uff01-\uff20\uff3b-\uff40\uff5b-\uff65]")
