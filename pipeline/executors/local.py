"""The local executor: a stage's parts on this machine.

Items of every part stream through one `OrderedPool` (worker processes, results in order, a
file that crashes or hangs its worker pinned on that file alone, small items batched); a part's
``finish`` runs here as its last item comes back, so parts can be small (what a killed run does
again) at no cost. Whole parts (`run_parts`) run in this process one after the other, a part's
last step that only waits on the disk (`Later`) overlapping the next part.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from pipeline.core.cores import worker_count
from pipeline.core.executor import OrderedPool
from pipeline.executors import Items, Later, OnPart

PART_ITEMS = 256  # items in one part here: what a killed run does again at most (a second or two of a pool's work)


class LocalExecutor:
    name = "local"

    def __init__(self, address: str = "auto", workers: int = 0, keep_warm: float = 0.0):
        self.workers = workers  # (a pool on this machine ends with the command: nothing to keep warm)
        self._pool: OrderedPool | None = None
        self._pool_for: tuple | None = None

    def session(self, items: Items | None = None, part_fn: Callable | None = None,
                warm: bool = True) -> contextlib.AbstractContextManager[None]:
        """With ``items`` and ``warm``: the worker processes started now, so that their start-up
        overlaps the stage's listing and planning."""
        return self._session(items if warm else None)

    @contextlib.contextmanager
    def _session(self, items: Items | None) -> Iterator[None]:
        if items is not None:
            self._pool, self._pool_for = self._new_pool(items, worker_count(self.workers)).start(), items.pool_key()
        try:
            yield
        finally:
            pool, self._pool, self._pool_for = self._pool, None, None
            if pool is not None:
                pool.close()

    def ahead(self, items: Items, first: Sequence[Any]) -> None:
        """The session's pool starts on ``first`` (`OrderedPool.ahead`); `map_parts` takes their results."""
        if self._pool is not None and self._pool_for == items.pool_key():
            self._pool.ahead(first)

    def part_size(self, requested: int) -> int:
        return max(1, min(requested, PART_ITEMS))

    @staticmethod
    def _new_pool(items: Items, workers: int) -> OrderedPool:
        return OrderedPool(items.fn, workers, initializer=items.initializer, initargs=items.initargs, preload=items.preload)

    def map_parts(self, items: Items, parts: Sequence[tuple[Any, Sequence[Any]]], on_part: OnPart,
                  on_item: Callable[[Any], None] | None = None, progress: bool = True) -> None:
        todo = sum(len(its) for _, its in parts)
        pool = self._pool if self._pool is not None and self._pool_for == items.pool_key() else None
        if pool is None and todo:
            pool = self._new_pool(items, min(worker_count(self.workers), max(1, todo)))
        self._pool = None  # map closes the pool when it ends
        results: Iterator[Any] = iter(())
        if todo and pool is not None:
            results = pool.map((item for _, its in parts for item in its), on_crash=items.on_crash,
                               timeout=items.timeout, on_timeout=items.on_timeout, batch=items.batch,
                               batchable=items.batchable)
        try:
            for i, (meta, its) in enumerate(parts):
                if items.start is not None and its:
                    items.start(meta)
                got: list[Any] = []
                for _ in range(len(its)):
                    r: Any = next(results)
                    got.append(r)
                    if on_item is not None:
                        on_item(r)
                on_part(i, items.run_finish(meta, got), None)
        finally:
            if pool is not None:
                pool.close()

    def run_parts(self, fn: Callable[..., Any], calls: Iterable[tuple], on_done: OnPart) -> None:
        """One part after another; a `Later` part's last step runs on a thread while the next part
        works, and is reported once done. Interrupted, the part already written is still
        finished and reported, so a rerun keeps it."""
        from concurrent.futures import Future, ThreadPoolExecutor

        behind: tuple[int, Future, Later] | None = None

        def settle() -> None:
            nonlocal behind
            if behind is None:
                return
            i, finishing, later = behind
            behind = None
            finishing.result()
            on_done(i, later.value, None)

        with ThreadPoolExecutor(1, thread_name_prefix="pipe-part-finish") as finisher:
            try:
                for i, call in enumerate(calls):
                    out = fn(*call)
                    try:
                        settle()  # the previous part in place and reported before this one is handed over
                    except BaseException:
                        if isinstance(out, Later):
                            out.discard()
                        raise
                    if isinstance(out, Later):
                        behind = (i, finisher.submit(out.finish), out)
                    else:
                        on_done(i, out, None)
                settle()
            finally:
                if behind is not None:  # interrupted: the part already written still goes in place, reported
                    with contextlib.suppress(Exception):
                        settle()

    def summary(self, **facts: Any) -> dict | None:
        """Nothing: parts are this machine's unit of resuming, not news."""
        return None
