"""Judge and normalise one text: bytes in, UTF-8 NFC text out, or a quarantine reason.

The steps, each a check that keeps the text or returns a reason (datatrove style):

1. decode (`encodings.decode_bytes`): text or binary, which encoding, strictly;
2. garbled text: mojibake (``Ã©``, ``â€™``, UTF-8 Chinese read as cp1252 or as GBK) is repaired
   when the repair is certain (a whole-text re-encoding that leaves nothing suspicious behind),
   else ``garbled_text``; U+FFFD (left by an earlier lossy conversion) is ``garbled_text``.
   Correct text in any language is never touched: ftfy's badness heuristic decides whether to
   look at all, and only ftfy's encoding fix is used (not its quote, width or ligature changes);
3. normalise: ``\\n`` newlines, no byte-order mark, no control characters but tab and newline,
   NFC; nothing left is ``empty_text``;
4. fingerprints: an exact-duplicate hash of the normalised text and LSH keys for near duplicates.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass, field, replace

import xxhash

from pipeline.formats.vocabulary import Reason
from pipeline.media.text.decoded import Decoded

# Default --max-text-bytes. The longest texts that make sense as one sample are books: a long
# novel is 1-3 MB of UTF-8 (War and Peace about 3.2 MB), captions and documents far less; 16 MiB
# is five such novels. Above it a "text" is a log, a dump or a whole corpus in one file, and
# judging it costs memory in proportion (the bytes, the decoded text and its normalised copies):
# see `clean_text` for the multiple.
MAX_TEXT_BYTES = 16 << 20


@dataclass(frozen=True)
class TextSettings:
    repair_mojibake: bool = True
    """Repair certain mojibake (and say so) instead of quarantining it as garbled_text."""
    max_bytes: int = MAX_TEXT_BYTES
    """Texts larger than this are too_large, judged from the size before reading (--max-text-bytes)."""


@dataclass
class TextOutcome:
    reason: Reason | None = None
    detail: str = ""
    encoding: str | None = None
    confidence: float | None = None
    text: str | None = None
    content_hash: str | None = None
    minhash: str | None = None  # base64 LSH band keys (see pipeline.similarity.minhash)
    notes: list[str] = field(default_factory=list)


# Line breaks other than \n: CRLF, CR, NEL, vertical tab, form feed, line/paragraph separators.
_BREAKS = re.compile("\r\n|[\r\x85\x0b\x0c\u2028\u2029]")
# C0/C1 controls except tab and newline, plus stray byte-order marks inside the text.
_CONTROLS = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x84\x86-\x9f\ufeff]")


def clean_text(data: bytes, s: TextSettings = TextSettings(), reading: Decoded | None = None,
               fingerprints: bool = True) -> TextOutcome:
    """The text stage on one file's bytes; ``reading``: a decode made elsewhere (the folder prior's,
    `prior.by_folder`) to judge instead of detecting the encoding again; ``fingerprints=False``:
    the text alone, without the hashes (the folder prior weighing a reading it may not take)."""
    if len(data) > s.max_bytes:  # callers check the size before reading; this keeps the bound for any other
        return TextOutcome(reason=Reason.TOO_LARGE, detail=f"{len(data)} bytes > --max-text-bytes {s.max_bytes}")
    if reading is None:
        from pipeline.media.text.encodings import decode_bytes  # its alphabets take ~0.15 s to build: workers only

        d = decode_bytes(data)
    else:
        d = replace(reading, notes=list(reading.notes))  # (the text is let go below: not the caller's copy)
    out = TextOutcome(encoding=d.encoding, confidence=d.confidence, notes=list(d.notes))
    if d.text is None:
        out.reason, out.detail = d.reason, d.detail
        return out
    text, d.text = d.text, None  # one reference: each normalised copy frees the one before it
    text, reason, detail = repair_garbled(text, s.repair_mojibake)
    if reason:
        out.reason, out.detail = reason, detail
        return out
    if detail:
        out.notes.append(detail)
    text, removed = normalize(text)
    if removed:
        out.notes.append(f"removed {removed} control character{'s' if removed > 1 else ''}")
    if not text or text.isspace():  # (text.strip() would copy it)
        out.reason, out.detail = Reason.EMPTY_TEXT, "nothing but whitespace after normalisation"
        return out
    out.text = text
    if not fingerprints:
        return out
    out.content_hash = text_hash(text)
    from pipeline.similarity.minhash import encode_keys, text_keys

    out.minhash = encode_keys(text_keys(text))
    return out


def normalize(text: str) -> tuple[str, int]:
    """``\\n`` line breaks, no control characters but tab and newline, NFC. Returns (text, removed)."""
    text = _BREAKS.sub("\n", text)
    text, removed = _CONTROLS.subn("", text)
    if not text.isascii():
        text = unicodedata.normalize("NFC", text)
    return text, removed


def text_hash(text: str) -> str:
    """Exact-duplicate key: the normalised text, ignoring trailing whitespace on lines and at the end.

    Hashed a piece of lines at a time: splitting a 16 MB text into one list of lines (50 bytes a
    line) and encoding it whole would cost several times the text."""
    text = text.strip()
    h = xxhash.xxh3_128()
    i = 0
    while i < len(text):
        j = text.find("\n", i + HASH_PIECE)
        j = len(text) if j < 0 else j
        h.update("\n".join(line.rstrip() for line in text[i:j].split("\n")).encode("utf-8"))
        if j < len(text):
            h.update(b"\n")
        i = j + 1
    return h.hexdigest()


HASH_PIECE = 1 << 20  # characters


def repair_garbled(text: str, repair: bool = True) -> tuple[str, Reason | None, str]:
    """Return (text, reason, detail): the text unchanged, repaired with a note, or garbled_text."""
    if text.isascii():
        return text, None, ""
    fixed, how = _fix_mojibake(text)
    if fixed is not None:
        if not repair:
            return text, Reason.GARBLED_TEXT, f"mojibake ({how}); repair is off"
        return fixed, None, f"repaired mojibake ({how})"
    if how:  # bad, but no certain repair
        return text, Reason.GARBLED_TEXT, how
    n = text.count("\ufffd")
    if n:
        return text, Reason.GARBLED_TEXT, f"{n} U+FFFD replacement character{'s' if n > 1 else ''}: lost in an earlier conversion"
    return text, None, ""


def _fix_mojibake(text: str) -> tuple[str | None, str]:
    """(repaired text, how) when the repair is certain; (None, why) when garbled; (None, "") when fine."""
    gbk = _utf8_read_as_gbk(text)
    if gbk is not None:
        return gbk, "utf-8 read as gbk"
    spans = _suspect_windows(text)
    if not spans:
        return None, ""  # no UTF-8 lead character followed by a continuation one: nothing to fix
    import ftfy

    bad = _bad_spot(text, spans)
    if bad is None:
        return None, ""
    fixed, explained = ftfy.fix_encoding_and_explain(text)
    steps = explained or []  # ftfy types the steps as optional; fix_encoding always lists them
    kinds = [s[0] for s in steps]
    # certain: a whole-text re-encoding (no partial patching, no lossy substitutions) after which
    # nothing looks wrong any more, and no replacement character anywhere
    certain = (fixed != text and kinds and all(k in ("encode", "decode") for k in kinds)
               and _bad_spot(fixed) is None and "\ufffd" not in text and "\ufffd" not in fixed)
    if certain:
        read_as = next((enc for k, enc in steps if k == "encode"), "?").replace("sloppy-", "")
        return fixed, f"utf-8 read as {read_as}"
    near = f'near "{_excerpt(text, bad)}"'
    if fixed != text and steps:
        return None, (f"mojibake that cannot be repaired with certainty, {near} "
                      f"(ftfy: {', '.join(f'{a} {b}' for a, b in steps)})")
    return None, f"mojibake (characters typical of a wrong decoding, {near}) that ftfy cannot repair"


def _suspect_windows(text: str, before: int = 8, after: int = 16) -> list[tuple[int, int]]:
    """Merged (start, end) spans around each suspect spot: where mojibake's marks can be.

    ftfy's badness scan costs about 0.25 us a character (4-6 ms for 20 KB), and every Greek,
    Cyrillic or Turkish text has a few suspect pairs ("о»" is a cp1251 lead and continuation):
    scanning only around them is several times cheaper on such texts. Mojibake's marks are where
    the misread lead and continuation characters are, so nothing is missed there; badness far
    from any such pair is no sign of mojibake."""
    spans: list[tuple[int, int]] = []
    for m in _suspect().finditer(text):
        a, b = max(0, m.start() - before), m.start() + after
        if spans and a <= spans[-1][1]:
            spans[-1] = (spans[-1][0], b)
        else:
            spans.append((a, b))
    return spans


def _bad_spot(text: str, spans: list[tuple[int, int]] | None = None) -> int | None:
    """Where ftfy's badness heuristic first sees mojibake (within ``spans``, else anywhere), or None.

    ftfy takes "»" and "›" for closing quotes, as French uses them ("« mot »"); German,
    Hungarian, Czech, Danish and others open a quotation with them ("»ámulok«", "»Öl«"), so one
    followed by a letter is not mojibake. (Mojibake has other, unambiguous marks: "Ã»" for "û"
    is still seen.)"""
    from ftfy.badness import BADNESS_RE

    for a, b in spans if spans is not None else [(0, len(text))]:
        for m in BADNESS_RE.finditer(text, a, b):
            if not _OPENING_GUILLEMET.fullmatch(m.group()):
                return m.start()
    return None


_OPENING_GUILLEMET = re.compile("[»›][^\\W\\d_]")


def _excerpt(text: str, at: int) -> str:
    """The characters around ``at``, for a detail: control characters (C1 ones are typical of
    mojibake, and invisible) written as escapes."""
    return _INVISIBLE.sub(lambda m: f"\\x{ord(m.group()):02x}", text[max(0, at - 12) : at + 12].strip())


_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f]")


# The single-byte encodings ftfy can undo. UTF-8 read as any of them turns a lead byte
# (0xC2-0xF4) into one character and the continuation byte after it (0x80-0xBF) into another;
# mojibake always has such a pair, so texts without one skip ftfy's costlier badness scan.
_MISREAD_AS = ("latin-1", "sloppy-windows-1252", "sloppy-windows-1250", "sloppy-windows-1251",
               "sloppy-windows-1253", "sloppy-windows-1254", "sloppy-windows-1257", "iso-8859-2", "macroman", "cp437")


@functools.cache
def _suspect() -> re.Pattern:
    import ftfy.bad_codecs  # noqa: F401 - registers the sloppy-windows-* codecs

    leads = {ch for c in _MISREAD_AS for ch in bytes(range(0xC2, 0xF5)).decode(c)}
    conts = {ch for c in _MISREAD_AS for ch in bytes(range(0x80, 0xC0)).decode(c)}
    cls = lambda chars: "[" + re.escape("".join(sorted(chars))) + "]"  # noqa: E731
    return re.compile(f"{cls(leads)}(?={cls(conts)})|[\x80-\x9f]")


_HANZI = re.compile("[\u4e00-\u9fff]")
# GBK lead bytes of common hanzi decoded from UTF-8 bytes: UTF-8 Chinese read as GBK looks like
# "浣犲ソ" for "你好". Re-encoding as GBK and decoding as UTF-8 strictly succeeds only for that.
def _utf8_read_as_gbk(text: str) -> str | None:
    if not _HANZI.search(text):
        return None
    head = text[:4000]
    if len(head.encode("utf-8")) - len(head) < 12:
        return None  # under ~6 non-ASCII characters: a short real Chinese text could pass by chance
    try:
        repaired = text.encode("gb18030").decode("utf-8")
    except UnicodeError:
        return None
    if repaired == text or "\ufffd" in repaired:
        return None
    return repaired
