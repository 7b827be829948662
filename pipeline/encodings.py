"""Bytes to text: is it text at all, and which encoding, decoded strictly or not at all.

`decode_bytes` tries, in order (each step a strict decode of the *whole* file):

1. a byte-order mark (UTF-32, UTF-8, UTF-16): the mark says the encoding;
2. UTF-16/32 without a mark, from the byte pattern (NUL bytes at one parity for mostly-ASCII
   text; for CJK text, which has no NULs, a strict decode whose characters are plausible);
3. binary content: NUL bytes and other control bytes make up a noticeable share;
4. strict UTF-8 (the fast path: most files end here, at memory speed);
5. ISO-2022 (7-bit, escape sequences);
6. chardet on a bounded window that starts at the first non-ASCII byte (the ASCII before it
   says nothing about the encoding), then, if that guess fails on the rest of the file,
   chardet's other candidates, chardet on the whole file, and a short list of multi-byte
   encodings.

Nothing is ever decoded with ``errors="replace"`` or ``"ignore"``: bytes no candidate decodes
strictly are ``undecodable_text``.
"""

from __future__ import annotations

import codecs
import re
import unicodedata
from dataclasses import dataclass, field

# chardet looks at this many bytes; enough for a stable guess, far less than reading it all.
DETECT_WINDOW = 4096
# Bytes inspected for the binary and UTF-16/32 byte-pattern checks.
SNIFF_BYTES = 65536
# More than this share of control bytes (NUL included) in the sniffed bytes means binary.
MAX_CONTROL_SHARE = 0.01
# Characters looked at when judging how plausible a decode is.
PLAUSIBLE_CHARS = 4096
# Below this chardet confidence a guess is weighed against alternatives by plausibility.
LOW_CONFIDENCE = 0.5
# chardet's guesses beyond this many are not worth a decode.
MAX_GUESSES = 6

_CONTROL_BYTES = bytes([*range(0x00, 0x09), *range(0x0E, 0x1B), *range(0x1C, 0x20), 0x7F])
_BOMS = (  # longest first: the UTF-32-LE mark starts with the UTF-16-LE one
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
)
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
MULTIBYTE = {"gb18030", "big5hkscs", "cp932", "shift_jis_2004", "cp949", "euc_jis_2004", "euc_kr", "johab"}
# Tried last, when every guess failed: multi-byte encodings, whose strict decode of a whole file
# is strong evidence. (No single-byte code page: those decode anything.)
FALLBACKS = ("gb18030", "big5hkscs", "cp932", "cp949", "euc_jis_2004")
# Likely scripts for the letters of a text read as UTF-16 without a byte-order mark.
_PLAUSIBLE_UTF16 = ((0x0020, 0x024F), (0x0370, 0x052F), (0x0590, 0x06FF), (0x0900, 0x0E7F),
                    (0x2000, 0x206F), (0x3000, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF),
                    (0xAC00, 0xD7A3), (0xFF00, 0xFFEF))


@dataclass
class Decoded:
    """The text of a file, or why there is none."""

    text: str | None = None
    encoding: str | None = None  # Python codec name
    confidence: float | None = None  # 1.0 for a byte-order mark or valid UTF-8
    reason: str | None = None  # binary_content | undecodable_text
    detail: str = ""
    notes: list[str] = field(default_factory=list)


def decode_bytes(data: bytes, window: int = DETECT_WINDOW) -> Decoded:
    """Decode ``data`` strictly, detecting its encoding. Never raises on any input."""
    for bom, enc in _BOMS:
        if data.startswith(bom):
            return _decode_with_bom(data, bom, enc)
    head = data[:SNIFF_BYTES]
    controls = len(head) - len(head.translate(None, _CONTROL_BYTES))
    if controls:
        # UTF-16/32 text has NULs and control-range bytes; it must be recognised before they are
        # taken for binary
        wide = _utf16_32_by_nuls(data, head) if b"\x00" in head else None
        if wide is None and len(data) % 2 == 0:
            wide = _utf16_without_nuls(data)
        if wide is not None:
            return wide
        if controls == len(head) or (controls >= 2 and controls / len(head) > MAX_CONTROL_SHARE):
            nuls = head.count(0)
            what = f"{nuls} NUL bytes, " if nuls else ""
            return Decoded(reason="binary_content",
                           detail=f"binary data: {what}{controls / len(head):.1%} control bytes in the first {len(head)} bytes")
    if b"\x1b$" in head and head.isascii():
        iso = _iso2022(data)
        if iso is not None:
            return iso
    try:
        return Decoded(data.decode("utf-8"), "utf-8", 1.0)
    except UnicodeDecodeError as e:
        utf8_error = e
    if not controls and len(data) % 2 == 0:
        wide = _utf16_without_nuls(data)
        if wide is not None:
            return wide
    return _detect(data, window, utf8_error)


def _decode_with_bom(data: bytes, bom: bytes, enc: str) -> Decoded:
    body = data[len(bom):]
    codec = "utf-8" if enc == "utf-8-sig" else enc
    try:
        text = body.decode(codec)
    except UnicodeDecodeError as e:
        return Decoded(encoding=enc, confidence=1.0, reason="undecodable_text",
                       detail=f"starts with a {_bom_name(enc)} byte-order mark but is not valid {_bom_name(enc)}: "
                              f"{e.reason} at byte {e.start + len(bom)}")
    notes = [] if enc == "utf-8-sig" else [f"{_bom_name(enc)} with a byte-order mark"]
    return Decoded(text, enc, 1.0, notes=notes)


def _bom_name(enc: str) -> str:
    return {"utf-8-sig": "UTF-8"}.get(enc, enc.upper())


def _control_share(head: bytes) -> float:
    if not head:
        return 0.0
    return (len(head) - len(head.translate(None, _CONTROL_BYTES))) / len(head)


def _utf16_32_by_nuls(data: bytes, head: bytes) -> Decoded | None:
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
        if odd > 0.05 and even < odd / 10:
            candidates.append("utf-16-le")
        if even > 0.05 and odd < even / 10:
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


def _utf16_without_nuls(data: bytes) -> Decoded | None:
    """UTF-16 CJK text without a byte-order mark: no NULs, so judge the decoded characters.

    A legacy multi-byte text misread as UTF-16 gives code units scattered over the whole range
    (surrogates, private use, unassigned, many unrelated blocks); real UTF-16 text stays in a
    few scripts plus punctuation and spaces.
    """
    sample = data[: min(len(data), 2 * PLAUSIBLE_CHARS) & ~1]
    best = None
    for enc in ("utf-16-le", "utf-16-be"):
        try:
            text = sample.decode(enc)
        except UnicodeDecodeError:
            continue
        # no NULs to go by: a Shift_JIS or GBK text read as UTF-16 is all "CJK" too, but without
        # the ideographic punctuation real prose has every sentence or so
        if len(text) >= 8 and _plausible_text(text, 1 / 80) and _script_count(text) <= 3:
            best = enc
            break
    if best is None:
        return None
    try:
        text = data.decode(best)
    except UnicodeDecodeError:
        return None
    return Decoded(text, best, 0.8, notes=[f"{best.upper()} without a byte-order mark (from the characters)"])


def _plausible_text(text: str, min_breaks: float) -> bool:
    """Nearly all characters from common scripts, and at least ``min_breaks`` (a share of the
    characters) of spaces or CJK punctuation between them: prose has them every few words."""
    text = text[:PLAUSIBLE_CHARS]
    if not text:
        return False
    odd = len(_IMPLAUSIBLE_CHAR.findall(text))
    breaks = len(_BREAK_CHAR.findall(text))
    return odd <= 0.02 * len(text) and breaks >= min_breaks * len(text)


_IMPLAUSIBLE_CHAR = re.compile("[^\t\n\r" + "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in _PLAUSIBLE_UTF16) + "]")
_BREAK_CHAR = re.compile("[\t\n \u3000-\u303f\uff00-\uff20]")


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


def _detect(data: bytes, window: int, utf8_error: UnicodeDecodeError) -> Decoded:
    """chardet on a window, verified by a strict decode of everything, with fallbacks."""
    import chardet

    start = _first_high_byte(data)
    start = max(0, start - 256)  # all ASCII before the first high byte: any point in it is a character boundary
    probe = data[start : start + window]
    guesses = _chardet_candidates(chardet, probe)
    tried: list[str] = []
    first = guesses[0][0] if guesses else None
    result = _first_strict(data, guesses, tried)
    if result is None and len(data) > len(probe):
        result = _first_strict(data, _chardet_candidates(chardet, data, max_bytes=len(data)), tried)
    if result is None:
        result = _first_strict(data, [(enc, 0.0) for enc in FALLBACKS], tried, plausible_only=True)
    if result is None:
        return Decoded(encoding=first, confidence=guesses[0][1] if guesses else None, reason="undecodable_text",
                       detail=f"no encoding decodes it strictly (not UTF-8: {utf8_error.reason} at byte "
                              f"{utf8_error.start}; tried {', '.join(tried) or 'nothing'})")
    text, enc, conf = result
    out = Decoded(text, enc, round(conf, 3))
    if first is not None and enc != first and enc != SUPERSET.get(first):
        why = "did not decode the whole file" if first not in tried[: tried.index(enc)] or not _decodes(data, first) \
            else "gave less plausible text"
        out.notes.append(f"decoded as {enc}: chardet's first guess {first} {why}")
    return out


def _decodes(data: bytes, enc: str) -> bool:
    try:
        data.decode(enc)
        return True
    except (UnicodeDecodeError, LookupError):
        return False


def _paired(text: str) -> bool:
    """At least two characters beyond Latin-1 were made of paired bytes."""
    return sum(1 for ch in text[:4000] if ord(ch) > 0x2E7F) >= 2


def _first_high_byte(data: bytes) -> int:
    stripped = data.lstrip(bytes(range(0x80)))
    return len(data) - len(stripped)


def _chardet_candidates(chardet, data: bytes, max_bytes: int | None = None) -> list[tuple[str, float]]:
    """chardet's guesses, best first, mapped to the codecs that decode them, without repeats."""
    era = chardet.EncodingEra.MODERN_WEB | chardet.EncodingEra.LEGACY_ISO | chardet.EncodingEra.LEGACY_REGIONAL
    kw = {"max_bytes": max_bytes} if max_bytes else {}
    found = chardet.detect_all(data, encoding_era=era, compat_names=False, **kw)
    out: list[tuple[str, float]] = []
    for g in found[:MAX_GUESSES]:
        enc = g.get("encoding")
        if not enc:
            continue
        for codec in (SUPERSET.get(enc), enc):
            if codec and codec not in (c for c, _ in out) and _known(codec):
                out.append((codec, float(g.get("confidence") or 0.0)))
    if out and "cp1252" not in (c for c, _ in out) and (out[0][1] < LOW_CONFIDENCE or out[0][0].startswith("iso8859")):
        out.append(("cp1252", 0.0))  # short Western texts: chardet's weakest spot
    return out


def _known(codec: str) -> bool:
    try:
        codecs.lookup(codec)
        return True
    except LookupError:
        return False


def _first_strict(data: bytes, guesses: list[tuple[str, float]], tried: list[str],
                  plausible_only: bool = False) -> tuple[str, str, float] | None:
    """The first guess that decodes all of ``data``; among low-confidence guesses, the most plausible."""
    decoded: list[tuple[str, str, float]] = []
    for enc, conf in guesses:
        if enc in tried:
            continue
        tried.append(enc)
        try:
            text = data.decode(enc)
        except (UnicodeDecodeError, LookupError):
            continue
        if conf >= LOW_CONFIDENCE and not decoded and not _C1.search(text):
            return text, enc, conf
        decoded.append((text, enc, conf))
    if not decoded:
        return None
    # Weigh the decodes by implausibility: C1 control characters (an ISO-8859 reading of cp1252
    # quotes), and words that mix scripts, which is what a wrong single-byte code page makes of
    # accented letters ("cafι" for "café"). On a tie, a multi-byte encoding whose every high byte
    # paired up into a character wins if chardet rated it about as well: a single-byte code page
    # decodes any bytes, so its success says nothing, while chance pairings soon fail. Then
    # chardet's order.
    top = max(c for _t, _e, c in decoded)
    best = None
    for i, (t, e, c) in enumerate(decoded):
        evidence = 0 if e in MULTIBYTE and c >= top / 2 and _paired(t) else 1
        if best is not None and (best[0] == 0 and evidence >= best[1]):
            continue  # cannot beat a flawless earlier decode: skip the costly score
        score = (_implausibility(t), evidence, i)
        if best is None or score < best:
            best = score
    if plausible_only and best[0] > 0:
        return None
    return decoded[best[2]]


_C1 = re.compile("[\x80-\x9f]")
_ASCII = "".join(map(chr, range(128)))
# a non-ASCII symbol, digit-like sign or currency between two letters
_WEDGED = re.compile(r"(?<=[^\W\d_])[\u00a0-\u00bf\u00d7\u00f7\u02c6-\u02dd\u2020-\u2022\u2030\u2039\u203a\u20ac\u2122](?=[^\W\d_])")
_SCRIPT_CACHE: dict[str, str] = {}
_WORD = re.compile(r"[^\W\d_]+")


def _script(ch: str) -> str:
    s = _SCRIPT_CACHE.get(ch)
    if s is None:
        try:
            s = unicodedata.name(ch).split(" ", 1)[0]
        except ValueError:
            s = "?"
        _SCRIPT_CACHE[ch] = s
    return s


def _implausibility(text: str, limit: int = 1500) -> int:
    """How wrong a decode looks: C1 controls (an ISO-8859 reading of cp1252 quotes), words that
    mix scripts ("cafι" for "café"), and symbols wedged between letters ("¯ó³æ" for "Żółć")."""
    start = len(text) - len(text.lstrip(_ASCII))  # ASCII says nothing: look where the rest begins
    start = max(0, start - 64)
    text = text[start : start + limit]
    return len(_C1.findall(text)) + _mixed_script_words(text, limit) + len(_WEDGED.findall(text))


def _script_count(text: str) -> int:
    return len({_script(ch) for ch in text[:2000] if ch.isalpha()})


def _mixed_script_words(text: str, limit: int = PLAUSIBLE_CHARS) -> int:
    """Words that mix scripts, e.g. Latin with Greek ("cafι"): the mark of a wrong code page."""
    mixed = 0
    for m in _WORD.finditer(text, 0, limit):
        word = m.group()
        if word.isascii():
            continue
        scripts = {_script(ch) for ch in word}
        if len(scripts) > 1 and not scripts <= _CJK_SCRIPTS:
            mixed += 1
    return mixed


# Japanese mixes these within a word by design.
_CJK_SCRIPTS = {"CJK", "HIRAGANA", "KATAKANA", "HALFWIDTH", "FULLWIDTH"}
