"""`pipe shard` with object storage on either side, around the stage's own code.

CLEAN_DIR on S3: its manifest.parquet and data/ (the kept outputs, all pipe shard reads) are
copied to a local folder named after the URL, so a rerun sees the same input path. SHARD_DIR on
S3: the stage writes into a local staging folder, then `transfer.publish` uploads each shard once,
removes shards of an earlier run and writes index.json last with a conditional write: of two
runs at once exactly one commits. The shards and index.json are byte for byte a local run's.

With --executor ray the Ray tasks never touch the driver's copies: each reads its shard's files
from CLEAN_DIR itself (from S3, or a shared folder) and uploads its shard straight to SHARD_DIR;
the marker goes up before any task runs, index.json last, by the driver, with the same
conditional write.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tempfile
from pathlib import Path

from pipeline.core.errors import UsageError
from pipeline.formats import index as shard_index
from pipeline.storage import is_remote, open_folder
from pipeline.storage.transfer import MARKER, claim, download, publish, remove_staging, staging_dir

COMMIT = shard_index.INDEX_NAME


def run(cfg, show_progress: bool) -> dict:
    from pipeline.shard import stage

    if is_remote(cfg.input) and is_remote(cfg.output):
        src, dst = open_folder(str(cfg.input)).url, open_folder(str(cfg.output)).url
        if dst == src or dst.startswith(src + "/"):
            raise UsageError(f"the output folder {dst} is inside CLEAN_DIR {src}; choose another folder")
    input_id = open_folder(str(cfg.input)).url if is_remote(cfg.input) else str(Path(cfg.input).resolve())
    staged: list[Path] = []
    # where the Ray tasks read and write: the real places, never the driver's copies of them
    task_dirs = (_task_dir(cfg.input), _task_dir(cfg.output))
    try:
        local = cfg
        if is_remote(cfg.output):
            dest = open_folder(str(cfg.output))
            claim(dest, "pipe shard", COMMIT, cfg.overwrite, lambda marker: _differs(marker, cfg, input_id))
            staged.append(staging_dir("shard"))
            local = dataclasses.replace(local, output=staged[-1], overwrite=False)
        if is_remote(cfg.input):
            staged.append(_stage_clean_dir(str(cfg.input)))
            local = dataclasses.replace(local, input=staged[-1])
        if is_remote(cfg.output) and cfg.executor == "ray":  # before any task writes, so a rerun finds the prefix ours
            dest.write(MARKER, _marker(local, input_id).encode("utf-8"))
        summary = stage.run(local, show_progress, task_dirs=task_dirs)
        if is_remote(cfg.output):
            out = local.output
            (out / MARKER).write_text(_marker(local, input_id), encoding="utf-8")
            uploaded = ({e["name"] for e in json.loads((out / COMMIT).read_text(encoding="utf-8"))["shards"]}
                        if cfg.executor == "ray" else set())
            publish(out, dest, COMMIT, keep=lambda rel: bool(stage.SHARD_NAME.match(rel)) or rel == MARKER,
                    owned=lambda rel: bool(stage.SHARD_NAME.match(rel)), uploaded=uploaded)
            summary["output"] = dest.url
    finally:
        for path in staged:
            remove_staging(path)
    return summary


def _task_dir(arg) -> str:
    """A folder as a Ray task on any node reaches it: the s3:// URL, or the local path (which
    must then be a shared file system; the task says so when it is not)."""
    return open_folder(str(arg)).url if is_remote(arg) else str(Path(arg).resolve())


def _marker(local, input_id: str) -> str:
    """SHARD_DIR's marker, naming the real CLEAN_DIR rather than the driver's copy of it."""
    return json.dumps({**local.marker(), "input": input_id}, indent=2, sort_keys=True)


def _stage_clean_dir(url: str) -> Path:
    """manifest.parquet and data/ of an S3 CLEAN_DIR in a local folder named after its URL."""
    src = open_folder(url)
    if not src.exists("manifest.parquet"):
        raise UsageError(f"{src.url} has no manifest.parquet: run pipe clean first (or let it finish)")
    local = Path(tempfile.gettempdir()) / f"pipe-clean-dir-{hashlib.sha256(src.url.encode()).hexdigest()[:16]}"
    remove_staging(local)
    local.mkdir(parents=True)
    download(src, ["manifest.parquet", *(f"data/{e.rel}" for e in src.child("data").list())], local)
    return local


def _differs(marker: dict, cfg, input_id: str) -> str | None:
    if marker.get("input") != input_id:
        return f"was sharded from {marker.get('input')}, not {input_id}"
    want = {k: getattr(cfg, k) for k in cfg.OUTPUT_SETTINGS}
    if marker.get("settings") != want:
        return "was made with other settings"
    return None
