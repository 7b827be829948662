"""Start the fork server `OrderedPool`'s workers fork from, as early as a command can.

`pipe clean` calls `warm_up` first thing, before it imports anything else (the command line, the
stage, the executor itself): the server's own imports (numpy, the decoders) are the longest part
of its start-up, and they only overlap the rest of it from the moment the server is started.
So this module imports only what starting it needs (multiprocessing), not the executor
(concurrent.futures, typing: ~15-50 ms more before the server could start).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from collections.abc import Sequence

LIFELINE = "pipeline.core.lifeline"  # the first module the server imports (see that module)


def single_threaded_workers() -> None:
    """One worker per core, so no thread pools inside them: OpenBLAS (numpy) would start one
    thread per core in each worker, and its import is ~30% faster without them. Set before a
    worker or the fork server starts: they take the environment of that moment."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def server_context(preload: Sequence[str]):
    """The fork-server context with ``preload`` registered, or None where workers are spawned
    (no preload asked for, not Linux, or no fork server in this Python)."""
    if not preload or not sys.platform.startswith("linux") or "forkserver" not in mp.get_all_start_methods():
        return None
    single_threaded_workers()
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([LIFELINE, *preload])
    return ctx


def warm_up(preload: Sequence[str]) -> None:
    """Start the fork server now, importing ``preload`` (the modules the workers run), so that
    its start-up overlaps what the caller still has to do (parse its command line, import its
    stage, discover the input): the first worker then forks from it ready to work. Call it from
    the main thread (the server dies with the thread that started it); off Linux it does nothing."""
    if server_context(preload) is not None:
        from multiprocessing import forkserver

        forkserver.ensure_running()
