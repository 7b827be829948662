"""Where a stage reads and writes its folders: a local directory or an S3 prefix, behind one small
interface (`Folder`), so clean, shard, check and train need not care which.

`open_folder("s3://bucket/prefix")` gives an S3 folder; anything else is a local path, exactly as
before. boto3 is imported only when an s3:// folder is opened, so local runs never need it.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.storage.folder import Entry, Folder, TooLarge

__all__ = ["Entry", "Folder", "TooLarge", "is_remote", "open_folder"]

S3_SCHEME = "s3://"


def is_remote(arg: str | Path) -> bool:
    """Whether a folder argument names object storage (checked before anything is imported)."""
    return isinstance(arg, str) and arg.startswith(S3_SCHEME)


def open_folder(arg: str | Path) -> Folder:
    """The folder an argument names: ``s3://bucket/prefix`` -> S3, anything else -> local."""
    if is_remote(arg):
        from pipeline.storage.s3 import S3Folder

        return S3Folder.from_url(str(arg))
    from pipeline.storage.local import LocalFolder

    return LocalFolder(Path(arg))
