"""Fixtures for the training tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread, as each rank of a launched run gets, from the module's fixtures on: on a
    shared 2-core machine two OpenMP threads spin against the other processes and a step takes
    10-20x longer. Modules that train in-process ask for it with ``usefixtures("one_thread")``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(before)
