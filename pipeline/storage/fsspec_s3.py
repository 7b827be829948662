"""A Folder in S3-compatible object storage through fsspec (s3fs): the prototype that the choice
between fsspec and our own boto3 layer (`pipeline/storage/s3.py`) was measured with.

It is not in `pipeline.storage.SCHEMES` (see the package docstring for the numbers and the
decision); the measurement put it there for a run by patching the table. It keeps the contract
of `Folder` where s3fs allows: errors as pipe's two exceptions, one line, scrubbed (`s3.scrub`);
a client per process made again after fork; no listing cache (a stage lists what it just wrote).
What s3fs does not offer is said where it shows: a conditional create goes out as
``If-None-Match: *`` (s3fs's ``mode="create"``), and an answer of 409 (a conditional write of
the same key in flight) is not retried by s3fs, so it is retried here as `S3Folder` does.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pipeline.core.errors import StageFailed, UsageError
from pipeline.storage.folder import Entry, Folder, TooLarge, check_rel, sort_key
from pipeline.storage.s3 import CONFLICT_RETRIES, parse_url, scrub

_fs: dict[tuple[int, str], Any] = {}
_lock = threading.Lock()


def filesystem() -> Any:
    """This process's S3FileSystem (none shared across fork: its event loop thread is the parent's),
    made again when the AWS environment changes, as `s3.client` is."""
    env = "\0".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("AWS_"))
    pid = (os.getpid(), env)
    fs = _fs.get(pid)
    if fs is None:
        with _lock:
            fs = _fs.get(pid)
            if fs is None:
                try:
                    import s3fs  # type: ignore[import-not-found,import-untyped,unused-ignore]
                except ImportError:
                    raise UsageError("this folder needs s3fs: pip install s3fs") from None
                attempts = int(os.environ.get("AWS_MAX_ATTEMPTS", 6))
                fs = _fs[pid] = s3fs.S3FileSystem(
                    skip_instance_cache=True, use_listings_cache=False, max_concurrency=1,
                    config_kwargs={"retries": {"mode": "standard", "total_max_attempts": attempts},
                                   "response_checksum_validation": "when_required",
                                   "request_checksum_calculation": "when_required"})
    return fs


def _code(e: BaseException) -> str:
    cause = e.__cause__ or e
    response = getattr(cause, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return code if code and not code.isdigit() else status or code


class FsspecS3Folder(Folder):
    def __init__(self, bucket: str, prefix: str):
        self.bucket, self.prefix = bucket, prefix
        self.url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        self.local_path = None

    @classmethod
    def from_url(cls, url: str) -> FsspecS3Folder:
        return cls(*parse_url(url))

    def _path(self, rel: str) -> str:
        check_rel(rel)
        return f"{self.bucket}/{self.prefix}/{rel}" if self.prefix else f"{self.bucket}/{rel}"

    @contextlib.contextmanager
    def _errors(self, rel: str | None = None, missing_ok: bool = False) -> Iterator[None]:
        where = f"{self.url}/{rel}" if rel else self.url
        from botocore.exceptions import BotoCoreError, NoCredentialsError, PartialCredentialsError

        try:
            yield
        except (NoCredentialsError, PartialCredentialsError):
            raise UsageError(f"{where}: no AWS credentials found; set AWS_ACCESS_KEY_ID and "
                             "AWS_SECRET_ACCESS_KEY or AWS_PROFILE") from None
        except FileNotFoundError as e:
            if _code(e) == "NoSuchBucket":
                raise UsageError(f"{where}: the bucket {self.bucket} does not exist") from None
            raise FileNotFoundError(errno.ENOENT, "no such object", where) from None
        except PermissionError as e:
            raise UsageError(f"{where}: access refused ({_code(e) or 403}); check the AWS credentials and their "
                             "permissions") from None
        except (OSError, BotoCoreError) as e:
            raise StageFailed(f"{where}: {scrub(str(e))}") from None

    def list(self) -> list[Entry]:
        base = f"{self.bucket}/{self.prefix}/" if self.prefix else f"{self.bucket}/"
        with self._errors():
            try:
                found = filesystem().find(base, detail=True)
            except FileNotFoundError as e:
                if _code(e) == "NoSuchBucket":
                    raise
                found = {}
        out = []
        for path, info in found.items():
            rel = path[len(base):]
            if rel and not rel.endswith("/") and info.get("type") == "file":
                out.append(Entry(rel=rel, size=int(info["size"]), version=str(info.get("ETag", "")).strip('"'),
                                 mtime_ns=_ns(info.get("LastModified"))))
        out.sort(key=lambda e: sort_key(e.rel))
        return out

    def read(self, rel: str, max_bytes: int | None = None) -> bytes:
        path = self._path(rel)
        with self._errors(rel):
            if max_bytes is None:
                return filesystem().cat_file(path)
            with filesystem().open(path, "rb", block_size=0) as f:  # (its size from the HEAD s3fs makes on open)
                if f.size > max_bytes:
                    raise TooLarge(rel, f.size)
                return f.read()

    def read_range(self, rel: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        with self._errors(rel):
            try:
                return filesystem().cat_file(self._path(rel), start=start, end=start + length)
            except OSError as e:
                if _code(e) in ("InvalidRange", "416"):
                    return b""
                raise

    def read_heads(self, rels: Iterable[str], n: int) -> Iterator[bytes | OSError]:
        """s3fs's own concurrency: every ranged GET in one call of its event loop."""
        rels = list(rels)
        with self._errors():
            got = filesystem().cat_ranges([self._path(r) for r in rels], [0] * len(rels), [n] * len(rels),
                                          on_error="return")
        for g in got:
            if isinstance(g, bytes):
                yield g
            elif _code(g) in ("InvalidRange", "416") or "InvalidRange" in str(g):  # an empty object: s3fs says EINVAL
                yield b""
            else:
                yield g if isinstance(g, OSError) else OSError(str(g))

    def open(self, rel: str):
        path = self._path(rel)
        with self._errors(rel):
            f = filesystem().open(path, "rb")
        return _Stream(self, rel, f)

    def upload(self, rel: str, path: Path) -> None:
        with self._errors(rel):
            filesystem().put_file(str(path), self._path(rel))

    def write(self, rel: str, data: bytes, durable: bool = False) -> None:
        with self._errors(rel):
            filesystem().pipe_file(self._path(rel), data)

    def write_if_absent(self, rel: str, data: bytes) -> bool:
        for attempt in range(CONFLICT_RETRIES + 1):
            with self._errors(rel):
                try:
                    filesystem().pipe_file(self._path(rel), data, mode="create")
                    return True
                except FileExistsError:
                    return False
                except OSError as e:
                    code = _code(e)
                    if code in ("PreconditionFailed", "412"):
                        return False
                    if code not in ("ConditionalRequestConflict", "409") or attempt == CONFLICT_RETRIES:
                        raise
            time.sleep(0.1 * 2**attempt)
        return False

    def move(self, src: str, dest: str) -> None:
        with self._errors(src):
            filesystem().mv(self._path(src), self._path(dest))

    def exists(self, rel: str) -> bool:
        with self._errors(rel):
            return bool(filesystem().isfile(self._path(rel)))

    def delete(self, rel: str) -> None:
        with self._errors(rel):
            with contextlib.suppress(FileNotFoundError):
                filesystem().rm_file(self._path(rel))

    def child(self, rel: str) -> FsspecS3Folder:
        return FsspecS3Folder(self.bucket, f"{self.prefix}/{check_rel(rel)}" if self.prefix else check_rel(rel))


def _ns(when: Any) -> int:
    return int(when.timestamp()) * 1_000_000_000 if when is not None else 0


class _Stream:
    """An s3fs file as a Folder stream: ``stat()`` from the HEAD s3fs made when it opened it."""

    def __init__(self, folder: FsspecS3Folder, rel: str, f: Any):
        self._folder, self._rel, self._f = folder, rel, f

    def read(self, size: int = -1) -> bytes:
        with self._folder._errors(self._rel):
            return self._f.read(size)

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def close(self) -> None:
        self._f.close()

    def stat(self) -> SimpleNamespace:
        info = self._f.details
        return SimpleNamespace(st_size=int(info["size"]), st_mtime_ns=_ns(info.get("LastModified")), st_ctime_ns=0)

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
