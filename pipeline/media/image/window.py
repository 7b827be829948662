"""`--window`: how an image of more than 8 bits a sample is brought to 8 bits (`depth.py` does it).

Kept apart from `depth` so the command line can check the value without importing numpy: the
main process of `pipe clean` never decodes an image.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

WINDOWS = ("auto", "full")
_PERCENTILES = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*,\s*([0-9]+(?:\.[0-9]+)?)\s*$")
# the TOML value's pattern (the schema's): auto, full or two percentiles
PATTERN = r"^\s*(auto|full|[0-9]+(\.[0-9]+)?\s*,\s*[0-9]+(\.[0-9]+)?)\s*$"


@dataclass(frozen=True)
class Window:
    """``auto`` (the range the container declares, else the data's maximum rounded up to a bit
    depth), ``full`` (the sample type's whole range) or ``percentile`` (the image's own
    ``low``-th to ``high``-th percentile)."""

    mode: str = "auto"
    low: float = 0.0
    high: float = 100.0

    def __str__(self) -> str:
        return f"{self.low:g},{self.high:g}" if self.mode == "percentile" else self.mode


AUTO = Window()


def parse_window(value: str) -> Window:
    """``auto``, ``full`` or ``P1,P2`` (0 <= P1 < P2 <= 100); ValueError with one sentence otherwise."""
    v = str(value).strip().lower()
    if v in WINDOWS:
        return Window(v)
    m = _PERCENTILES.match(v)
    if m:
        low, high = float(m.group(1)), float(m.group(2))
        if 0.0 <= low < high <= 100.0 and math.isfinite(high):
            return Window("percentile", low, high)
    raise ValueError(f"--window {value!r} is not a window: use auto, full or two percentiles P1,P2 with "
                     "0 <= P1 < P2 <= 100 (e.g. 0.5,99.5)")
