"""Resuming an interrupted `pipe shard`: shards a killed run finished are kept, not written again.

The plan is deterministic (same CLEAN_DIR, same settings: same shard names, same samples in
each, in the same order), so a rerun would write the same bytes. After each shard is in place
(renamed, or uploaded) its name, its plan digest (`ShardPlan.digest`: what its bytes are made of) and its index
entry (size, sha256, offsets) are appended to ``SHARD_DIR/.pipe/shards.jsonl``. A rerun keeps a
shard when its plan digest is the one recorded and the file on disk still has the recorded
size and sha256 (read back, so a damaged or replaced shard is written again); anything else is
written anew. A finished run rewrites the journal with exactly its own shards.
"""

from __future__ import annotations

import contextlib
import hashlib
import json

from pipeline.core.files import STATE_DIR
from pipeline.formats.index import ShardEntry
from pipeline.storage import Folder
from pipeline.storage.folder import FileAppendable

JOURNAL = f"{STATE_DIR}/shards.jsonl"
READ_CHUNK = 1 << 20


class WrittenShards:
    """The journal of shards written into one SHARD_DIR (see the module docstring)."""

    def __init__(self, shard_dir: Folder):
        self.dir = shard_dir
        self.recorded = self._load()
        self._f: FileAppendable | None = None

    def _load(self) -> dict[str, tuple[str, ShardEntry]]:
        """name -> (plan digest, entry); the last line for a name wins, a line cut short or not ours is skipped."""
        found: dict[str, tuple[str, ShardEntry]] = {}
        try:
            text = self.dir.read(JOURNAL).decode("utf-8")
        except (OSError, UnicodeDecodeError):
            return found
        for line in text.splitlines(keepends=True):
            if not line.endswith("\n"):
                break  # the tail of a killed run
            with contextlib.suppress(ValueError, TypeError, KeyError):
                rec = json.loads(line)
                found[rec["entry"]["name"]] = (str(rec["plan"]), ShardEntry(**rec["entry"]))
        return found

    def reusable(self, name: str, plan: str) -> ShardEntry | None:
        """The recorded entry of the shard ``name`` when it was written from this very plan and
        is still intact in the folder (size and sha256 as recorded); None: write it."""
        rec = self.recorded.get(name)
        if rec is None or rec[0] != plan:
            return None
        entry = rec[1]
        try:
            with self.dir.open(name) as f:
                if f.stat().st_size != entry.bytes or _sha256(f) != entry.sha256:
                    return None
        except OSError:
            return None
        return entry

    def add(self, entry: ShardEntry, plan: str) -> None:
        """Note a shard that is now complete in the folder (after its rename or upload)."""
        if self._f is None:
            self._f = self.dir.appender(JOURNAL)
        self._f.add(_line(entry, plan))  # no fsync: a line lost to a crash only means that shard is written again

    def finish(self, done: list[tuple[ShardEntry, str]]) -> None:
        """The run is complete: the journal becomes exactly its shards."""
        self.close()
        self.dir.write(JOURNAL, "".join(_line(e, p) for e, p in done).encode("utf-8"))

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def _line(entry: ShardEntry, plan: str) -> str:
    return json.dumps({"plan": plan, "entry": entry.as_dict()}, separators=(",", ":")) + "\n"


def _sha256(f) -> str:
    h = hashlib.sha256()
    while chunk := f.read(READ_CHUNK):
        h.update(chunk)
    return h.hexdigest()
