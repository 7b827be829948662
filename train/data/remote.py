"""Shards in a folder that is not on this machine (object storage), as a source for the streaming reader.

Imported only for such a folder (`train.data.sources.open_source`): a local run never imports
an object store's client. The storage itself is `pipeline.storage`'s Folder: its client is made
lazily, one per process, and made again after fork, so every dataloader worker gets its own (a
client's connection pool must not cross a fork); the prefetch threads of one worker share it.
Credentials and the endpoint come from the storage's standard environment and config; no
message here carries them (the folder's URL has none).

Reads are ranged reads, merged up to 8 MiB (a round trip to object storage costs milliseconds
whatever the size: fewer, larger reads), 4 in flight per worker. The folder retries a failed
request itself; what still fails with a storage error (StageFailed: a refused connection, a
5xx, a timeout) is retried again by the reader with its own backoff, so an object store that
restarts mid-epoch costs a pause, not the run. A missing object, refused credentials or a
missing bucket (FileNotFoundError, UsageError) are not retried.
"""

from __future__ import annotations

from pipeline.core.errors import StageFailed
from pipeline.storage import Folder
from train.data.ranges import MiB


class FolderSource:
    cap = 8 * MiB
    ahead = 4

    def __init__(self, folder: Folder):
        self.folder = folder
        self.base = folder.url.rstrip("/")

    def url(self, rel: str) -> str:
        return f"{self.base}/{rel}"

    def transient(self, exc: BaseException) -> bool:
        return isinstance(exc, StageFailed)

    def read_range(self, rel: str, start: int, length: int) -> bytes:
        return self.folder.read_range(rel, start, length)

    def close(self) -> None:
        """Nothing to close: the process's client is the storage module's, kept for the next epoch."""
