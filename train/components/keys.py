"""`--record-keys` in training runs: the keys the checkpointed model trained on, per epoch and rank.

Files: ``RUN_DIR/keys/epoch{E}-rank{R}.txt`` for a run's first attempt and
``epoch{E}-rank{R}-attempt{A}.txt`` for the A-th resume, one key per line in the order the rank
trained on them; a sample skipped because it did not decode is a line ``KEY skipped`` (keys
never hold a space). Over all files of an epoch every sample the epoch trained on is there once.

Keys are kept in memory and appended to the files only with a checkpoint: every rank flushes
before the checkpoint's gather (`flush`), and the checkpoint records the attempt and the length
of every file (`Records`). A resumed run truncates the files of the attempt it continues to
those lengths and deletes what later attempts wrote (`prepare`, rank 0, before any rank writes
again): keys trained on after the last checkpoint of a killed attempt were trained on by a
model that no longer exists, and the resumed run trains on them again, in its own file.

No torch here: tests and tools read the record with `read_epoch`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Container
from dataclasses import dataclass, field
from pathlib import Path

KEYS = "keys"
SKIPPED_MARK = "skipped"
_NAME = re.compile(r"^epoch(\d+)-rank(\d+)(?:-attempt(\d+))?\.txt$")


def key_file(epoch: int, rank: int, attempt: int) -> str:
    """The record of ``epoch`` (from 0) by ``rank`` in ``attempt`` (0: the run's first)."""
    return f"epoch{epoch}-rank{rank}.txt" if attempt == 0 else f"epoch{epoch}-rank{rank}-attempt{attempt}.txt"


def parse_name(name: str) -> tuple[int, int, int] | None:
    """``epoch{E}-rank{R}[-attempt{A}].txt`` -> (epoch, rank, attempt), None for any other name."""
    m = _NAME.match(name)
    return None if m is None else (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


@dataclass
class Records:
    """What a checkpoint says about the key record: the attempt that wrote it, and how long
    each of that attempt's files was (bytes) when it was written. ``files`` None: unknown (a
    checkpoint of a run before this record existed)."""

    attempt: int = 0
    files: dict[str, int] | None = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"attempt": self.attempt, "files": dict(self.files or {})}

    @classmethod
    def of(cls, saved: dict | None) -> Records | None:
        """The records of a loaded checkpoint (None: a fresh run)."""
        if saved is None:
            return None
        records = saved.get("records") or {}
        if "attempt" not in records:
            return cls(0, None)
        return cls(int(records["attempt"]), {str(k): int(v) for k, v in (records.get("files") or {}).items()})


def attempt_of(resumed: Records | None) -> int:
    """This run's attempt number: 0 fresh, one more than the checkpoint's when resumed."""
    return 0 if resumed is None else resumed.attempt + 1


def prepare(run_dir: Path, resumed: Records | None) -> None:
    """Make RUN_DIR/keys what the checkpoint being continued trained on (rank 0, before any rank
    writes): files of the checkpoint's attempt cut to their recorded lengths, files it does not
    list and files of later attempts deleted. A fresh run starts from an empty record."""
    folder = Path(run_dir) / KEYS
    if not folder.is_dir():
        return
    for path in folder.iterdir():
        parsed = parse_name(path.name)
        if parsed is None:
            continue
        attempt = parsed[2]
        if resumed is None or attempt > resumed.attempt:
            path.unlink(missing_ok=True)
        elif attempt == resumed.attempt and resumed.files is not None:
            size = resumed.files.get(path.name)
            if size is None:
                path.unlink(missing_ok=True)
            elif path.stat().st_size != size:
                os.truncate(path, size)


class KeyRecorder:
    """One rank's record for one attempt: `trained`/`skipped` per batch, `flush` at a checkpoint."""

    def __init__(self, run_dir: Path, rank: int, attempt: int, enabled: bool):
        self.folder = Path(run_dir) / KEYS
        self.rank, self.attempt, self.enabled = rank, attempt, enabled
        self._pending: dict[int, list[str]] = {}
        self._sizes: dict[str, int] = {}

    def trained(self, epoch: int, keys: list[str], skipped: Container[int] = ()) -> None:
        """A batch the rank trained on; positions in ``skipped`` did not decode (not trained)."""
        if not self.enabled:
            return
        lines = self._pending.setdefault(epoch, [])
        lines.extend(f"{k} {SKIPPED_MARK}" if i in skipped else k for i, k in enumerate(keys))

    def flush(self) -> dict[str, int]:
        """Append what was recorded since the last flush (fsynced), before the checkpoint is
        written; returns the length of every file this rank wrote in this attempt, for it."""
        if self._pending:
            self.folder.mkdir(parents=True, exist_ok=True)
        for epoch, lines in sorted(self._pending.items()):
            name = key_file(epoch, self.rank, self.attempt)
            with open(self.folder / name, "a") as f:
                f.write("".join(line + "\n" for line in lines))
                f.flush()
                os.fsync(f.fileno())
                self._sizes[name] = f.tell()
        self._pending = {}
        return dict(self._sizes)


def read_epoch(run_dir: Path, epoch: int) -> dict[tuple[int, int], list[str]]:
    """{(attempt, rank): lines} of ``epoch``'s record, in attempt then rank order."""
    folder = Path(run_dir) / KEYS
    found = []
    for path in folder.iterdir() if folder.is_dir() else []:
        parsed = parse_name(path.name)
        if parsed is not None and parsed[0] == epoch:
            found.append(((parsed[2], parsed[1]), path))
    return {k: path.read_text().splitlines() for k, path in sorted(found)}


def trained_keys(run_dir: Path, epoch: int) -> tuple[list[str], list[str]]:
    """(keys trained on, keys skipped) in ``epoch``, over every rank and attempt, in file order."""
    trained: list[str] = []
    skipped: list[str] = []
    for lines in read_epoch(run_dir, epoch).values():
        for line in lines:
            key, _, mark = line.partition(" ")
            (skipped if mark == SKIPPED_MARK else trained).append(key)
    return trained, skipped
