"""Run code on real gloo ranks (separate processes, spawned) and collect what each returns.

Each rank gets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT as torchrun gives them,
so code under test joins the group the way it does in production (`train.distributed.group.setup`).

Starting a rank costs a torch import (seconds on a busy 2-core CI machine), so the multi-rank
checks of every test module run as *scenarios* in one shared 2-rank world: `scenario_results`
spawns it once per test session and runs every function in ``SCENARIOS`` in turn, each in a
fresh process group on its own port (or, for ``SELF_MANAGED`` ones like `train.loop.run`, letting
the function join and leave the group itself). Tests then assert on their scenario's results.
A rank that raises fails the run with its traceback; a run that outlives its timeout is killed
(a hang is a failure, not a stuck CI job).
"""

from __future__ import annotations

import atexit
import functools
import importlib
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

WORLD = 2
# "module:function" run on every rank as fn(d, workdir) inside a process group ...
SCENARIOS = [
    "tests.train.distributed.test_group:accumulation_scenario",
    "tests.train.distributed.test_group:unfreeze_scenario",
    "tests.train.distributed.test_preflight:mismatch_scenario",
    "tests.train.models.test_vision:bn_unfreeze_scenario",
    "tests.train.objectives.test_losses:global_batch_scenario",
]
# ... or as fn(workdir), joining the group itself (the training loop does)
SELF_MANAGED = [
    "tests.train.components.test_monitor:drift_scenario",
    "tests.train.test_loop:reference_run_scenario",
]


def tiny_model() -> torch.nn.Module:
    """The built-in image model, small and seeded: what the distributed scenarios train."""
    from train.models.builtin import build_model

    torch.manual_seed(0)
    return build_model("image", 3, width=8, resolution=16)


def random_batch(n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` seeded 16x16 images and labels of 3 classes, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 3, (n,), generator=g)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _resolve(spec: str):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _entry(rank: int, world: int, ports: list[int], workdir: str, specs: list[str], self_managed: set[str]) -> None:
    from train.distributed import group as distributed

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    results = {}
    for spec, port in zip(specs, ports):
        os.environ["MASTER_PORT"] = str(port)
        fn = _resolve(spec)
        scratch = Path(workdir) / spec.replace(":", ".")
        scratch.mkdir(exist_ok=True)
        if spec in self_managed:
            results[spec] = fn(scratch)
            continue
        d = distributed.setup("gloo")
        ok = False
        try:
            results[spec] = fn(d, scratch)
            ok = True
        finally:
            distributed.teardown(d, ok)
    torch.save(results, Path(workdir) / f"rank{rank}.pt")


def run_world(specs: list[str], self_managed: set[str], workdir: Path, world: int = WORLD, timeout: float = 240.0) -> list[dict]:
    """{spec: result} per rank, in rank order."""
    ports = [free_port() for _ in specs]
    ctx = mp.start_processes(_entry, args=(world, ports, str(workdir), specs, self_managed), nprocs=world,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"{world} gloo ranks still running after {timeout:.0f}s (a hang?)")
    return [torch.load(workdir / f"rank{r}.pt", weights_only=False) for r in range(world)]


@functools.cache
def _shared_world() -> tuple[str, list[dict]]:
    workdir = Path(tempfile.mkdtemp(prefix="pipe-gloo-"))
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    return str(workdir), run_world(SCENARIOS + SELF_MANAGED, set(SELF_MANAGED), workdir)


def scenario_results(fn) -> tuple[list, Path]:
    """The results of scenario ``fn`` on each rank, and its scratch folder (shared world, run once)."""
    spec = f"{fn.__module__}:{fn.__name__}"  # pytest's importlib mode names modules by their path: tests.train.X
    assert spec in SCENARIOS + SELF_MANAGED, f"register {spec} in tests/gloo.py"
    workdir, ranks = _shared_world()
    return [r[spec] for r in ranks], Path(workdir) / spec.replace(":", ".")
