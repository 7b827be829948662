"""Resuming an interrupted `pipe shard`: shards a killed run finished are kept, not written again.

The plan is deterministic (same CLEAN_DIR, same settings: same shard names, same samples in
each, in the same order), so a rerun would write the same bytes. After each shard is renamed
into place its name, its plan digest (`ShardPlan.digest`: what its bytes are made of) and its index
entry (size, sha256, offsets) are appended to ``SHARD_DIR/.pipe/shards.jsonl``. A rerun keeps a
shard when its plan digest is the one recorded and the file on disk still has the recorded
size and sha256 (read back, so a damaged or replaced shard is written again); anything else is
written anew. A finished run rewrites the journal with exactly its own shards.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import TextIO

from pipeline.core.files import STATE_DIR, atomic_write_text
from pipeline.formats.index import ShardEntry

JOURNAL = "shards.jsonl"
READ_CHUNK = 1 << 20


class WrittenShards:
    """The journal of shards written into one SHARD_DIR (see the module docstring)."""

    def __init__(self, shard_dir: Path):
        self.dir = shard_dir
        self.path = shard_dir / STATE_DIR / JOURNAL
        self.recorded = self._load()
        self._f: TextIO | None = None

    def _load(self) -> dict[str, tuple[str, ShardEntry]]:
        """name -> (plan digest, entry); the last line for a name wins, a line cut short or not ours is skipped."""
        found: dict[str, tuple[str, ShardEntry]] = {}
        try:
            with open(self.path, encoding="utf-8") as f:
                for line in f:
                    if not line.endswith("\n"):
                        break  # the tail of a killed run
                    with contextlib.suppress(ValueError, TypeError, KeyError):
                        rec = json.loads(line)
                        found[rec["entry"]["name"]] = (str(rec["plan"]), ShardEntry(**rec["entry"]))
        except (OSError, UnicodeDecodeError):
            pass
        return found

    def reusable(self, path: Path, plan: str) -> ShardEntry | None:
        """The recorded entry of the shard at ``path`` when it was written from this very plan and
        is still intact on disk (size and sha256 as recorded); None: write it."""
        rec = self.recorded.get(path.name)
        if rec is None or rec[0] != plan:
            return None
        entry = rec[1]
        try:
            if path.stat().st_size != entry.bytes or _sha256(path) != entry.sha256:
                return None
        except OSError:
            return None
        return entry

    def add(self, entry: ShardEntry, plan: str) -> None:
        """Note a shard that is now complete on disk (after its rename)."""
        if self._f is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a", encoding="utf-8")
        self._f.write(_line(entry, plan))
        self._f.flush()  # no fsync: a line lost to a crash only means that shard is written again

    def finish(self, done: list[tuple[ShardEntry, str]]) -> None:
        """The run is complete: the journal becomes exactly its shards."""
        self.close()
        atomic_write_text(self.path, "".join(_line(e, p) for e, p in done))

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def _line(entry: ShardEntry, plan: str) -> str:
    return json.dumps({"plan": plan, "entry": entry.as_dict()}, separators=(",", ":")) + "\n"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(READ_CHUNK):
            h.update(chunk)
    return h.hexdigest()
