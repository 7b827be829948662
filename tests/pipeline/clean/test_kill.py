"""SIGKILL `pipe clean` at several points of a run, run it again, and get exactly what one
uninterrupted run gives: the same manifest.parquet bytes, the same output files, nothing
half-written at any moment, no temporary files left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests import nasty
from tests.conftest import pipe_env
from tests.factories import image_bytes, noise_rgb, write

N_IMAGES = 240


def build_input(src: Path) -> None:
    rng = np.random.default_rng(0)
    for i in range(N_IMAGES):
        cls = ("cats", "dogs", "birds")[i % 3]
        arr = noise_rgb(64, 48, seed=i)
        fmt = ("JPEG", "PNG", "WEBP")[i % 3]
        write(src / cls / f"{i:04d}.{fmt.lower()}", image_bytes(arr, fmt))
        if i % 10 == 0:
            write(src / cls / f"{i:04d}.txt", f"caption number {i}: {rng.integers(1e9)}")
        if i % 25 == 0:  # the same pixels again, in another container: a duplicate, parked
            write(src / cls / f"{i:04d}_copy.bmp", image_bytes(arr, "BMP"))
    write(src / "cats" / "broken.jpg", nasty.truncate(image_bytes(noise_rgb(64, 48, seed=999), "JPEG"), 0.5))
    write(src / "dogs" / "empty.png", b"")
    write(src / "birds" / "notes.zip", b"PK\x03\x04" + bytes(64))


def start(src: Path, out: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pipeline", "clean", str(src), "-o", str(out), "--workers", "2", "--size", "48", "--json"]
    return subprocess.Popen(cmd, env=pipe_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def journal_lines(out: Path) -> int:
    """How far a run is: the outputs its workers have written (what a journal line per file once said)."""
    data = out / "data"
    return sum(len(files) for _, _, files in os.walk(data)) if data.is_dir() else 0


def run_and_kill(src: Path, out: Path, when, group: bool = True, timeout: float = 120) -> bool:
    """Start pipe clean and SIGKILL it once ``when(out)`` holds; False if it finished first."""
    p = start(src, out)
    t = time.monotonic()
    while p.poll() is None:
        workers = [] if group else pool_workers(p.pid)
        if when(out) and (group or workers):
            os.killpg(p.pid, signal.SIGKILL) if group else os.kill(p.pid, signal.SIGKILL)
            p.wait()
            if not group:  # orphaned workers must notice the dead parent and exit, not wait forever
                assert workers, "pipe clean had no worker processes to orphan"
                assert wait_gone(workers, 10), f"workers {workers} outlived their SIGKILLed parent"
            return True
        assert time.monotonic() - t < timeout
        time.sleep(0.002)
    assert p.returncode == 0, p.stderr.read().decode()
    return False


def children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (Linux /proc)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def pool_workers(pid: int) -> list[int]:
    """The processes of ``pid``'s pool (not multiprocessing's resource tracker): spawned
    workers, or the fork server and the workers forked from it, once there are workers."""
    out = []
    for kid in children(pid):
        try:
            cmdline = Path(f"/proc/{kid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            out.append(kid)
        elif b"forkserver" in cmdline and (forked := children(kid)):
            out += [kid, *forked]
    return out


def wait_gone(pids: list[int], seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not [p for p in pids if Path(f"/proc/{p}").exists() and "Z" not in _state(p)]:
            return True
        time.sleep(0.1)
    return False


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def snapshot(out: Path) -> dict[str, bytes]:
    files = {}
    for p in sorted(out.rglob("*")):
        if p.is_file():
            rel = p.relative_to(out).as_posix()
            data = p.read_bytes()
            if rel == "report.json":  # timings, the reused count and the folder's name differ
                doc = json.loads(data)
                doc.pop("timings"), doc.pop("reused"), doc["settings"].pop("output")
                data = json.dumps(doc, sort_keys=True).encode()
            files[rel] = data
    return files


def assert_nothing_half_written(out: Path) -> None:
    """At any moment every visible output is complete: it decodes."""
    for p in (out / "data").rglob("*") if (out / "data").exists() else ():
        if p.is_file() and not p.name.endswith(".tmp") and p.suffix != ".txt":
            Image.open(p).load()


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("kill") / "raw"
    build_input(src)
    return src


@pytest.fixture(scope="module")
def reference(raw) -> dict[str, bytes]:
    out = raw.parent / "reference"
    p = start(raw, out)
    assert p.wait(timeout=300) == 0, p.stderr.read().decode()
    return snapshot(out)


@pytest.mark.slow
def test_killed_runs_resume_to_the_uninterrupted_result(raw, reference):
    out = raw.parent / "killed"
    kills = [
        lambda o: (o / ".pipe" / "state.json").exists(),  # right after start-up
        lambda o: journal_lines(o) >= 30,
        lambda o: journal_lines(o) >= 120,
        lambda o: journal_lines(o) >= 200,
    ]
    killed = 0
    for when in kills:
        killed += run_and_kill(raw, out, when)
        assert_nothing_half_written(out)
        assert not (out / "manifest.parquet").exists()  # no manifest unless a run completed
    # one kill of the main process alone (its workers orphaned), one inside the last phase
    # (counted from where the journal stands: the last kill may have let it run on a little)
    base = journal_lines(out)
    killed += run_and_kill(raw, out, lambda o: journal_lines(o) >= base + 10, group=False)
    killed += run_and_kill(raw, out, lambda o: (o / "quarantine").exists() or (o / "report.json").exists())
    assert killed >= 5, "the runs finished before they could be killed: the test proved nothing"
    assert_nothing_half_written(out)
    p = start(raw, out)
    assert p.wait(timeout=300) == 0, p.stderr.read().decode()
    got = snapshot(out)
    assert not [f for f in got if f.endswith(".tmp")]
    assert sorted(got) == sorted(reference)
    assert got["manifest.parquet"] == reference["manifest.parquet"]
    different = [f for f in reference if got[f] != reference[f]]
    assert different == []


def test_rerun_of_a_finished_dir_changes_nothing(raw, reference):
    out = raw.parent / "reference"
    p = start(raw, out)
    assert p.wait(timeout=300) == 0
    assert snapshot(out) == reference
