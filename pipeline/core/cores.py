"""How many CPU cores this process may use: the one count every stage's ``--workers 0`` and
`pipe doctor` rely on.

``os.cpu_count()`` is the host's cores; the affinity mask (taskset, cpusets) may allow fewer,
and a container's CPU quota (``docker --cpus=2``, a Kubernetes limit) fewer still while the
mask shows every core of the host. Starting a worker per host core under a quota of two makes
64 processes share two cores' time: slower than two workers, and 32 times the memory.
"""

from __future__ import annotations

import os
from pathlib import Path

CGROUP_ROOT = "/sys/fs/cgroup"


def available_cores() -> int:
    """CPUs this process may use: its affinity mask, capped by a container's CPU quota (cgroups)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    quota = cgroup_cpu_quota(CGROUP_ROOT)
    return max(1, min(n, int(quota + 0.999))) if quota else n


def worker_count(requested: int) -> int:
    """The processes a ``--workers`` value means: the number given, or 0 for every available core."""
    return requested or available_cores()


def cgroup_cpu_quota(root: str = CGROUP_ROOT) -> float | None:
    """CPUs allowed by a cgroup quota (``docker --cpus``, Kubernetes limits); None when unlimited."""
    try:
        quota, period = Path(root, "cpu.max").read_text().split()[:2]  # cgroup v2: "200000 100000" or "max 100000"
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int(Path(root, "cpu", "cpu.cfs_quota_us").read_text())  # cgroup v1; -1: unlimited
        period_us = int(Path(root, "cpu", "cpu.cfs_period_us").read_text())
        return quota_us / period_us if quota_us > 0 else None
    except (OSError, ValueError):
        return None
