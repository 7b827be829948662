"""Bytes to text: is it text at all, and which encoding, decoded strictly or not at all.

`decode_bytes` tries, in order (each step a strict decode of the *whole* file):

1. a byte-order mark (UTF-32, UTF-8, UTF-16): the mark says the encoding;
2. UTF-16/32 without a mark, from the byte pattern (NUL bytes at one parity for mostly-ASCII
   text; for CJK text, which has no NULs, a strict decode whose characters are plausible);
3. binary content: NUL bytes and other control bytes make up a noticeable share;
4. HZ (7-bit GB2312 between "~{" and "~}", which UTF-8 would take for ASCII), then strict
   UTF-8 (the fast path: most files end here, at memory speed);
5. ISO-2022 (7-bit, escape sequences);
   For a legacy file up to `FLOOR_BYTES` long, chardet's reading of the whole file (the naive
   way) is the floor: it is taken when nothing in it is implausible for one language in one
   script (`_penalty`), else it is weighed against our own reading (steps 6-8), the more
   plausible taken, a tie going to chardet's unless it is a rare code page; a reading both
   chose that shows implausible letters gives way to a cleaner one in another code page of its
   script; and one whose letters beyond ASCII are those of a code page that only one language
   uses, in words shaped like that language's (Esperanto in ISO-8859-3), is taken over readings
   that make them other languages' letters (`_told_by_its_words`). Every legacy reading gets a
   calibrated confidence (`_calibrated`): below 0.7 in a rare code page, or below 0.3 for a
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
"""

from __future__ import annotations

import codecs
import collections
import functools
import re
import unicodedata
from dataclasses import dataclass, field

from pipeline.formats.vocabulary import Reason

# chardet looks at this many bytes; enough for a stable guess, far less than reading it all.
DETECT_WINDOW = 4096
# The quick pass gives chardet this many: its cost grows with the window, and a guess from a
# short one is checked on the whole file anyway.
QUICK_WINDOW = 1024
# ...starting this many bytes of ASCII before the first non-ASCII one (the words around it).
QUICK_CONTEXT = 32
# When chardet is unsure on the window, or no guess from it decodes the whole file, chardet
# looks at this many bytes (its own default): the characters that tell can be few and late.
FULL_WINDOW = 200_000
# Files up to this long are also read as chardet reads the whole file (the naive way, and the
# floor): on them chardet costs about what our quick pass does, and short texts are where a
# reading chosen from a few letters most often goes wrong.
FLOOR_BYTES = 4096
# Bytes inspected for the binary and UTF-16/32 byte-pattern checks.
SNIFF_BYTES = 65536
# More than this share of control bytes (NUL included) in the sniffed bytes means binary.
MAX_CONTROL_SHARE = 0.01
# Characters looked at when judging how plausible a decode is.
PLAUSIBLE_CHARS = 4096
# Below this many code units, text read as UTF-16 without a byte-order mark must keep to one
# script throughout (`_one_script_throughout`): a legacy text this short passes the shares.
SHORT_UTF16_CHARS = 64
# Below this chardet confidence a guess is weighed against alternatives by plausibility.
LOW_CONFIDENCE = 0.5
# chardet's guesses beyond this many are not worth a decode.
MAX_GUESSES = 6
# The quick pass keeps a guess only from this chardet confidence up (0.10 is chardet's "nothing fit").
QUICK_MIN_CONFIDENCE = 0.2
# A file our own reading would refuse is decoded in chardet's whole-file reading from this
# calibrated confidence up (`_calibrated`: a rare code page needs 6 bytes beyond ASCII).
TAKE_REFUSED = 0.7
# A rare code page (Mac, DOS, regional) is taken from this calibrated confidence up, else the
# file is refused: below it, such readings of real texts were nearly all wrong.
RARE_MIN_CONFIDENCE = 0.7
# A short file's reading of ours, not chardet's, below this calibrated confidence is refused:
# more implausible spots than the text has evidence for ("隴45霽(鑱鯏僊" for Korean "第45條(休職期間")
# were wrong more often than right. (chardet's reading of the whole file is the floor; a long
# file's confidence comes from a 1 KB window: too little to refuse on.)
MIN_CONFIDENCE = 0.3
# A runner-up rated this share of the quick pass's guess or more is a rival worth weighing.
QUICK_RIVAL = 0.7
# What the quick pass asks chardet about: its modern-web era (the encodings today's legacy files
# are in) less UTF-8/16/32, ASCII and ISO-2022, which are settled before chardet is asked, and
# less EUC-KR, TIS-620 and Shift_JIS-2004, whose text their supersets here read the same (a
# file with JIS X 0213 kanji fails cp932 and goes to the full detection). Each candidate costs
# chardet a trial decode and a model score.
QUICK_ENCODINGS = ("gb18030", "big5hkscs", "cp932", "euc_jis_2004", "cp949", "cp1250", "cp1251", "cp1252",
                   "cp1253", "cp1254", "cp1255", "cp1256", "cp1257", "cp1258", "koi8-r", "koi8-u", "cp874")

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
# Windows code pages and the ISO-8859 parts of the same alphabets, which put some letters
# elsewhere (cp1250 "ą" is ISO-8859-2 "ą" at another byte; cp1252 "¼" is ISO-8859-15 "Œ"). The
# quick pass knows only the Windows ones: a file whose bytes read differently in the ISO part is
# left to the full detection, which weighs both.
ISO_TWIN = {"cp1250": "iso8859-2", "cp1252": "iso8859-15", "cp1253": "iso8859-7", "cp1257": "iso8859-13"}
# What today's legacy files are written in: chardet's modern-web era (Windows code pages, KOI8,
# the CJK encodings of the web), and the ISO-8859 parts (`_rare` says so for those by name).
COMMON = {"ascii", "cp874", "cp932", "cp949", "euc_jis_2004", "euc_jp", "euc_kr", "gb18030", "gb2312", "gbk", "big5",
          "big5hkscs", "cp950", "shift_jis", "shift_jis_2004", "tis-620", "koi8-r", "koi8-u",
          *(f"cp{n}" for n in range(1250, 1259))}
# A text up to this long may be read as cp1252 rather than as an unsure code page (`_western_instead`).
WESTERN_MAX_BYTES = 400
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
# Tried last, when every guess failed: multi-byte encodings, whose strict decode of a whole file
# is strong evidence. (No single-byte code page: those decode anything.)
FALLBACKS = ("gb18030", "big5hkscs", "cp932", "cp949", "euc_jis_2004")
# Likely scripts for the letters of a text read as UTF-16 without a byte-order mark.
_PLAUSIBLE_UTF16 = ((0x0020, 0x024F), (0x0370, 0x052F), (0x0590, 0x06FF), (0x0900, 0x0E7F),
                    (0x2000, 0x206F), (0x3000, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF),
                    (0xAC00, 0xD7A3), (0xFF00, 0xFFEF))


class _Lazy:
    """A regular expression compiled when first used. The compiler fills a table a character at
    a time for a class over the CJK or Hangul blocks: milliseconds each, which every process
    paid at import, though most files (UTF-8) never need them."""

    def __init__(self, pattern: str, flags: int = 0) -> None:
        self.pattern, self.flags = pattern, flags

    @functools.cached_property
    def compiled(self) -> re.Pattern[str]:
        return re.compile(self.pattern, self.flags)


@dataclass
class Decoded:
    """The text of a file, or why there is none."""

    text: str | None = None
    encoding: str | None = None  # Python codec name
    confidence: float | None = None  # 1.0 for a byte-order mark or valid UTF-8; legacy: `_calibrated`
    reason: Reason | None = None  # BINARY_CONTENT | UNDECODABLE_TEXT
    detail: str = ""
    notes: list[str] = field(default_factory=list)


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
        wide = _utf16_32_by_nuls(data, head) if b"\x00" in head else None
        if wide is None and len(data) % 2 == 0:
            wide = _utf16_without_nuls(data)
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
        return Decoded(encoding=enc, confidence=1.0, reason=Reason.UNDECODABLE_TEXT,
                       detail=f"starts with a {_bom_name(enc)} byte-order mark but is not valid {_bom_name(enc)}: "
                              f"{e.reason} at byte {e.start + len(bom)}")
    notes = [] if enc == "utf-8-sig" else [f"{_bom_name(enc)} with a byte-order mark"]
    return Decoded(text, enc, 1.0, notes=notes)


def _bom_name(enc: str) -> str:
    return {"utf-8-sig": "UTF-8"}.get(enc, enc.upper())


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
        if len(text) >= 8 and _plausible_text(text, 1 / 80) and _script_count(text) <= 3 \
                and (len(data) >= 2 * SHORT_UTF16_CHARS or _one_script_throughout(text)):
            best = enc
            break
    if best is None:
        return None
    try:
        text = data.decode(best)
    except UnicodeDecodeError:
        return None
    return Decoded(text, best, 0.8, notes=[f"{best.upper()} without a byte-order mark (from the characters)"])


def _one_script_throughout(text: str) -> bool:
    """A short text read as BOM-less UTF-16 gives too few characters for the shares `_plausible_text`
    counts to mean anything (one break in eleven characters passes): ask for all its letters in one
    writing system (Japanese kanji and kana together) and no invisible format characters. A Latin
    text in a legacy code page read so pairs its letters into ideographs, and a letter before a
    space into U+2061-U+207A (invisible operators, bidi controls, superscripts)."""
    if any(unicodedata.category(ch) == "Cf" for ch in text):
        return False
    return len({_SCRIPT_TAGS[ord(ch)] for ch in text} - {" "}) <= 1


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


_IMPLAUSIBLE_CHAR = _Lazy("[^\t\n\r" + "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in _PLAUSIBLE_UTF16) + "]")
# Spaces and the punctuation of East Asian prose: the ideographic space, comma and full stop,
# brackets and quotation marks, and the full-width and half-width forms of ASCII punctuation
# (full-width digits too: "ウィンドウ１０に切り替え" has no other).
# Not the rest of U+3000-U+303F (iteration and repeat marks, Hangzhou numerals): "10" read as
# UTF-16-LE is U+3031, so a digit pair in a legacy text would pass for a sentence break.
_BREAK_CHAR = re.compile("[\t\n \u3000-\u3004\u3008-\u3011\u3014-\u301f"
                         "\uff01-\uff20\uff3b-\uff40\uff5b-\uff65]")


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
    if not all(_HZ_PLAUSIBLE.compiled.fullmatch(run) for run in runs) or len(_HAN.compiled.findall("".join(runs))) < 2:
        return None
    return Decoded(text, "hz", 0.99, notes=["HZ (7-bit GB2312 between ~{ and ~})"])


_HAN = _Lazy("[\u4e00-\u9fff]")
_HZ_RUN = _Lazy(r"~\{.*?~\}", re.S)
# what GB2312 holds beyond ASCII: Han, CJK and full-width punctuation, kana, Greek, Cyrillic,
# box drawing; at least one Han character per run
_HZ_PLAUSIBLE = _Lazy("[\u4e00-\u9fff\u3000-\u30ff\uff01-\uff5e\u2000-\u26ff"
                           "\u0391-\u03c9\u0401-\u0451\u00a4-\u00fc\\s]*", re.S)


def _detect(data: bytes, window: int, utf8_error: UnicodeDecodeError) -> Decoded:
    """A legacy file: for a short one, chardet's reading of the whole file (the naive way) is the
    floor (`_with_floor`); our own reading (`_our_reading`) replaces it only when more plausible.
    The confidence says how plausible the reading taken is (`_calibrated`)."""
    import chardet

    if len(data) <= FLOOR_BYTES:
        out, penalty, chardets = _with_floor(chardet, data, lambda: _our_reading(chardet, data, window, utf8_error))
        if penalty and out.text is not None:
            first = out
            out, penalty = _sibling(data, out, penalty)
            chardets = chardets and out is first
        if out.text is not None:
            told = _told_by_its_words(data, out, penalty)
            if told is not None:
                out, penalty, chardets = told, _penalty(told.text or "", data, told.encoding or ""), False
    else:
        out, penalty, chardets = _our_reading(chardet, data, window, utf8_error), None, False
    if out.text is None or out.encoding is None:  # a reading always names its encoding
        return out
    out.confidence = _calibrated(out.text, data, out.encoding, penalty)
    if _rare(out.encoding) and out.confidence < RARE_MIN_CONFIDENCE:
        return Decoded(encoding=out.encoding, confidence=out.confidence, reason=Reason.UNDECODABLE_TEXT,
                       detail=f"no trustworthy reading: the likeliest is the rare code page {out.encoding}, and too "
                              f"little of the text (confidence {out.confidence:.2f}) says it is right")
    if out.confidence < MIN_CONFIDENCE and len(data) <= FLOOR_BYTES and not chardets:
        return Decoded(encoding=out.encoding, confidence=out.confidence, reason=Reason.UNDECODABLE_TEXT,
                       detail=f"no plausible reading: the likeliest, {out.encoding}, has letters or characters "
                              f"that text in it hardly ever shows (confidence {out.confidence:.2f})")
    return out


# Code pages of one script, which put some of its letters at each other's bytes: a reading in
# one that shows implausible letters may be clean in another.
SIBLINGS = (("cp1250", "iso8859-2"), ("cp1252", "iso8859-15", "iso8859-3"), ("cp1257", "iso8859-13", "iso8859-4"),
            ("cp1251", "koi8-r", "koi8-u", "iso8859-5", "mac-cyrillic", "cp866"), ("cp1253", "iso8859-7", "cp737"),
            ("cp1254", "iso8859-9"))


def _sibling(data: bytes, out: Decoded, penalty: int) -> tuple[Decoded, int]:
    """A reading with implausible letters (Polish "pištek": cp1250 "piątek" read as ISO-8859-2),
    when both we and chardet chose it, against the other code pages of its script: one that
    reads the bytes with fewer implausible spots is taken."""
    if out.encoding is None:  # not a reading: nothing to compare
        return out, penalty
    name = codecs.lookup(out.encoding).name
    family = next((f for f in SIBLINGS if name in f), ())
    best = (penalty, out)
    for codec in family:
        if codec == name:
            continue
        try:
            text = data.decode(codec)
        except UnicodeDecodeError:
            continue
        p = _penalty(text, data, codec)
        if p < best[0]:
            best = (p, Decoded(text, codec, notes=[f"decoded as {codec}: its letters are more plausible than "
                                                   f"{out.encoding}'s, the code page chosen first"]))
    return best[1], best[0]


# Letters that only one code page gives, and the words of the one language written in it: in a
# short text the letters beyond ASCII are one or two, and other code pages read them as letters
# of other languages just as plausibly (Esperanto "danĝera" is Czech-looking "danřera" in cp1250,
# "feliĉo" Danish-looking "feliæo" in cp1252); the ASCII words around them are what tells.
# Esperanto's words say so by their endings: every noun ends in -o, adjective -a, adverb -e,
# verb -i, -as, -is, -os, -us or -u, with -j for the plural and -n for the object; the rest are
# a few dozen short words, none of one letter; it has no q, w, x or y, its "j" follows a vowel,
# and its diphthongs are "aj ej oj uj", not "ai ei oi ui" (Czech "chyba přetekla", Croatian
# "neposjećene", Lithuanian "vaikai žaidžia" read in ISO-8859-3 look Esperanto by their
# endings). Its "ĉ ĝ ĵ" come before a vowel, "ĥ ŝ" beside one, and "ŭ" after one ("aŭ",
# "eŭ"), where Danish "æ ø" and Turkish "ı" read in ISO-8859-3 are vowels among consonants
# ("ĉndre" for "ændre", "lĉse" for "læse", "yapŭlmaz" for "yapılmaz").
_CONSONANT = "b-df-hj-np-tv-zĉĝĥĵŝ"
_TOLD_BY_WORDS = (
    ("iso8859-3", frozenset("ĉĝĥĵŝŭĈĜĤĴŜŬ"),
     re.compile(f"(?i)(?<![ae])ŭ|[ĉĝĵ](?=[{_CONSONANT}])|(?<=[{_CONSONANT}])[ĥŝ](?=[{_CONSONANT}])"),
     re.compile(f"^(?!.*(?:[qwxy]|[{_CONSONANT}]j|[aeou]i)).*(?:[oa]j?n?|e|[iu]|[aiou]s)$"),
     frozenset("la kaj de al el en ol kun sen por pri sed ke se ne tre pli nur per pro dum post sur sub tra "
               "inter mi vi li ni ili oni ŝi ĝi ĉu ĉar ĉe ĝis ankaŭ laŭ kontraŭ jam jen kiel tiel nun tuj tro for "
               "ĉiam neniam iam kiam tiam kiom tiom kiu tiu ĉiu kio tio".split())),
)
# ...from this share of a text's words, and at least this many words.
WORDS_TELL_SHARE = 0.8
WORDS_TELL_MIN = 3
# a word: letters, not after a digit or a format's "%", an option's "-" or an escape's "\\"
_WORD = re.compile(r"(?<![%\\-])\b[^\W\d_]+")


def _told_by_its_words(data: bytes, out: Decoded, penalty: int | None) -> Decoded | None:
    """A reading in a code page whose own letters are the only ones beyond ASCII, in words shaped
    like its language's (`_TOLD_BY_WORDS`), instead of ``out``, when no less plausible."""
    for codec, letters, misplaced, ending, words in _TOLD_BY_WORDS:
        if out.encoding == codec:
            continue
        try:
            text = data.decode(codec)
        except UnicodeDecodeError:
            continue
        beyond = set(text) - set(_ASCII)
        if not beyond or not beyond <= letters or text == out.text or misplaced.search(text):
            continue
        found = _WORD.findall(text.lower())
        shaped = sum(1 for w in found if len(w) > 1 and (w in words or ending.search(w)))
        if len(found) < WORDS_TELL_MIN or shaped < WORDS_TELL_SHARE * len(found):
            continue
        if penalty is not None and _penalty(text, data, codec) > penalty:
            continue
        return Decoded(text, codec, notes=[f"decoded as {codec}: its letters are the only ones beyond ASCII, in words "
                                           f"shaped like its language's ({shaped} of {len(found)}), where "
                                           f"{out.encoding} read other letters"])
    return None


def _our_reading(chardet, data: bytes, window: int, utf8_error: UnicodeDecodeError) -> Decoded:
    """The quick pass, else chardet over more eras and bytes, every guess verified by a strict
    decode of everything and weighed by its oddities, with fallbacks."""

    # all ASCII before the first high byte: any point in it is a character boundary
    first_high = _first_high_byte(data)
    quick_start = max(0, first_high - QUICK_CONTEXT)
    quick = _quick_guess(chardet, data, data[quick_start : quick_start + QUICK_WINDOW])
    if quick is not None:
        return quick
    start = max(0, first_high - 256)
    probe = data[start : start + window]
    eras = chardet.EncodingEra.MODERN_WEB | chardet.EncodingEra.LEGACY_ISO | chardet.EncodingEra.LEGACY_REGIONAL
    guesses = _chardet_candidates(chardet, probe, eras)
    if len(data) > len(probe) and (not guesses or guesses[0][1] < LOW_CONFIDENCE):
        # unsure on the window: chardet on more of the file, its guesses first (the letters that
        # tell cp1252 from cp1250 or ISO-8859-15 from ISO-8859-10 can be few and late)
        wide = _chardet_candidates(chardet, data[start : start + FULL_WINDOW], eras)
        guesses = wide + [g for g in guesses if g[0] not in {enc for enc, _ in wide}]
    tried: list[str] = []
    first = guesses[0][0] if guesses else None
    result = _best_strict(data, guesses, tried)
    if result is None or result[3] > 0:
        # everything looks a little wrong, or nothing fit (then the window misled: look at more
        # of the file): chardet over every era, which also knows the Mac, DOS and EBCDIC code
        # pages; one of those must look right to be taken
        wider = probe if result is not None else data[start : start + FULL_WINDOW]
        others = _chardet_candidates(chardet, wider, chardet.EncodingEra.ALL)
        if result is not None:  # chardet must rate the other reading at least as high
            others = [(enc, conf) for enc, conf in others if conf >= result[2]]
        more = _best_strict(data, others, tried, plausible_only=result is None)
        if more is not None and (result is None or more[3] < result[3]):
            result = more
    if result is None:
        result = _best_strict(data, [(enc, 0.0) for enc in FALLBACKS], tried, plausible_only=True)
    if result is None:
        return Decoded(encoding=first, confidence=guesses[0][1] if guesses else None, reason=Reason.UNDECODABLE_TEXT,
                       detail=f"no encoding decodes it strictly (not UTF-8: {utf8_error.reason} at byte "
                              f"{utf8_error.start}; tried {', '.join(tried) or 'nothing'})")
    western = _western_instead(data, result)
    if western is not None:
        return Decoded(western, "cp1252", round(result[2], 3), notes=[
            f"decoded as cp1252: as clean as chardet's unsure {result[1]} ({result[2]:.2f}), whose reading has "
            f"letters that text in it hardly ever shows"])
    why = _why_not_first(data, first, result[1], tried)
    if _rare(result[1]) or why == _LESS_PLAUSIBLE:
        checked = _second_opinion(chardet, data, result)
        if isinstance(checked, str):
            return Decoded(encoding=result[1], confidence=round(result[2], 3), reason=Reason.UNDECODABLE_TEXT, detail=checked)
        if checked[0] is not result[0]:
            text, enc, conf, _odd = checked
            which = "is a rare code page" if _rare(result[1]) else f"was preferred to its first guess {first}"
            return Decoded(text, enc, round(conf, 3), notes=[
                f"decoded as {enc}: chardet's reading of the whole file, as plausible as {result[1]}, which {which}"])
        result = checked
    text, enc, conf, _odd = result
    out = Decoded(text, enc, round(conf, 3))
    if why:
        out.notes.append(f"decoded as {enc}: chardet's first guess {first} {why}")
    return out


def _with_floor(chardet, data: bytes, our_reading) -> tuple[Decoded, int | None, bool]:
    """chardet's reading of the whole file against ours (``our_reading()``, made only when it
    could win): the reading more plausible for one language in one script throughout
    (`_penalty`) is taken, and on a tie chardet's, unless it is a rare code page and ours is not
    (chardet's whole-file guesses for short Western texts are often a DOS or Mac code page). A
    file we would refuse is decoded in chardet's reading when nothing in it looks out of place.
    Returns the reading, its penalty (None when not worked out), and whether it is chardet's."""
    found = chardet.detect(data, compat_names=False)
    enc = found.get("encoding")
    codec = SUPERSET.get(enc, enc) if enc else None
    if codec in EBCDIC and not _ebcdic_like(data):
        codec = None  # high bytes without EBCDIC's spaces: EBCDIC letters by chance
    try:
        text = data.decode(codec) if codec else None
    except (UnicodeDecodeError, LookupError):
        text = None
    if text is None or codec is None:
        return our_reading(), None, False
    floor = _penalty(text, data, codec)
    taken = Decoded(text, codec)
    conf = float(found.get("confidence") or 0.0)
    unsure = conf < QUICK_MIN_CONFIDENCE and codec not in MULTIBYTE
    if floor == 0 and not _rare(codec) and not unsure:
        return taken, 0, True  # ours could at best tie, and a tie is chardet's
    ours = our_reading()
    if ours.text is None:
        if floor or _calibrated(text, data, codec, floor) < TAKE_REFUSED:
            return ours, None, False  # implausible, or a rare code page with too few letters to tell
        taken.notes.append(f"decoded as {codec}: chardet's reading of the whole file, in which nothing looks out "
                           f"of place (refused otherwise: {ours.detail})")
        return taken, floor, True
    if ours.text == text or ours.encoding is None:  # (a reading always names its encoding)
        return ours, floor, True
    mine = _penalty(ours.text, data, ours.encoding)
    if mine < floor or (mine == floor and _less_likely(codec, unsure, ours)):
        return ours, mine, False
    why = "more plausible" if floor < mine else "as plausible"
    taken.notes.append(f"decoded as {codec}: chardet's reading of the whole file, {why} than {ours.encoding}")
    return taken, floor, True


def _less_likely(codec: str, unsure: bool, ours: Decoded) -> bool:
    """Of two readings as plausible, chardet's (in ``codec``) is the less likely: a rare code page
    against a common one, or a single-byte code page chardet rates in its "nothing fit" range
    against our multi-byte reading whose high bytes all paired into characters (a short GBK
    caption chardet rates 0.01 as Thai: any bytes decode in a single-byte code page, chance
    pairings soon fail)."""
    if ours.text is None or ours.encoding is None:  # not a reading: chardet's is the likelier
        return False
    if _rare(codec) and not _rare(ours.encoding):
        return True
    return unsure and ours.encoding in MULTIBYTE and _paired(ours.text)


_HIGH_BYTES = bytes(range(0x80, 0x100))


def _window(text: str, data: bytes, codec: str) -> tuple[str, bytes, str]:
    """`QUICK_WINDOW` bytes of a long reading from a little before its first byte beyond ASCII
    (what the quick pass showed chardet), as text and bytes that match (a single-byte code page:
    a byte is a character; a multi-byte one: the bytes decoded again from a character boundary
    the ASCII before it gives)."""
    start = max(0, _first_high_byte(data) - QUICK_CONTEXT)
    if _single_byte(codec) is not None:
        return text[start : start + QUICK_WINDOW], data[start : start + QUICK_WINDOW], codec
    chunk = data[start : start + QUICK_WINDOW]
    return chunk.decode(codec, "ignore"), chunk, codec  # only the last character may be cut


def _calibrated(text: str, data: bytes, codec: str, penalty: int | None = None) -> float:
    """How likely the reading is right, from how plausible it is (``penalty``, `_penalty`) and
    how much it rests on (its bytes beyond ASCII). Fitted on ~4,500 short and long real texts in
    40 languages (bench/text_packages.py and bench/text_accuracy.py): a reading with nothing out
    of place in a common code page was right 93% of the time with a handful of such bytes and
    99-100% with ten or more; in a rare code page 0-30% and 90%; each implausible spot lowers
    the odds, less so in a long text. A long file is judged on a 1 KB window (`_window`)."""
    if penalty is None:  # a long file: judged on a window from its first byte beyond ASCII, at a bounded cost
        text, data, codec = _window(text, data, codec)
        penalty = _penalty(text, data, codec)
    sample = data[:FLOOR_BYTES]
    n = len(sample) - len(sample.translate(None, _HIGH_BYTES))  # bytes beyond ASCII: the evidence
    doubt = 3.0 if _rare(codec) else 0.3
    conf = max(0.0, 1 - doubt / (4 + n)) * max(0.05, 1 - 3 * penalty / (4 + n))
    return round(conf, 3)


def _penalty(text: str, data: bytes, codec: str) -> int:
    """How implausible a reading is: its oddities (`_oddities`) and its letters that no one
    language's alphabet holds together with the rest (`_foreign_letters`)."""
    odd = _oddities(text, data, codec)
    if odd and _HANGUL.compiled.search(text):  # Korean writes Han and Hangul in one word ("期間등"): no oddity
        odd = max(0, odd - len(_HAN_HANGUL.compiled.findall(text, 0, 2000)))
    if "\u00b7" in text:  # "声声慢·寻寻觅觅", "고용·임금": a separator
        odd -= len(_CJK_MIDDLE_DOT.compiled.findall(text, 0, 2000))
    ukrainian_g = text.count("ґ")
    return (max(0, odd) + _foreign_letters(text) + _rare_ideographs(text, codec) + len(_GLUED.findall(text))
            + len(_CYRILLIC_CAMEL.findall(text))
            + _rare_letters(text) + (ukrainian_g if ukrainian_g > 1 and ukrainian_g > text.count("і") else 0))


def _rare_ideographs(text: str, codec: str) -> int:
    """Ideographs beyond the common set of the reading's language, past one in ten: Korean
    text read as EUC-JIS-2004 is made of JIS level-2 kanji ("隴45霽(鑱鯏僊" for "第45條(休職期間"),
    while real Japanese and Chinese text draws nearly all its characters from level 1 (JIS X
    0208) or GB2312 level 1 (the 3,755 most frequent hanzi), bar a name or two."""
    common = _COMMON_IDEOGRAPH.get(codecs.lookup(codec).name) if codec in MULTIBYTE or codec in _COMMON_IDEOGRAPH else None
    if common is None:
        return 0
    han = _HAN.compiled.findall(text, 0, 4000)
    rare = sum(1 for ch in han if not common(ch))
    return max(0, rare - len(han) // 10)


def _in_level_1(codec: str, lo: int, hi: int):
    """Whether a character's first byte in ``codec`` falls in [lo, hi] (a frequency level)."""
    def common(ch: str) -> bool:
        try:
            b = ch.encode(codec)
        except UnicodeEncodeError:
            return False
        return lo <= b[0] <= hi
    return functools.lru_cache(maxsize=8192)(common)


_JIS_LEVEL_1 = _in_level_1("euc_jp", 0xB0, 0xCF)
_GB_LEVEL_1 = _in_level_1("gb2312", 0xB0, 0xD7)
_BIG5_FREQUENT = _in_level_1("big5", 0xA4, 0xC6)
_COMMON_IDEOGRAPH = {"cp932": _JIS_LEVEL_1, "euc_jis_2004": _JIS_LEVEL_1, "shift_jis_2004": _JIS_LEVEL_1,
                     "euc_jp": _JIS_LEVEL_1, "shift_jis": _JIS_LEVEL_1, "gb18030": _GB_LEVEL_1, "gbk": _GB_LEVEL_1,
                     "gb2312": _GB_LEVEL_1, "big5hkscs": _BIG5_FREQUENT, "big5": _BIG5_FREQUENT, "cp950": _BIG5_FREQUENT}


def _rare_letters(text: str) -> int:
    """`_RARE_LETTER`s of a mostly Latin text (in Russian, "В" and "У" are words)."""
    head = text[:2000]
    if _GREEK_OR_CYRILLIC_WORD.search(head):
        return 0
    rare = _RARE_LETTER_FAST.findall(text)  # mostly none: then the letters need no counting
    if not rare or len(_LATIN_LETTER.findall(head)) * 2 < len(_LETTER_RE.findall(head)):
        return 0
    return len(rare)


# `_RARE_LETTER`, matching from one class of the characters a match can start with (a rare
# letter, a digit, a Greek or Cyrillic letter): the scan skips to those, where a look-behind
# first, or a letter class first, is tried at every position (a third of the cost)
_RARE_LETTER_FAST = re.compile("[ŕŔĺĹďĎŤĒ0-9\u0370-\u03ff\u0400-\u04ff]"
                               "(?:(?<=[ŕŔĺĹďĎŤĒ])|(?<=[0-9])[^\\W\\d_](?![^\\W\\d_])"
                               "|(?<=[\u0370-\u03ff\u0400-\u04ff])(?<![^\\W\\d_].)(?![^\\W\\d_]))")


# Signs a wrong code page puts where a capital letter was, at the start of a word: MacCyrillic
# capitals read as cp1251 ("‚сі" for "Всі", "€нший" for "Інший"), a DOS or Mac letter read as a
# Windows one. Between two letters they are oddities already. (Each match is one sign, matched
# from one class of them all and told apart by a look-behind after it: the scan skips to the
# signs, where an alternation of classes is tried at every position, at five times the cost.)
_GLUED = re.compile("[†‡•‰‹›€™…№¬√ƒ≈∆÷‚–—\u2500-\u259f\u2320\u2321]"
                    "(?:(?<=[†‡•‰‹›€™…№¬√ƒ≈∆÷])(?<![^\\W\\d_].)(?=[^\\W\\d_])|(?<=‚)(?=[\u0430-\u045f])|(?<=‚)(?<!\\S.)(?!\\S)"
                    "|(?<=[–—])(?<![^\\W\\d_].)(?=[\u0430-\u045f])"
                    # box drawing touching a letter: a DOS code page's letters read as another's
                    "|(?<=[\u2500-\u259f\u2320\u2321])(?=[^\\W\\d_])|(?<=[\u2500-\u259f\u2320\u2321])(?<=[^\\W\\d_].))")
_HANGUL = _Lazy("[\uac00-\ud7a3]")
_HAN_HANGUL = _Lazy("[\u4e00-\u9fff](?=[\uac00-\ud7a3])|[\uac00-\ud7a3](?=[\u4e00-\u9fff])")
_CJK_MIDDLE_DOT = _Lazy("\u00b7(?<=[\u3040-\u30ff\u4e00-\u9fff\uac00-\ud7a3].)(?=[\u3040-\u30ff\u4e00-\u9fff\uac00-\ud7a3])")
# A Cyrillic capital after lower-case letters of its word ("народжуютьсЯ": MacCyrillic "я" read
# as cp1251): Cyrillic has no camelCase identifiers.
# (One class of both first, as `_GLUED`.)
_CYRILLIC_CAMEL = re.compile("[\u0400-\u045f](?:(?<=[\u0400-\u042f])(?<=[\u0430-\u045f]{2}.)"
                             # ...or a word's lower-case first letter before capitals ("пРИВЕТ": cp1251 read as KOI8)
                             "|(?<=[\u0430-\u045f])(?<![^\\W\\d_].)(?=[\u0400-\u042f]{2}))")
_GREEK_OR_CYRILLIC_WORD = re.compile("[\u0370-\u03ff\u0400-\u04ff]{2}")


def _foreign_letters(text: str) -> int:
    """Letters beyond ASCII that the language whose alphabet fits the text best lacks.

    A wrong single-byte code page keeps the script but changes the language: Esperanto "ĉiu"
    read as cp1252 is "æiu", Ukrainian MacCyrillic read as cp1251 mixes Serbian "Ђ", "ћ" with
    Ukrainian "і", a Swedish "på" read as ISO-8859-3 is Maltese "pċ" beside Swedish "ä". Real
    text is written in one language, and its letters beyond ASCII fit that language's alphabet,
    bar a name or two."""
    lower = text.lower()
    # ASCII, Latin-1 signs, and what is not a letter do not count
    letters = {ch for ch in set(lower) if ch >= "\u00c0" and ch not in "×÷" and ch.isalpha()}
    if not letters or _one_alphabet_holds(letters):
        return 0  # (most texts: told by the distinct letters, without counting each)
    counts = collections.Counter(lower)
    for ch in [ch for ch in counts if ch not in letters]:
        del counts[ch]
    total = sum(counts.values())
    inside = 0
    # the alphabets holding the most frequent letter first: one of them mostly holds them all,
    # and the scan ends there (CJK text would otherwise be weighed against 40 alphabets first)
    for alphabet in _alphabets_holding_first(max(counts, key=counts.__getitem__)):
        inside = max(inside, sum(counts[ch] for ch in alphabet.held(letters)))
        if inside == total:
            break
    return total - inside


def _one_alphabet_holds(letters: set[str]) -> bool:
    """One of `_ALPHABETS` holds all of ``letters``: such an alphabet holds any one of them, so
    only those holding one are tried."""
    some = min(letters)
    for alphabet in _alphabets_holding_first(some):
        if not alphabet.holds(some):
            return False  # the rest hold none of them
        if len(alphabet.held(letters)) == len(letters):
            return True
    return False


# The letters beyond ASCII of the languages legacy files were written in, lower case, each
# pattern deleting them from a string.
_ALPHABET_CLASSES = (
    "æøåéèóòôü", "åäöéü", "äöåšž", "áðéíóúýþæö", "áðíóúýæø", "äöüßéà", "éëïöüèáóúàç", "àâæçéèêëîïôœùûüÿ",
    "áéíóúñüàèç", "áâãàçéêíóôõúü", "àèéìíîòóùú", "àçèéíïòóúü", "áéíóú", "âêîôûŵŷáéíóúàèìòùäëïöüÿ",
    "ĉĝĥĵŝŭ", "ċġħżàèìòù", "çğıöşüâîû", "çəğıöşü", "áčďéěíňóřšťúůýž", "áäčďéíĺľňóôŕšťúýž",
    "ąćęłńóśźż", "áéíóöőúüű", "ăâîșțşţ", "čćđšž", "çë", "ąčęėįšųūž", "āčēģīķļņšūž", "äõöüšž",
    "àáâãèéêìíòóôõùúýăđĩũơư\u1ea0-\u1ef9",
    "а-яё", "а-щьюяєіїґ", "а-ийк-шы-яёіў", "а-щъьюяѝ", "а-ијк-шђљњћџ", "а-ијк-шѓѕљњќџѐѝ", "а-яёәғқңөұүһі",
    "\u0386-\u03ce", "\u05d0-\u05ea", "\u0621-\u064a\u0671-\u06d3", "\u0e01-\u0e5b",
    "\u4e00-\u9fff\u3400-\u4dbf\uf900-\ufaff", "\u4e00-\u9fff\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f",
    "\uac00-\ud7a3\u3131-\u318e\u4e00-\u9fff",
)


@dataclass(frozen=True)
class _Alphabet:
    """A language's letters: a set of the few, and ranges for the blocks of thousands (CJK,
    Hangul), which as sets cost about 60 ms of every process's start to build."""

    letters: frozenset[str]
    blocks: tuple[tuple[str, str], ...]

    def holds(self, ch: str) -> bool:
        return ch in self.letters or any(lo <= ch <= hi for lo, hi in self.blocks)

    def held(self, letters: set[str]) -> set[str]:
        """Those of ``letters`` in the alphabet (`&` runs over the smaller side)."""
        held = letters & self.letters
        for lo, hi in self.blocks:  # one pass a block: a CJK text has hundreds of letters to place
            held.update(ch for ch in letters if lo <= ch <= hi)
        return held


# A range longer than this stays a range (`_Alphabet.blocks`).
_BLOCK = 256


def _expand(letters: str) -> _Alphabet:
    """The alphabet of a class body of letters and ranges ("а-яё")."""
    out: set[str] = set()
    blocks = []
    i = 0
    while i < len(letters):
        if i + 2 < len(letters) and letters[i + 1] == "-":
            lo, hi = letters[i], letters[i + 2]
            if ord(hi) - ord(lo) > _BLOCK:
                blocks.append((lo, hi))
            else:
                out.update(map(chr, range(ord(lo), ord(hi) + 1)))
            i += 3
        else:
            out.add(letters[i])
            i += 1
    return _Alphabet(frozenset(out), tuple(blocks))


_ALPHABETS = [_expand(letters) for letters in _ALPHABET_CLASSES]


@functools.lru_cache(maxsize=1024)
def _alphabets_holding_first(top: str) -> tuple[_Alphabet, ...]:
    """`_ALPHABETS`, those holding ``top`` first (in their order): a text's most frequent letter
    is one of a few hundred, so the order is worked out once for each."""
    return tuple(sorted(_ALPHABETS, key=lambda a: not a.holds(top)))


_LESS_PLAUSIBLE = "gave less plausible text"
# Letters a Western (cp1252) text shows when read in a Central European or Baltic code page, and
# that text in those languages hardly ever has: Slovak "ŕ", "ĺ" (Western "à", "å"), "ď" ("ï"),
# a capital "Ť" (the "«" of Western quotes; "»" is "ť"), a capital "Ē" ("Ç").
_RARE_LETTER = re.compile("[ŕŔĺĹďĎŤĒ]"
                          # a letter stuck to a number ("10Ł" for "10£")
                          r"|(?<=[0-9])[^\W\d_](?![^\W\d_])"
                          # a lone Greek or Cyrillic letter among Latin words ("и" for Italian "è")
                          r"|(?<![^\W\d_])[\u0370-\u03ff\u0400-\u04ff](?![^\W\d_])")


def _western_instead(data: bytes, result: tuple[str, str, float, int]) -> str | None:
    """The cp1252 reading of a short text, when chardet was unsure of a single-byte reading that
    is no more plausible: cp1252 reads it without oddities, and the other reading shows letters
    text in its code page hardly ever has. Western text is the likeliest legacy text, and
    chardet's weakest spot on short texts."""
    text, enc, conf, odd = result
    if odd or conf >= LOW_CONFIDENCE or len(data) > WESTERN_MAX_BYTES or enc in ("cp1252", "iso8859-1", "iso8859-15"):
        return None
    if _single_byte(enc) is None or not _RARE_LETTER.search(text):
        return None
    try:
        western = data.decode("cp1252")
    except UnicodeDecodeError:
        return None
    if western == text or _oddities(western, data, "cp1252") or _RARE_LETTER.search(western):
        return None
    if len(_LATIN_LETTER.findall(text)) < len(_LETTER_RE.findall(text)) / 2:
        return None  # mostly Greek or Cyrillic: not a Western text misread
    return western


_LATIN_LETTER = re.compile("[A-Za-zÀ-ɏ]")


def _why_not_first(data: bytes, first: str | None, enc: str, tried: list[str]) -> str:
    """Why the reading is not chardet's first guess ("" when it is)."""
    if first is None or enc in (first, SUPERSET.get(first)):
        return ""
    if first not in tried[: tried.index(enc)] or not _decodes(data, first):
        return "did not decode the whole file"
    return _LESS_PLAUSIBLE


def _rare(codec: str) -> bool:
    """A code page outside chardet's modern-web era and the ISO-8859 parts: Mac, DOS, EBCDIC
    and regional ones (KZ-1048, PTCP154, HP Roman-8, ...), Johab."""
    try:
        name = codecs.lookup(codec).name
    except LookupError:
        return True
    return name not in COMMON and not name.startswith("iso8859-")


def _second_opinion(chardet, data: bytes, result: tuple[str, str, float, int]) -> tuple[str, str, float, int] | str:
    """Check a reading that is a rare code page, or that overrode chardet's first guess, with
    chardet's own view of the file: every era, from its first byte (where an XML or HTML
    declaration says what the file is in) over as much as `FULL_WINDOW`, as the naive way asks.

    A rare code page that wins a plausibility contest among look-alikes is more often a wrong
    guess than a real KZ-1048 file, and the oddities cannot tell readings in the same script
    apart: the reading stands when chardet agrees; when chardet reads the file otherwise and
    that reading decodes it strictly and looks no odder, chardet's reading is taken; else there
    is no reading to trust, and the returned string says why (a rare pick) or the reading
    stands (an override, which had a reason: chardet's first guess looked odder). chardet's
    reading counts only when rated above its "nothing fit" range (`QUICK_MIN_CONFIDENCE`): a
    short GBK caption that chardet rates 0.01 as Thai is Chinese, as its paired bytes say.
    """
    text, enc, _conf, odd = result
    found = chardet.detect_all(data[:FULL_WINDOW], encoding_era=chardet.EncodingEra.ALL, compat_names=False)
    other = found[0].get("encoding") if found else None
    if not other:
        return result if not _rare(enc) else _untrusted(enc, "has no guess")
    other, other_conf = SUPERSET.get(other, other), float(found[0].get("confidence") or 0.0)
    try:
        other_text = data.decode(other)
    except (UnicodeDecodeError, LookupError):
        other_text = None
    if other_text == text:  # agreed; chardet's name for it, when rated higher (a declared IBM866, not cp1125)
        return (text, other, other_conf, odd) if other_conf > result[2] else result
    if other_text is None:
        why = "which does not decode all of it"
    elif other_conf < QUICK_MIN_CONFIDENCE:
        why = f"rating that only {other_conf:.2f}"
    else:
        other_odd = _oddities(other_text, data, other)
        if other_odd <= odd:
            return other_text, other, other_conf, other_odd
        why = "which looks odder"
    return result if not _rare(enc) else _untrusted(enc, f"reads it as {other}, {why}")


def _untrusted(enc: str, why: str) -> str:
    return f"no trustworthy reading: the likeliest is the rare code page {enc}, but chardet over every era {why}"


def _quick_guess(chardet, data: bytes, probe: bytes) -> Decoded | None:
    """chardet restricted to the modern-web encodings, kept only when its decode is clean and
    no other reading is.

    Weighing the ISO-8859 and regional code pages too costs chardet twice as much, and today's
    files are seldom in them. When one is, the decode here looks wrong (Polish ISO-8859-2 read
    as cp1250 shows "±" and "¶" beside letters, Greek ISO-8859-7 read as cp1253 "¶" for "Ά"), or
    the ISO twin reads other clean letters (Croatian ISO-8859-2 "š" is cp1250 "ą"), and the full
    detection decides.
    """
    found = chardet.detect_all(probe, include_encodings=QUICK_ENCODINGS, compat_names=False)
    enc, conf = found[0].get("encoding"), float(found[0].get("confidence") or 0.0)
    if not enc or conf < QUICK_MIN_CONFIDENCE:
        return None
    codec = SUPERSET.get(enc, enc)
    try:
        text = data.decode(codec)
    except (UnicodeDecodeError, LookupError):
        return None
    if not _looks_clean(text, data, codec):
        return None
    # a close runner-up, or the ISO-8859 twin chardet was not asked about, that reads the bytes
    # as other letters just as clean (cp1254 "ı" for cp1252 "ý"): a choice for the full pass
    rivals = [SUPERSET.get(g["encoding"], g["encoding"]) for g in found[1:MAX_GUESSES]
              if g.get("encoding") and float(g.get("confidence") or 0.0) >= QUICK_RIVAL * conf]
    if any(_reads_otherwise(data, text, rival) for rival in [ISO_TWIN.get(codec), *rivals] if rival != codec):
        return None
    return Decoded(text, codec, round(conf, 3))


def _looks_clean(text: str, data: bytes, codec: str) -> bool:
    """A multi-byte decode paired its high bytes into characters beyond Latin-1 (CJK text mixes
    in Latin words by right, so no more is asked); a single-byte one has no oddities."""
    if codec in MULTIBYTE:
        return _paired(text) and not _has_c1(text)
    return _oddities(text, data, codec) == 0


def _has_c1(text: str) -> bool:
    """A C1 control anywhere: looked for among the text's Latin-1 characters alone (dropping the
    rest is a C loop; a regex over 50 KB of CJK text costs about 4x as much)."""
    return bool(text.encode("latin-1", "ignore").translate(None, _NOT_C1_BYTES))


_NOT_C1_BYTES = bytes([*range(0x80), *range(0xA0, 0x100)])


def _reads_otherwise(data: bytes, text: str, rival: str | None) -> bool:
    """``data`` reads as different text in ``rival`` that looks just as right."""
    if rival is None:
        return False
    try:
        other = data.decode(rival)
    except (UnicodeDecodeError, LookupError):
        return False
    return other != text and _looks_clean(other, data, rival)


def _decodes(data: bytes, enc: str) -> bool:
    try:
        data.decode(enc)
        return True
    except (UnicodeDecodeError, LookupError):
        return False


def _paired(text: str) -> bool:
    """At least two characters beyond Latin-1 were made of paired bytes."""
    first = _PAIRED_CHAR.compiled.search(text, 0, 4000)
    return first is not None and _PAIRED_CHAR.compiled.search(text, first.end(), 4000) is not None


_PAIRED_CHAR = _Lazy("[^\x00-\u2e7f]")  # negated: a range to the end of Unicode compiles slowly


def _first_high_byte(data: bytes) -> int:
    """Where the first byte beyond ASCII is (``len(data)`` if none): a search, where stripping
    the ASCII before it copied the rest of the file each time."""
    found = _HIGH_BYTE.search(data)
    return found.start() if found else len(data)


_HIGH_BYTE = re.compile(b"[\x80-\xff]")


def _chardet_candidates(chardet, data: bytes, era) -> list[tuple[str, float]]:
    """chardet's guesses for all of ``data``, best first, mapped to the codecs that decode them,
    without repeats."""
    found = chardet.detect_all(data, encoding_era=era, compat_names=False, max_bytes=max(1, len(data)))
    out: list[tuple[str, float]] = []
    for g in found[:MAX_GUESSES]:
        enc = g.get("encoding")
        if not enc:
            continue
        for codec in (SUPERSET.get(enc), enc):
            if codec in EBCDIC and not _ebcdic_like(data):
                continue
            if codec and codec not in (c for c, _ in out) and _known(codec):
                out.append((codec, float(g.get("confidence") or 0.0)))
    if out and "cp1252" not in (c for c, _ in out) and (out[0][1] < LOW_CONFIDENCE or out[0][0].startswith("iso8859")):
        out.append(("cp1252", 0.0))  # short Western texts: chardet's weakest spot
    return out


def _ebcdic_like(data: bytes) -> bool:
    """EBCDIC text has its letters at 0x81-0xE9 and its spaces at 0x40 ("@" in ASCII), and ASCII
    letters there are symbols: bytes with no such spaces, or with ASCII letters, are not EBCDIC."""
    n = len(data)
    if not n:
        return False
    letters = n - len(data.translate(None, _ASCII_LETTER_BYTES))
    return data.count(0x40) * EBCDIC_SPACE_SHARE >= n and letters * 10 < n


_ASCII_LETTER_BYTES = bytes([*range(0x41, 0x5B), *range(0x61, 0x7B)])


def _known(codec: str) -> bool:
    try:
        codecs.lookup(codec)
        return True
    except LookupError:
        return False


def _best_strict(data: bytes, guesses: list[tuple[str, float]], tried: list[str],
                 plausible_only: bool = False) -> tuple[str, str, float, int] | None:
    """(text, codec, confidence, oddities): a confident guess that decodes all of ``data`` and
    looks right, else the least odd of the guesses that decode it."""
    decoded: list[tuple[str, str, float]] = []
    for enc, conf in guesses:
        if enc in tried:
            continue
        tried.append(enc)
        try:
            text = data.decode(enc)
        except (UnicodeDecodeError, LookupError):
            continue
        if conf >= LOW_CONFIDENCE and not decoded and _oddities(text, data, enc) == 0:
            return text, enc, conf, 0
        decoded.append((text, enc, conf))
    if not decoded:
        return None
    # Weigh the decodes by their oddities (see `_oddities`). On a tie, a multi-byte encoding
    # whose every high byte paired up into a character wins if chardet rated it about as well: a
    # single-byte code page decodes any bytes, so its success says nothing, while chance
    # pairings soon fail. Then chardet's order.
    top = max(c for _t, _e, c in decoded)
    best = None
    for i, (t, e, c) in enumerate(decoded):
        evidence = 0 if e in MULTIBYTE and c >= top / 2 and _paired(t) else 1
        less = e in LESS_COMMON
        if best is not None and (best[0] == 0 and (evidence, less) >= best[1:3]):
            continue  # cannot beat a flawless earlier decode: skip the costly score
        score = (_oddities(t, data, e), evidence, less, i)
        if best is None or score < best:
            best = score
    if best is None or (plausible_only and best[0] > 0):  # (best is None only when nothing decoded)
        return None
    return (*decoded[best[-1]], best[0])


_C1 = re.compile("[\x80-\x9f]")
_ASCII = "".join(map(chr, range(128)))
_LETTER = "[^\\W\\d_]"
# a non-ASCII symbol, digit-like sign or currency between two letters: Latin-1 signs, spacing
# accents, cp1252's daggers, bullets and per-mille, box drawing (DOS code pages), mathematical
# operators (Mac code pages); not a no-break space, which Czech and Polish put after one-letter
# words, nor the middle dot of Catalan "l·l" (the symbol first: the scan skips to candidates)
_WEDGED = re.compile(r"[\u00a1-\u00bf\u00d7\u00f7\u02c6-\u02dd\u2020-\u2022\u2030\u2039\u203a\u20ac\u2122\u2200-\u22ff\u2500-\u259f]"
                     r"(?<=[^\W\d_].)(?<![lL]\u00b7)(?=[^\W\d_])")
# Symbols a wrong single-byte code page leaves where a letter should be, touching a letter
# ("s±" for "są", "¶pi" for "śpi", "¦entjernej" for "Šentjernej"), and the currency sign "¤"
# anywhere (ISO-8859-15's "€" read as cp1252). Real text has them beside letters about never.
_RARE_SYMBOLS = "¢£¥¦§¨©¬®¯±´¶¸¼-¾ˇ˘-˝"
_UNUSUAL = re.compile(f"[\x80-\x9f¤{_RARE_SYMBOLS}]")
_ODD_SYMBOL = re.compile(f"[¤{_RARE_SYMBOLS}](?:(?<=¤)|(?<={_LETTER}.)|(?={_LETTER}))")
# a capital inside a lower-case word: Cyrillic "Я" ("подходЯщие" is MacCyrillic, whose "я" is
# cp1251's "Я", read as cp1251), or an accented Latin one ("karatØai" is Estonian ISO-8859-15
# "karatšai" read as cp1257). Prose has no such camelCase; program identifiers do, so only these.
# (the capitals first, in one class: the scan skips to them)
_CAMEL = re.compile("[\u042f\u00c0-\u00d6\u00d8-\u00de](?:(?<=[\u0430-\u045f]{2}\u042f)(?=[\u0430-\u045f])"
                    "|(?<=[a-z\u00df-\u00f6\u00f8-\u00ff]{2}[\u00c0-\u00d6\u00d8-\u00de])(?=[a-z\u00df-\u00f6\u00f8-\u00ff]))")
_SCRIPT_CACHE: dict[str, str] = {}


def _script(ch: str) -> str:
    s = _SCRIPT_CACHE.get(ch)
    if s is None:
        try:
            s = unicodedata.name(ch).split(" ", 1)[0]
        except ValueError:
            s = "?"
        _SCRIPT_CACHE[ch] = s
    return s


def _oddities(text: str, data: bytes | None = None, codec: str | None = None, limit: int = 1500) -> int:
    """How wrong a decode looks: C1 controls (an ISO-8859 reading of cp1252 quotes) and rare
    symbols beside letters anywhere, and, in the first ``limit`` characters from the first
    non-ASCII one, words that mix scripts ("cafι" for "café"), symbols wedged between letters
    ("¯ó³æ" for "Żółć") and capitals inside lower-case words ("подходЯщие").

    Given the bytes ``text`` was decoded from with a single-byte ``codec``, the two scans that
    look at every character look at the bytes instead, a byte being a character there."""
    table = _single_byte(codec) if data is not None and codec is not None else None
    raw = data if table else None  # scanned instead of the text: a byte is a character there
    odd = 0
    if raw.translate(None, table.usual) if raw is not None and table else _UNUSUAL.search(text):  # rarely needed
        odd += len(_C1.findall(text)) + len(_ODD_SYMBOL.findall(text))
    # ASCII says nothing: look where the rest begins. Given the bytes, that is their first high
    # byte, the same place in every reading (a code page that maps an ASCII byte elsewhere, as
    # Shift_JIS-2004 does "~" to "‾", must not move its own window past the text that tells)
    start = _first_high_byte(data) if data is not None else len(text) - len(text.lstrip(_ASCII))
    start = max(0, start - 64)
    window = text[start : start + limit]
    if raw is not None and table:
        changes = _script_changes_in_bytes(raw[start : start + limit].translate(table.tags))
    else:
        changes = _mixed_script_words(window)
    return odd + changes + len(_WEDGED.findall(window)) + len(_CAMEL.findall(window))


@dataclass(frozen=True)
class _ByteTables:
    usual: bytes  # the byte values that decode to ordinary characters (to delete, leaving the rest)
    tags: bytes  # byte value -> the script tag of its character, as `_ScriptTags` gives it


@functools.lru_cache(maxsize=64)
def _single_byte(codec: str) -> _ByteTables | None:
    """Tables for a code page that decodes every byte to one character (or not at all)."""
    if codec in MULTIBYTE:
        return None
    try:
        decoder = codecs.getincrementaldecoder(codec)()
    except LookupError:
        return None
    chars = []
    for b in range(256):
        try:
            ch = decoder.decode(bytes([b]))
        except UnicodeDecodeError:
            decoder.reset()
            chars.append("")  # undefined here: a strict decode of the file has already ruled it out
            continue
        if len(ch) != 1:
            return None  # a lead byte waiting for more (gbk, shift_jis), or two characters
        chars.append(ch)
    usual = bytes(b for b, ch in enumerate(chars) if not ch or not _UNUSUAL.match(ch))
    return _ByteTables(usual, bytes(_byte_tag(ch) for ch in chars))


def _byte_tag(ch: str) -> int:
    """`_ScriptTags` for one byte: 0x20 for a non-letter, else a byte value of its own per script."""
    if not ch or _SCRIPT_TAGS[ord(ch)] == " ":
        return 0x20
    return _BYTE_TAG_OF_TAG.setdefault(_SCRIPT_TAGS[ord(ch)], 0x80 + len(_BYTE_TAG_OF_TAG) % 0x80)


def _script_count(text: str) -> int:
    return len({_script(ch) for ch in text[:2000] if ch.isalpha()})


class _ScriptTags(dict):
    """``ord(ch)`` -> one character standing for the script of ``ch`` (" " for a non-letter), for
    ``str.translate``. Japanese mixes kanji and kana within a word by design: one tag for all,
    the iteration and prolonged-sound marks ("々", "ー") included."""

    def __missing__(self, o: int) -> str:
        ch = chr(o)
        if not _LETTER_RE.match(ch) or ch in _ANY_SCRIPT:
            tag = " "
        else:
            script = _script(ch)
            if script in _CJK_SCRIPTS or (script != "HANGUL" and any(lo <= o <= hi for lo, hi in _CJK_RANGES)):
                script = "CJK"
            tag = _TAG_OF_SCRIPT.setdefault(script, chr(0xE000 + len(_TAG_OF_SCRIPT)))
        self[o] = tag
        return tag


def _script_changes_in_bytes(tags: bytes) -> int:
    """`_mixed_script_words` for a single-byte reading's bytes, each replaced by its script's tag
    (`_ByteTables.tags`). One script throughout, as in most texts, has no change: two byte
    operations tell, where the regex's back-reference is tried at every letter."""
    letters = tags.replace(b" ", b"")
    if not letters.strip(letters[:1]):
        return 0
    return len(_SCRIPT_CHANGE_BYTES.findall(tags))


def _mixed_script_words(text: str) -> int:
    """Script changes within words, e.g. Latin to Greek in "cafι": the mark of a wrong code page.

    Chinese and Japanese are written without spaces, and Korean particles attach to the word
    before them, so a Latin word set in them touches their characters ("使用CSS布局", "PC에서"):
    no change of script within a word. A lone East Asian character between two Latin letters
    still is ("d捐ut"): a multi-byte code page pairing an accented letter with the next one."""
    if len({_SCRIPT_TAGS[ord(ch)] for ch in set(text)} - {" "}) <= 1:
        # one script throughout (most texts): no change anywhere. Told from the distinct
        # characters, at a fifth of the cost of tagging each (a CJK text's are hundreds of
        # look-ups, its characters thousands)
        return 0
    tags = text.translate(_SCRIPT_TAGS)  # each letter -> its script's tag, the rest -> " "
    changes = len(_SCRIPT_CHANGE.findall(tags))
    if _CJK_TAG in tags or _HANGUL_TAG in tags:
        changes += len(_EAST_ASIAN_WEDGED.findall(tags)) - len(_EAST_ASIAN_EDGE.findall(tags))
    return changes


# Japanese mixes these within a word by design.
_CJK_SCRIPTS = {"CJK", "HIRAGANA", "KATAKANA", "HALFWIDTH", "FULLWIDTH"}
# ...and these blocks, whose marks are named otherwise ("IDEOGRAPHIC ITERATION MARK",
# "KATAKANA-HIRAGANA PROLONGED SOUND MARK"): CJK radicals to the unified ideographs,
# compatibility ideographs, half- and full-width forms, the supplementary ideographs.
_CJK_RANGES = ((0x2E80, 0x9FFF), (0xF900, 0xFAFF), (0xFF00, 0xFFEF), (0x20000, 0x3FFFF))
_LETTER_RE = re.compile(_LETTER)
# Latin-1 signs that count as letters and go with words of any script ("nº", "µm", "km²"; "³"
# inside a word is a symbol wedged between letters, counted as such), and the modifier letter
# apostrophe of Ukrainian "мʼясо".
_ANY_SCRIPT = set("ªºµ¹²³¼½¾ʼ")
_TAG_OF_SCRIPT: dict[str, str] = {"LATIN": "\ue000", "CJK": "\ue001", "HANGUL": "\ue002"}
_LATIN_TAG, _CJK_TAG, _HANGUL_TAG = _TAG_OF_SCRIPT["LATIN"], _TAG_OF_SCRIPT["CJK"], _TAG_OF_SCRIPT["HANGUL"]
_SCRIPT_TAGS = _ScriptTags()
_SCRIPT_CHANGE = re.compile(r"(\S)(?!\1)(?=\S)")  # a letter followed by one of another script
_EAST_ASIAN_EDGE = re.compile(f"{_LATIN_TAG}(?=[{_CJK_TAG}{_HANGUL_TAG}])|[{_CJK_TAG}{_HANGUL_TAG}](?={_LATIN_TAG})")
_EAST_ASIAN_WEDGED = re.compile(f"[{_CJK_TAG}{_HANGUL_TAG}](?<={_LATIN_TAG}.)(?={_LATIN_TAG})")
_SCRIPT_CHANGE_BYTES = re.compile(rb"([^ ])(?!\1)(?=[^ ])")
_BYTE_TAG_OF_TAG: dict[str, int] = {}
