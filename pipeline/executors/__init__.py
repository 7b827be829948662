"""Who runs a stage's parts: the executor, chosen once at the command line (`get`) and handed to
the stage's run. Executors know no stage and stages never ask which executor runs them.

A stage is a plan of parts and a pure function per part: `Executor.run_parts` runs ``fn(*call)``
for each part (pipe shard: one shard each), or, for work made of many small items,
`Executor.map_parts` runs a per-item function (`Items`) over every item of each part and the
part's ``finish`` over its results where the part ran (pipe clean: a file each, then the part's
results file). Results come back to the caller as each part ends.

`EXECUTORS` is the one table of executors: ``--executor``'s choices and help come from it. Ray is
imported only by `pipeline.executors.ray`, and only when a Ray executor runs.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pipeline.core.errors import UsageError

# name -> (module:class, what it is, what it needs installed, or "")
EXECUTORS: dict[str, tuple[str, str, str]] = {
    "local": ("pipeline.executors.local:LocalExecutor", "a process pool on this machine", ""),
    "ray": ("pipeline.executors.ray:RayExecutor", "a Ray cluster, in parts", "ray"),
}
INSTALL = {"ray": "pip install 'pipe-ml[ray]'"}  # the extra each optional executor's package comes with
HELP = "; ".join(f"{name}: {what}" + (f" ({INSTALL[need]})" if need else "") for name, (_, what, need) in EXECUTORS.items())
KEEP_WARM_S = 600.0  # how long a cluster's warm workers wait for the next command, unless --ray-keep-warm says


def address_setting() -> Any:
    """The ``ray_address`` field of every stage's Config that runs on an executor: declared here,
    once, like `keep_warm_setting`."""
    from pipeline.core.settings import setting

    return setting("auto", "The Ray cluster for --executor ray: auto (the one started on this machine, or "
                           "RAY_ADDRESS; the run names the cluster, its nodes and CPUs before the first part), local "
                           "(a private cluster on this machine for this command alone) or HOST:PORT.",
                   schema={"type": "string", "minLength": 1})


def keep_warm_setting() -> Any:
    """The ``ray_keep_warm`` field of every stage's Config that runs on an executor: declared here,
    once (a dataclass field cannot be shared, so each Config calls this)."""
    from pipeline.core.settings import setting

    return setting(KEEP_WARM_S, "Seconds the Ray cluster's warm workers (imports done, decoders started) wait for "
                                "the next command's parts before they end themselves; 0 = none: each part is a "
                                "one-CPU Ray task in processes that end with the command. Warm workers hold no CPU "
                                "in Ray's books, so on a cluster shared with other work prefer 0.",
                   minimum=0, unit="seconds")


@dataclass(frozen=True)
class PartRun:
    """What a summary says about one part that ran: where and how long (absent when reused)."""

    part: str
    files: int
    seconds: float
    node: str

    def as_dict(self) -> dict:
        return {"part": self.part, "files": self.files, "seconds": round(self.seconds, 3), "node": self.node}


@dataclass(frozen=True)
class Items:
    """A stage's per-item work inside its parts, every function a module-level one (it travels
    to other processes and machines by name): ``fn(item)`` in a worker process set up by
    ``initializer(*initargs)``, an item that crashes its worker twice -> ``on_crash(item, exc)``,
    one that runs past ``timeout`` s -> ``on_timeout(item, seconds)``; up to ``batch`` items that
    ``batchable`` accepts go to a worker in one message. ``start(meta)`` runs before a part's
    items and ``finish(meta, results)`` after them, where the part ran; what ``finish`` returns
    is what the caller gets. ``name`` names a part's task; ``preload``: modules a worker imports."""

    fn: Callable[[Any], Any]
    on_crash: Callable[[Any, BaseException], Any]
    initializer: Callable[..., None] | None = None
    initargs: tuple = ()
    timeout: float | None = None
    on_timeout: Callable[[Any, float], Any] | None = None
    batch: int = 1
    batchable: Callable[[Any], bool] | None = None
    start: Callable[[Any], None] | None = None
    finish: Callable[[Any, list], Any] | None = None
    name: str = "part"
    preload: tuple[str, ...] = field(default=())

    def pool_key(self) -> tuple:
        """What a worker process is made ready for: two Items of one key can share workers."""
        return (self.fn, self.initializer, self.initargs, self.preload)

    def run_finish(self, meta: Any, results: list) -> Any:
        return self.finish(meta, results) if self.finish is not None else results


@dataclass
class Later:
    """A part's result whose last step only waits on a disk (a sync and a rename): ``finish()``
    completes it, ``discard()`` drops it. An executor may run that step while the next part works."""

    value: Any
    finish: Callable[[], None]
    discard: Callable[[], None] = lambda: None

    def done(self) -> Any:
        self.finish()
        return self.value


OnPart = Callable[[int, Any, "PartRun | None"], None]


class Executor(Protocol):
    name: str

    def session(self, items: Items | None = None, part_fn: Callable | None = None,
                warm: bool = True) -> contextlib.AbstractContextManager[None]:
        """The stage's whole run: workers made ready (for ``items``, or to run ``part_fn``) while
        the stage lists and plans, when ``warm``; everything ended with the block."""

    def part_size(self, requested: int) -> int:
        """Items in one part: a part is what a killed run does again at most."""

    def ahead(self, items: Items, first: Sequence[Any]) -> None:
        """``items.fn`` started now on each of ``first``, where a warm session's workers can (else
        nothing): the stage found them first and will most likely hand them to `map_parts` first,
        in this order, once it has listed and planned the rest; `map_parts` then takes those
        results. From the first that does not come in its place on, the work is dropped (what it
        wrote, the stage must tolerate)."""

    def map_parts(self, items: Items, parts: Sequence[tuple[Any, Sequence[Any]]], on_part: OnPart,
                  on_item: Callable[[Any], None] | None = None, progress: bool = True) -> None:
        """``items.fn`` over every item of every part (``(meta, items)``); ``on_part(i, finish's
        value, run)`` as part ``i`` ends; ``on_item(result)`` for each item where the results
        pass through the caller one by one (not every executor does); ``progress``: whether it
        may say how far it is (beside the stage's own bar)."""

    def run_parts(self, fn: Callable[..., Any], calls: Iterable[tuple], on_done: OnPart) -> None:
        """``fn(*call)`` for every call (a part each); ``on_done(i, value, run)`` as each ends (a
        `Later`'s last step done). Calls are taken from ``calls`` only as parts are handed out."""

    def summary(self, **facts: Any) -> dict | None:
        """What a stage's report says about how its parts ran, or None where there is nothing to say."""


def require(name: str) -> None:
    """Refuse an unknown executor, and one whose package is not installed, in one sentence."""
    if name not in EXECUTORS:
        raise UsageError(f"--executor must be one of {', '.join(EXECUTORS)}, got {name!r}")
    need = EXECUTORS[name][2]
    if need and importlib.util.find_spec(need) is None:
        raise UsageError(f"--executor {name} needs {need.capitalize()}, which is not installed: {INSTALL[need]}")


def get(name: str, *, address: str = "auto", workers: int = 0, keep_warm: float = KEEP_WARM_S) -> Executor:
    """The executor ``name`` (`EXECUTORS`): ``workers`` for a pool on this machine (0: a core
    each), ``address`` for a cluster to join, ``keep_warm`` for how long its workers wait for
    the next command (`keep_warm_setting`)."""
    require(name)
    module, _, cls = EXECUTORS[name][0].partition(":")
    return getattr(importlib.import_module(module), cls)(address=address, workers=workers, keep_warm=keep_warm)
