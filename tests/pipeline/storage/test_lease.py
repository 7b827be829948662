"""One run at a time into an object-store output whose server ignores conditional writes
(rclone's does; moto honours them): the probe tells the two apart, and on rclone two real pipe
clean runs into one prefix no longer both exit 0: the second stops with the busy line, exit 1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.core.errors import StageFailed
from pipeline.storage import lease as leases
from pipeline.storage import open_folder
from tests.conftest import pipe_env
from tests.factories import photo


def test_the_probe_tells_a_server_that_ignores_if_none_match_from_one_that_honours_it(
        s3_server, moto_conditional_server, monkeypatch):
    s3_server.setenv(monkeypatch)
    rclone = open_folder(s3_server.make_bucket("probe") + "/out")
    assert leases.honours_conditional_writes(rclone) is False
    assert rclone.list() == []  # the probe leaves nothing
    moto_conditional_server.setenv(monkeypatch)
    moto = open_folder(moto_conditional_server.make_bucket("probe") + "/out")
    assert leases.honours_conditional_writes(moto) is True
    assert moto.list() == []


@pytest.fixture
def quick(monkeypatch):
    """Leases renewed and watched in fractions of a second (the same code, shorter times)."""
    monkeypatch.setattr(leases, "RENEW_S", 0.3)
    monkeypatch.setattr(leases, "POLL_S", 0.1)


def test_a_held_lease_keeps_a_second_run_out_and_goes_with_its_run(s3_server, monkeypatch, quick):
    s3_server.setenv(monkeypatch)
    out = open_folder(s3_server.make_bucket("lease") + "/held")
    with out.lock("pipe clean"):
        assert [e.rel.split("/")[:2] for e in out.list()] == [[".pipe", "lease"]]
        assert not out.occupied()  # a claim is no content: the run's own claim check passes
        with pytest.raises(StageFailed, match=r"is being written by another run \(pipe clean on .*, pid \d+, holds "
                                              r"its lease \.pipe/lease/\w+\); wait for it .* for this pipe shard$"):
            with open_folder(out.url).lock("pipe shard"):
                pass
        assert len(out.list()) == 1  # the second run's claim went with it
        out.commit("manifest.parquet", b"mine")  # still held: it commits
    assert [e.rel for e in out.list()] == ["manifest.parquet"]


def test_a_lease_left_by_a_dead_run_is_taken_over(s3_server, monkeypatch, quick, capfd):
    """Judged by renewals seen, not by the server's clock: rclone (--no-modtime) says every object
    was modified at the time of the listing."""
    s3_server.setenv(monkeypatch)
    monkeypatch.setattr(leases, "STALE_S", 1.5)
    out = open_folder(s3_server.make_bucket("lease") + "/stale")
    out.write(f"{leases.LEASES}/deadrun", b'{"tool": "pipe clean", "host": "gone", "pid": 1}')
    started = time.monotonic()
    with out.lock("pipe clean"):
        assert time.monotonic() - started >= 1.5
        assert "deadrun" not in {e.rel.rsplit("/", 1)[-1] for e in out.list()}
    assert out.list() == []
    assert "has not been renewed" in capfd.readouterr().err


def test_a_run_taken_over_while_stopped_does_not_commit(s3_server, monkeypatch):
    s3_server.setenv(monkeypatch)
    out = open_folder(s3_server.make_bucket("lease") + "/taken")
    with out.lock("pipe clean"):
        mine = next(e.rel for e in out.list())
        out.delete(mine)  # what a run that found it stale did
        with pytest.raises(StageFailed, match="another run took this output over"):
            out.commit("manifest.parquet", b"late")
    assert not out.exists("manifest.parquet")


def _wait_for_staging(tmpdir: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while not list(tmpdir.glob("pipe-clean-*")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)


@pytest.mark.slow
def test_two_cleans_into_one_prefix_on_a_server_that_ignores_conditional_writes(s3_server, tmp_path, monkeypatch):
    """The attack: two real pipe clean runs into one s3:// output on rclone. Both exited 0 and the
    manifest held one run's rows over the other's files; now the second stops (exit 1, one line,
    nothing of it left) and the first commits. The first is paused once it holds the output, until
    the second has made its claim and a renewal of the first's is due, so they surely meet."""
    s3_server.setenv(monkeypatch)
    raw = tmp_path / "raw"
    # enough work that the first is still running well after it resumes (it renews its lease at once,
    # and the second looks every POLL_S): 40 photos took 1.1 s on a quiet machine, within one look
    for i in range(240):
        photo(raw / "cats" / f"{i}.jpg", 640, 480, seed=i)
    url = s3_server.make_bucket("lease") + "/race"
    env = {**pipe_env(), **s3_server.env}
    (tmp_path / "a").mkdir()
    argv = [sys.executable, "-m", "pipeline", "clean", str(raw), "-o", url, "--workers", "1"]
    first = subprocess.Popen(argv, env={**env, "TMPDIR": str(tmp_path / "a")}, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for_staging(tmp_path / "a", first)
    os.kill(first.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        second = subprocess.Popen(argv, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        claims = open_folder(url).child(leases.LEASES)
        while len(claims.list()) < 2:
            assert second.poll() is None, second.communicate()
            time.sleep(0.02)
        time.sleep(max(0.5, leases.RENEW_S + 0.5 - (time.monotonic() - stopped)))
    finally:
        os.kill(first.pid, signal.SIGCONT)
    _, err = second.communicate(timeout=300)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert second.returncode == 1 and len(lines) == 1, err
    assert f"{url} is being written by another run (pipe clean on" in lines[0] and "for this pipe clean" in lines[0]
    assert first.wait(timeout=300) == 0, first.communicate()
    after = {e.rel for e in open_folder(url).list()}
    assert "manifest.parquet" in after
    assert not [rel for rel in after if rel.startswith((leases.LEASES, leases.PROBE))]  # the runs took theirs along
