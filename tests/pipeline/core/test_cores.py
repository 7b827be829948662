"""Core counting: `--workers 0` and `pipe doctor` count the cores a container's quota allows,
not the host's (under `docker --cpus=2` on a 64-core host, 2 workers, not 64)."""

import os

import pytest

from pipeline.core import cores


@pytest.fixture
def host_with_64_cores(monkeypatch, tmp_path):
    """This process may run on 64 cores (its affinity mask); the cgroup files live in tmp_path."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    monkeypatch.setattr(cores, "CGROUP_ROOT", str(tmp_path))
    return tmp_path


def test_cgroup_cpu_quota(tmp_path):
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    assert cores.cgroup_cpu_quota(str(tmp_path)) == 2.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cores.cgroup_cpu_quota(str(tmp_path)) is None


def test_cgroup_v1_quota(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("150000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cores.cgroup_cpu_quota(str(tmp_path)) == 1.5
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cores.cgroup_cpu_quota(str(tmp_path)) is None


def test_a_cpu_quota_caps_the_affinity_mask(host_with_64_cores):
    (host_with_64_cores / "cpu.max").write_text("200000 100000\n")  # docker --cpus=2
    assert cores.available_cores() == 2
    assert cores.worker_count(0) == 2
    assert cores.worker_count(5) == 5  # a number given is the operator's to choose
    (host_with_64_cores / "cpu.max").write_text("250000 100000\n")  # --cpus=2.5: a third core, part-time
    assert cores.available_cores() == 3


def test_without_a_quota_every_core_of_the_mask_counts(host_with_64_cores):
    assert cores.available_cores() == 64
    (host_with_64_cores / "cpu.max").write_text("max 100000\n")
    assert cores.available_cores() == 64
