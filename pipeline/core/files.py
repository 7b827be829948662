"""Crash-safe file writes: write to a temporary name in the same folder, then rename.

A reader (or a re-run after SIGKILL) sees either the old file or the complete new one, never a
half-written file. Temporary names end in ``.tmp`` so a later run can sweep leftovers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

TMP_SUFFIX = ".tmp"


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")


def atomic_write_bytes(path: Path, data: bytes, fsync: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path)
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
    tmp = _tmp_name(dest)
    shutil.copyfile(src, tmp)
    os.replace(tmp, dest)


def sweep_tmp(root: Path) -> int:
    """Remove temporary files a killed run left under ``root``; return how many."""
    n = 0
    if root.exists():
        for p in root.rglob(f"*{TMP_SUFFIX}"):
            if p.is_file() and p.name.startswith("."):
                p.unlink(missing_ok=True)
                n += 1
    return n
