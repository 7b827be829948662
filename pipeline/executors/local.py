"""The local executor: a stage's parts on this machine.

Items of every part stream through one `OrderedPool` (worker processes, results in order, a
file that crashes or hangs its worker pinned on that file alone, small items batched); a part's
``finish`` runs here as its last item comes back, so parts can be small (what a killed run does
again) at no cost. Whole parts (`run_parts`) run in this process one after the other, a part's
last step that only waits on the disk (`Later`) overlapping the next part; where there are many
parts and more than one core, helper processes (one fewer than the workers) take parts too
while this process writes its own, so a 2-core machine writes two at a time. Which process runs
a part changes nothing in what it makes (a part is a pure function of its call).
"""

from __future__ import annotations

import contextlib
import functools
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from pipeline.core.cores import worker_count
from pipeline.core.errors import StageFailed
from pipeline.core.executor import OrderedPool
from pipeline.executors import Items, Later, OnPart

PART_ITEMS = 256  # items in one part here: what a killed run does again at most (a second or two of a pool's work)
# Whole parts: fewer than this many (as the calls' length hint says) are run here alone: a helper's start
# (importing the part's modules: ~0.4 s of CPU for pipe shard's) would cost more CPU than it saves time.
SHARED_PARTS = 16
HELPER_SERVER = (__name__,)  # what the helpers' fork server imports: little (the helpers import the rest)
HELPER_QUEUE = 2  # parts handed to each helper ahead: it never waits for this process to hand it the next


class LocalExecutor:
    name = "local"

    def __init__(self, address: str = "auto", workers: int = 0, keep_warm: float = 0.0):
        self.workers = workers  # (a pool on this machine ends with the command: nothing to keep warm)
        self._pool: OrderedPool | None = None
        self._pool_for: tuple | None = None

    def session(self, items: Items | None = None, part_fn: Callable | None = None,
                warm: bool = True) -> contextlib.AbstractContextManager[None]:
        """With ``items`` and ``warm``: the worker processes started now, so that their start-up
        overlaps the stage's listing and planning. With ``part_fn``, ``warm`` and more than one
        worker: the fork server `run_parts`'s helpers fork from, started now and light (this
        module: ~0.05 s of CPU beside the stage's loading, whatever the run's size); a helper
        imports the part's modules itself, and only where there are many parts."""
        return self._session(items if warm else None, part_fn if warm else None)

    @contextlib.contextmanager
    def _session(self, items: Items | None, part_fn: Callable | None) -> Iterator[None]:
        if items is not None:
            self._pool, self._pool_for = self._new_pool(items, worker_count(self.workers)).start(), items.pool_key()
        elif part_fn is not None and worker_count(self.workers) > 1:
            from pipeline.core.prestart import warm_up

            warm_up(HELPER_SERVER)
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
        """One part after another in this process, a `Later` part's last step on a thread while
        the next part works, reported once done; with many parts (`SHARED_PARTS`, from the
        calls' length hint) and more than one worker, helper processes take parts as well
        (`_Helpers`), each run whole there, reported as it ends. Interrupted, the parts already
        written are still finished and reported, so a rerun keeps them."""
        from concurrent.futures import ThreadPoolExecutor

        helpers = worker_count(self.workers) - 1
        shared = _Helpers(fn, helpers, on_done) if helpers > 0 and operator.length_hint(calls) >= SHARED_PARTS else None
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
                    if shared is not None and shared.take(i, call):
                        continue
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
                if shared is not None:
                    shared.wait()
            finally:
                if behind is not None:  # interrupted: the part already written still goes in place, reported
                    with contextlib.suppress(Exception):
                        settle()
                if shared is not None:
                    shared.close()

    def summary(self, **facts: Any) -> dict | None:
        """Nothing: parts are this machine's unit of resuming, not news."""
        return None


class _Helpers:
    """Helper processes that run whole parts beside this one (`run_parts`): each is given up to
    `HELPER_QUEUE` parts ahead, the rest this process runs itself; their parts are reported as
    they end (``on_done``, in this thread), and only once started: a helper forks from the fork
    server (`session` started it) and imports the part function's modules (~0.4 s of its own CPU
    for pipe shard) while this process works on its own parts; it is never handed a part before
    (which this process would then wait for at the end)."""

    def __init__(self, fn: Callable[..., Any], helpers: int, on_done: OnPart):
        self.pool = OrderedPool(functools.partial(_whole_part, fn), helpers, initializer=_import_all,
                                initargs=(_helper_modules(fn),), preload=HELPER_SERVER).start()
        self.room = helpers * HELPER_QUEUE
        self.on_done = on_done
        self.away: dict[Future, int] = {}

    def take(self, i: int, call: tuple) -> bool:
        """Report the helpers' finished parts; hand part ``i`` to them (True) if they are started
        and have room."""
        self._report(done_only=True)
        if len(self.away) >= self.room or not self.pool.ready():
            return False
        self.away[self.pool.submit(call)] = i
        return True

    def wait(self) -> None:
        """Every part handed out, finished and reported (the first failure raised)."""
        while self.away:
            self._report(done_only=False)

    def _report(self, done_only: bool) -> None:
        from concurrent.futures import FIRST_COMPLETED, wait

        done = [f for f in self.away if f.done()] if done_only else wait(self.away, return_when=FIRST_COMPLETED).done
        for fut in sorted(done, key=self.away.__getitem__):
            i = self.away.pop(fut)
            try:
                value = fut.result()
            except BrokenProcessPool:
                raise StageFailed("a helper process running parts ended abruptly (killed, or out of memory?); "
                                  "run the same command again to resume") from None
            self.on_done(i, value, None)

    def close(self) -> None:
        """Stop: the parts not started are dropped, those running end; the ones that finished are
        reported (a rerun keeps them), a failure among them aside."""
        for fut in self.away:
            fut.cancel()
        self.pool.close()
        for fut in sorted((f for f in self.away if f.done() and not f.cancelled()), key=self.away.__getitem__):
            with contextlib.suppress(BaseException):
                self.on_done(self.away[fut], fut.result(), None)
        self.away.clear()


def _helper_modules(fn: Callable) -> tuple[str, ...]:
    """What a helper imports as it starts: the part function's module, and the modules that
    module names in ``PART_PRELOAD`` (imported there only inside functions, needed by every part)."""
    import sys

    return (fn.__module__, *getattr(sys.modules.get(fn.__module__), "PART_PRELOAD", ()))


def _import_all(modules: tuple[str, ...]) -> None:
    """A helper's start: the part's modules imported before it says it is ready."""
    import importlib

    for name in modules:
        importlib.import_module(name)


def _whole_part(fn: Callable[..., Any], call: tuple) -> Any:
    """A whole part in a helper: the part function on it, its last step (`Later`) done there."""
    out = fn(*call)
    return out.done() if isinstance(out, Later) else out
