"""Which executor runs a stage's per-item work: `local` (a process pool, the default, nothing to
install) or `ray` (a Ray cluster, the optional extra). Ray is never imported here: a local run
must not pay for it, or need it installed."""

from __future__ import annotations

import importlib.util

from pipeline.core.errors import UsageError

EXECUTORS = ("local", "ray")
INSTALL_RAY = "pip install 'pipe-ml[ray]'"


def require(executor: str) -> None:
    """Refuse an unknown executor, and `ray` where Ray is not installed, in one sentence."""
    if executor not in EXECUTORS:
        raise UsageError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    if executor == "ray" and importlib.util.find_spec("ray") is None:
        raise UsageError(f"--executor ray needs Ray, which is not installed: {INSTALL_RAY}")
