"""The learning-rate schedule: linear warmup, then a cosine down to the floor."""

from __future__ import annotations

import pytest

from train.components.optimizer import WarmupCosine


def test_warmup_then_cosine():
    f = WarmupCosine(total=100, warmup=10, floor=0.1)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(55) == pytest.approx(0.55) and f(100) == pytest.approx(0.1)
    assert all(f(s) >= f(s + 1) for s in range(10, 120))
