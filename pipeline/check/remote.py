"""`pipe check` of folders on object storage: each s3:// folder is copied to a local staging
folder (its .pipe/ bookkeeping aside), checked by the same code as a local one, and reported
under its URL. The staging folders are removed afterwards."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pipeline.core.errors import UsageError
from pipeline.storage import is_remote, open_folder
from pipeline.storage.transfer import MARKER, download, remove_staging, staging_dir


def run(cfg, show_progress: bool):
    from pipeline.check import stage

    urls: dict[Path, str] = {}
    try:
        dirs = []
        for d in cfg.dirs:
            if is_remote(d):
                local = _stage(str(d))
                urls[local] = open_folder(str(d)).url
                dirs.append(local)
            else:
                dirs.append(d)
        report = stage.run(dataclasses.replace(cfg, dirs=dirs), show_progress)
    finally:
        for local in urls:
            remove_staging(local)
    for folder in report.folders:
        url = urls.get(folder.path)
        if url is not None:
            for r in folder.results:
                r.message = r.message.replace(str(folder.path), url)
            folder.path = url  # type: ignore[assignment]  # shown and written as the URL it is
    return report


def _stage(url: str) -> Path:
    src = open_folder(url)
    rels = [e.rel for e in src.list() if not e.rel.startswith(".pipe/") or e.rel == MARKER]
    if not rels:
        raise UsageError(f"folder not found: {src.url} holds no objects")
    local = staging_dir("check")
    try:
        download(src, rels, local)
    except BaseException:
        remove_staging(local)
        raise
    return local
