"""Shards in S3-compatible object storage, as a source for the streaming reader.

Imported only for an ``s3://`` SHARD_DIR (`train.data.sources.open_source`): a local run never
imports boto3. The storage itself is `pipeline.storage`'s S3 folder: its client is made lazily,
one per process, and made again after fork, so every dataloader worker gets its own (a boto3
client's connection pool must not cross a fork); the prefetch threads of one worker share it
(boto3 clients are thread-safe). Credentials and the endpoint come from the standard AWS
environment and config; no message here carries them (the folder's URL has none).

Reads are ranged GETs, merged up to 8 MiB (a round trip to object storage costs milliseconds
whatever the size: fewer, larger reads), 4 in flight per worker. The folder retries a failed
request itself (boto3's standard mode); what still fails with a storage error (StageFailed: a
refused connection, a 5xx, a timeout) is retried again by the reader with its own backoff, so
an object store that restarts mid-epoch costs a pause, not the run. A missing object, refused
credentials or a missing bucket (FileNotFoundError, UsageError) are not retried.
"""

from __future__ import annotations

from pipeline.core.errors import StageFailed
from train.data.ranges import MiB


class S3Source:
    cap = 8 * MiB
    ahead = 4

    def __init__(self, location: str):
        from pipeline.storage import open_folder

        self.folder = open_folder(location)
        self.base = self.folder.url.rstrip("/")

    def url(self, rel: str) -> str:
        return f"{self.base}/{rel}"

    def transient(self, exc: BaseException) -> bool:
        return isinstance(exc, StageFailed)

    def read_range(self, rel: str, start: int, length: int) -> bytes:
        return self.folder.read_range(rel, start, length)

    def close(self) -> None:
        """Nothing to close: the process's client is the storage module's, kept for the next epoch."""
