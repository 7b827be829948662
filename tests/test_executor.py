"""The ordered pool: results in input order; a worker crash is pinned on one item."""

import os

from pipeline.executor import OrderedPool


def square(x: int) -> int:
    return x * x


def crash_on_seven(x: int) -> int:
    if x == 7:
        os._exit(139)  # what a segfaulting decoder looks like from outside
    return x


def test_results_in_input_order():
    pool = OrderedPool(square, workers=2)
    assert list(pool.map(range(50), on_crash=lambda i, e: -1, window=5)) == [i * i for i in range(50)]


def test_crash_is_isolated_to_its_item():
    pool = OrderedPool(crash_on_seven, workers=2)
    out = list(pool.map(range(12), on_crash=lambda i, e: ("crashed", i), window=4))
    assert out == [0, 1, 2, 3, 4, 5, 6, ("crashed", 7), 8, 9, 10, 11]


def hang_on_three(x: int) -> int:
    import time

    if x == 3:
        time.sleep(3600)
    return x


def test_a_stuck_item_times_out_and_the_rest_complete():
    import time

    pool = OrderedPool(hang_on_three, workers=2)
    t = time.monotonic()
    out = list(pool.map(range(8), on_crash=lambda i, e: ("crashed", i), window=4, timeout=2,
                        on_timeout=lambda i, s: ("timeout", i)))
    assert out == [0, 1, 2, ("timeout", 3), 4, 5, 6, 7]
    assert time.monotonic() - t < 30
