"""How wrong a reading of a file looks, from its text alone: no code page is told by its bytes, but
a wrong one leaves marks real text hardly ever has. `oddities`: C1 controls, rare symbols beside
letters, words that change script, symbols wedged between letters, capitals inside lower-case
words. `penalty_of`: the oddities plus letters no one language holds together
(`alphabets.foreign_letters`), rare letters and ideographs, signs glued to words. `paired` and
`has_c1`: the evidence a multi-byte reading gives. `guesses` and `legacy` weigh readings by these."""

from __future__ import annotations

import codecs
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.media.text.alphabets import foreign_letters
from pipeline.media.text.codepages import MULTIBYTE, first_high_byte
from pipeline.media.text.scripts import (
    ASCII,
    HAN,
    LATIN_LETTER,
    LETTER,
    LETTER_RE,
    Lazy,
    byte_tag,
    mixed_script_words,
    script_changes_in_bytes,
)


def oddities(text: str, data: bytes | None = None, codec: str | None = None, limit: int = 1500) -> int:
    """How wrong a decode looks: C1 controls (an ISO-8859 reading of cp1252 quotes) and rare
    symbols beside letters anywhere, and, in the first ``limit`` characters from the first
    non-ASCII one, words that mix scripts ("cafι" for "café"), symbols wedged between letters
    ("¯ó³æ" for "Żółć") and capitals inside lower-case words ("подходЯщие").

    Given the bytes ``text`` was decoded from with a single-byte ``codec``, the two scans that
    look at every character look at the bytes instead, a byte being a character there."""
    table = single_byte(codec) if data is not None and codec is not None else None
    raw = data if table else None  # scanned instead of the text: a byte is a character there
    odd = 0
    if raw.translate(None, table.usual) if raw is not None and table else _UNUSUAL.search(text):  # rarely needed
        odd += len(_C1.findall(text)) + len(_ODD_SYMBOL.findall(text))
    # ASCII says nothing: look where the rest begins. Given the bytes, that is their first high
    # byte, the same place in every reading (a code page that maps an ASCII byte elsewhere, as
    # Shift_JIS-2004 does "~" to "‾", must not move its own window past the text that tells)
    start = first_high_byte(data) if data is not None else len(text) - len(text.lstrip(ASCII))
    start = max(0, start - 64)
    window = text[start : start + limit]
    if raw is not None and table:
        changes = script_changes_in_bytes(raw[start : start + limit].translate(table.tags))
    else:
        changes = mixed_script_words(window)
    return odd + changes + len(_WEDGED.findall(window)) + len(_CAMEL.findall(window))


_C1 = re.compile("[\x80-\x9f]")
# a non-ASCII symbol, digit-like sign or currency between two letters: Latin-1 signs, spacing
# accents, cp1252's daggers, bullets and per-mille, box drawing (DOS code pages), mathematical
# operators (Mac code pages); not a no-break space, which Czech and Polish put after one-letter
# words, nor the middle dot, which separates letters in Catalan "l·l", Basque hyphenation
# ("huts·egin·da") and inclusive French ("ami·e·s") (the symbol first: the scan skips to candidates)
_WEDGED = re.compile(r"[\u00a1-\u00b6\u00b8-\u00bf\u00d7\u00f7\u02c6-\u02dd\u2020-\u2022\u2030\u2039\u203a\u20ac\u2122"
                     r"\u2200-\u22ff\u2500-\u259f]"
                     r"(?<=[^\W\d_].)(?=[^\W\d_])")
# Symbols a wrong single-byte code page leaves where a letter should be, touching a letter
# ("s±" for "są", "¶pi" for "śpi", "¦entjernej" for "Šentjernej"), and the currency sign "¤"
# anywhere (ISO-8859-15's "€" read as cp1252). Real text has them beside letters about never.
_RARE_SYMBOLS = "¢£¥¦§¨©¬®¯±´¶¸¼-¾ˇ˘-˝"
_UNUSUAL = re.compile(f"[\x80-\x9f¤{_RARE_SYMBOLS}]")
_ODD_SYMBOL = re.compile(f"[¤{_RARE_SYMBOLS}](?:(?<=¤)|(?<={LETTER}.)|(?={LETTER}))")
# a capital inside a lower-case word: Cyrillic "Я" ("подходЯщие" is MacCyrillic, whose "я" is
# cp1251's "Я", read as cp1251), or an accented Latin one ("karatØai" is Estonian ISO-8859-15
# "karatšai" read as cp1257). Prose has no such camelCase; program identifiers do, so only these.
# (the capitals first, in one class: the scan skips to them)
_CAMEL = re.compile("[\u042f\u00c0-\u00d6\u00d8-\u00de](?:(?<=[\u0430-\u045f]{2}\u042f)(?=[\u0430-\u045f])"
                    "|(?<=[a-z\u00df-\u00f6\u00f8-\u00ff]{2}[\u00c0-\u00d6\u00d8-\u00de])(?=[a-z\u00df-\u00f6\u00f8-\u00ff]))")


@dataclass(frozen=True)
class _ByteTables:
    usual: bytes  # the byte values that decode to ordinary characters (to delete, leaving the rest)
    tags: bytes  # byte value -> the script tag of its character, as `scripts._ScriptTags` gives it


@functools.lru_cache(maxsize=64)
def single_byte(codec: str) -> _ByteTables | None:
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
    return _ByteTables(usual, bytes(byte_tag(ch) for ch in chars))


def penalty_of(text: str, data: bytes, codec: str) -> int:
    """How implausible a reading is: its oddities (`oddities`) and its letters that no one
    language's alphabet holds together with the rest (`foreign_letters`)."""
    odd = oddities(text, data, codec)
    if odd and _HANGUL.compiled.search(text):  # Korean writes Han and Hangul in one word ("期間등"): no oddity
        odd = max(0, odd - len(_HAN_HANGUL.compiled.findall(text, 0, 2000)))
    if "\u00b7" in text:  # "声声慢·寻寻觅觅", "고용·임금": a separator
        odd -= len(_CJK_MIDDLE_DOT.compiled.findall(text, 0, 2000))
    ukrainian_g = text.count("ґ")
    return (max(0, odd) + foreign_letters(text) + _rare_ideographs(text, codec) + len(_GLUED.findall(text))
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
    han = HAN.compiled.findall(text, 0, 4000)
    rare = sum(1 for ch in han if not common(ch))
    return max(0, rare - len(han) // 10)


def _in_level_1(codec: str, lo: int, hi: int) -> Callable[[str], bool]:
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
    """`guesses._RARE_LETTER`s of a mostly Latin text (in Russian, "В" and "У" are words)."""
    head = text[:2000]
    if _GREEK_OR_CYRILLIC_WORD.search(head):
        return 0
    rare = _RARE_LETTER_FAST.findall(text)  # mostly none: then the letters need no counting
    if not rare or len(LATIN_LETTER.findall(head)) * 2 < len(LETTER_RE.findall(head)):
        return 0
    return len(rare)


# `guesses._RARE_LETTER`, matching from one class of the characters a match can start with (a rare
# letter, a digit, a Greek or Cyrillic letter): the scan skips to those, where a look-behind
# first, or a letter class first, is tried at every position (a third of the cost)
_RARE_LETTER_FAST = re.compile("[ŕŔĺĹďĎŤĒ0-9\u0370-\u03ff\u0400-\u04ff]"
                               "(?:(?<=[ŕŔĺĹďĎŤĒ])|(?<=[0-9])[^\\W\\d_\\x00-\\x7f](?![^\\W\\d_])"
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
_HANGUL = Lazy("[\uac00-\ud7a3]")
_HAN_HANGUL = Lazy("[\u4e00-\u9fff](?=[\uac00-\ud7a3])|[\uac00-\ud7a3](?=[\u4e00-\u9fff])")
_CJK_MIDDLE_DOT = Lazy("\u00b7(?<=[\u3040-\u30ff\u4e00-\u9fff\uac00-\ud7a3].)(?=[\u3040-\u30ff\u4e00-\u9fff\uac00-\ud7a3])")
# A Cyrillic capital after lower-case letters of its word ("народжуютьсЯ": MacCyrillic "я" read
# as cp1251): Cyrillic has no camelCase identifiers.
# (One class of both first, as `_GLUED`.)
_CYRILLIC_CAMEL = re.compile("[\u0400-\u045f](?:(?<=[\u0400-\u042f])(?<=[\u0430-\u045f]{2}.)"
                             # ...or a word's lower-case first letter before capitals ("пРИВЕТ": cp1251 read as KOI8)
                             "|(?<=[\u0430-\u045f])(?<![^\\W\\d_].)(?=[\u0400-\u042f]{2}))")
_GREEK_OR_CYRILLIC_WORD = re.compile("[\u0370-\u03ff\u0400-\u04ff]{2}")


def paired(text: str) -> bool:
    """At least two characters beyond Latin-1 were made of paired bytes."""
    first = _PAIRED_CHAR.compiled.search(text, 0, 4000)
    return first is not None and _PAIRED_CHAR.compiled.search(text, first.end(), 4000) is not None


_PAIRED_CHAR = Lazy("[^\x00-\u2e7f]")  # negated: a range to the end of Unicode compiles slowly


def has_c1(text: str) -> bool:
    """A C1 control anywhere: looked for among the text's Latin-1 characters alone (dropping the
    rest is a C loop; a regex over 50 KB of CJK text costs about 4x as much)."""
    return bool(text.encode("latin-1", "ignore").translate(None, _NOT_C1_BYTES))


_NOT_C1_BYTES = bytes([*range(0x80), *range(0xA0, 0x100)])
