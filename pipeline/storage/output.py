"""A stage's output folder, wherever it is: claimed before the run, marked as the stage's
(``.pipe/state.json``), and committed last with the file that says it is complete.

Where the storage can lock a folder (`Folder.exclusive`: a local one), a run holds it alone and a
rerun into a complete output takes it over (it resumes, then commits again). Where it cannot
(object storage), two runs may meet: a complete output is refused unless --overwrite, and of two
runs that both claimed it exactly one commits (`Folder.commit`); the other stops with one line
(StageFailed, exit 1). A reader that finds the commit file finds everything it names.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from pipeline.core.errors import UsageError
from pipeline.storage.folder import LOCK, Folder, committed_by_another_run  # noqa: F401 - the stages' one line

MARKER = ".pipe/state.json"


def read_marker(folder: Folder) -> dict | None:
    """The marker of a folder pipe wrote, or None (absent or unreadable)."""
    try:
        state = json.loads(folder.read(MARKER, max_bytes=1 << 20))
    except (OSError, ValueError, RecursionError):
        return None
    return state if isinstance(state, dict) else None


def write_marker(folder: Folder, state: dict) -> None:
    folder.write(MARKER, json.dumps(state, indent=2, sort_keys=True).encode("utf-8"))


def claim(out: Folder, tool: str, commit: str, overwrite: bool, differs: Callable[[dict], str | None],
          owned: tuple[str, ...], refused: str = "") -> None:
    """Before anything is written: refuse a folder another tool (or a person) filled; with
    --overwrite remove what ``tool`` writes there (``owned``: top-level names; the commit file
    first, so no reader takes the folder for complete while it is redone); without it refuse a
    complete output where runs cannot lock, and one begun with other input or settings
    (``differs`` says how, as the rest of a sentence, or None). ``refused``: the sentence for a
    foreign folder, when the tool says it its own way."""
    marker = refuse_foreign(out, tool, refused)
    if marker is None:
        return
    if overwrite:
        remove(out, (commit, *(name for name in owned if name != commit)))
        return
    if not out.exclusive and out.exists(commit):
        raise UsageError(f"{out.url} already holds a complete output of {tool} ({commit}); pass --overwrite to "
                         "replace it, or choose another folder")
    why = differs(marker)
    if why:
        raise UsageError(f"{out.url} {why}")


def refuse_foreign(out: Folder, tool: str, refused: str = "") -> dict | None:
    """Refuse a folder that is not empty unless ``tool``'s marker says ``tool`` wrote it (before
    anything is written there, the lock file included); return the marker (None: empty)."""
    marker = read_marker(out)
    if out.occupied() and (marker is None or marker.get("tool") != tool):
        raise UsageError(refused or f"{out.url} is not empty and was not written by {tool} (it has no {MARKER} of "
                                    f"{tool}'s); choose an empty folder (--overwrite replaces only a folder {tool} wrote)")
    return marker


def remove(out: Folder, names: tuple[str, ...]) -> None:
    """Remove the files and folders ``names`` (top-level) of ``out``, its lock and lease aside."""
    for name in names:
        out.sweep(name, {LOCK})  # (nothing where it is a file)
        if not out.child(name).list():  # a file, or nothing: a folder still holding a lease stays (a
            out.delete(name)  # file-backed store refuses to delete the key of a folder that is not empty)


def commit(out: Folder, rel: str, source: bytes | object, scratch: tuple[str, ...] = ()) -> None:
    """The commit file, written last (`Folder.commit`). Where the output is final (no lock: a
    rerun is refused), ``scratch`` (bookkeeping only a resumed run reads) goes after it."""
    out.commit(rel, source)  # type: ignore[arg-type]
    if not out.exclusive:
        for name in scratch:
            out.sweep(name, set())
