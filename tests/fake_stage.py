"""A trivial stage for the executor tests: a plan of parts of numbers, a pure function per item
(its square; -1 kills its worker process, as a hostile file kills a decoder), a part's finish
(the results and their sum) and a pure function per whole part. Module-level functions, so they
travel to worker processes and Ray nodes by name."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pipeline.executors import Items, Later

PARTS = [("a", [1, 2, 3]), ("b", [4, -1, 5]), ("c", []), ("d", [6])]


def square(x: int) -> int:
    if x == -1:
        os._exit(1)  # the worker dies on this item: the executor must pin it on this item alone
    return x * x


def crashed(x: int, exc: BaseException) -> str:
    return f"crashed on {x}"


def finish(meta: str, results: list) -> dict:
    return {"part": meta, "results": results, "sum": sum(r for r in results if isinstance(r, int))}


def total(name: str, numbers: list[int]) -> Later:
    """A whole part whose last step is left for later (as a shard's sync and rename are)."""
    value = {"part": name, "total": sum(numbers)}
    return Later(value, lambda: value.update(finished=True))


def slow(marker: str, seconds: float) -> str:
    """A whole part that takes ``seconds`` and then leaves the file ``marker``: whether a part
    outlives its driver shows."""
    time.sleep(seconds)
    Path(marker).write_text("done")
    return marker


def shared_part(k: int, caller: int, folder: str) -> tuple[int, int]:
    """A whole part that says which process ran it. Run by another process than ``caller`` it
    leaves a file in ``folder``; run by the caller, it takes 10 ms until such a file is there, so
    that helpers still starting find parts left to take."""
    if os.getpid() != caller:
        Path(folder, str(k)).write_text("")
    elif not (Path(folder).is_dir() and any(Path(folder).iterdir())):
        time.sleep(0.01)
    return k, os.getpid()


ITEMS = Items(square, crashed, finish=finish, name="fake_part")


def run(executor) -> dict:
    """The fake stage's results on ``executor``, in part order, as plain data."""
    by_part: dict[int, object] = {}
    whole: dict[int, object] = {}
    with executor.session(items=ITEMS):
        executor.map_parts(ITEMS, PARTS, lambda i, value, run: by_part.__setitem__(i, value), progress=False)
        executor.run_parts(total, [(name, numbers) for name, numbers in PARTS], lambda i, value, run: whole.__setitem__(i, value))
    return {"items": [by_part[i] for i in range(len(PARTS))], "whole": [whole[i] for i in range(len(PARTS))]}


EXPECTED = {
    "items": [{"part": "a", "results": [1, 4, 9], "sum": 14},
              {"part": "b", "results": [16, "crashed on -1", 25], "sum": 41},
              {"part": "c", "results": [], "sum": 0},
              {"part": "d", "results": [36], "sum": 36}],
    "whole": [{"part": "a", "total": 6, "finished": True}, {"part": "b", "total": 8, "finished": True},
              {"part": "c", "total": 0, "finished": True}, {"part": "d", "total": 6, "finished": True}],
}
