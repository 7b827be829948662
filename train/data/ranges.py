"""Byte ranges in, bytes out: how the streaming reader turns the samples it needs into reads.

No torch and no storage client here. Three pieces, each small enough to test on its own:

* `plan_reads` (pure): the samples a worker needs, in order, each a byte range of a shard, are
  merged into few large reads. On object storage every request costs a round trip (milliseconds)
  whatever its size, so a read per sample would be latency-bound; adjacent samples of one shard
  are joined into reads of up to ``cap`` bytes (several MiB), in the order they are needed.
  A sample is never split, so a read exceeds ``cap`` only when one sample does.
* `read_with_retries`: one read, retried with exponential backoff and full jitter while the
  source says the failure is transient (a dropped connection, a 5xx, a timeout: an object store
  restarting), for a bounded time; then one `ShardReadError` naming the shard's URL.
* `prefetched`: the reads, fetched a few ahead on threads (storage calls release the GIL), handed
  back in order.

A source is anything with ``read_range(rel, start, length) -> bytes | memoryview``,
``transient(exc) -> bool``, ``url(rel) -> str`` and ``close()`` (`train/data/sources.py`).
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

MiB = 1 << 20


class Want(NamedTuple):
    """Bytes ``start..start+length-1`` of object ``rel`` that the reader needs, indivisible (a
    sample); ``tag`` is the caller's (which sample it is)."""

    rel: str
    start: int
    length: int
    tag: Any = None


@dataclass(frozen=True)
class Read:
    """One request: bytes ``start..start+length-1`` of ``rel``, exactly the ``wants`` back to back."""

    rel: str
    start: int
    length: int
    wants: tuple[Want, ...]


def plan_reads(wants: Iterable[Want], cap: int) -> Iterator[Read]:
    """The wants, in order, merged into reads: a want joins the read before it when it is in the
    same object, starts where that read ends and keeps the read within ``cap`` bytes.

    Lazy (a worker's piece of an epoch can be millions of samples). Every wanted byte is in
    exactly one read, once; reads come in the order of their wants; a read is longer than ``cap``
    only when it is a single want that is.
    """
    if cap < 1:
        raise ValueError(f"the read cap must be at least 1 byte, got {cap}")
    rel, start, end = "", 0, 0
    group: list[Want] = []
    for w in wants:
        if group and w.rel == rel and w.start == end and end - start + w.length <= cap:
            group.append(w)
            end += w.length
            continue
        if group:
            yield Read(rel, start, end - start, tuple(group))
        rel, start, end, group = w.rel, w.start, w.start + w.length, [w]
    if group:
        yield Read(rel, start, end - start, tuple(group))


class Source(Protocol):
    def read_range(self, rel: str, start: int, length: int) -> bytes | memoryview: ...
    def transient(self, exc: BaseException) -> bool: ...
    def url(self, rel: str) -> str: ...
    def close(self) -> None: ...


class SampleDecodeError(RuntimeError):
    """A sample in a shard could not be read or decoded; the message names the shard and key."""


class ShardReadError(SampleDecodeError):
    """A shard's bytes could not be read (after retries where the failure looked transient).
    The message names the shard's URL (never a credential) and the bytes."""


@dataclass(frozen=True)
class Retry:
    """Exponential backoff with full jitter: after failure k wait uniform(0, min(most, first x 2^k))
    seconds; at most ``attempts`` tries, and none begun once ``budget`` seconds have passed since
    the first. The defaults ride out an object store that restarts (seconds) and give up on one
    that is gone within about a minute."""

    attempts: int = 10
    first: float = 0.2
    most: float = 10.0
    budget: float = 60.0

    def delays(self, rng: random.Random) -> Iterator[float]:
        for k in range(self.attempts - 1):
            yield rng.uniform(0, min(self.most, self.first * 2**k))


DEFAULT_RETRY = Retry()


def read_with_retries(source: Source, read: Read, retry: Retry = DEFAULT_RETRY,
                      sleep: Callable[[float], None] = time.sleep, exact: bool = True) -> bytes | memoryview:
    """The bytes of ``read``, retried while ``source.transient`` says a failure may pass.

    A read that comes back short is the shard's fault, not the network's: `ShardReadError`
    at once ("shorter than index.json says"), as is a failure the source calls permanent.
    ``exact=False``: a short read is returned as it is (the object ends there)."""
    delays = retry.delays(random.Random())
    began, tries = time.monotonic(), 1
    while True:
        try:
            data = source.read_range(read.rel, read.start, read.length)
            break
        except Exception as e:  # noqa: BLE001 - classified by the source; anything else ends the read
            if not source.transient(e):
                raise ShardReadError(f"{source.url(read.rel)}: cannot read bytes {read.start}-{read.start + read.length}: "
                                     f"{_describe(e)}") from None
            wait = next(delays, None)
            if wait is None or time.monotonic() - began + wait > retry.budget:
                raise ShardReadError(f"{source.url(read.rel)}: cannot read bytes {read.start}-{read.start + read.length} "
                                     f"after {tries} tries in {time.monotonic() - began:.0f} s: {_describe(e)}") from None
            tries += 1
            sleep(wait)
    if exact and len(data) != read.length:
        raise ShardReadError(f"{source.url(read.rel)}: the file is shorter than index.json says "
                             f"(wanted bytes {read.start}-{read.start + read.length})")
    return data


def _describe(e: BaseException) -> str:
    """One line about a failure: the exception's own words, without a URL's query string."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text.split("?", 1)[0] if "://" in text else text


def prefetched(source: Source, reads: Iterable[Read], ahead: int, retry: Retry = DEFAULT_RETRY,
               exact: bool = True) -> Iterator[tuple[Read, bytes | memoryview]]:
    """(read, its bytes) in order, with up to ``ahead`` reads in flight on threads (0: each read
    made when it is asked for, in the caller's thread). Stopping early cancels what is queued.
    ``exact=False``: a read cut short by the object's end comes back short (`read_with_retries`)."""
    if ahead <= 0:
        for r in reads:
            yield r, read_with_retries(source, r, retry, exact=exact)
        return
    pending: deque[tuple[Read, Future]] = deque()
    it = iter(reads)
    pool = ThreadPoolExecutor(max_workers=ahead, thread_name_prefix="pipe-read")
    try:
        for r in it:
            pending.append((r, pool.submit(read_with_retries, source, r, retry, exact=exact)))
            if len(pending) >= ahead:
                break
        while pending:
            r, fut = pending.popleft()
            data = fut.result()
            nxt = next(it, None)
            if nxt is not None:
                pending.append((nxt, pool.submit(read_with_retries, source, nxt, retry, exact=exact)))
            yield r, data
    finally:
        # not waiting: a read still retrying must not hold up a worker that is shutting down
        pool.shutdown(wait=False, cancel_futures=True)
