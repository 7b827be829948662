"""A Folder in S3-compatible object storage, through boto3.

Why boto3: it is AWS's own client, the best kept of the three candidates, reads the standard AWS
environment and config (``AWS_ENDPOINT_URL``, profiles, SSO, instance roles) exactly as the
operator's other tools do, and offers conditional writes (``IfNoneMatch="*"``) that a run's commit
needs. s3fs/fsspec adds an async layer and a file-system emulation we do not use; obstore is
fast but young, and its configuration differs from the AWS conventions users already have.

One client per process, made on first use and made again in a forked child (a boto3 client's
connection pool must not be shared across fork), with standard retries and checksum validation
only "when_required": recent boto3 otherwise rejects ranged reads from some S3-compatible servers.

Errors: missing or refused credentials and a missing bucket are the operator's to fix (UsageError,
exit 2); any other storage failure that outlives the retries stops the stage (StageFailed, exit 1).
Both are one line naming the folder's URL; no message carries a secret (see `scrub`).
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import io
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pipeline.core.errors import StageFailed, UsageError
from pipeline.storage.folder import Entry, Folder, TooLarge, check_rel, sort_key
from pipeline.storage.secrets import scrub, userinfo

# boto3's standard retry mode: exponential backoff with jitter, ~30 s in all for 6 attempts;
# AWS_MAX_ATTEMPTS, the standard variable, sets another number
MAX_ATTEMPTS = 6
CONFLICT_RETRIES = 5  # a conditional write racing another one in flight (HTTP 409) is tried again
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,254}$")
_NOT_FOUND = {"NoSuchKey", "NotFound", "404"}
_PRECONDITION = {"PreconditionFailed", "412"}
_CONFLICT = {"ConditionalRequestConflict", "409"}
_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "403"}

_clients: dict[tuple[int, str], Any] = {}
_lock = threading.Lock()


def _forget_clients() -> None:
    """In a forked child: the parent's clients (and a lock another thread may have held) are not ours."""
    global _lock
    _clients.clear()
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_clients)


def parse_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix/`` -> ("bucket", "some/prefix"). Credentials, a query or a
    fragment in the URL are refused without echoing them: secrets belong in the environment."""
    rest = url[len("s3://"):]
    bucket, _, prefix = rest.partition("/")
    if "@" in bucket or ":" in bucket:
        raise UsageError("an s3:// URL must not carry credentials or a port: set AWS_ENDPOINT_URL and the "
                         "credentials in the environment or an AWS profile")
    if "?" in rest or "#" in rest:
        raise UsageError(f"s3://{bucket}/...: an s3:// URL takes no query or fragment")
    if not _BUCKET.match(bucket):
        raise UsageError(f"{url!r} names no valid bucket: write s3://BUCKET/PREFIX")
    prefix = prefix.strip("/")
    if prefix:
        try:
            check_rel(prefix)
        except UsageError:
            raise UsageError(f"s3://{bucket}/{prefix}: the prefix has an empty, '.' or '..' part") from None
    return bucket, prefix


def client() -> Any:
    """This process's S3 client, made on first use (and again after fork or a change of the
    AWS environment, which tests and long-lived drivers may make)."""
    env = "\0".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("AWS_"))
    key = (os.getpid(), hashlib.sha256(env.encode("utf-8", "surrogateescape")).hexdigest())
    c = _clients.get(key)
    if c is None:
        with _lock:
            c = _clients.get(key)
            if c is None:
                c = _clients[key] = _make_client()
    return c


def _make_client() -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise UsageError("s3:// folders need boto3: pip install 'pipe-ml[s3]'") from None
    config = Config(
        retries={"mode": "standard", "total_max_attempts": _max_attempts()},
        response_checksum_validation="when_required",
        request_checksum_calculation="when_required",
        max_pool_connections=32,
    )
    from botocore.exceptions import BotoCoreError

    _check_endpoint()
    try:
        return boto3.session.Session().client("s3", config=config)
    except BotoCoreError as e:  # no region, a malformed endpoint, an unknown profile
        raise UsageError(f"cannot set up the S3 client: {scrub(str(e))}") from None


def _check_endpoint() -> None:
    """An endpoint whose user:password holds a "/" is no URL botocore takes (an AWS secret often
    holds one): say so in one line, without the secret, before botocore says it with it."""
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        if "/" in userinfo(os.environ.get(name, "")):
            raise UsageError(f"{name} is no valid URL: the user:password before its host holds a '/' (not shown here); "
                             "leave credentials out of it (S3 signs with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), "
                             "or write the '/' as %2F")


def _max_attempts() -> int:
    try:
        return max(1, int(os.environ.get("AWS_MAX_ATTEMPTS", MAX_ATTEMPTS)))
    except ValueError:
        raise UsageError("AWS_MAX_ATTEMPTS must be a whole number") from None


def _code(e: Exception) -> str:
    response = getattr(e, "response", None) or {}
    err = response.get("Error", {})
    code = str(err.get("Code", ""))
    status = str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return code if code and not code.isdigit() else status or code


SCHEME = "s3://"
HEAD_THREADS = 32  # first bytes of objects read at once (discovery): each is one small ranged GET


class S3Folder(Folder):
    def __init__(self, bucket: str, prefix: str):
        self.bucket, self.prefix = bucket, prefix
        self.url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        self.local_path = None

    @classmethod
    def from_url(cls, url: str) -> S3Folder:
        return cls(*parse_url(url))

    def _key(self, rel: str) -> str:
        check_rel(rel)
        return f"{self.prefix}/{rel}" if self.prefix else rel

    @contextlib.contextmanager
    def _errors(self, rel: str | None = None) -> Iterator[None]:
        """Storage failures as the two exceptions of pipe's error model, one line naming the URL."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

        where = f"{self.url}/{rel}" if rel else self.url
        try:
            yield
        except (NoCredentialsError, PartialCredentialsError):
            raise UsageError(f"{where}: no AWS credentials found; set AWS_ACCESS_KEY_ID and "
                             f"AWS_SECRET_ACCESS_KEY or AWS_PROFILE") from None
        except ClientError as e:
            code = _code(e)
            if code == "NoSuchBucket":
                raise UsageError(f"{where}: the bucket {self.bucket} does not exist") from None
            if code in _DENIED:
                raise UsageError(f"{where}: access refused ({code}); check the AWS credentials and their permissions") from None
            raise StageFailed(f"{where}: {scrub(str(e))}") from None
        except BotoCoreError as e:
            raise StageFailed(f"{where}: {scrub(str(e))}") from None

    def list(self) -> builtins.list[Entry]:
        """Every object but those whose key ends in "/" (no file path can be such a name)."""
        return [e for e in self.list_all() if not e.rel.endswith("/")]

    def list_all(self) -> builtins.list[Entry]:
        """Every object, a key ending in "/" included when it holds bytes: the "folder/" markers
        consoles and tools create hold none and are no file, but one with content is an input
        that must have its row (rows == files)."""
        base = f"{self.prefix}/" if self.prefix else ""
        found = []
        with self._errors():
            pages = client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base)
            for page in pages:
                for obj in page.get("Contents", ()):
                    rel, size = obj["Key"][len(base):], int(obj["Size"])
                    if rel and (size or not rel.endswith("/")):
                        found.append(Entry(rel=rel, size=size, version=str(obj.get("ETag", "")).strip('"'),
                                           mtime_ns=_ns(obj.get("LastModified"))))
        found.sort(key=lambda e: sort_key(e.rel))
        return found

    def read(self, rel: str, max_bytes: int | None = None) -> bytes:
        """One GET; with ``max_bytes``, a ranged GET of one byte more than allowed, so a huge
        object is refused after reading at most ``max_bytes + 1`` bytes of it."""
        if max_bytes is None:
            return self._get(rel, {})
        try:
            data, total = self._get_sized(rel, f"bytes=0-{max_bytes}")
        except _EmptyRange:
            return b""
        if total > max_bytes:
            raise TooLarge(rel, total)
        return data

    def read_range(self, rel: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        try:
            return self._get_sized(rel, f"bytes={start}-{start + length - 1}")[0]
        except _EmptyRange:
            return b""

    def _get(self, rel: str, extra: dict) -> bytes:
        from botocore.exceptions import ClientError

        key = self._key(rel)
        with self._errors(rel):
            try:
                resp = client().get_object(Bucket=self.bucket, Key=key, **extra)
            except ClientError as e:
                if _code(e) in _NOT_FOUND:
                    raise FileNotFoundError(2, "no such object", f"{self.url}/{rel}") from None
                raise
            return resp["Body"].read()

    def _get_sized(self, rel: str, byte_range: str) -> tuple[bytes, int]:
        """A ranged GET: the bytes and the object's whole size. A range starting past the end is
        refused by S3 (416): _EmptyRange."""
        from botocore.exceptions import ClientError

        key = self._key(rel)
        with self._errors(rel):
            try:
                resp = client().get_object(Bucket=self.bucket, Key=key, Range=byte_range)
            except ClientError as e:
                code = _code(e)
                if code in _NOT_FOUND:
                    raise FileNotFoundError(2, "no such object", f"{self.url}/{rel}") from None
                if code in ("InvalidRange", "416"):
                    raise _EmptyRange from None
                raise
            content_range = resp.get("ContentRange") or ""
            total = int(content_range.rpartition("/")[2]) if "/" in content_range else int(resp.get("ContentLength", 0))
            start, _, end = byte_range[len("bytes="):].partition("-")
            if not content_range and total > int(end) + 1:  # a server that ignored Range: do not read it all
                resp["Body"].close()
                return b"", total
            data = resp["Body"].read()
            return (data[int(start): int(end) + 1] if not content_range else data), total

    def open(self, rel: str) -> ObjectStream:
        """One GET whose body is read as the caller asks (in chunks for hashing)."""
        from botocore.exceptions import ClientError

        key = self._key(rel)
        with self._errors(rel):
            try:
                resp = client().get_object(Bucket=self.bucket, Key=key)
            except ClientError as e:
                if _code(e) in _NOT_FOUND:
                    raise FileNotFoundError(2, "no such object", f"{self.url}/{rel}") from None
                raise
        return ObjectStream(self, rel, resp)

    def upload(self, rel: str, path: Path) -> None:
        """boto3's managed upload: one PUT for a small file, a multipart upload (completed as
        one object, visible only when whole) for a large one, such as a 1 GiB shard."""
        key = self._key(rel)
        with self._errors(rel):
            client().upload_file(str(path), self.bucket, key)

    def write(self, rel: str, data: bytes, durable: bool = False) -> None:
        key = self._key(rel)
        with self._errors(rel):
            client().put_object(Bucket=self.bucket, Key=key, Body=data)

    def write_if_absent(self, rel: str, data: bytes) -> bool:
        """PutObject with ``If-None-Match: *``: S3 creates the object only if none exists (412
        otherwise). A 409 means another conditional write of it is in flight: wait and ask again;
        the answer is then 412 (it won) or success (it failed)."""
        from botocore.exceptions import ClientError

        key = self._key(rel)
        for attempt in range(CONFLICT_RETRIES + 1):
            with self._errors(rel):
                try:
                    client().put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*")
                    return True
                except ClientError as e:
                    code = _code(e)
                    if code in _PRECONDITION:
                        return False
                    if code not in _CONFLICT or attempt == CONFLICT_RETRIES:
                        raise
            time.sleep(0.1 * 2**attempt)
        return False

    def move(self, src: str, dest: str) -> None:
        """CopyObject then DeleteObject (S3 has no rename); objects over 5 GiB are copied in parts
        by boto3's managed copy."""
        from botocore.exceptions import ClientError

        with self._errors(src):
            try:
                client().copy({"Bucket": self.bucket, "Key": self._key(src)}, self.bucket, self._key(dest))
            except ClientError as e:
                if _code(e) in _NOT_FOUND:
                    raise FileNotFoundError(2, "no such object", f"{self.url}/{src}") from None
                raise
            client().delete_object(Bucket=self.bucket, Key=self._key(src))

    def exists(self, rel: str) -> bool:
        from botocore.exceptions import ClientError

        key = self._key(rel)
        with self._errors(rel):
            try:
                client().head_object(Bucket=self.bucket, Key=key)
            except ClientError as e:
                if _code(e) in _NOT_FOUND:
                    return False
                raise
        return True

    def delete(self, rel: str) -> None:
        key = self._key(rel)
        with self._errors(rel):
            client().delete_object(Bucket=self.bucket, Key=key)

    def child(self, rel: str) -> S3Folder:
        return S3Folder(self.bucket, self._key(rel))

    def _first_keys(self, n: int, after: str = "") -> tuple[builtins.list[str], bool]:
        """At most ``n`` keys under the prefix (after ``after``), relative to it, and whether there
        are more: one request, however many there are."""
        base = f"{self.prefix}/" if self.prefix else ""
        extra = {"StartAfter": base + after} if after else {}
        with self._errors():
            page = client().list_objects_v2(Bucket=self.bucket, Prefix=base, MaxKeys=n, **extra)
        return [obj["Key"][len(base):] for obj in page.get("Contents", ())], bool(page.get("IsTruncated"))

    def state(self) -> str:
        """Whether the prefix holds anything (one small listing)."""
        return "folder" if self._first_keys(1)[0] else "absent"

    def occupied(self) -> bool:
        """Anything besides pipe's own lock and lease claims (small listings, not the whole
        prefix's: past the claims, which are few, the first other key answers)."""
        from pipeline.storage.lease import pipe_own

        after = ""
        while True:
            keys, more = self._first_keys(8, after)
            if any(not pipe_own(rel) for rel in keys):
                return True
            if not more or not keys:
                return False
            after = keys[-1]

    def read_heads(self, rels: Iterable[str], n: int) -> Iterator[bytes | OSError]:
        """Many small ranged GETs at once, answered in order: each is a round trip."""
        from concurrent.futures import ThreadPoolExecutor

        def head(rel: str) -> bytes | OSError:
            try:
                return self.read_range(rel, 0, n)
            except OSError as e:
                return e

        with ThreadPoolExecutor(HEAD_THREADS) as pool:
            yield from pool.map(head, rels)


def _ns(when: Any) -> int:
    """An object's Last-Modified (a datetime from boto3) in ns since the epoch; 0 when absent."""
    return int(when.timestamp()) * 1_000_000_000 if when is not None else 0


class ObjectStream(io.RawIOBase):
    """An object's body as a binary stream; ``stat()`` gives its size and its Last-Modified as
    the modification time (what a re-run compares with the listing's; no ctime: 0). A failure
    while reading is a storage failure (StageFailed)."""

    def __init__(self, folder: S3Folder, rel: str, resp: dict):
        super().__init__()
        self._folder, self._rel, self._body = folder, rel, resp["Body"]
        self._size = int(resp.get("ContentLength", 0))
        self._mtime_ns = _ns(resp.get("LastModified"))

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        with self._folder._errors(self._rel):
            return self._body.read(None if size is None or size < 0 else size)

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._body.close()
        super().close()

    def stat(self) -> SimpleNamespace:
        return SimpleNamespace(st_size=self._size, st_mtime_ns=self._mtime_ns, st_ctime_ns=0)


class _EmptyRange(Exception):
    """A ranged read starting at or past the end of the object."""
