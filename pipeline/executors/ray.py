"""The Ray executor: a stage's parts as Ray tasks. The only module that imports Ray; it knows no
stage: a task runs the function the stage gave, on the part the stage planned.

A part of items (`map_parts`) is one task, named as the stage names it (``ray::NAME`` on the
node): the items go through a one-worker `OrderedPool` kept in the Ray worker process from one
part to the next (a decoder that crashes or hangs on an item gets the same verdict as on the
local executor), then the part's ``finish`` runs in the task. A whole part (`run_parts`) is one
task calling the stage's function. A task whose worker process or node dies is retried by Ray
(`MAX_RETRIES`): parts rewrite the same bytes under the same names.

Fixed costs: a job's workers are fresh processes (Ray's import, then ours: numpy, pyarrow, the
decoders; 1-2 s of CPU each). `session` joins the cluster first thing in a stage and hands every
CPU a task that readies a worker for the stage's parts, so they get ready while the driver lists
and plans; it ends the session with the stage, without Ray's half-second wait at exit. (Keeping
workers warm across commands, e.g. actors holding the pools, fits here: `session` and the part
runners are the only places that would change.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from pipeline.core.errors import StageFailed, UsageError
from pipeline.core.executor import OrderedPool
from pipeline.executors import INSTALL, Items, Later, OnPart, PartRun

# Ray retries a task whose worker process or node died this many times (a node lost twice in one
# part's life is bad luck; five times is a broken cluster, and the run stops saying so).
MAX_RETRIES = 5


class RayExecutor:
    name = "ray"

    def __init__(self, address: str = "auto", workers: int = 0):
        self.address = address

    def session(self, items: Items | None = None, part_fn: Callable | None = None,
                warm: bool = True) -> contextlib.AbstractContextManager[None]:
        return _session(self.address, items, part_fn)

    def part_size(self, requested: int) -> int:
        return max(1, requested)

    def map_parts(self, items: Items, parts: Sequence[tuple[Any, Sequence[Any]]], on_part: OnPart,
                  on_item: Callable[[Any], None] | None = None, progress: bool = True) -> None:
        line = PartsLine(len(parts), sum(len(its) for _, its in parts), progress, self.name)

        def done(i: int, result: tuple[Any, PartRun]) -> None:
            value, run = result
            on_part(i, value, run)
            line.part_done(run.files)

        with connected(self.address) as ray:
            # a generator: a part's arguments are made when it is submitted, so only those in flight are held
            calls = ((items, meta, list(its)) for meta, its in parts)
            run_tasks(ray, _items_part, calls, done, name=items.name)

    def run_parts(self, fn: Callable[..., Any], calls: Iterable[tuple], on_done: OnPart) -> None:
        def done(i: int, result: tuple[Any, PartRun]) -> None:
            value, run = result
            on_done(i, value, run)

        with connected(self.address) as ray:
            run_tasks(ray, _whole_part, ((fn, call) for call in calls), done, name=getattr(fn, "__name__", "part"))

    def summary(self, **facts: Any) -> dict | None:
        return {"executor": self.name, **facts}


@contextlib.contextmanager
def connected(address: str):
    """Join the cluster at ``address`` ("auto": the one `ray start` started on this machine, or
    RAY_ADDRESS) for the block; yield the ray module. A session the caller already had is used
    and left open. Usage errors name what to do."""
    ray = _import_ray()
    if ray.is_initialized():
        yield ray
        return
    _join(ray, address)
    try:
        yield ray
    finally:
        ray.shutdown()


def _import_ray():
    """The ray module, or a usage error that says how to install it."""
    try:
        import ray
    except ImportError:
        raise UsageError(f"--executor ray needs Ray, which is not installed: {INSTALL['ray']}") from None
    return ray


def _join(ray, address: str) -> None:
    """Join the cluster. The driver waits for every task whose outcome counts and reports its
    failure in one line; the tasks it lets go on purpose (warm-ups, the parts still in flight when
    a run stops on a failed one) are not for Ray to print a traceback about after that line when
    their references are dropped (a user's own RAY_IGNORE_UNHANDLED_ERRORS is left as it is)."""
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    try:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise UsageError(f"no Ray cluster at --ray-address {address} ({str(e).splitlines()[0][:200]}); "
                         "start one with `ray start --head` or pass its address") from None


@contextlib.contextmanager
def _session(address: str, items: Items | None, part_fn: Callable | None) -> Iterator[None]:
    """A session for the block (a stage's whole run, `connected`), joined first thing, with each
    of the cluster's CPUs handed a task that readies a worker process for the stage's parts
    (their imports; for items, the part's pool). Nothing waits for these tasks: a warm-up that
    fails costs nothing, the real task meets the same error.

    The session ends with the block, not in Ray's exit handler, which first sleeps 0.5 s for
    worker log lines to reach the driver (this one takes none, ``log_to_driver=False``): a trace
    of the driver showed 0.8 s from a command's return to its exit."""
    with connected(address) as ray:
        remote = ray.remote(num_cpus=1, max_retries=0)(_ready)
        for _ in range(max(1, int(ray.cluster_resources().get("CPU", 1)))):
            remote.remote(items, part_fn)
        yield


def _ready(items: Items | None, part_fn: Callable | None) -> None:
    """A warm-up task: ``items``' pool started (the function's modules came with the arguments)."""
    if items is not None:
        _pool_for(items).start()


def run_tasks(ray, fn: Callable, calls: Iterable[tuple], on_done: Callable[[int, Any], None],
              window: int | None = None, name: str | None = None) -> None:
    """Run ``fn(*call)`` as a Ray task for every call, at most ``window`` in flight (the driver's
    memory and the object store hold only those), calling ``on_done(i, result)`` as each ends."""
    remote = ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False)(fn)
    if name:
        remote = remote.options(name=name)
    if window is None:
        window = max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))
    pending: dict[Any, int] = {}
    todo = iter(enumerate(calls))
    try:
        while True:
            for i, call in todo:
                pending[remote.remote(*call)] = i
                if len(pending) >= window:
                    break
            if not pending:
                return
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                i = pending.pop(ref)
                on_done(i, _get(ray, ref))
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)


def _get(ray, ref):
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:  # our own error inside the task: say it as the task said it, in one line
        cause = getattr(e, "cause", None)
        if isinstance(cause, UsageError):
            raise UsageError(str(cause)) from None
        if isinstance(cause, StageFailed):
            raise StageFailed(str(cause)) from None
        raise StageFailed(f"a Ray task failed: {str(e).strip().splitlines()[-1][:300]}") from None
    except ray.exceptions.RayError as e:
        raise StageFailed(f"a Ray task was lost after {MAX_RETRIES} retries: {type(e).__name__}: "
                          f"{str(e).strip().splitlines()[0][:300]}") from None


class _KeptPool(OrderedPool):
    """The one-worker pool of a Ray worker process, kept from one part to the next: `map` ends
    by closing its pool, and starting a worker (a fresh interpreter importing the decoders) for
    every part would cost more than a part of small items. Its worker dies with the Ray worker."""

    def close(self) -> None:
        """Kept open for the next part (`map` calls this when it ends); `shut` really closes."""

    def shut(self) -> None:
        super().close()


_KEPT: tuple[tuple, _KeptPool] | None = None


def _pool_for(items: Items) -> _KeptPool:
    global _KEPT
    key = items.pool_key()
    if _KEPT is None or _KEPT[0] != key:
        if _KEPT is not None:
            _KEPT[1].shut()
        _KEPT = (key, _KeptPool(items.fn, 1, initializer=items.initializer, initargs=items.initargs))
    return _KEPT[1]


def _items_part(items: Items, meta: Any, its: list) -> tuple[Any, PartRun]:
    """A Ray task: ``items.fn`` over one part's items in this worker's kept pool, then the part's
    ``finish`` here. The pool's worker (a fresh interpreter) starts first, on a part that is this
    worker's first, so that its imports run beside this process's own, not after them."""
    t = time.perf_counter()
    pool = _pool_for(items).start()
    if items.start is not None:
        items.start(meta)
    results = list(pool.map(its, on_crash=items.on_crash, timeout=items.timeout, on_timeout=items.on_timeout,
                            batch=items.batch, batchable=items.batchable))
    value = items.run_finish(meta, results)
    return value, PartRun(_part_name(meta), len(results), time.perf_counter() - t, node())


def _whole_part(fn: Callable[..., Any], call: tuple) -> tuple[Any, PartRun]:
    """A Ray task: the stage's function on one part, its last step (`Later`) done here."""
    t = time.perf_counter()
    out = fn(*call)
    value = out.done() if isinstance(out, Later) else out
    return value, PartRun(_part_name(call[0] if call else None), _part_len(call[0] if call else None),
                          time.perf_counter() - t, node())


def _part_name(meta: Any) -> str:
    return str(getattr(meta, "name", meta))


def _part_len(meta: Any) -> int:
    try:
        return len(meta)
    except TypeError:
        return 1


def node() -> str:
    """This node's address (for a summary), or the host's name."""
    try:
        import ray

        return str(ray.util.get_node_ip_address())
    except Exception:  # noqa: BLE001 - only for the report
        return socket.gethostname()


class PartsLine:
    """Progress across the cluster, beside the items bar: parts done, items/s, time left; one
    line every 10 s at most (and for the last part), so a million parts do not flood a log."""

    EVERY_S = 10.0

    def __init__(self, parts: int, files: int, enabled: bool, name: str = "ray"):
        self.name, self.parts, self.files, self.enabled = name, parts, files, enabled
        self.start = self.last = time.monotonic()
        self.parts_done = self.files_done = 0

    def part_done(self, files: int) -> None:
        from pipeline.core.ui import duration

        self.parts_done += 1
        self.files_done += files
        now = time.monotonic()
        if not self.enabled or (now - self.last < self.EVERY_S and self.parts_done < self.parts):
            return
        self.last = now
        rate = self.files_done / max(now - self.start, 1e-9)
        left = (self.files - self.files_done) / rate if rate > 0 else 0.0
        sys.stderr.write(f"{self.name}: {self.parts_done}/{self.parts} parts done, {rate:.0f} files/s"
                         f"{f', about {duration(left)} left' if self.parts_done < self.parts else ''}\n")
        sys.stderr.flush()
