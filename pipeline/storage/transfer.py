"""A stage's output on object storage: claimed before the run, written in a local staging
folder by the stage's own code (the same code path and files as a local run), then published:
every file uploaded once under its deterministic name, stale objects of an earlier run removed,
and the commit file (manifest.parquet, index.json) written last with a conditional write.

Of two runs into one output at once, exactly one commit succeeds; the other stops with one line
(StageFailed, exit 1). A reader that finds the commit file finds everything it names.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pipeline.core.errors import StageFailed, UsageError
from pipeline.core.files import STATE_DIR
from pipeline.storage.folder import Folder

MARKER = f"{STATE_DIR}/state.json"
THREADS = 16  # uploads and downloads in flight: objects are small, the round trip is the cost


def staging_dir(purpose: str) -> Path:
    """A fresh local folder for one run (under TMPDIR; set TMPDIR for a bigger disk)."""
    return Path(tempfile.mkdtemp(prefix=f"pipe-{purpose}-"))


def remove_staging(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def read_marker(folder: Folder) -> dict | None:
    try:
        state = json.loads(folder.read(MARKER, max_bytes=1 << 20))
    except (FileNotFoundError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def claim(dest: Folder, tool: str, commit: str, overwrite: bool, same: Callable[[dict], str | None]) -> None:
    """Before anything runs: refuse an output another tool (or a person) wrote; refuse a complete
    one unless --overwrite; refuse one begun with other input or settings (``same`` says how it
    differs, or None) unless --overwrite. With --overwrite the commit file goes first, so no
    reader takes the folder for complete while it is redone."""
    marker = read_marker(dest)
    if marker is None or marker.get("tool") != tool:
        if dest.list():
            raise UsageError(f"{dest.url} is not empty and was not written by {tool} (it has no {MARKER} of {tool}'s); "
                             f"choose an empty prefix (--overwrite replaces only an output {tool} wrote)")
        return
    if dest.exists(commit):
        if not overwrite:
            raise UsageError(f"{dest.url} already holds a complete output of {tool} ({commit}); "
                             "pass --overwrite to replace it, or choose another prefix")
        dest.delete(commit)
        return
    why = same(marker)
    if why and not overwrite:
        raise UsageError(f"{dest.url} {why}; pass --overwrite to replace it")


def _files(root: Path) -> list[str]:
    out = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            out.append((Path(dirpath) / name).relative_to(root).as_posix())
    return sorted(out)


def publish(staging: Path, dest: Folder, commit: str, keep: Callable[[str], bool], owned: Callable[[str], bool],
            uploaded: Iterable[str] = ()) -> None:
    """Upload every staged file ``keep`` accepts (the marker first, ``commit`` last and only if
    absent), then remove objects of an earlier run that this run did not write (nor put there
    itself by other means: ``uploaded``, e.g. shards Ray tasks uploaded) and ``owned`` says are
    the stage's own. Raises StageFailed when another run committed first."""
    files = [rel for rel in _files(staging) if keep(rel) and rel != commit]
    if (staging / MARKER).is_file():
        dest.upload(MARKER, staging / MARKER)
    parallel(lambda rel: dest.upload(rel, staging / rel), [rel for rel in files if rel != MARKER])
    written = set(files) | set(uploaded) | {commit}
    stale = [e.rel for e in dest.list() if e.rel not in written and owned(e.rel)]
    parallel(dest.delete, stale)
    if not dest.write_if_absent(commit, (staging / commit).read_bytes()):
        raise StageFailed(f"{dest.url}/{commit} was committed by another run while this one worked; that run's output "
                          "stands and this run's was not committed")


def download(src: Folder, rels: Iterable[str], staging: Path) -> None:
    """Copy objects of ``src`` into the local folder ``staging`` under the same names."""

    def get(rel: str) -> None:
        path = staging / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with src.open(rel) as f, open(path, "wb") as out:
            shutil.copyfileobj(f, out, 1 << 20)

    parallel(get, list(rels))


def parallel(fn: Callable[[str], None], items: list[str]) -> None:
    """``fn`` on every item, THREADS at a time (each is one round trip); the first error stops it."""
    if not items:
        return
    with ThreadPoolExecutor(min(THREADS, len(items))) as pool:
        for _ in pool.map(fn, items):
            pass
