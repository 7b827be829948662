"""Bad samples mid-stream, on the data side: what the reader hands on instead of raising.

A training run must not die at hour 30 over one image that does not decode, a caption that is
not UTF-8, a sample missing its class, or a shard cut short. With ``skip_bad`` the reader
(`train.data.stream.SampleReader`, `train.data.reader.ShardReader`) keeps going: a sample that
cannot be parsed becomes a `BadSample` (its key where the tar header still names it, its shard,
byte offset and the reason), and a sample that does not decode is found while the batch is
collated. Either way the batch keeps its size, so every rank still runs the same steps: the bad
slot is filled with a copy of a good sample of the same batch, marked ``valid=False`` (the loss
and the gradient leave it out, `train.components.skipping`), and listed in the batch's
``skipped``: ``(slot, shard, key, offset, reason)``.

Why a masked copy and not a replacement sample: a replacement would be some other sample seen
twice (or one the epoch left out), breaking "every sample once per epoch", and could itself be
bad; a masked slot changes nothing but that the step's mean counts the skipped sample as zero.
Why a copy and not zeros: BatchNorm layers normalise with the batch, and a blank image would skew
the statistics of the samples that do train.

No torch here (`train.data.stream` imports it).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from pipeline.core.errors import UsageError
from pipeline.formats.sample import RawSample, split_name

_SAFE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_LIMIT = re.compile(r"^(?:(\d+)|(\d*\.?\d+)%)$")


@dataclass
class BadSample(RawSample):
    """A sample that could not be read or parsed: no fields, and why."""

    reason: str = ""


def key_in_header(data: bytes | memoryview, offset: int) -> str:
    """The key a tar header at the start of ``data`` names, when it is a plain key; else
    ``@OFFSET`` (the sample's byte offset in its shard: what still identifies it)."""
    try:
        name = bytes(data[:100]).split(b"\0", 1)[0].decode("ascii")
        key = split_name(name)[0]
    except (UnicodeDecodeError, ValueError):
        return f"@{offset}"
    return key if _SAFE_KEY.match(key) else f"@{offset}"


def text_problem(data: bytes | memoryview | None) -> str | None:
    """Why a caption cannot be fed (None when it can): `pipe clean` writes UTF-8 only."""
    if data is None:
        return None
    try:
        bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        return f"its caption is not UTF-8 ({e.reason} at byte {e.start})"
    return None


def donors(size: int, bad: set[int]) -> dict[int, int | None]:
    """For each bad slot of a batch of ``size``, the good slot whose sample fills it: the nearest
    one before it, else after it (None when the whole batch is bad)."""
    good = [i for i in range(size) if i not in bad]
    out: dict[int, int | None] = {}
    for i in sorted(bad):
        before = [g for g in good if g < i]
        after = [g for g in good if g > i]
        out[i] = before[-1] if before else (after[0] if after else None)
    return out


def parse_limit(spec: str, train_samples: int) -> int:
    """``--max-skipped``: ``N`` distinct samples, or ``P%`` of the train split's (at least one)."""
    m = _LIMIT.match(str(spec).strip())
    if m is None:
        raise UsageError(f"--max-skipped {spec!r} is not a count or a percentage, e.g. 10 or 0.1%")
    if m.group(1) is not None:
        return int(m.group(1))
    share = float(m.group(2))
    if share > 100:
        raise UsageError(f"--max-skipped {spec}: a percentage of the train split is at most 100%")
    return max(1, math.floor(share / 100 * train_samples)) if share > 0 else 0
