"""The local executor's whole parts: many of them are shared with a helper process, each run
and reported once, whatever process ran it."""

from __future__ import annotations

import os

import pytest

from pipeline.executors import local
from pipeline.executors.local import LocalExecutor
from tests import fake_stage


def run_parts(workers: int, calls) -> dict[int, tuple[int, int]]:
    got: dict[int, tuple[int, int]] = {}

    def done(i, value, run):
        assert i not in got and run is None
        got[i] = value

    LocalExecutor(workers=workers).run_parts(fake_stage.shared_part, calls, done)
    return got


def test_many_whole_parts_are_shared_with_a_helper_and_each_reported_once(tmp_path):
    calls = [(k, os.getpid(), str(tmp_path)) for k in range(400)]  # a list: its length is the hint
    got = run_parts(2, calls)
    assert sorted(got) == list(range(400)) and all(got[i][0] == i for i in got)
    ran = {pid for _, pid in got.values()}
    assert os.getpid() in ran and len(ran) == 2  # this process and one helper
    assert sorted(int(p.name) for p in tmp_path.iterdir()) == sorted(k for k, pid in got.values() if pid != os.getpid())


@pytest.mark.parametrize("workers, count, hint", [(1, local.SHARED_PARTS, True), (2, local.SHARED_PARTS - 1, True),
                                                  (2, local.SHARED_PARTS, False)])
def test_one_worker_few_parts_or_no_count_run_here_alone(tmp_path, workers, count, hint):
    calls = [(k, os.getpid(), str(tmp_path)) for k in range(count)]
    got = run_parts(workers, calls if hint else (c for c in calls))  # a generator: no length hint, no helpers
    assert {pid for _, pid in got.values()} == {os.getpid()} and sorted(got) == list(range(count))


def test_a_part_that_fails_in_a_helper_fails_the_run(tmp_path):
    (tmp_path / "file").write_text("")
    calls = [(k, os.getpid(), str(tmp_path / "file")) for k in range(400)]  # a helper cannot write into a file
    with pytest.raises(NotADirectoryError):
        run_parts(2, calls)
