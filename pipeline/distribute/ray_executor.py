"""`--executor ray`: the one module that imports Ray (the `ray` extra). Everything here runs the
same per-item functions a local run runs; only where they run changes.

clean: the driver plans parts (`parts.plan`), reuses those whose results file a previous run left
(and whose files are unchanged), and runs one Ray task per remaining part. A task runs
`pipeline.clean.process.process` over its part in the same one-worker `OrderedPool` a local run
uses (so a decoder that crashes or hangs on one file gets the same verdict as locally), writes
each file's output, then the part's results file last. A task whose worker process or node dies
is retried by Ray (`max_retries`); its retry rewrites the same bytes. The driver reads the
results files in part order and returns them: the stage then decides, finalizes and writes the
manifest exactly as a local run does.

shard: the plan is made once on the driver; one task writes each shard with the same function a
local run uses (`pipeline.shard.stage.write_shard`) and returns its index entry; the driver
writes `index.json` last.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.errors import StageFailed, UsageError
from pipeline.core.executor import OrderedPool
from pipeline.distribute.executors import INSTALL_RAY

# Ray retries a task whose worker process or node died this many times (a node lost twice in one
# part's life is bad luck; five times is a broken cluster, and the run stops saying so).
MAX_RETRIES = 5


@contextlib.contextmanager
def connected(address: str):
    """Join the cluster at ``address`` ("auto": the one `ray start` started on this machine, or
    RAY_ADDRESS) for the block; yield the ray module. A session the caller already had is used
    and left open. Usage errors name what to do."""
    try:
        import ray
    except ImportError:
        raise UsageError(f"--executor ray needs Ray, which is not installed: {INSTALL_RAY}") from None
    if ray.is_initialized():
        yield ray
        return
    try:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise UsageError(f"no Ray cluster at --ray-address {address} ({str(e).splitlines()[0][:200]}); "
                         "start one with `ray start --head` or pass its address") from None
    try:
        yield ray
    finally:
        ray.shutdown()


@dataclass
class PartRun:
    """What the report says about one part: where and how long it ran (absent when reused)."""

    part: str
    files: int
    seconds: float
    node: str

    def as_dict(self) -> dict:
        return {"part": self.part, "files": self.files, "seconds": round(self.seconds, 3), "node": self.node}


def run_tasks(ray, fn: Callable, calls: Iterable[tuple], on_done: Callable[[int, Any], None],
              window: int | None = None) -> None:
    """Run ``fn(*call)`` as a Ray task for every call, at most ``window`` in flight (the driver's
    memory and the object store hold only those), calling ``on_done(i, result)`` as each ends."""
    remote = ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False)(fn)
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


# ---------------------------------------------------------------- clean


class _KeptPool(OrderedPool):
    """The one-worker pool of a Ray worker process, kept from one part to the next: `map` ends
    by closing its pool, and starting a worker (a fresh interpreter importing the decoders) for
    every part would cost more than a part of small files. Its worker dies with the Ray worker."""

    def close(self) -> None:
        """Kept open for the next part (`map` calls this when it ends); `shut` really closes."""

    def shut(self) -> None:
        super().close()


_KEPT: tuple[object, _KeptPool] | None = None


def _pool_for(settings) -> _KeptPool:
    global _KEPT
    if _KEPT is None or _KEPT[0] != settings:
        if _KEPT is not None:
            _KEPT[1].shut()
        from pipeline.clean.process import init_worker, process

        _KEPT = (settings, _KeptPool(process, 1, initializer=init_worker, initargs=(settings,)))
    return _KEPT[1]


def clean_part(settings, clean_dir: str, part, candidates: list, file_timeout: float) -> PartRun:
    """A Ray task: process one part's files as a local run would (the same `process` in the same
    one-worker pool: a decoder that crashes or hangs on a file gets the same verdict), its outputs
    first, its results file last."""
    from pipeline.clean.process import crashed, timed_out
    from pipeline.distribute.parts import write_results

    t = time.perf_counter()
    results = list(_pool_for(settings).map(candidates, on_crash=crashed, timeout=file_timeout, on_timeout=timed_out))
    try:
        write_results(Path(clean_dir), part, results)
    except OSError as e:
        raise StageFailed(f"could not write the cleaned output: {e}") from None
    return PartRun(part.name, len(results), time.perf_counter() - t, _node())


def _node() -> str:
    try:
        import ray

        return str(ray.util.get_node_ip_address())
    except Exception:  # noqa: BLE001 - only for the report
        return socket.gethostname()


def process_parts(address: str, settings, clean_dir: Path, parts: Sequence, candidates: Sequence, file_timeout: float,
                  todo: Sequence[int], on_part: Callable[[int, PartRun], None]) -> None:
    """Run the parts whose indexes are in ``todo`` on the cluster, calling ``on_part`` as each ends."""
    with connected(address) as ray:
        # a generator: a part's arguments are made when it is submitted, so only those in flight are held
        calls = ((settings, os.fspath(clean_dir), parts[i], list(candidates[parts[i].begin:parts[i].end]), file_timeout)
                 for i in todo)
        run_tasks(ray, clean_part, calls, lambda k, run: on_part(todo[k], run))


# ---------------------------------------------------------------- shard


def shard_task(plan, clean_dir: str, out_dir: str):
    """A Ray task: write one shard with the function a local run uses; return its index entry."""
    from pipeline.shard.write import write_shard

    try:
        return write_shard(plan, Path(clean_dir), Path(out_dir))
    except OSError as err:
        raise StageFailed(f"could not write {Path(out_dir) / plan.name}: {err}") from None


def write_shards(address: str, plans: Iterable, clean_dir: Path, out_dir: Path,
                 on_done: Callable[[int, Any], None]) -> None:
    """Write each planned shard (`pipeline.shard.plan.ShardPlan`) in a Ray task; ``on_done(i,
    entry)`` as each ends. Plans are taken from ``plans`` only as tasks are handed out."""
    with connected(address) as ray:
        run_tasks(ray, shard_task, ((p, os.fspath(clean_dir), os.fspath(out_dir)) for p in plans), on_done)
