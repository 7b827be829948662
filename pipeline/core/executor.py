"""One small executor: map a pure per-item function over items in worker processes and yield
the results in input order, with a bounded number of items in flight.

Ordered results make determinism and resume free. Workers are separate processes, so a decoder
that crashes (a segfault in a C library on a hostile file) takes down a worker, not the run:
the items in flight are retried one by one in a fresh pool, and the one that crashes again is
handed to ``on_crash``. A file that keeps its worker busy longer than ``timeout`` seconds (a
fuzzer-made "oom-" or "timeout-" file can hold a decoder for minutes) has its worker killed and
is handed to ``on_timeout``; the other items in flight are simply run again.

Workers are forked from a fork server (Linux) when the caller names the modules they need
(``preload``): the server imports them once, early (`prestart.warm_up`), and each worker then starts in
milliseconds instead of a fresh interpreter importing numpy and the decoders (~0.3 s a worker,
paid again by every pool a crash or a timeout replaces). Without ``preload`` (or off Linux)
workers are spawned. Either way a worker dies with its caller: the kernel kills it when its
parent dies (PR_SET_PDEATHSIG), and the fork server, whose children the workers are, is tied
to the caller the same way (`pipeline.core.lifeline`, the first module it imports).
"""

from __future__ import annotations

import atexit
import itertools
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Generic, TypeVar

# starting the fork server: a module of its own, light enough for `pipe clean` to run before anything else
from pipeline.core.prestart import server_context, single_threaded_workers

T = TypeVar("T")
R = TypeVar("R")


def _nothing(fn=None) -> None:
    """A no-op call; given the pool's function (pickled by name), the worker imports its module
    to receive it, so a worker that ran it is ready for real items."""
    return None


def _start_worker(parent: int, initializer, initargs) -> None:
    """Runs first in every worker process. ``parent`` is the pid of the process that started
    it (the caller, or the fork server) as the caller saw it: a parent killed while this worker
    was still starting is already gone here, and ``os.getppid()`` would name the reaper that
    adopted us, which never dies (the worker outlived its caller)."""
    _kill_me_with_parent()
    if os.getppid() != parent:  # died before the kernel could be asked to kill us with it
        os._exit(1)
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True, name="parent-watch").start()
    if initializer is not None:
        initializer(*initargs)
    # A worker has sent all its results and closed its files before it exits; tearing down its
    # interpreter (numpy, Pillow, ...) would only keep the caller waiting ~0.2 s at shutdown.
    atexit.register(os._exit, 0)


def _kill_me_with_parent() -> None:
    """Linux: have the kernel SIGKILL this worker when the process that started it dies
    (PR_SET_PDEATHSIG), whatever the worker is doing. `_exit_with_parent` is the portable
    backstop. (Pools are started from the caller's main thread, whose end is the process's.)"""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _exit_with_parent(parent: int, every: float = 0.5) -> None:
    """End this worker once its parent is gone. A SIGKILLed (or OOM-killed) caller never tells
    its workers, and they would wait for work forever: each holds the write end of its own task
    queue's pipe (multiprocessing passes both ends), so the read never sees end-of-file."""
    while True:
        time.sleep(every)
        if os.getppid() != parent:  # re-parented: the caller died
            os._exit(1)


START_WAIT = 60.0  # seconds a pool may take to start before items are timed all the same


def stop_server(wait: float = 2.0) -> None:
    """Ask a fork server this process started to exit once its workers have, and reap it, so
    that its CPU time and its workers' count as this process's children's (`time pipe clean`).
    Never blocks longer than ``wait`` seconds: a server still held open is left to die with us."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    pid, alive = getattr(server, "_forkserver_pid", None), getattr(server, "_forkserver_alive_fd", None)
    if not isinstance(pid, int) or not isinstance(alive, int) or server is None:
        return
    os.close(alive)  # the server exits when no process holds this pipe open any more
    server._forkserver_alive_fd = None
    end = time.monotonic() + wait
    while time.monotonic() < end:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
        except ChildProcessError:
            break
        time.sleep(0.005)
    server._forkserver_pid = server._forkserver_address = None  # a later pool starts a new one


def _server_pid() -> int | None:
    """The running fork server's pid, or None (not started; or a Python that keeps it elsewhere)."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    return pid if isinstance(pid, int) else None


class OrderedPool(Generic[T, R]):
    def __init__(self, fn: Callable[[T], R], workers: int, initializer=None, initargs=(),
                 preload: Sequence[str] = ()):
        """``preload``: modules every worker imports (dotted names); given, workers fork from a
        fork server that imported them once (see the module's docstring)."""
        self.fn, self.workers = fn, max(1, workers)
        self.initializer, self.initargs = initializer, initargs
        self.preload = tuple(preload)
        self._pool: ProcessPoolExecutor | None = None
        self._starting: list[Future] = []  # start's no-op calls, done once a worker runs
        self._launcher: threading.Thread | None = None  # submits those calls (see `start`)
        self._from_server = False  # whether the last pool made forks its workers from the fork server
        self._ahead: tuple[list[T], threading.Thread, list[Future]] | None = None  # `ahead`'s items, submitter, futures

    def _new_pool(self, workers: int) -> ProcessPoolExecutor:
        single_threaded_workers()
        ctx = server_context(self.preload)
        if ctx is not None:
            from multiprocessing import forkserver

            forkserver.ensure_running()
            server = _server_pid()
            if server is not None:  # the workers' parent is the server, which dies with us
                self._from_server = True
                return ProcessPoolExecutor(workers, mp_context=ctx, initializer=_start_worker,
                                           initargs=(server, self.initializer, self.initargs))
        # spawn, not fork: the parent may hold threads (progress bar, pyarrow) that fork would copy mid-state
        self._from_server = False
        return ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"),
                                   initializer=_start_worker, initargs=(os.getpid(), self.initializer, self.initargs))

    def start(self) -> OrderedPool:
        """Spawn the workers now, so that their start-up (a fresh interpreter importing the
        decoders) overlaps with what the caller does before `map` (discovery, resume).

        Forked from a fork server, a worker's launch waits until the server has imported the
        preloaded modules (it answers with the new pid only then): a thread launches them, so
        the caller goes on with its discovery meanwhile. Spawned workers are launched here, by
        the caller's thread: a worker is killed when the thread that started it ends."""
        if self._pool is None:
            pool = self._pool = self._new_pool(self.workers)
            if self._from_server:
                self._launcher = threading.Thread(target=self._launch, args=(pool,), daemon=True, name="pool-launch")
                self._launcher.start()
            else:
                self._launch(pool)
        return self

    def _launch(self, pool: ProcessPoolExecutor) -> None:
        try:
            self._starting = [pool.submit(_nothing, self.fn) for _ in range(self.workers)]
        except (BrokenProcessPool, RuntimeError):
            pass  # a pool that broke while it started: map's first submission finds out and recovers

    def ahead(self, items: Sequence[T]) -> None:
        """Start on ``items`` now, each alone, before `map` is called: the caller found them first
        and is still listing the rest (on `pipe clean`'s start-up, ~0.1-0.2 s of the caller's CPU
        that the first files no longer wait for). `map` takes their results while its first
        items are these, in order; at the first that is not, the workers are killed (dropping
        the work) and a new pool does the rest, the items already taken again: a caller that may
        be wrong must tolerate what the dropped work left (pipe clean sweeps stray outputs).

        The submissions run on a thread of their own: they wait for the launcher (`start`) to
        have the workers, which takes until the fork server has imported what they need."""
        self.start()
        if self._ahead is not None or not items:
            return
        launcher = self._launcher
        got: list[Future] = []

        def submit() -> None:
            if launcher is not None:
                launcher.join()
            got.extend(self._submit([item]) for item in items)

        thread = threading.Thread(target=submit, daemon=True, name="pool-ahead")
        thread.start()
        self._ahead = (list(items), thread, got)

    def _take_ahead(self) -> list[tuple[T, Future]]:
        """The items `ahead` submitted, each with its future (once submitted); forgotten here."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return []
        items, thread, got = ahead
        thread.join()
        return list(zip(items, got))  # (none where the pool shut down meanwhile)

    def _launched(self) -> None:
        """Wait for the thread `start` may have left launching the workers."""
        launcher, self._launcher = self._launcher, None
        if launcher is not None:
            launcher.join()

    def _started(self) -> None:
        """Wait (at most `START_WAIT` s) until the workers of the pool `start` made have run a
        first call (and imported the function's module): a timeout counts from the moment an
        item is the oldest in flight, and a pool's start-up (long on a loaded machine) must not
        be blamed on the first item it gets."""
        self._launched()
        starting, self._starting = self._starting, []
        if starting:
            wait(starting, timeout=START_WAIT)

    def map(self, items: Iterable[T], on_crash: Callable[[T, BaseException], R], window: int | None = None,
            timeout: float | None = None, on_timeout: Callable[[T, float], R] | None = None,
            batch: int = 1, batchable: Callable[[T], bool] | None = None) -> Iterator[R]:
        """Results in input order. ``timeout`` counts from the moment an item is the oldest in
        flight: in FIFO dispatch it is running by then, so it is never cut short.

        ``batch``: up to that many consecutive items for which ``batchable`` says yes travel to
        a worker in one message and come back in one (``window`` counts messages). A message
        per item cost more of the caller's CPU than a small file's whole judging. A batch
        counts as one item for ``timeout``; one that runs past it has its worker killed and its
        items run again one by one, each with the whole ``timeout`` (so a file that hangs in a
        batch is told after up to twice ``timeout``): batch only items that take far less."""
        window = window or self.workers * 4
        self.start()
        if timeout:
            self._started()
        else:
            self._launched()
        pending: deque[tuple[list[T], Future]] = deque()
        items = self._with_ahead(iter(items), pending)
        groups = _groups(items, batch, batchable)
        try:
            while True:
                while len(pending) < window:
                    group = next(groups, None)
                    if group is None:
                        break
                    pending.append((group, self._submit(group)))
                if not pending:
                    return
                group, fut = pending[0]
                try:
                    results = fut.result(timeout=timeout or None)
                except FutureTimeout:
                    pending.popleft()
                    if len(group) == 1:
                        yield _timed_out(group[0], timeout, on_timeout)
                    self._restart(pending, [[item] for item in group] if len(group) > 1 else [])
                    continue
                except BrokenProcessPool:
                    yield from self._recover(pending, on_crash, timeout, on_timeout)
                    continue
                pending.popleft()
                yield from results
        finally:
            self.close()

    def _with_ahead(self, items: Iterator[T], pending: deque) -> Iterator[T]:
        """``items`` less the first ones that `ahead` already submitted, in order (their futures
        then first in ``pending``); from the first that differs on, the work ahead is dropped
        with the workers doing it, and the ones taken are run again in a new pool."""
        for item, fut in self._take_ahead():
            try:
                got = next(items)
            except StopIteration:  # fewer items than were started ahead
                self._restart(pending, [])
                return items
            if got != item:
                self._restart(pending, [])
                return itertools.chain([got], items)
            pending.append(([got], fut))
        return items

    def _running(self) -> ProcessPoolExecutor:
        """The pool in use: `map` starts one before it submits, replaces it while it runs, and
        drops it only when it ends."""
        if self._pool is None:
            raise RuntimeError("OrderedPool: no pool running (used outside map)")
        return self._pool

    def _submit(self, group: list[T]) -> Future:
        try:
            return self._running().submit(_each, self.fn, group)
        except BrokenProcessPool:
            fut: Future = Future()
            fut.set_exception(BrokenProcessPool("pool broken"))
            return fut

    def _recover(self, pending: deque, on_crash, timeout, on_timeout) -> Iterator[R]:
        """The pool died: run each in-flight item alone to find the one that kills its worker."""
        self._running().shutdown(wait=False, cancel_futures=True)
        items = [item for group, _ in pending for item in group]
        pending.clear()
        for item in items:
            solo = self._new_pool(1)
            if timeout:
                wait([solo.submit(_nothing, self.fn)], timeout=START_WAIT)
            try:
                yield solo.submit(self.fn, item).result(timeout=timeout or None)
            except BrokenProcessPool as e:
                yield on_crash(item, e)
            except FutureTimeout:
                _kill(solo)
                yield _timed_out(item, timeout, on_timeout)
            finally:
                solo.shutdown(wait=True, cancel_futures=True)
        self._pool = None
        self.start()
        if timeout:
            self._started()

    def _restart(self, pending: deque, first: list[list[T]]) -> None:
        """Kill the workers (one is stuck) and run the other in-flight items again in a new pool,
        after the groups in ``first``."""
        _kill(self._running())
        self._pool = None
        self.start()._started()
        groups = [*first, *(group for group, _ in pending)]
        pending.clear()
        pending.extend((group, self._submit(group)) for group in groups)

    def ready(self) -> bool:
        """Whether the workers `start` launched have started (their initializer run, the
        function's module imported): an item submitted now runs at once, and `submit` does not
        wait for a fork server still importing."""
        if self._launcher is not None and self._launcher.is_alive():
            return False
        return all(f.done() for f in self._starting)

    def submit(self, item: T) -> Future:
        """``fn(item)`` on one of the workers (started now if `start` was not called), its result
        or exception left to the caller: no retry after a crash, no timeout (for calls whose
        failure fails the caller's run, such as a stage's whole parts)."""
        self.start()
        self._launched()
        return self._running().submit(self.fn, item)

    def close(self) -> None:
        self._launched()
        self._take_ahead()
        self._starting = []
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _each(fn: Callable[[T], R], group: list[T]) -> list[R]:
    """What a worker runs for one message: ``fn`` over its items, in order."""
    return [fn(item) for item in group]


def _groups(items: Iterable[T], batch: int, batchable: Callable[[T], bool] | None) -> Iterator[list[T]]:
    """``items`` as messages: runs of up to ``batch`` batchable items, every other item alone."""
    group: list[T] = []
    for item in items:
        if batch > 1 and batchable is not None and batchable(item):
            group.append(item)
            if len(group) < batch:
                continue
        elif group:
            yield group
            group = [item]
        else:
            group = [item]
        yield group
        group = []
    if group:
        yield group


def _timed_out(item: T, timeout: float | None, on_timeout: Callable[[T, float], R] | None) -> R:
    """The result for an item that ran past ``timeout``: a result only times out when a timeout
    was given, and a caller that gives one must say what a timed-out item yields."""
    if timeout is None or on_timeout is None:
        raise TypeError("OrderedPool.map: a timeout needs on_timeout")
    return on_timeout(item, timeout)


def _kill(pool: ProcessPoolExecutor) -> None:
    # ProcessPoolExecutor cannot cancel a running call; killing its processes is the only way
    for proc in list(getattr(pool, "_processes", {}).values()):
        proc.kill()
    pool.shutdown(wait=True, cancel_futures=True)
