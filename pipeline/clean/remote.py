"""`pipe clean` with object storage on either side.

INPUT on S3: the listing replaces the walk (links and ``outside_root`` are local rules and have no
counterpart there), each object's head is sniffed as a file's is, and the workers read objects
through pipeline.storage (`process._open_input`), so nothing is copied to local disk first.

CLEAN_DIR on S3, local executor: the stage runs its own code into a local staging folder, then
`transfer.publish` uploads every file once, removes stale objects of an earlier run and writes
manifest.parquet last with a conditional write: of two runs at once exactly one commits.

CLEAN_DIR on S3, `--executor ray`: only the manifest goes through the driver's disk. The marker
is written first; each Ray task writes its part's outputs and then its results file straight to
the bucket under the same names as in a folder; the driver reads the part results from there,
decides, moves and deletes what the decisions change (`pipeline.clean.objects.ObjectCleanDir`),
and commits manifest.parquet last with the same conditional write. A rerun after a killed
driver finds the finished parts there.
"""

from __future__ import annotations

import dataclasses
import io
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pipeline.clean.discover import Candidate, _looks_binary, _metadata_folder, _pillow_format, hidden_folder_detail, labelled
from pipeline.core.errors import UsageError
from pipeline.formats.vocabulary import Kind, Reason
from pipeline.media.sniff import HEAD_BYTES, sniff
from pipeline.storage import Folder, is_remote, open_folder
from pipeline.storage.folder import check_rel
from pipeline.storage.transfer import MARKER, claim, parallel, publish, remove_staging, staging_dir

COMMIT = "manifest.parquet"
THREADS = 32  # heads read at once during discovery: each is one small ranged GET


def check_folders(input: object, output: object) -> None:
    """An S3 INPUT: the output may not lie under its prefix (pipe never writes into its input)."""
    if not (is_remote(input) and is_remote(output)):
        return
    src, dst = open_folder(str(input)), open_folder(str(output))
    if dst.url == src.url or dst.url.startswith(src.url + "/"):
        raise UsageError(f"the output folder {dst.url} is inside the input folder {src.url}; pipe never writes into its input")


def discover_remote(url: str, labels: dict[str, str] | None = None, exclude: set[str] | None = None) -> list[Candidate]:
    """Every object under the prefix as a Candidate, as `discover` makes them for files: hidden
    and tool folders are one row each, kinds come from the first bytes, sorted, labelled, keyed."""
    folder = open_folder(url)
    entries = folder.list()
    if not entries:
        raise UsageError(f"input folder not found: {folder.url} holds no objects")
    hidden: dict[str, int] = {}
    rels = []
    for e in entries:
        parts = e.rel.split("/")
        meta = next((i for i, p in enumerate(parts[:-1]) if _metadata_folder(p)), None)
        if meta is not None:
            name = "/".join(parts[: meta + 1])
            hidden[name] = hidden.get(name, 0) + 1
        elif not (exclude and e.rel in exclude):
            rels.append(e.rel)
    out = [Candidate(name, f"{folder.url}/{name}", Kind.OTHER, "directory", problem=Reason.UNSUPPORTED_FORMAT,
                     detail=hidden_folder_detail(n)) for name, n in hidden.items()]
    with ThreadPoolExecutor(THREADS) as pool:
        out += pool.map(lambda rel: _classify(folder, rel), rels)
    return labelled(out, labels)


def _classify(folder: Folder, rel: str) -> Candidate:
    url = f"{folder.url}/{rel}"
    try:
        check_rel(rel)
    except UsageError:  # legal in S3, yet no path a folder (or CLEAN_DIR's mirror of it) could hold
        return Candidate(rel, url, Kind.OTHER, "?", problem=Reason.UNREADABLE,
                         detail="an object key with an empty, '.' or '..' part is no file path")
    try:
        head = folder.read_range(rel, 0, HEAD_BYTES + 512)
    except FileNotFoundError:
        return Candidate(rel, url, Kind.OTHER, "?", problem=Reason.UNREADABLE, detail="FileNotFoundError: gone since it was listed")
    kind, fmt = sniff(head, rel.rsplit("/", 1)[-1])
    if kind == Kind.TEXT and _looks_binary(head):
        fmt = _pillow_format(io.BytesIO(folder.read(rel))) or fmt  # type: ignore[arg-type]  # Image.open takes a file too
        kind = Kind.IMAGE if fmt != "text?" else kind
    return Candidate(rel, url, kind, fmt)


def copy_input(input_url: str, source: str, dest: Path) -> None:
    """A quarantined object copied into CLEAN_DIR/quarantine/, streamed (it may be a huge file
    quarantined as too_large) through a temporary name (FileNotFoundError: gone since)."""
    import contextlib
    import os
    import shutil

    from pipeline.core.files import tmp_name

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(dest)
    try:
        with open_folder(input_url).open(source) as f, open(tmp, "wb") as out:
            shutil.copyfileobj(f, out, 1 << 20)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def run_to_object_storage(cfg, show_progress: bool) -> dict:
    """CLEAN_DIR on S3: claim it, run the stage into a staging folder, publish, commit last."""
    from pipeline.clean import stage

    url = str(cfg.output)
    stage.validate(cfg)
    dest = open_folder(url)
    claim(dest, "pipe clean", COMMIT, cfg.overwrite, lambda marker: _differs(marker, cfg))
    if cfg.executor == "ray":
        # Ray tasks run in other working directories, on other machines: a local INPUT as an absolute path
        local_input = cfg.input if is_remote(cfg.input) else Path(cfg.input).resolve()
        return _run_on_ray(dataclasses.replace(cfg, output=dest.url, input=local_input), dest, show_progress)
    staging = staging_dir("clean")
    try:
        local = dataclasses.replace(cfg, output=staging, overwrite=False)
        report = stage.run(local, show_progress)
        report["settings"]["output"] = dest.url
        (staging / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False, sort_keys=False) + "\n",
                                             encoding="utf-8")
        publish(staging, dest, COMMIT, keep=lambda rel: not rel.startswith(".pipe/") or rel == MARKER,
                owned=lambda rel: rel.startswith(("data/", "quarantine/")) or rel == "report.json")
    finally:
        remove_staging(staging)
    return report


def _run_on_ray(cfg, dest: Folder, show_progress: bool) -> dict:
    """--executor ray into object storage: the marker first (a rerun after a killed driver then
    finds the prefix pipe clean's and reuses its finished parts), then the stage in place."""
    from pipeline.clean import stage
    from pipeline.clean.objects import ObjectCleanDir

    if cfg.overwrite:  # as --overwrite on a folder: nothing of the earlier run is kept, reused or moved back
        owned = [e.rel for e in dest.list() if e.rel.startswith(("data/", "quarantine/", ".pipe/")) or e.rel == "report.json"]
        parallel(dest.delete, owned)
    dest.write(MARKER, json.dumps(stage.marker(cfg), indent=2, sort_keys=True).encode("utf-8"))
    staging = staging_dir("clean")
    try:
        return stage.run_in_parts(cfg, ObjectCleanDir(cfg, dest, staging), show_progress)
    finally:
        remove_staging(staging)


def _differs(marker: dict, cfg) -> str | None:
    """How a CLEAN_DIR begun by another run differs from this one (None: it does not)."""
    from pipeline.clean.stage import input_id

    if marker.get("input") != input_id(cfg):
        return f"was cleaned from {marker.get('input')}, not {input_id(cfg)}"
    if marker.get("settings") != cfg.fingerprint():
        return "was made with other settings"
    return None
