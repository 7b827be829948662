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

Fixed costs: a job's workers are fresh processes (Ray's import, then ours: numpy, pyarrow, the
decoders; 1-2 s of CPU each), and clean and shard are two jobs. `warmed_up` joins the cluster
first thing in a stage and starts them with one task per CPU, so they get ready while the driver
lists and plans; the session ends with the stage, without Ray's half-second wait at exit. A clean
task batches small files to its pool as a local run does.

Where tasks write: a local CLEAN_DIR or SHARD_DIR must be a file system every node mounts at the
same path (a task that does not find the driver's marker there stops the run with one line,
`output_folder`); an s3:// one is written straight from the tasks, nothing through the driver.
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
        raise UsageError(f"--executor ray needs Ray, which is not installed: {INSTALL_RAY}") from None
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
def warmed_up(address: str, fn: Callable, *args):
    """A session for the block (a stage's whole run, `connected`), joined first thing, with each
    of the cluster's CPUs handed a task that readies a worker process for the stage's tasks
    (``fn(*args)``: their imports, a clean part's decode pool). A job's workers are fresh processes
    that import Ray and then ours (1-2 s of CPU each); without this they would start only once the
    driver had listed, planned and submitted, and the cluster would sit idle meanwhile. Nothing
    waits for these tasks: a warm-up that fails costs nothing, the real task meets the same error.

    The session ends with the block, not in Ray's exit handler, which first sleeps 0.5 s for
    worker log lines to reach the driver (this one takes none, ``log_to_driver=False``): a trace
    of the driver showed 0.8 s from a command's return to its exit."""
    with connected(address) as ray:
        remote = ray.remote(num_cpus=1, max_retries=0)(fn)
        for _ in range(max(1, int(ray.cluster_resources().get("CPU", 1)))):
            remote.remote(*args)
        yield


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


def ready_for_clean(settings) -> None:
    """A warm-up task (`warmed_up`): `clean_part`'s decode pool started and its imports done."""
    _pool_for(settings).start()
    from pipeline.clean.columns import to_table  # noqa: F401
    from pipeline.clean.stage import BATCH_FILES  # noqa: F401
    from pipeline.distribute.parts import write_results  # noqa: F401


def clean_part(settings, clean_dir: str, part, candidates: list, file_timeout: float, input_dir: str = "") -> PartRun:
    """A Ray task: process one part's files as a local run would (the same `process` in the same
    one-worker pool: a decoder that crashes or hangs on a file gets the same verdict), its outputs
    first, its results file last, both straight into CLEAN_DIR (a shared folder or object storage).
    Small files travel to the pool BATCH_FILES to a message, as in a local run: a message per
    file cost this process more CPU than it had to spare on a core it shares with the pool."""
    t = time.perf_counter()
    # the pool's worker (a fresh interpreter importing the decoders) starts first, on a part that
    # is this worker's first, so that its imports run beside this process's own, not after them
    pool = _pool_for(settings).start()
    from pipeline.clean.columns import to_table  # noqa: F401 - imported now, beside the pool's start-up: write_results needs it
    from pipeline.clean.process import crashed, timed_out
    from pipeline.clean.stage import BATCH_FILES, _small
    from pipeline.distribute.parts import write_results
    from pipeline.storage import is_remote

    where = output_folder(clean_dir, "CLEAN_DIR")
    if input_dir and not is_remote(input_dir) and not Path(input_dir).is_dir():
        raise UsageError(f"INPUT {input_dir} is not visible on the Ray node {_node()}: with --executor ray a local "
                         "input must be a shared file system mounted at the same path on every node; or read it from s3://")
    results = list(pool.map(candidates, on_crash=crashed, timeout=file_timeout, on_timeout=timed_out,
                            batch=BATCH_FILES, batchable=_small))
    try:
        write_results(where, part, results)
    except OSError as e:
        raise StageFailed(f"could not write the cleaned output: {e}") from None
    return PartRun(part.name, len(results), time.perf_counter() - t, _node())


def output_folder(arg: str, role: str):
    """Where a task writes: an s3:// URL as a storage Folder, a local path as itself, once this
    node sees the driver's marker (``.pipe/state.json``, written before any task starts) there.
    A node that does not is not sharing the driver's file system: its outputs would land where
    nobody reads them, so the run stops with one line instead."""
    from pipeline.core.files import read_marker
    from pipeline.storage import is_remote, open_folder

    if is_remote(arg):
        return open_folder(arg)
    if read_marker(Path(arg)) is None:
        raise UsageError(f"{role} {arg} is not visible on the Ray node {_node()} (no .pipe/state.json there): with "
                         "--executor ray a local output must be a shared file system mounted at the same path on "
                         "every node; or write to s3://")
    return Path(arg)


def _node() -> str:
    try:
        import ray

        return str(ray.util.get_node_ip_address())
    except Exception:  # noqa: BLE001 - only for the report
        return socket.gethostname()


def process_parts(address: str, settings, clean_dir: str, parts: Sequence, candidates: Sequence, file_timeout: float,
                  todo: Sequence[int], on_part: Callable[[int, PartRun], None], input_dir: str = "") -> None:
    """Run the parts whose indexes are in ``todo`` on the cluster, calling ``on_part`` as each ends.
    ``clean_dir`` and ``input_dir``: absolute paths every node mounts, or s3:// URLs."""
    with connected(address) as ray:
        # a generator: a part's arguments are made when it is submitted, so only those in flight are held
        calls = ((settings, clean_dir, parts[i], list(candidates[parts[i].begin:parts[i].end]), file_timeout, input_dir)
                 for i in todo)
        run_tasks(ray, clean_part, calls, lambda k, run: on_part(todo[k], run))


# ---------------------------------------------------------------- shard


def ready_for_shard() -> None:
    """A warm-up task (`warmed_up`): `shard_task`'s imports done."""
    from pipeline.shard.write import write_shard  # noqa: F401
    from pipeline.storage.transfer import download  # noqa: F401


def shard_task(plan, clean_dir: str, out_dir: str) -> tuple[Any, PartRun]:
    """A Ray task: write one shard with the function a local run uses; return its index entry
    and what the summary says about the task. CLEAN_DIR and SHARD_DIR are shared folders or
    s3:// URLs: from object storage the shard's files are fetched to this node first, to it the
    finished shard is uploaded under its name (one object, whole or absent)."""
    import tempfile

    from pipeline.shard.write import write_shard
    from pipeline.storage import Folder, is_remote, open_folder
    from pipeline.storage.transfer import download

    t = time.perf_counter()
    out = output_folder(out_dir, "SHARD_DIR")
    if not is_remote(clean_dir) and not (Path(clean_dir) / "manifest.parquet").is_file():
        raise UsageError(f"CLEAN_DIR {clean_dir} is not visible on the Ray node {_node()}: with --executor ray a "
                         "local CLEAN_DIR must be a shared file system mounted at the same path on every node; or use s3://")
    with tempfile.TemporaryDirectory(prefix="pipe-shard-") as tmp:
        source = Path(clean_dir)
        if is_remote(clean_dir):
            source = Path(tmp) / "in"
            download(open_folder(clean_dir), [p for p in (*plan.images.to_pylist(), *plan.texts.to_pylist()) if p is not None], source)
        target = Path(tmp) if isinstance(out, Folder) else out
        try:
            entry = write_shard(plan, source, target)
        except OSError as err:
            raise StageFailed(f"could not write {out_dir}/{plan.name}: {err}") from None
        if isinstance(out, Folder):
            out.upload(plan.name, target / plan.name)
    return entry, PartRun(plan.name, len(plan), time.perf_counter() - t, _node())


def write_shards(address: str, plans: Iterable, clean_dir: str, out_dir: str,
                 on_done: Callable[[int, Any], None]) -> None:
    """Write each planned shard (`pipeline.shard.plan.ShardPlan`) in a Ray task; ``on_done(i,
    (entry, run))`` as each ends. Plans are taken from ``plans`` only as tasks are handed out.
    ``clean_dir`` and ``out_dir``: the folders as every node sees them (shared), or s3:// URLs."""
    with connected(address) as ray:
        run_tasks(ray, shard_task, ((p, clean_dir, out_dir) for p in plans), on_done)
