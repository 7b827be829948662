"""Decode and normalise one text: bytes in, UTF-8 NFC text out, or a quarantine reason.

(Minimal first version; see ARCHITECTURE.md for what the full one guarantees.)
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field

import xxhash


@dataclass(frozen=True)
class TextSettings:
    pass


@dataclass
class TextOutcome:
    reason: str | None = None
    detail: str = ""
    encoding: str | None = None
    confidence: float | None = None
    text: str | None = None
    content_hash: str | None = None
    minhash: str | None = None
    notes: list[str] = field(default_factory=list)


def clean_text(data: bytes, s: TextSettings) -> TextOutcome:
    if b"\x00" in data:
        return TextOutcome("binary_content", "NUL bytes")
    try:
        text, enc, conf = data.decode("utf-8-sig"), "utf-8", 1.0
    except UnicodeDecodeError:
        import chardet

        guess = chardet.detect(data)
        enc, conf = guess["encoding"], guess["confidence"]
        try:
            text = data.decode(enc) if enc else None
        except (UnicodeDecodeError, LookupError):
            text = None
        if text is None:
            return TextOutcome("undecodable_text", f"no strict decode (chardet guessed {enc})", enc, conf)
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch) != "Cc")
    if not text.strip():
        return TextOutcome("empty_text", "nothing left after normalisation", enc, conf)
    return TextOutcome(None, "", enc, conf, text, xxhash.xxh3_128_hexdigest(text.encode()))
