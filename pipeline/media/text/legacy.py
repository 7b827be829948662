"""A file that is neither UTF-8 nor UTF-16/32 nor 7-bit: which reading is taken, and how sure it
is. For a short file, chardet's reading of the whole file (the naive way) is the floor, against
which our reading (`guesses.our_reading`) must be more plausible; a reading with implausible
letters gives way to a cleaner one in another code page of its script; a code page only one
language uses is told by its words. Every reading gets a calibrated confidence (`_calibrated`),
and one too unsure in a rare code page, or a short file's implausible reading, is refused."""

from __future__ import annotations

import codecs
import re
from collections.abc import Callable
from types import ModuleType

from pipeline.formats.vocabulary import Reason
from pipeline.media.text.codepages import EBCDIC, MULTIBYTE, SUPERSET, ebcdic_like, first_high_byte, rare
from pipeline.media.text.decoded import Decoded
from pipeline.media.text.guesses import QUICK_CONTEXT, QUICK_MIN_CONFIDENCE, QUICK_WINDOW, our_reading
from pipeline.media.text.plausibility import paired, penalty_of, single_byte
from pipeline.media.text.scripts import ASCII

# Files up to this long are also read as chardet reads the whole file (the naive way, and the
# floor): on them chardet costs about what our quick pass does, and short texts are where a
# reading chosen from a few letters most often goes wrong.
FLOOR_BYTES = 4096
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


def detect(data: bytes, window: int, utf8_error: UnicodeDecodeError) -> Decoded:
    """A legacy file: for a short one, chardet's reading of the whole file (the naive way) is the
    floor (`_with_floor`); our own reading (`our_reading`) replaces it only when more plausible.
    The confidence says how plausible the reading taken is (`_calibrated`)."""
    import chardet

    if len(data) <= FLOOR_BYTES:
        out, penalty, chardets = _with_floor(chardet, data, lambda: our_reading(chardet, data, window, utf8_error))
        if penalty and out.text is not None:
            first = out
            out, penalty = _sibling(data, out, penalty)
            chardets = chardets and out is first
        if out.text is not None:
            told = _told_by_its_words(data, out, penalty)
            if told is not None:
                out, penalty, chardets = told, penalty_of(told.text or "", data, told.encoding or ""), False
    else:
        out, penalty, chardets = our_reading(chardet, data, window, utf8_error), None, False
    if out.text is None or out.encoding is None:  # a reading always names its encoding
        return out
    out.confidence = _calibrated(out.text, data, out.encoding, penalty)
    if rare(out.encoding) and out.confidence < RARE_MIN_CONFIDENCE:
        return Decoded(encoding=out.encoding, confidence=out.confidence, reason=Reason.UNDECODABLE_TEXT,
                       detail=f"no trustworthy reading: the likeliest is the rare code page {out.encoding}, and too "
                              f"little of the text (confidence {out.confidence:.2f}) says it is right")
    if out.confidence < MIN_CONFIDENCE and len(data) <= FLOOR_BYTES and not chardets:
        return Decoded(encoding=out.encoding, confidence=out.confidence, reason=Reason.UNDECODABLE_TEXT,
                       detail=f"no plausible reading: the likeliest, {out.encoding}, has letters or characters "
                              f"that text in it hardly ever shows (confidence {out.confidence:.2f})")
    return out


def _with_floor(chardet: ModuleType, data: bytes, our_reading: Callable[[], Decoded]) -> tuple[Decoded, int | None, bool]:
    """chardet's reading of the whole file against ours (``our_reading()``, made only when it
    could win): the reading more plausible for one language in one script throughout
    (`penalty_of`) is taken, and on a tie chardet's, unless it is a rare code page and ours is not
    (chardet's whole-file guesses for short Western texts are often a DOS or Mac code page). A
    file we would refuse is decoded in chardet's reading when nothing in it looks out of place.
    Returns the reading, its penalty (None when not worked out), and whether it is chardet's."""
    found = chardet.detect(data, compat_names=False)
    enc = found.get("encoding")
    codec = SUPERSET.get(enc, enc) if enc else None
    if codec in EBCDIC and not ebcdic_like(data):
        codec = None  # high bytes without EBCDIC's spaces: EBCDIC letters by chance
    try:
        text = data.decode(codec) if codec else None
    except (UnicodeDecodeError, LookupError):
        text = None
    if text is None or codec is None:
        return our_reading(), None, False
    floor = penalty_of(text, data, codec)
    taken = Decoded(text, codec)
    conf = float(found.get("confidence") or 0.0)
    unsure = conf < QUICK_MIN_CONFIDENCE and codec not in MULTIBYTE
    if floor == 0 and not rare(codec) and not unsure:
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
    mine = penalty_of(ours.text, data, ours.encoding)
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
    if rare(codec) and not rare(ours.encoding):
        return True
    return unsure and ours.encoding in MULTIBYTE and paired(ours.text)


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
        p = penalty_of(text, data, codec)
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
        beyond = set(text) - set(ASCII)
        if not beyond or not beyond <= letters or text == out.text or misplaced.search(text):
            continue
        found = _WORD.findall(text.lower())
        shaped = sum(1 for w in found if len(w) > 1 and (w in words or ending.search(w)))
        if len(found) < WORDS_TELL_MIN or shaped < WORDS_TELL_SHARE * len(found):
            continue
        if penalty is not None and penalty_of(text, data, codec) > penalty:
            continue
        return Decoded(text, codec, notes=[f"decoded as {codec}: its letters are the only ones beyond ASCII, in words "
                                           f"shaped like its language's ({shaped} of {len(found)}), where "
                                           f"{out.encoding} read other letters"])
    return None


_HIGH_BYTES = bytes(range(0x80, 0x100))


def _window(text: str, data: bytes, codec: str) -> tuple[str, bytes, str]:
    """`QUICK_WINDOW` bytes of a long reading from a little before its first byte beyond ASCII
    (what the quick pass showed chardet), as text and bytes that match (a single-byte code page:
    a byte is a character; a multi-byte one: the bytes decoded again from a character boundary
    the ASCII before it gives)."""
    start = max(0, first_high_byte(data) - QUICK_CONTEXT)
    if single_byte(codec) is not None:
        return text[start : start + QUICK_WINDOW], data[start : start + QUICK_WINDOW], codec
    chunk = data[start : start + QUICK_WINDOW]
    return chunk.decode(codec, "ignore"), chunk, codec  # only the last character may be cut


def _calibrated(text: str, data: bytes, codec: str, penalty: int | None = None) -> float:
    """How likely the reading is right, from how plausible it is (``penalty``, `penalty_of`) and
    how much it rests on (its bytes beyond ASCII). Fitted on ~4,500 short and long real texts in
    40 languages (bench/text_packages.py and bench/text_accuracy.py): a reading with nothing out
    of place in a common code page was right 93% of the time with a handful of such bytes and
    99-100% with ten or more; in a rare code page 0-30% and 90%; each implausible spot lowers
    the odds, less so in a long text. A long file is judged on a 1 KB window (`_window`)."""
    if penalty is None:  # a long file: judged on a window from its first byte beyond ASCII, at a bounded cost
        text, data, codec = _window(text, data, codec)
        penalty = penalty_of(text, data, codec)
    sample = data[:FLOOR_BYTES]
    n = len(sample) - len(sample.translate(None, _HIGH_BYTES))  # bytes beyond ASCII: the evidence
    doubt = 3.0 if rare(codec) else 0.3
    conf = max(0.0, 1 - doubt / (4 + n)) * max(0.05, 1 - 3 * penalty / (4 + n))
    return round(conf, 3)
