"""Where a stage reads and writes its folders: a local directory or object storage, behind one
interface (`Folder`), so clean, shard, check, report and train never ask which.

The storage a folder argument names is decided here, once: a URL's scheme is looked up in
`SCHEMES` (the only table of object stores pipe knows), anything without a scheme is a local
path. `location` reads a folder argument or config value; `open_folder` opens it. An object
store's client library is imported only when one of its folders is opened, so local runs never
need it.
"""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path
from typing import Any

from pipeline.core.errors import UsageError
from pipeline.storage.folder import Entry, Folder, TooLarge

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
        raise UsageError(f"{arg.split('?')[0][:200]}: pipe knows no storage for {scheme}:// (it reads and writes local "
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

