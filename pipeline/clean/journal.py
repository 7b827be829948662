"""The clean journal: one JSON line per processed file, appended as results arrive.

It is what makes `pipe clean` resumable. A re-run reuses the record of every input whose size
and modification time are unchanged (and whose output is still on disk) instead of decoding it
again. A line cut short by SIGKILL is ignored; the last record for a source wins.

Layout under CLEAN_DIR/.pipe/: ``state.json`` (what input and which output-affecting settings
this folder was made from) and ``journal.jsonl``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TextIO

from pipeline.clean.records import FileResult
from pipeline.core.files import STATE_DIR, atomic_write_text, tmp_name

FLUSH_EVERY = 0.2  # seconds


class Journal:
    def __init__(self, clean_dir: Path):
        self.dir = clean_dir / STATE_DIR
        self.path = self.dir / "journal.jsonl"
        self.state_path = self.dir / "state.json"
        self._f: TextIO | None = None  # opened by the first append
        self._since_sync = 0
        self._flushed = 0.0  # time.monotonic() of the last flush

    def read_state(self) -> dict | None:
        try:
            return json.loads(self.state_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def write_state(self, state: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.state_path, json.dumps(state, indent=2, sort_keys=True))

    def load(self) -> dict[str, FileResult]:
        records: dict[str, FileResult] = {}
        try:
            with open(self.path, encoding="utf-8") as f:
                for line in f:
                    if not line.endswith("\n"):
                        break  # the tail of a killed run
                    try:
                        r = FileResult.from_json(line)
                    except (ValueError, TypeError):
                        continue
                    records[r.source] = r
        except FileNotFoundError:
            pass
        return records

    def append(self, r: FileResult) -> None:
        """Buffered: the lines reach the file at most `FLUSH_EVERY` seconds apart (a write per
        file cost as much as a small file's whole decode). A killed run loses the last fraction
        of a second of lines, and the next run redoes those files; a line cut short is ignored."""
        if self._f is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a", encoding="utf-8", buffering=1 << 16)
        self._f.write(r.to_json() + "\n")
        self._since_sync += 1
        now = time.monotonic()
        if now - self._flushed >= FLUSH_EVERY:
            self._f.flush()
            self._flushed = now
        if self._since_sync >= 256:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._since_sync = 0

    def close(self) -> None:
        if self._f is not None:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            self._f = None

    def compact(self, results: Iterable[FileResult]) -> None:
        """Rewrite the journal with exactly the current records, in order."""
        with self.rewrite() as put:
            for r in results:
                put(r)

    @contextlib.contextmanager
    def rewrite(self) -> Iterator[Callable[[FileResult], None]]:
        """`compact`, fed one record at a time: streamed to a temporary file that replaces the
        journal when the block ends without an error (the text of ten million records is GBs)."""
        self.close()
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = tmp_name(self.path)
        try:
            with open(tmp, "w", encoding="utf-8", buffering=1 << 20) as f:
                def put(r: FileResult) -> None:
                    f.write(r.to_json() + "\n")

                yield put
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
