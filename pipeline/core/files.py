"""Crash-safe file writes: write to a temporary name in the same folder, then rename.

A reader (or a re-run after SIGKILL) sees either the old file or the complete new one, never a
half-written file. Temporary names end in ``.tmp`` so a later run can sweep leftovers.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

from pipeline.core.errors import StageFailed, UsageError

TMP_SUFFIX = ".tmp"
NAME_MAX = 255  # bytes in one path component (Linux, macOS, ext4, xfs, btrfs, APFS)
# What pipe keeps inside a folder it writes: ``state.json``, the marker that says which stage
# wrote the folder (tool, version, input, settings; schemas/state.schema.json), and ``lock``.
STATE_DIR = ".pipe"
LOCK_NAME = "lock"


def tmp_name(path: Path) -> Path:
    """``.{name}.{pid}.tmp`` beside ``path``, within the file system's limit on one name.

    A legal input name may already use all of NAME_MAX (255 bytes): adding the affixes would make
    every write of it fail with "File name too long", on every re-run. Such a name keeps as many
    of its first bytes as fit and ends in a hash of the whole name, so it stays unique and the same
    on every run (a killed run's leftovers are swept by the same pattern).
    """
    suffix = f".{os.getpid()}{TMP_SUFFIX}"
    raw = os.fsencode(path.name)
    if 1 + len(raw) + len(suffix) <= NAME_MAX:
        return path.with_name(f".{path.name}{suffix}")
    digest = hashlib.sha256(raw).hexdigest()[:16]
    head = raw[: NAME_MAX - 1 - len(suffix) - 1 - len(digest)]
    return path.with_name(f".{os.fsdecode(head)}~{digest}{suffix}")


def atomic_write_bytes(path: Path, data: bytes, fsync: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()  # a failed write (disk full, the target a folder) leaves nothing behind
        raise


def atomic_write_text(path: Path, text: str, fsync: bool = False) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), fsync=fsync)


def atomic_copy(src: str | Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(dest)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()  # a failed copy (disk full) leaves nothing behind
        raise


def sweep_tmp(root: Path) -> int:
    """Remove temporary files a killed run left under ``root``; return how many."""
    n = 0
    if root.exists():
        for p in root.rglob(f"*{TMP_SUFFIX}"):
            if p.is_file() and p.name.startswith("."):
                p.unlink(missing_ok=True)
                n += 1
    return n


def read_marker(folder: Path) -> dict | None:
    """The marker ``.pipe/state.json`` of a folder pipe wrote, or None (absent or unreadable)."""
    try:
        state = json.loads((folder / STATE_DIR / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return state if isinstance(state, dict) else None


def occupied(folder: Path) -> bool:
    """Whether ``folder`` holds anything besides pipe's own lock file (an absent folder holds nothing)."""
    try:
        for p in folder.iterdir():
            if p.name != STATE_DIR or not p.is_dir() or any(q.name != LOCK_NAME for q in p.iterdir()):
                return True
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as e:
        raise UsageError(f"cannot read the output folder {folder}: {e.strerror or e}") from None
    return False


@contextlib.contextmanager
def output_lock(folder: Path, tool: str):
    """Hold an exclusive lock on ``folder/.pipe/lock`` for the whole run.

    Two runs writing one folder would interleave their files and each delete the other's: the
    second stops at once with one line instead, writing nothing. It exits 1, as a run that loses
    the commit race on object storage does (`pipeline.storage.output`): of two concurrent runs exactly
    one commits and the other failed, whichever way they met. The
    kernel drops the lock when the holder exits, however it dies, so a stale lock file is harmless.
    The file stays empty (no pid in it): the folder's bytes do not depend on which run made them.
    """
    path = folder / STATE_DIR / LOCK_NAME
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "ab")
    except OSError as e:
        raise UsageError(f"cannot write to the output folder {folder}: {e.strerror or e}") from None
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise output_busy(str(folder), tool, f"it holds {path}; `fuser {path}` names it") from None
        yield


def output_busy(folder: str, tool: str, how: str) -> StageFailed:
    """The one line of every command whose output folder another run is writing, whatever the
    storage (a local flock, an object-store lease): exit 1, as the run that loses the commit race
    where runs cannot lock exits 1. Not a usage error: the same command succeeds once the other
    run ends, nothing about it needs fixing. ``how``: how the other run was seen."""
    return StageFailed(f"{folder} is being written by another run ({how}); "
                       f"wait for it to finish or choose another folder for this {tool}")


def refuse_output_inside(path: Path, folders: list[Path], flag: str, kind: str, role: str) -> None:
    """Before anything runs: a file the command writes (``flag`` names it: --junit, --html, -o)
    must not be a folder, nor land inside a folder it reads (``role``: "checked", "reported on"),
    where it would overwrite index.json or manifest.parquet, or add a stray file to data/."""
    target = path.resolve()
    if target.is_dir():
        raise UsageError(f"{flag} {path} is a folder; name the {kind} file to write")
    for folder in folders:
        inside = folder.resolve()
        if target == inside or inside in target.parents:
            raise UsageError(f"{flag} {path} is inside {folder}, a folder being {role}; write it elsewhere")
