"""Seeded random generators: one way to turn the operator's ``--seed`` into a generator.

Each use (the split, the shuffle of a split, an epoch's shard order, ...) takes its own stream,
named by a few integers after the seed, so adding a draw to one use never shifts another's, and
the same seed gives the same split, shards and data order on every machine (numpy's
``SeedSequence`` mixes the integers; ``PCG64`` draws the same numbers on every platform).
"""

from __future__ import annotations

import numpy as np


def rng_for(seed: int, *stream: int) -> np.random.Generator:
    """A generator for one purpose, identified by ``stream``, derived from the user's ``seed``."""
    return np.random.default_rng(np.random.SeedSequence([seed, *stream]))
