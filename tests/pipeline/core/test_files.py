"""core/files.py's output lock: every command whose output folder another run is writing says so
in the same one line and exits 1 (`output_busy`), with two real runs meeting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.clean_dirs import make_clean_dir, simple_specs
from tests.conftest import pipe_env
from tests.factories import photo


def _start(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pipeline", *map(str, args)], env=pipe_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _pause_once_it_holds_the_folder(proc: subprocess.Popen, out: Path) -> None:
    """SIGSTOP the run once it has its staging folder (made after the lock and the claim)."""
    deadline = time.monotonic() + 300
    while not list((out / ".pipe").glob("staging-*")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGSTOP)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["clean", "shard"])
def test_a_second_run_into_a_busy_output_exits_1_in_one_line_whatever_the_command(tmp_path, command):
    if command == "clean":
        src = tmp_path / "raw"
        for i in range(24):
            photo(src / "cats" / f"{i}.jpg", seed=i, size=(640, 480))
        flags = ["--workers", "1"]
    else:
        src = make_clean_dir(tmp_path / "clean", simple_specs(60, classes=3))
        flags = ["--workers", "1", "--max-count", "2"]
    out = tmp_path / "out"
    first = _start(command, src, "-o", out, *flags)
    try:
        _pause_once_it_holds_the_folder(first, out)
        second = subprocess.run([sys.executable, "-m", "pipeline", command, src, "-o", out, *flags], env=pipe_env(),
                                capture_output=True, text=True, timeout=300)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    lines = [ln for ln in second.stderr.splitlines() if ln.strip()]
    assert second.returncode == 1 and len(lines) == 1, second.stderr
    assert f"{out} is being written by another run" in lines[0] and f"for this pipe {command}" in lines[0]
    assert first.wait(timeout=300) == 0, first.communicate()
