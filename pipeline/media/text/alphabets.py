"""Letters a language does not have: a wrong single-byte code page keeps the script but changes
the language (Esperanto "ĉiu" read as cp1252 is "æiu"). The alphabets of the languages legacy
files were written in, and how many of a text's letters beyond ASCII the best-fitting one lacks;
one term of `plausibility.penalty_of`."""

from __future__ import annotations

import collections
import functools
from dataclasses import dataclass


def foreign_letters(text: str) -> int:
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
