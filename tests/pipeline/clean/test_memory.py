"""Memory is bounded by settings, not by the input (issue 14, item 2).

A single 1 GB one-line .txt once drove `pipe clean` to a 24 GB peak and 3 minutes before it was
filed `unreadable`; a 100 MB text peaked at 3.7 GB (3.4 GB here) and was kept. Texts above
--max-text-bytes are now too_large, judged from their size before a byte is read, and the text
path holds a small multiple of a text it does read.

Peak memory is that of `pipe clean` and its worker processes: a watchdog sums the resident
memory of the run's process group from /proc while it runs (and stops a run that goes past the
bound, so a regression fails the test instead of the machine), and the largest resident size
any of them ever had comes from getrusage(RUSAGE_CHILDREN) of a small parent process.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import pipe_env

GB = 1 << 30
MB = 1 << 20
LINE = b"the quick brown fox jumps over the lazy dog, line %d of a text nobody should keep whole. "
# Runs the command given as arguments, then prints the largest resident size (KiB) any process
# it waited for reached: the run and its workers (ru_maxrss of waited-for descendants).
PEAK = ("import resource, subprocess, sys\n"
        "rc = subprocess.run(sys.argv[1:]).returncode\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
        "sys.exit(rc)\n")


def sparse_text(path: Path, size: int) -> None:
    """A text file of ``size`` bytes in an instant: real text first (so its content says text),
    the rest a hole in the file that reads as NUL bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"".join(LINE % i for i in range(100)))
        f.truncate(size)


def real_text(path: Path, size: int) -> None:
    """``size`` bytes of one-line text written fast: one block of distinct sentences, repeated."""
    path.parent.mkdir(parents=True, exist_ok=True)
    block = b"".join(LINE % i for i in range(20_000))
    with open(path, "wb") as f:
        for _ in range(size // len(block)):
            f.write(block)
        f.write(block[: size % len(block)])


def group_rss(sid: int) -> int:
    """Bytes resident in all processes of session ``sid`` (Linux /proc)."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # fields after the name: state, ppid, pgrp, session, ..., rss is the 22nd
            total += int(fields[21]) * page
    return total


def clean_peak(src: Path, out: Path, *flags: str, bound: int, timeout: float = 240) -> tuple[int, int, float]:
    """Run `pipe clean src -o out`; return (largest single process RSS, largest group RSS seen,
    seconds). Stops the run (and fails) when the group goes past ``bound``."""
    cmd = [sys.executable, "-c", PEAK, sys.executable, "-m", "pipeline", "clean", str(src), "-o", str(out),
           "--workers", "2", "--json", *flags]
    t = time.monotonic()
    p = subprocess.Popen(cmd, env=pipe_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    seen = 0
    while p.poll() is None:
        seen = max(seen, group_rss(p.pid))
        if seen > bound or time.monotonic() - t > timeout:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            raise AssertionError(f"pipe clean stopped after {time.monotonic() - t:.0f} s with {seen / MB:.0f} MB "
                                 f"resident (bound {bound / MB:.0f} MB)")
        time.sleep(0.02)
    err = p.stderr.read().decode()
    assert p.returncode == 0, err
    return int(err.split()[-1]) * 1024, seen, time.monotonic() - t


def rows(out: Path) -> dict[str, dict]:
    return {r["source"]: r for r in pq.read_table(out / "manifest.parquet").to_pylist()}


@pytest.mark.slow
def test_a_1gb_text_is_too_large_at_once_and_never_read_into_memory(tmp_path):
    src = tmp_path / "in"
    sparse_text(src / "notes" / "dump.txt", GB)
    real_text(src / "notes" / "small.txt", 2000)
    peak, seen, seconds = clean_peak(src, tmp_path / "out", bound=GB)
    got = rows(tmp_path / "out")
    assert got["notes/dump.txt"]["reason"] == "too_large"
    assert "--max-text-bytes" in got["notes/dump.txt"]["detail"] and got["notes/dump.txt"]["bytes"] == GB
    assert got["notes/dump.txt"]["sha256"]  # hashed in chunks all the same, and linked into quarantine/
    assert (tmp_path / "out" / "quarantine" / "too_large" / "notes" / "dump.txt").stat().st_size == GB
    assert os.path.samefile(tmp_path / "out" / "quarantine" / "too_large" / "notes" / "dump.txt",
                            src / "notes" / "dump.txt")  # not another GB
    assert got["notes/small.txt"]["status"] == "kept"
    assert peak < GB and seen < GB, (peak, seen)
    assert seconds < 120  # was 3 minutes before ending unreadable; here hashing 1 GB dominates
    shutil.rmtree(tmp_path)  # pytest keeps the last runs' folders: not 1 GB of them


@pytest.mark.slow
def test_a_100mb_text_is_too_large_by_default_and_read_within_a_small_multiple_when_allowed(tmp_path):
    src = tmp_path / "in"
    real_text(src / "book.txt", 100 * 1000 * 1000)
    clean_peak(src, tmp_path / "default", bound=GB)
    assert rows(tmp_path / "default")["book.txt"]["reason"] == "too_large"

    peak, seen, _ = clean_peak(src, tmp_path / "allowed", "--max-text-bytes", "200MB", bound=2 * GB, timeout=290)
    row = rows(tmp_path / "allowed")["book.txt"]
    assert row["status"] == "kept" and row["encoding"] == "utf-8"
    assert (tmp_path / "allowed" / row["output"]).stat().st_size == row["bytes"]  # UTF-8 in, the same text out
    # measured: about 3x the text in the worker (the bytes read, the decoded text, the UTF-8
    # written), against 34x before; 5x leaves room for an interpreter and its libraries
    assert peak < 5 * 100 * MB, peak / MB
    shutil.rmtree(tmp_path)


def test_the_limit_is_a_flag_and_a_config_key_with_units(tmp_path, cli):
    src = tmp_path / "in"
    real_text(src / "a.txt", 3000)
    real_text(src / "b.txt", 500)
    cfg = tmp_path / "pipe.toml"
    cfg.write_text('[clean]\nmax_text_bytes = "2KiB"\nworkers = 1\n')
    r = cli("clean", src, "-o", tmp_path / "out", "--config", cfg, "--json")
    assert r.exit_code == 0, r.output
    got = rows(tmp_path / "out")
    assert got["a.txt"]["reason"] == "too_large" and "3000 bytes > --max-text-bytes 2048" in got["a.txt"]["detail"]
    assert got["b.txt"]["status"] == "kept"
    r = cli("clean", src, "-o", tmp_path / "out2", "--max-text-bytes", "3kB", "--workers", "1", "--json")
    assert r.exit_code == 0 and rows(tmp_path / "out2")["a.txt"]["status"] == "kept"
    r = cli("clean", src, "-o", tmp_path / "out3", "--max-text-bytes", "lots")
    assert r.exit_code == 2 and "--max-text-bytes must be a byte count" in r.output
