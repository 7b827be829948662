"""The ordered pool: results in input order; a worker crash is pinned on one item."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.executor import OrderedPool
from tests.conftest import pipe_env


def square(x: int) -> int:
    return x * x


def crash_on_seven(x: int) -> int:
    if x == 7:
        os._exit(139)  # what a segfaulting decoder looks like from outside
    return x


# workers spawned, and forked from a fork server that imported the modules named (pipe clean's way)
HOW = pytest.mark.parametrize("preload", [(), ("json",)], ids=["spawn", "forkserver"])


@HOW
def test_results_in_input_order(preload):
    pool = OrderedPool(square, workers=2, preload=preload)
    assert list(pool.map(range(50), on_crash=lambda i, e: -1, window=5)) == [i * i for i in range(50)]


@HOW
def test_crash_is_isolated_to_its_item(preload):
    pool = OrderedPool(crash_on_seven, workers=2, preload=preload)
    out = list(pool.map(range(12), on_crash=lambda i, e: ("crashed", i), window=4))
    assert out == [0, 1, 2, 3, 4, 5, 6, ("crashed", 7), 8, 9, 10, 11]


def test_workers_of_the_pipe_script_do_not_rerun_it(tmp_path):
    # the `pipe` console script is a file run as __main__; spawned workers re-run such a file
    # first (importing the whole CLI) unless cli.main says it is pipeline's __main__
    script = tmp_path / "pipe"
    script.write_text(
        "import sys\n"
        "from pipeline.cli import app as cli\n"
        "if __name__ == '__main__':\n"
        "    if sys.argv[1] == 'as-main':\n"
        "        cli._workers_skip_the_script()\n"
        "    from pipeline.core.executor import OrderedPool\n"
        "    probe = \"'pipeline.cli.app' in __import__('sys').modules\"\n"
        "    print(list(OrderedPool(eval, 1).map([probe], on_crash=lambda item, e: None)))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[3]))
    runs = {how: subprocess.run([sys.executable, str(script), how], env=env, capture_output=True, text=True, check=True)
            for how in ("as-main", "plain")}
    assert runs["as-main"].stdout.strip() == "[False]", runs["as-main"].stderr
    assert runs["plain"].stdout.strip() == "[True]"  # what it guards against


def hang_on_three(x: int) -> int:
    import time

    if x == 3:
        time.sleep(3600)
    return x


@pytest.mark.slow
@HOW
def test_a_stuck_item_times_out_and_the_rest_complete(preload):
    import time

    pool = OrderedPool(hang_on_three, workers=2, preload=preload)
    t = time.monotonic()
    out = list(pool.map(range(8), on_crash=lambda i, e: ("crashed", i), window=4, timeout=2,
                        on_timeout=lambda i, s: ("timeout", i)))
    assert out == [0, 1, 2, ("timeout", 3), 4, 5, 6, 7]
    assert time.monotonic() - t < 30


def test_a_worker_whose_caller_died_while_it_started_exits_at_once():
    # A caller SIGKILLed while its worker was still importing is gone when the worker's start-up
    # runs: the worker, adopted by a reaper that never dies, must not wait for work forever (the
    # kill test saw two such orphans). The caller's pid comes from the caller, not from getppid().
    code = "from pipeline.core.executor import _start_worker; _start_worker(1, None, ()); print('kept running')"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=pipe_env())
    assert p.returncode == 1 and "kept running" not in p.stdout, (p.returncode, p.stdout, p.stderr)



@HOW
def test_batches_keep_input_order_and_single_items_between_them(preload):
    # batch: runs of consecutive batchable items go to a worker in one message (pipe clean's small files)
    pool = OrderedPool(square, workers=2, preload=preload)
    out = list(pool.map(range(60), on_crash=lambda i, e: -1, window=3, batch=4, batchable=lambda x: x % 7 != 0))
    assert out == [i * i for i in range(60)]


@HOW
def test_a_crash_in_a_batch_is_pinned_on_its_item(preload):
    pool = OrderedPool(crash_on_seven, workers=2, preload=preload)
    out = list(pool.map(range(20), on_crash=lambda i, e: ("crashed", i), window=2, batch=4, batchable=lambda x: True))
    assert out == [*range(7), ("crashed", 7), *range(8, 20)]


@pytest.mark.slow
@HOW
def test_a_stuck_item_in_a_batch_times_out_alone_and_its_batch_completes(preload):
    import time

    pool = OrderedPool(hang_on_three, workers=2, preload=preload)
    t = time.monotonic()
    out = list(pool.map(range(12), on_crash=lambda i, e: ("crashed", i), window=2, timeout=2,
                        on_timeout=lambda i, s: ("timeout", i), batch=4, batchable=lambda x: True))
    assert out == [0, 1, 2, ("timeout", 3), *range(4, 12)]
    assert time.monotonic() - t < 40


def logged_square(item: tuple[str, int]) -> int:
    """Squares, each call logged in the file named (the workers are other processes)."""
    log, x = item
    with open(log, "a") as f:
        f.write(f"{x}\n")
    return x * x


@HOW
def test_items_started_ahead_are_the_maps_first_and_run_once(tmp_path, preload):
    log = str(tmp_path / "calls")
    pool = OrderedPool(logged_square, workers=2, preload=preload).start()
    pool.ahead([(log, 3), (log, 4)])
    items = [(log, x) for x in (3, 4, 5, 6)]
    assert list(pool.map(items, on_crash=lambda i, e: -1, timeout=60, on_timeout=lambda i, s: -2)) == [9, 16, 25, 36]
    assert sorted(Path(log).read_text().split()) == ["3", "4", "5", "6"]


@HOW
def test_items_started_ahead_that_do_not_come_first_are_dropped(tmp_path, preload):
    import time

    pool = OrderedPool(hang_on_three, workers=1, preload=preload)
    pool.ahead([3])  # it never ends: dropped all the same (its worker killed), not waited for
    t = time.monotonic()
    assert list(pool.map([4, 5], on_crash=lambda i, e: -1)) == [4, 5]
    pool.ahead([4, 3])  # the first taken, the second not its map's: the first is run again in the new pool
    assert list(pool.map([4, 6], on_crash=lambda i, e: -1)) == [4, 6]
    pool.ahead([3])
    assert list(pool.map([], on_crash=lambda i, e: -1)) == []  # nothing to map: the worker busy ahead ends
    assert time.monotonic() - t < 30
