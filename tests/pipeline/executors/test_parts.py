"""Parts: the planner cuts any stage's items into contiguous ranges, every item exactly once, in
order, the same way every time (a stage's own part results: tests/pipeline/clean/test_parts.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pipeline.executors import parts


@given(st.integers(0, 500), st.integers(1, 60))
def test_cut_covers_every_item_once_in_order(n, max_files):
    ranges = parts.cut(n, max_files)
    flat = [i for b, e in ranges for i in range(b, e)]
    assert flat == list(range(n))
    assert all(0 < e - b <= max_files for b, e in ranges)
    assert ranges == parts.cut(n, max_files)  # deterministic


@given(st.lists(st.integers(0, 1000), max_size=300), st.integers(1, 50), st.integers(1, 3000))
def test_cut_by_bytes_keeps_parts_under_the_limit_unless_one_item_is_larger(sizes, max_files, max_bytes):
    ranges = parts.cut(len(sizes), max_files, sizes, max_bytes)
    assert [i for b, e in ranges for i in range(b, e)] == list(range(len(sizes)))
    for b, e in ranges:
        assert e - b <= max_files
        assert sum(sizes[b:e]) <= max_bytes or e - b == 1
