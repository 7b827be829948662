"""Where a stage reads and writes its folders: a local directory or object storage, behind one
interface (`Folder`), so clean, shard, check, report and train never ask which.

The storage a folder argument names is decided here, once: a URL's scheme is looked up in
`SCHEMES` (the only table of object stores pipe knows), anything without a scheme is a local
path. `location` reads a folder argument or config value; `open_folder` opens it. An object
store's client library is imported only when one of its folders is opened, so local runs never
need it.

s3:// stays on our own boto3 layer (`s3.py`), not fsspec/s3fs: measured 2026-12-02 on 2 cores shared
with other jobs (load 3.6-4.5), both behind this interface (`fsspec_s3.py` is the fsspec Folder,
patched into `SCHEMES` for the runs), against one loopback `rclone serve s3`:

* the same behaviour: the 81 object-storage tests (tests/pipeline/storage, tests/train/data/test_s3.py,
  tests/pipeline/executors/test_ray.py) pass on both, wall 112.5 s boto3 vs 139.6 s fsspec, once
  the prototype learnt what s3fs hides: an empty object's ranged read comes back as a bare
  OSError(EINVAL) "InvalidRange", a missing bucket as FileNotFoundError (the code only in
  ``__cause__``), a conditional write in flight (409) is not retried, AWS_MAX_ATTEMPTS is not read;
* slower where pipe train lives: `bench/stream.py` (1500 images, best of 3, two rounds each,
  alternating), S3 bytes only 11,037 / 9,258 samples/s boto3 vs 5,565 / 6,385 fsspec (0.50-0.69x);
  decoded batches S3/local 0.95 / 1.08 boto3 vs 0.63 / 0.87 fsspec; `bench/storage.py` (best of
  3): 8 MiB ranges 4 in flight 676 vs 468 MB/s (0.69x), 1 in flight 0.89x; small writes, reads,
  heads, listing and the commit within 0.97-1.24x; a fresh process's import + first listing 0.37
  vs 0.59 s (every dataloader worker and Ray worker pays it);
* and it cannot be installed beside boto3: s3fs 2026.9.0 needs aiobotocore 3.10, which pins
  botocore < 1.43.118, while boto3 1.44 needs botocore 1.44 (pip would downgrade botocore under
  boto3; the measurement ran s3fs from a separate ``pip install --target``).

What fsspec would give for free (gcs, azure, http) is a Folder class and a line in `SCHEMES` here,
`fsspec_s3.py` being the template, without moving s3:// off boto3.
"""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path
from typing import Any

from pipeline.core.errors import UsageError
from pipeline.storage.folder import Entry, Folder, TooLarge
from pipeline.storage.secrets import scrub_url

__all__ = ["EXAMPLE_URL", "Entry", "Folder", "Location", "SCHEMES", "TooLarge", "local_path", "location", "open_folder"]

# scheme -> "module:class" of its Folder: the one table of the object stores pipe reads and writes
SCHEMES: dict[str, str] = {
    "s3": "pipeline.storage.s3:S3Folder",  # S3 and S3-compatible stores (boto3: the s3 extra)
}
EXAMPLE_URL = "s3://bucket/prefix"  # what help texts show as a folder in object storage
FOLDER_HELP = f"a folder or {EXAMPLE_URL}"

Location = Path | str
"""A folder argument as a config holds it: a local Path, or a URL (a str: a Path would fold its "//")."""

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def _scheme(arg: object) -> str | None:
    m = _URL.match(arg) if isinstance(arg, str) else None
    return m.group(1).lower() if m else None


def _folder_class(scheme: str, arg: str) -> Any:
    target = SCHEMES.get(scheme)
    if target is None:
        known = ", ".join(f"{s}://" for s in SCHEMES)
        raise UsageError(f"{scrub_url(arg)[:200]}: pipe knows no storage for {scheme}:// (it reads and writes local "
                         f"folders and {known})")
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def location(value: str | os.PathLike) -> Location:
    """A folder argument or config value as a stage's config holds it: a URL of a known scheme
    stays the text it is (an unknown scheme is a UsageError, one line), anything else is a Path."""
    if isinstance(value, Path):
        return value
    value = os.fspath(value)
    scheme = _scheme(value)
    if scheme is None:
        return Path(value)
    _folder_class(scheme, value)
    return value


def local_path(value: Location | Folder) -> Path | None:
    """The local directory a folder argument names, None for object storage."""
    if isinstance(value, Folder):
        return value.local_path
    return None if _scheme(value) else Path(value)


def open_folder(arg: Location | os.PathLike | Folder) -> Folder:
    """The folder an argument names: a URL opens its scheme's Folder (`SCHEMES`), anything else
    is a local folder; a Folder is itself."""
    if isinstance(arg, Folder):
        return arg
    arg = arg if isinstance(arg, Path) else os.fspath(arg)
    scheme = _scheme(arg)
    if scheme is not None:
        return _folder_class(scheme, str(arg)).from_url(str(arg))
    from pipeline.storage.local import LocalFolder

    return LocalFolder(Path(arg))

