"""What the contrastive loss must know of a batch's samples besides their pixels and tokens: which
of them are the same pair twice over (`train.objectives.losses.same_pairs`).

* ``caption_id``: an int64 hash of the caption's exact UTF-8 bytes (all of them, not only what
  --max-text-len keeps): equal ids, the same text (a 64-bit hash: two different captions of a
  batch collide with a chance of about B^2 / 2^64);
* ``group_id``: a non-negative int64 hash of the near-duplicate group `pipe shard` recorded in the pair's
  ``.json`` member (``"group"``: the shard key of the group's first sample), -1 for none.

The reader puts both in the batch when the fields it decodes include ``pairs`` (it runs in the
dataloader workers; a few microseconds a sample). No torch needed to compute them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

NO_GROUP = -1


def _id(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


def caption_id(text: bytes | memoryview | None) -> int:
    """The caption's id (`train.evaluation.contrastive.caption_id` computes the same for a str)."""
    return _id(bytes(text) if text is not None else b"")


def group_id(meta: bytes | memoryview | None) -> int:
    """The group a pair's .json member names, as an id; NO_GROUP without one (or without a .json)."""
    if meta is None:
        return NO_GROUP
    raw = bytes(meta)
    if b'"group"' not in raw:
        return NO_GROUP
    try:
        group = json.loads(raw).get("group")
    except (ValueError, AttributeError):
        return NO_GROUP
    # 63 bits: every group id is 0 or more, -1 stays "in no group"
    return _id(group.encode("utf-8")) & (2**63 - 1) if isinstance(group, str) and group else NO_GROUP


def pair_ids(fields: Sequence[dict]) -> tuple[list[int], list[int]]:
    """(caption ids, group ids) of samples given as their members by extension."""
    return [caption_id(f.get("txt")) for f in fields], [group_id(f.get("json")) for f in fields]
