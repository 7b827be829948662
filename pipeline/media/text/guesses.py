"""Our own reading of a legacy file: chardet's guesses, each verified by a strict decode of the
whole file and weighed by its oddities (`plausibility`). The quick pass (the modern-web encodings
on 1 KB from the first byte beyond ASCII), else the full detection (the ISO-8859 and regional
code pages on 4 KB, more when unsure, every era when all look odd, multi-byte fallbacks), a
cp1252 reading for a short text chardet was unsure of, and a second opinion for a rare code page
or a reading that overrode chardet's first guess. `legacy.detect` weighs this reading against
chardet's reading of the whole file."""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

from pipeline.formats.vocabulary import Reason
from pipeline.media.text.codepages import (
    EBCDIC,
    ISO_TWIN,
    LESS_COMMON,
    MULTIBYTE,
    SUPERSET,
    decodes,
    ebcdic_like,
    first_high_byte,
    known,
    rare,
)
from pipeline.media.text.decoded import Decoded
from pipeline.media.text.plausibility import has_c1, oddities, paired, penalty_of, single_byte
from pipeline.media.text.scripts import LATIN_LETTER, LETTER_RE

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
# Below this chardet confidence a guess is weighed against alternatives by plausibility.
LOW_CONFIDENCE = 0.5
# chardet's guesses beyond this many are not worth a decode.
MAX_GUESSES = 6
# The quick pass keeps a guess only from this chardet confidence up (0.10 is chardet's "nothing fit").
QUICK_MIN_CONFIDENCE = 0.2
# A runner-up rated this share of the quick pass's guess or more is a rival worth weighing.
QUICK_RIVAL = 0.7
# What the quick pass asks chardet about: its modern-web era (the encodings today's legacy files
# are in) less UTF-8/16/32, ASCII and ISO-2022, which are settled before chardet is asked, and
# less EUC-KR, TIS-620 and Shift_JIS-2004, whose text their supersets here read the same (a
# file with JIS X 0213 kanji fails cp932 and goes to the full detection). Each candidate costs
# chardet a trial decode and a model score.
QUICK_ENCODINGS = ("gb18030", "big5hkscs", "cp932", "euc_jis_2004", "cp949", "cp1250", "cp1251", "cp1252",
                   "cp1253", "cp1254", "cp1255", "cp1256", "cp1257", "cp1258", "koi8-r", "koi8-u", "cp874")
# A text up to this long may be read as cp1252 rather than as an unsure code page (`_western_instead`).
WESTERN_MAX_BYTES = 400
# Tried last, when every guess failed: multi-byte encodings, whose strict decode of a whole file
# is strong evidence. (No single-byte code page: those decode anything.)
FALLBACKS = ("gb18030", "big5hkscs", "cp932", "cp949", "euc_jis_2004")


def our_reading(chardet: ModuleType, data: bytes, window: int, utf8_error: UnicodeDecodeError) -> Decoded:
    """The quick pass, else chardet over more eras and bytes, every guess verified by a strict
    decode of everything and weighed by its oddities, with fallbacks."""

    # all ASCII before the first high byte: any point in it is a character boundary
    first_high = first_high_byte(data)
    quick_start = max(0, first_high - QUICK_CONTEXT)
    quick = quick_guess(chardet, data, data[quick_start : quick_start + QUICK_WINDOW])
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
    if rare(result[1]) or why == _LESS_PLAUSIBLE:
        checked = _second_opinion(chardet, data, result)
        if isinstance(checked, str):
            return Decoded(encoding=result[1], confidence=round(result[2], 3), reason=Reason.UNDECODABLE_TEXT, detail=checked)
        if checked[0] is not result[0]:
            text, enc, conf, _odd = checked
            which = "is a rare code page" if rare(result[1]) else f"was preferred to its first guess {first}"
            return Decoded(text, enc, round(conf, 3), notes=[
                f"decoded as {enc}: chardet's reading of the whole file, as plausible as {result[1]}, which {which}"])
        result = checked
    text, enc, conf, _odd = result
    out = Decoded(text, enc, round(conf, 3))
    if why:
        out.notes.append(f"decoded as {enc}: chardet's first guess {first} {why}")
    return out


def quick_guess(chardet: ModuleType, data: bytes, probe: bytes) -> Decoded | None:
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
        return paired(text) and not has_c1(text)
    return oddities(text, data, codec) == 0


def _reads_otherwise(data: bytes, text: str, rival: str | None) -> bool:
    """``data`` reads as different text in ``rival`` that looks just as right."""
    if rival is None:
        return False
    try:
        other = data.decode(rival)
    except (UnicodeDecodeError, LookupError):
        return False
    return other != text and _looks_clean(other, data, rival)


def _chardet_candidates(chardet: ModuleType, data: bytes, era: Any) -> list[tuple[str, float]]:
    """chardet's guesses for all of ``data``, best first, mapped to the codecs that decode them,
    without repeats."""
    found = chardet.detect_all(data, encoding_era=era, compat_names=False, max_bytes=max(1, len(data)))
    out: list[tuple[str, float]] = []
    for g in found[:MAX_GUESSES]:
        enc = g.get("encoding")
        if not enc:
            continue
        for codec in (SUPERSET.get(enc), enc):
            if codec in EBCDIC and not ebcdic_like(data):
                continue
            if codec and codec not in (c for c, _ in out) and known(codec):
                out.append((codec, float(g.get("confidence") or 0.0)))
    if out and "cp1252" not in (c for c, _ in out) and (out[0][1] < LOW_CONFIDENCE or out[0][0].startswith("iso8859")):
        out.append(("cp1252", 0.0))  # short Western texts: chardet's weakest spot
    return out


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
        if conf >= LOW_CONFIDENCE and not decoded and oddities(text, data, enc) == 0:
            return text, enc, conf, 0
        decoded.append((text, enc, conf))
    if not decoded:
        return None
    # Weigh the decodes by their oddities (see `oddities`). On a tie, a multi-byte encoding
    # whose every high byte paired up into a character wins if chardet rated it about as well: a
    # single-byte code page decodes any bytes, so its success says nothing, while chance
    # pairings soon fail. Then chardet's order.
    top = max(c for _t, _e, c in decoded)
    best = None
    for i, (t, e, c) in enumerate(decoded):
        evidence = 0 if e in MULTIBYTE and c >= top / 2 and paired(t) else 1
        less = e in LESS_COMMON
        if best is not None and (best[0] == 0 and (evidence, less) >= best[1:3]):
            continue  # cannot beat a flawless earlier decode: skip the costly score
        score = (oddities(t, data, e), evidence, less, i)
        if best is None or score < best:
            if best is not None and score[:2] == best[:2] and best[2] and _fewer_foreign(decoded[best[-1]], (t, e), data):
                continue  # the less common code page's reading is the only one whose letters make one language
            best = score
    if best is None or (plausible_only and best[0] > 0):  # (best is None only when nothing decoded)
        return None
    return (*decoded[best[-1]], best[0])


# Characters of two single-byte readings compared by their letters (`_fewer_foreign`).
FOREIGN_WINDOW = 4000


def _fewer_foreign(less: tuple[str, str, float], other: tuple[str, str], data: bytes) -> bool:
    """Of two single-byte readings as odd, the one in a less common code page (``less``) has
    letters no less plausible for one language (`penalty_of`) and the other has more: a Maltese
    ISO-8859-3 text read as ISO-8859-2 turns "ċ ġ ħ" into "ĺ ő ą", clean symbols-wise but letters
    of three languages at once. Compared on the first `FOREIGN_WINDOW` bytes."""
    if single_byte(less[1]) is None or single_byte(other[1]) is None:
        return False
    n = FOREIGN_WINDOW
    mine = penalty_of(less[0][:n], data[:n], less[1])
    return mine < penalty_of(other[0][:n], data[:n], other[1])


_LESS_PLAUSIBLE = "gave less plausible text"
# Letters a Western (cp1252) text shows when read in a Central European or Baltic code page, and
# that text in those languages hardly ever has: Slovak "ŕ", "ĺ" (Western "à", "å"), "ď" ("ï"),
# a capital "Ť" (the "«" of Western quotes; "»" is "ť"), a capital "Ē" ("Ç").
_RARE_LETTER = re.compile("[ŕŔĺĹďĎŤĒ]"
                          # a letter beyond ASCII stuck to a number ("10Ł" for "10£"; ASCII reads the same
                          # in every code page, so "%.250s" says nothing)
                          r"|(?<=[0-9])[^\W\d_\x00-\x7f](?![^\W\d_])"
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
    if single_byte(enc) is None or not _RARE_LETTER.search(text):
        return None
    try:
        western = data.decode("cp1252")
    except UnicodeDecodeError:
        return None
    if western == text or oddities(western, data, "cp1252") or _RARE_LETTER.search(western):
        return None
    if len(LATIN_LETTER.findall(text)) < len(LETTER_RE.findall(text)) / 2:
        return None  # mostly Greek or Cyrillic: not a Western text misread
    return western


def _why_not_first(data: bytes, first: str | None, enc: str, tried: list[str]) -> str:
    """Why the reading is not chardet's first guess ("" when it is)."""
    if first is None or enc in (first, SUPERSET.get(first)):
        return ""
    if first not in tried[: tried.index(enc)] or not decodes(data, first):
        return "did not decode the whole file"
    return _LESS_PLAUSIBLE


def _second_opinion(chardet: ModuleType, data: bytes, result: tuple[str, str, float, int]) -> tuple[str, str, float, int] | str:
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
        return result if not rare(enc) else _untrusted(enc, "has no guess")
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
        other_odd = oddities(other_text, data, other)
        if other_odd <= odd:
            return other_text, other, other_conf, other_odd
        why = "which looks odder"
    return result if not rare(enc) else _untrusted(enc, f"reads it as {other}, {why}")


def _untrusted(enc: str, why: str) -> str:
    return f"no trustworthy reading: the likeliest is the rare code page {enc}, but chardet over every era {why}"
