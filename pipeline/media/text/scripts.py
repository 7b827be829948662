"""Letters and the scripts they belong to: the tags `str.translate` maps each letter to (one per
script; Japanese kanji and kana share one), the changes of script within a word that a wrong code
page leaves ("cafι"), and the character classes the other modules match with, compiled lazily
where they span the CJK or Hangul blocks."""

from __future__ import annotations

import functools
import re
import unicodedata


class Lazy:
    """A regular expression compiled when first used. The compiler fills a table a character at
    a time for a class over the CJK or Hangul blocks: milliseconds each, which every process
    paid at import, though most files (UTF-8) never need them."""

    def __init__(self, pattern: str, flags: int = 0) -> None:
        self.pattern, self.flags = pattern, flags

    @functools.cached_property
    def compiled(self) -> re.Pattern[str]:
        return re.compile(self.pattern, self.flags)


HAN = Lazy("[\u4e00-\u9fff]")
ASCII = "".join(map(chr, range(128)))
LETTER = "[^\\W\\d_]"
LETTER_RE = re.compile(LETTER)
LATIN_LETTER = re.compile("[A-Za-zÀ-ɏ]")
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


def script_count(text: str) -> int:
    return len({_script(ch) for ch in text[:2000] if ch.isalpha()})


def mixed_script_words(text: str) -> int:
    """Script changes within words, e.g. Latin to Greek in "cafι": the mark of a wrong code page.

    Chinese and Japanese are written without spaces, and Korean particles attach to the word
    before them, so a Latin word set in them touches their characters ("使用CSS布局", "PC에서"):
    no change of script within a word. A lone East Asian character between two Latin letters
    still is ("d捐ut"): a multi-byte code page pairing an accented letter with the next one."""
    if len({SCRIPT_TAGS[ord(ch)] for ch in set(text)} - {" "}) <= 1:
        # one script throughout (most texts): no change anywhere. Told from the distinct
        # characters, at a fifth of the cost of tagging each (a CJK text's are hundreds of
        # look-ups, its characters thousands)
        return 0
    tags = text.translate(SCRIPT_TAGS)  # each letter -> its script's tag, the rest -> " "
    changes = len(_SCRIPT_CHANGE.findall(tags))
    if _CJK_TAG in tags or _HANGUL_TAG in tags:
        changes += len(_EAST_ASIAN_WEDGED.findall(tags)) - len(_EAST_ASIAN_EDGE.findall(tags))
    return changes


def script_changes_in_bytes(tags: bytes) -> int:
    """`mixed_script_words` for a single-byte reading's bytes, each replaced by its script's tag
    (`plausibility.single_byte`'s tags). One script throughout, as in most texts, has no change: two byte
    operations tell, where the regex's back-reference is tried at every letter."""
    letters = tags.replace(b" ", b"")
    if not letters.strip(letters[:1]):
        return 0
    return len(_SCRIPT_CHANGE_BYTES.findall(tags))


def byte_tag(ch: str) -> int:
    """`_ScriptTags` for one byte: 0x20 for a non-letter, else a byte value of its own per script."""
    if not ch or SCRIPT_TAGS[ord(ch)] == " ":
        return 0x20
    return _BYTE_TAG_OF_TAG.setdefault(SCRIPT_TAGS[ord(ch)], 0x80 + len(_BYTE_TAG_OF_TAG) % 0x80)


class _ScriptTags(dict):
    """``ord(ch)`` -> one character standing for the script of ``ch`` (" " for a non-letter), for
    ``str.translate``. Japanese mixes kanji and kana within a word by design: one tag for all,
    the iteration and prolonged-sound marks ("々", "ー") included."""

    def __missing__(self, o: int) -> str:
        ch = chr(o)
        if not LETTER_RE.match(ch) or ch in _ANY_SCRIPT:
            tag = " "
        else:
            script = _script(ch)
            if script in _CJK_SCRIPTS or (script != "HANGUL" and any(lo <= o <= hi for lo, hi in _CJK_RANGES)):
                script = "CJK"
            tag = _TAG_OF_SCRIPT.setdefault(script, chr(0xE000 + len(_TAG_OF_SCRIPT)))
        self[o] = tag
        return tag


# Japanese mixes these within a word by design.
_CJK_SCRIPTS = {"CJK", "HIRAGANA", "KATAKANA", "HALFWIDTH", "FULLWIDTH"}
# ...and these blocks, whose marks are named otherwise ("IDEOGRAPHIC ITERATION MARK",
# "KATAKANA-HIRAGANA PROLONGED SOUND MARK"): CJK radicals to the unified ideographs,
# compatibility ideographs, half- and full-width forms, the supplementary ideographs.
_CJK_RANGES = ((0x2E80, 0x9FFF), (0xF900, 0xFAFF), (0xFF00, 0xFFEF), (0x20000, 0x3FFFF))
# Latin-1 signs that count as letters and go with words of any script ("nº", "µm", "km²"; "³"
# inside a word is a symbol wedged between letters, counted as such), and the modifier letter
# apostrophe of Ukrainian "мʼясо".
_ANY_SCRIPT = set("ªºµ¹²³¼½¾ʼ")
_TAG_OF_SCRIPT: dict[str, str] = {"LATIN": "\ue000", "CJK": "\ue001", "HANGUL": "\ue002"}
_LATIN_TAG, _CJK_TAG, _HANGUL_TAG = _TAG_OF_SCRIPT["LATIN"], _TAG_OF_SCRIPT["CJK"], _TAG_OF_SCRIPT["HANGUL"]
SCRIPT_TAGS = _ScriptTags()
_SCRIPT_CHANGE = re.compile(r"(\S)(?!\1)(?=\S)")  # a letter followed by one of another script
_EAST_ASIAN_EDGE = re.compile(f"{_LATIN_TAG}(?=[{_CJK_TAG}{_HANGUL_TAG}])|[{_CJK_TAG}{_HANGUL_TAG}](?={_LATIN_TAG})")
_EAST_ASIAN_WEDGED = re.compile(f"[{_CJK_TAG}{_HANGUL_TAG}](?<={_LATIN_TAG}.)(?={_LATIN_TAG})")
_SCRIPT_CHANGE_BYTES = re.compile(rb"([^ ])(?!\1)(?=[^ ])")
_BYTE_TAG_OF_TAG: dict[str, int] = {}
