"""What decoding a file gives: its text and encoding, or the reason it has none. One type that
every step of the decode (`encodings`, `wide`, `guesses`, `legacy`) returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.formats.vocabulary import Reason


@dataclass
class Decoded:
    """The text of a file, or why there is none."""

    text: str | None = None
    encoding: str | None = None  # Python codec name
    confidence: float | None = None  # 1.0 for a byte-order mark or valid UTF-8; legacy: `legacy._calibrated`
    reason: Reason | None = None  # BINARY_CONTENT | UNDECODABLE_TEXT
    detail: str = ""
    notes: list[str] = field(default_factory=list)
