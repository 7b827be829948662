"""The Ray executor: a stage's parts on a Ray cluster. The only module that imports Ray; it knows no
stage: a part runs the function the stage gave, on the part the stage planned.

A part of items (`map_parts`) runs the items through a one-worker `OrderedPool` kept in the Ray
worker process from one part to the next (a decoder that crashes or hangs on an item gets the
same verdict as on the local executor), then the part's ``finish``. A whole part (`run_parts`)
calls the stage's function. Either is named as the stage names it (``ray::NAME`` on the node).

**Warm workers.** Ray binds a task's worker processes to the job (the command) that made them,
so every command used to start fresh ones: each imported Ray (~1 s of CPU) and then ours (numpy,
pyarrow, the decoders, clean's pool: 1-2 s more), on the cores the parts needed. So the parts
run on a pool of *detached actors* (`WarmWorker`): one per CPU of each node, each pinned to its
node, in the namespace ``pipe`` under a name that holds pipe's code version (`code_version`: a
driver of other code never uses them). A command finds them by name or starts them; they keep
their imports and their item pool (keyed by the stage's per-item function, its settings applied
per message: a new CLEAN_DIR or size needs no new pool) from one command to the next, and each
ends itself after ``keep_warm`` seconds without a part (`--ray-keep-warm`, 10 minutes unless
set). Fixed cost per command, once warm: the driver's own start (`import ray` alone ~0.8 s) and
a round trip per part.

What that means for the cluster: a warm worker holds no CPU in Ray's books (``num_cpus=0``) so
that it never keeps anyone's task waiting, idle or not; while a command's parts run, Ray does not
know those CPUs are busy, and on a cluster shared with other work their tasks may land on the
same cores (both slow down; nothing fails). ``--ray-keep-warm 0`` runs every part as a plain
one-CPU task instead, as Ray counts them, in worker processes that end with the command.

**Which cluster.** ``--ray-address auto`` joins the cluster `ray start` started on this machine
(or RAY_ADDRESS), and Ray's own fallback for ``auto`` joins any other it finds running here: a
user's first run can land on someone else's. So the driver says, before the first part, the
address it joined, its nodes and their CPUs (`cluster_line`). ``--ray-address local`` starts a
private one-node cluster for this command instead (Ray's ``address="local"``, in a temp dir of
its own: it never becomes the machine's default cluster in /tmp/ray, the one ``auto`` reads
first), which ends with the command: its parts run as plain tasks, since no next command could
find warm workers there.

Failures: a part whose worker process or node dies is run again on another warm worker (then, if
none is left, as a task), `MAX_RETRIES` times at most; parts rewrite the same bytes under the same
names. A part whose driver died (killed, or stopped on another part's failure) is not left
running: a warm worker checks its driver is alive before a part and every `WATCH_S` during one,
and ends its process when it is not, as Ray ends a dead job's tasks.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import hashlib
import logging
import os
import pickle
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pipeline.core.errors import StageFailed, UsageError
from pipeline.core.executor import OrderedPool
from pipeline.executors import INSTALL, KEEP_WARM_S, Items, Later, OnPart, PartRun

# Ray retries a task whose worker process or node died this many times (a node lost twice in one
# part's life is bad luck; five times is a broken cluster, and the run stops saying so); a part
# whose warm worker died is run again elsewhere as often.
MAX_RETRIES = 5
LOCAL = "local"  # --ray-address: a private cluster on this machine for this command alone
NAMESPACE = "pipe"  # the warm workers' Ray namespace: their names are found there by any driver
WATCH_S = 0.5  # how often a warm worker checks that the driver of its part lives, and whether it idled long enough


class RayExecutor:
    name = "ray"

    def __init__(self, address: str = "auto", workers: int = 0, keep_warm: float = KEEP_WARM_S):
        self.address = address
        # a private cluster ends with the command: no next one will find warm workers there
        self.keep_warm = 0.0 if address == LOCAL else keep_warm
        self._pool: WarmPool | None = None

    def session(self, items: Items | None = None, part_fn: Callable | None = None,
                warm: bool = True) -> contextlib.AbstractContextManager[None]:
        return self._session(items, part_fn)

    @contextlib.contextmanager
    def _session(self, items: Items | None, part_fn: Callable | None) -> Iterator[None]:
        """A session for the block (a stage's whole run, `connected`), joined first thing. The
        warm workers are found (or started) and told what the stage's parts need (their item
        pool), so that whatever they lack gets ready while the driver lists and plans; with
        ``keep_warm`` 0, each of the cluster's CPUs is handed a task that readies a worker the
        same way. Nothing waits for these: one that fails costs nothing, the real part meets the
        same error.

        The session ends with the block, not in Ray's exit handler, which first sleeps 0.5 s for
        worker log lines to reach the driver (this one takes none, ``log_to_driver=False``): a
        trace of the driver showed 0.8 s from a command's return to its exit."""
        with connected(self.address, announce=True) as ray:
            if self.keep_warm > 0:
                self._pool = WarmPool.find_or_start(ray, self.keep_warm)
                self._pool.ready(items, part_fn)
            else:
                remote = ray.remote(num_cpus=1, max_retries=0)(_ready)
                for _ in range(max(1, int(ray.cluster_resources().get("CPU", 1)))):
                    remote.remote(items, part_fn)
            try:
                yield
            finally:
                self._pool = None

    def ahead(self, items: Items, first: Sequence[Any]) -> None:
        """Nothing: a cluster's parts are the unit of work here, none starts before it is planned."""

    def part_size(self, requested: int) -> int:
        return max(1, requested)

    def map_parts(self, items: Items, parts: Sequence[tuple[Any, Sequence[Any]]], on_part: OnPart,
                  on_item: Callable[[Any], None] | None = None, progress: bool = True) -> None:
        line = PartsLine(len(parts), sum(len(its) for _, its in parts), progress, self.name)

        def done(i: int, result: tuple[Any, PartRun]) -> None:
            value, run = result
            on_part(i, value, run)
            line.part_done(run.files)

        # a generator: a part's arguments are made when it is submitted, so only those in flight are held
        self._run(_items_part, ((items, meta, list(its)) for meta, its in parts), done, items.name)

    def run_parts(self, fn: Callable[..., Any], calls: Iterable[tuple], on_done: OnPart) -> None:
        def done(i: int, result: tuple[Any, PartRun]) -> None:
            value, run = result
            on_done(i, value, run)

        self._run(_whole_part, ((fn, call) for call in calls), done, getattr(fn, "__name__", "part"))

    def _run(self, fn: Callable, calls: Iterable[tuple], done: Callable[[int, Any], None], name: str) -> None:
        """``fn(*call)`` for every call, on the warm workers (or as tasks, with ``keep_warm`` 0)."""
        with connected(self.address, announce=True) as ray:
            pool = self._pool
            if pool is None and self.keep_warm > 0:  # parts outside a session
                pool = WarmPool.find_or_start(ray, self.keep_warm)
            if pool is None:
                run_tasks(ray, fn, calls, done, name=name)
            else:
                pool.run(fn, calls, done, name)

    def summary(self, **facts: Any) -> dict | None:
        return {"executor": self.name, **facts}


@contextlib.contextmanager
def connected(address: str, announce: bool = False):
    """Join the cluster at ``address`` ("auto": the one `ray start` started on this machine, or
    RAY_ADDRESS; `LOCAL`: a private one started now) for the block; yield the ray module. A session
    the caller already had is used and left open. ``announce``: say on stderr which cluster this
    is (`cluster_line`) once joined. Usage errors name what to do."""
    ray = _import_ray()
    if ray.is_initialized():
        yield ray
        return
    private = _join(ray, address)
    try:
        if announce:
            sys.stderr.write(cluster_line(ray, address) + "\n")
            sys.stderr.flush()
        yield ray
    finally:
        ray.shutdown()
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)


def _import_ray():
    """The ray module, or a usage error that says how to install it."""
    try:
        import ray
    except ImportError:
        raise UsageError(f"--executor ray needs Ray, which is not installed: {INSTALL['ray']}") from None
    return ray


def _join(ray, address: str) -> str | None:
    """Join the cluster, or with `LOCAL` start a private one (no dashboard; its own temp dir,
    returned for the caller to remove once it has ended, else None). The driver waits for every
    part whose outcome counts and reports its failure in one line; the calls it lets go on purpose
    (warm-ups, the parts still in flight when a run stops on a failed one) are not for Ray to print
    a traceback about after that line when their references are dropped (a user's own
    RAY_IGNORE_UNHANDLED_ERRORS is left as it is)."""
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    private = tempfile.mkdtemp(prefix="pipe-ray-", dir=private_root()) if address == LOCAL else None
    extra: dict[str, Any] = {"include_dashboard": False, "_temp_dir": private} if private else {}
    try:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False, **extra)
    except (ConnectionError, RuntimeError, ValueError, OSError) as e:
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)
            raise UsageError(f"could not start a private Ray cluster (--ray-address local): "
                             f"{str(e).splitlines()[0][:200]}") from None
        raise UsageError(f"no Ray cluster at --ray-address {address} ({str(e).splitlines()[0][:200]}); "
                         "start one with `ray start --head` or pass its address, or run on a private "
                         "cluster of this machine with --ray-address local") from None
    atexit.register(_skip_last_collection)
    return private


# Ray's sockets lie in its temp dir, at <dir>/session_<date>_<time>_<us>_<pid>/sockets/plasma_store,
# and a Unix socket's path holds 107 bytes at most: 64 of them are Ray's (a 7-digit pid), 18 the
# private dir's own.
SOCKET_PATH_MAX, RAY_SOCKET_TAIL = 107, 64 + 18


def private_root() -> str:
    """Where a private cluster's temp dir goes: the user's temp dir (TMPDIR), or /tmp where that
    path is too long for Ray's sockets to be made under it."""
    root = tempfile.gettempdir()
    return root if len(os.fsencode(root)) + RAY_SOCKET_TAIL <= SOCKET_PATH_MAX else "/tmp"


MAX_NODES_SHOWN = 8  # a cluster line names this many nodes, then counts the rest


def cluster_line(ray, address: str) -> str:
    """Which cluster the parts will run on, in one line: how it was found, its address, its live
    nodes and their CPUs (e.g. ``ray: joined the cluster at 10.0.0.1:6379 (--ray-address auto: the
    one running on this machine; --ray-address local starts a private one): 2 nodes, 16 CPUs:
    10.0.0.1 (8 CPUs), 10.0.0.2 (8 CPUs)``)."""
    from pipeline.core.ui import shown
    from pipeline.storage.secrets import scrub

    nodes = sorted(((str(n.get("NodeManagerAddress", "?")), int(n.get("Resources", {}).get("CPU", 0)))
                    for n in ray.nodes() if n.get("Alive")), key=lambda n: _natural(n[0]))
    cpus = sum(c for _, c in nodes)
    listed = ", ".join(f"{ip} ({_cpus(c)})" for ip, c in nodes[:MAX_NODES_SHOWN])
    if len(nodes) > MAX_NODES_SHOWN:
        listed += f" and {len(nodes) - MAX_NODES_SHOWN} more"
    if address == LOCAL:
        how = "started a private cluster for this command (--ray-address local; it ends with the command)"
    else:
        found = ("RAY_ADDRESS" if os.environ.get("RAY_ADDRESS") else "the one running on this machine") \
            if address == "auto" else "as given"
        how = (f"joined the cluster at {_head_address(ray)} (--ray-address {address}: {found}; "
               "--ray-address local starts a private one)")
    return shown(scrub(f"ray: {how}: {len(nodes)} node{'s' if len(nodes) != 1 else ''}, {_cpus(cpus)}: {listed}"))


def _natural(address: str) -> list:
    """10.0.0.2 before 10.0.0.10: the numbers in an address compared as numbers."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", address)]


def _cpus(n: int) -> str:
    return f"{n} CPU{'s' if n != 1 else ''}"


def _head_address(ray) -> str:
    """The address of the cluster this driver joined (its head's control store), or "?" where Ray does not say."""
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # noqa: BLE001 - only for the line said
        return "?"


def _skip_last_collection() -> None:
    """At exit, after the atexit handlers, the interpreter's last garbage collection walks every
    object the driver made, Ray's modules' above all: 0.7 s of a Ray command's wall on a loaded
    2-core machine, 0.07 s with them frozen first (measured). The process is ending and what it
    wrote is closed (files are synced and renamed as they are written), so they are frozen."""
    gc.freeze()


def _ready(items: Items | None, part_fn: Callable | None) -> None:
    """A warm-up: ``items``' pool started (the function's modules came with the arguments)."""
    if items is not None:
        _pool_for(items).start()


# ---------------------------------------------------------------- warm workers: the driver's side


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """What the warm workers' names hold, so that only a driver of the same code uses them: the
    Python and Ray versions and the source of the ``pipeline`` package (every .py file, by path
    and bytes: ~120 files, a few ms). Code a stage hands over from elsewhere (a test's functions)
    is not covered: such code is imported once per warm worker."""
    import ray

    import pipeline

    root = Path(pipeline.__file__).resolve().parent
    h = hashlib.sha256(f"{pipeline.__version__} {sys.version} {ray.__version__}\n".encode())
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def worker_names(ray) -> list[tuple[str, str]]:
    """(name, node id) of every warm worker this code's pool has on the cluster now: one per CPU of
    each live node, named by its node and place (a node that joins later gets its own)."""
    version = code_version()
    return [(f"warm-{version}-{n['NodeID'][:12]}-{k}", n["NodeID"]) for n in ray.nodes() if n.get("Alive")
            for k in range(int(n.get("Resources", {}).get("CPU", 0)))]


def warm_workers(address: str) -> list[dict]:
    """What this code's warm workers on the cluster at ``address`` say of themselves (`WarmWorker.facts`,
    with their names): for tests, benches and an operator who wants to know what a pool holds."""
    with connected(address) as ray:
        found = []
        for name, _ in worker_names(ray):
            try:
                found.append({"name": name, **ray.get(ray.get_actor(name, namespace=NAMESPACE).facts.remote(), timeout=60)})
            except (ValueError, ray.exceptions.RayError):
                continue  # not there (never started, ended, or its node is gone)
        return found


def end_warm(address: str) -> int:
    """End every warm worker on the cluster at ``address`` now, of any code version (``ray.kill``),
    rather than after their idle time; how many there were."""
    with connected(address) as ray:
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a["namespace"] == NAMESPACE and a["name"].startswith("warm-")]
        for name in names:
            with contextlib.suppress(ValueError, ray.exceptions.RayError):
                ray.kill(ray.get_actor(name, namespace=NAMESPACE))
        return len(names)


class WarmPool:
    """This command's handles on the warm workers, and how its parts are spread over them."""

    def __init__(self, ray, actors: list, keep_warm: float):
        self.ray, self.actors, self.keep_warm = ray, actors, keep_warm
        # an object this driver owns, handed with every call: a warm worker that cannot read it
        # any more knows the driver is gone (Ray says "owner died")
        self.driver = [ray.put(b"")]

    @classmethod
    def find_or_start(cls, ray, keep_warm: float) -> WarmPool:
        """The warm workers of this code, one per CPU of each node: found by name, or started
        (two drivers starting one at once get the same: ``get_if_exists``). Starting is not
        waited for: calls wait in the worker's queue until it is up."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        remote = ray.remote(WarmWorker)
        actors = [remote.options(name=name, namespace=NAMESPACE, lifetime="detached", get_if_exists=True, num_cpus=0,
                                 max_restarts=0, max_task_retries=0, max_concurrency=1,
                                 scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(keep_warm)
                  for name, node_id in worker_names(ray)]
        return cls(ray, actors, keep_warm)

    def ready(self, items: Items | None, part_fn: Callable | None) -> None:
        """Ask every warm worker to get ready for these parts (not waited for)."""
        for actor in self.actors:
            actor.ready.remote(items, part_fn, self.keep_warm)

    def run(self, fn: Callable, calls: Iterable[tuple], on_done: Callable[[int, Any], None], name: str) -> None:
        """``fn(*call)`` for every call, one part at a time on each warm worker, ``on_done(i,
        result)`` as each ends; a worker's next part is handed out before its last one is
        reported, so that none waits for the driver. A part whose worker died goes to another
        (with none left, the rest become tasks), `MAX_RETRIES` times at most."""
        ray = self.ray
        todo = iter(enumerate(calls))
        again: deque[tuple[int, tuple, int]] = deque()  # (index, call, tries) of parts whose worker died
        busy: dict[Any, tuple[int, tuple, int, int]] = {}  # ref -> (index, call, tries, worker)
        idle = list(range(len(self.actors)))

        def hand_out() -> None:
            while idle:
                nxt = again.popleft() if again else next(((i, c, 0) for i, c in todo), None)
                if nxt is None:
                    return
                w = idle.pop()
                busy[self.actors[w].run.options(name=name).remote(fn, nxt[1], self.keep_warm, self.driver)] = (*nxt, w)

        try:
            while True:
                hand_out()
                if not busy:  # all done; or no warm worker left (or none at all): the rest as tasks
                    _as_tasks(ray, fn, [*again, *((i, c, 0) for i, c in todo)], on_done, name)
                    return
                [ref], _ = ray.wait(list(busy), num_returns=1)
                i, call, tries, w = busy.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayTaskError:
                    idle.append(w)
                    _get(ray, ref)  # our own error inside the part: said as the part said it (raises)
                    raise
                except ray.exceptions.RayError as e:  # its worker (or node) is gone: the part goes to another
                    if tries >= MAX_RETRIES:
                        raise StageFailed(f"a Ray part was lost {MAX_RETRIES + 1} times: {type(e).__name__}: "
                                          f"{str(e).strip().splitlines()[0][:300]}") from None
                    again.append((i, call, tries + 1))
                    continue
                idle.append(w)
                hand_out()
                on_done(i, result)
        finally:
            for ref in busy:
                with contextlib.suppress(Exception):
                    ray.cancel(ref)  # queued: dropped; running: its worker ends it once this driver is gone


def _as_tasks(ray, fn: Callable, rest: list[tuple[int, tuple, int]], on_done: Callable[[int, Any], None], name: str) -> None:
    """The parts ``rest`` ((index, call, tries)) as tasks, reported under their own indexes."""
    if rest:
        run_tasks(ray, fn, (call for _, call, _ in rest), lambda k, result: on_done(rest[k][0], result), name=name)


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


# ---------------------------------------------------------------- warm workers: the worker's side


class WarmWorker:
    """A Ray worker process kept for the parts of any command of this code (a detached actor, see
    the module's docstring): runs one part at a time, and ends itself after ``keep_warm`` seconds
    without one, or at once when the driver of the part it runs is gone."""

    def __init__(self, keep_warm: float):
        self.keep_warm = keep_warm
        self.last = time.monotonic()  # when the last part (or warm-up) ended
        self.parts = 0  # parts run: a test's way to see a second command use the same worker
        self.driver: list | None = None  # the running part's driver object (see `WarmPool.driver`)
        self.busy = threading.Lock()  # held while a part or a warm-up runs, and while this worker ends
        threading.Thread(target=self._watch, daemon=True, name="pipe-warm-watch").start()

    def run(self, fn: Callable, call: tuple, keep_warm: float, driver: list) -> Any:
        """``fn(*call)`` (a part) for the driver that owns ``driver``; None, unrun, when it is gone."""
        with self.busy:
            self.keep_warm = keep_warm
            if not _alive(driver):
                return None
            self.driver = driver
            try:
                return fn(*call)
            finally:
                self.driver = None
                self.parts += 1
                self.last = time.monotonic()

    def ready(self, items: Items | None, part_fn: Callable | None, keep_warm: float) -> None:
        """Get ready for a stage's parts: its item pool started (the functions' modules came with
        the arguments). Not bound to its driver: what it starts serves the next command too."""
        with self.busy:
            self.keep_warm = keep_warm
            try:
                _ready(items, part_fn)
            finally:
                self.last = time.monotonic()

    def facts(self) -> dict:
        """Who this worker is: its process, its node, how many parts it ran, its item pool's process."""
        pool = _KEPT[1]._pool if _KEPT is not None else None
        return {"pid": os.getpid(), "node": node(), "parts": self.parts, "version": code_version(),
                "item_pool": sorted(getattr(pool, "_processes", None) or {})}

    def _watch(self) -> None:
        """Every `WATCH_S`: end this process at once if the running part's driver is gone (its
        parts are no one's now, as a dead job's tasks; the item pool's worker dies with it); end
        it once idle for ``keep_warm`` s, holding `busy` so that no part starts meanwhile (one
        queued by then fails as on a lost node, and its driver runs it elsewhere)."""
        import ray

        while True:
            time.sleep(WATCH_S)
            driver = self.driver
            if driver is not None:
                if not _alive(driver) and self.driver is driver:
                    os._exit(1)  # now: a part may be writing
            elif self._idle() and self.busy.acquire(blocking=False):
                if self._idle():
                    _shut_kept()
                    ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
                    time.sleep(60)  # (ray.kill ends this process)
                    os._exit(0)
                self.busy.release()

    def _idle(self) -> bool:
        return time.monotonic() - self.last >= self.keep_warm


def _alive(driver: list) -> bool:
    """Whether the driver that owns ``driver[0]`` still runs (Ray says "owner died" once it does not)."""
    import ray

    try:
        ray.get(driver[0], timeout=10)
    except ray.exceptions.OwnerDiedError:
        return False
    except ray.exceptions.RayError:
        pass  # slow, or any other trouble: not proof that the driver is gone
    return True


class _KeptPool(OrderedPool):
    """The one-worker pool of a Ray worker process, kept from one part to the next: `map` ends
    by closing its pool, and starting a worker (a fresh interpreter importing the decoders) for
    every part would cost more than a part of small items. Its worker dies with the Ray worker."""

    def close(self) -> None:
        """Kept open for the next part (`map` calls this when it ends); `shut` really closes."""

    def shut(self) -> None:
        super().close()


_KEPT: tuple[tuple, _KeptPool] | None = None
_SETTLED: bytes | None = None  # in the kept pool's worker: the settings it was last set up with


def _pool_for(items: Items) -> _KeptPool:
    """The kept pool for ``items``' function, started once per function (and preload): the
    settings (``initializer(*initargs)``) travel with every message and set the worker up again
    only when they change, so a command with another output folder or size reuses the worker."""
    global _KEPT
    key = (items.fn, items.initializer, items.preload)
    settings = pickle.dumps(items.initargs)
    fn = functools.partial(_settled, settings, items.initializer, items.initargs, items.fn)
    if _KEPT is None or _KEPT[0] != key:
        _shut_kept()
        _KEPT = (key, _KeptPool(fn, 1, initializer=_settle, initargs=(settings, items.initializer, items.initargs)))
    _KEPT[1].fn = fn
    return _KEPT[1]


def _shut_kept() -> None:
    global _KEPT
    kept, _KEPT = _KEPT, None
    if kept is not None:
        kept[1].shut()


def _settle(settings: bytes, initializer: Callable[..., None] | None, initargs: tuple) -> None:
    """In the kept pool's worker: set it up with these settings."""
    global _SETTLED
    if initializer is not None:
        initializer(*initargs)
    _SETTLED = settings


def _settled(settings: bytes, initializer: Callable[..., None] | None, initargs: tuple, fn: Callable, item: Any) -> Any:
    """In the kept pool's worker: ``fn(item)``, the worker set up with ``settings`` first if it was
    set up with others."""
    if settings != _SETTLED:
        _settle(settings, initializer, initargs)
    return fn(item)


def _items_part(items: Items, meta: Any, its: list) -> tuple[Any, PartRun]:
    """A part of items: ``items.fn`` over them in this worker's kept pool, then the part's
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
    """A whole part: the stage's function on it, its last step (`Later`) done here."""
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
