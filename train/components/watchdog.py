"""A rank that stops producing batches ends the run within --stall-timeout, saying which rank,
host and shard, instead of leaving every rank in a collective that never completes.

What stalls: a read from object storage that never returns (no error, no data), a dataloader
worker stopped or wedged. The rank itself is then blocked in the DataLoader (or the read), and the
other ranks in the step's gradient all-reduce, waiting for it. So:

* every rank has a watchdog thread that times the loop's waits for a batch (`Watchdog.waiting`);
  past the timeout it writes why to ``RUN_DIR/.stalled`` (RUN_DIR is on storage every node shares),
  records it where torch's elastic agent looks for a rank's error, says it on stderr, ends the
  rank's dataloader workers and exits the process (exit 1): the main thread is stuck, so nothing
  short of that ends it;
* the other ranks see their collective fail (gloo: the connection closed; NCCL and a rank that
  is gone without a word: the process group's timeout, set above the stall timeout by
  `collective_timeout`), and end with a line that names the stalled rank from that note
  (`peer_note`);
* under --max-restarts the elastic agent restarts the ranks, which resume from the last
  checkpoint exactly like after any other failure.

The shard is the one the awaited batch is read from, found from the reader's plan (pure: no read).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from train.distributed.group import COLLECTIVE_TIMEOUT_S, Dist

NOTE = ".stalled"


def collective_timeout(stall_timeout: float) -> float:
    """How long a collective waits: longer than a stalled rank waits for its batch, so the stalled
    rank is the first to speak (and the others then name it)."""
    return max(COLLECTIVE_TIMEOUT_S, stall_timeout + 300) if stall_timeout else COLLECTIVE_TIMEOUT_S


def children() -> list[int]:
    """This process's child processes (its dataloader workers), from /proc (Linux; [] elsewhere)."""
    found: list[int] = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                found += [int(p) for p in f.read().split()]
        except OSError:
            continue
    return found


def _exit_rank(message: str) -> None:
    """End a stalled rank: its main thread is blocked, so the process ends from here."""
    sys.stderr.write(f"pipe: failed: {message}\n")
    sys.stderr.flush()
    if os.environ.get("TORCHELASTIC_ERROR_FILE"):  # what the launcher reports for this rank (`launch._describe_failures`)
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        from pipeline.core.errors import StageFailed

        try:
            raise StageFailed(message)
        except StageFailed as e:
            ErrorHandler().record_exception(e)
    for pid in children():  # a stopped or wedged worker would outlive its rank
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    os._exit(1)


class Watchdog:
    """Times this rank's waits for a batch on a thread of its own; `close` stops it."""

    def __init__(self, run_dir: Path, d: Dist, timeout_s: float, on_stall: Callable[[str], Any] = _exit_rank):
        self.run_dir, self.d, self.timeout, self.on_stall = Path(run_dir), d, float(timeout_s), on_stall
        self.started = time.time()
        self._since: float | None = None
        self._what: Callable[[], str] = lambda: "its next batch"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.timeout > 0:
            self._thread = threading.Thread(target=self._watch, name="pipe-stall-watchdog", daemon=True)
            self._thread.start()

    @contextmanager
    def waiting(self, what: Callable[[], str]) -> Iterator[None]:
        """Around one wait for a batch; ``what`` says, when asked, which batch and shard it is."""
        self._what, self._since = what, time.monotonic()
        try:
            yield
        finally:
            self._since = None

    def _watch(self) -> None:
        poll = min(5.0, max(0.05, self.timeout / 20))
        while not self._stop.wait(poll):
            since = self._since
            if since is not None and time.monotonic() - since > self.timeout:
                self._stall(time.monotonic() - since)
                return

    def _stall(self, waited: float) -> None:
        try:
            what = self._what()
        except Exception:  # the description is best effort; the stop is not
            what = "its next batch"
        message = (f"rank {self.d.rank} on {self.d.host} waited {waited:.0f} s for {what}: a read that does not "
                   f"return or a dataloader worker that stopped; the run stops (--stall-timeout {self.timeout:g}; "
                   "under --max-restarts the ranks restart and resume from the last checkpoint)")
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.run_dir / f"{NOTE}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps({"rank": self.d.rank, "host": self.d.host, "message": message}))
            os.replace(tmp, self.run_dir / NOTE)
        except OSError:
            pass
        self.on_stall(message)

    def peer_note(self) -> str | None:
        """What a rank that stalled during this run wrote (another rank's, not this one's), or None."""
        path = self.run_dir / NOTE
        try:
            if path.stat().st_mtime < self.started - 1:
                return None
            note = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return note.get("message") if note.get("rank") != self.d.rank else None

    def close(self) -> None:
        self._stop.set()


def batch_shards(reader: Any, batches_in: int) -> list[str]:
    """The shards the reader's next batch comes from: ``batches_in`` batches after where the
    reader's iteration began (its position), the block of the dataloader worker whose turn it
    is, from the plan alone (no read). [] when the reader cannot say (a stand-in)."""
    from train.data.plan import batches_done, block_key, worker_blocks, worker_spans

    try:
        epoch, start = int(reader._position[0]), int(reader._position[1])
        workers = max(1, reader.num_workers)
        plan = reader.plan(epoch)
        t = start // reader.batch_size + batches_in
        logical = t % workers
        piece = worker_spans(plan.spans[reader.rank], plan.steps, reader.batch_size, workers)[logical]
        skip = batches_done(t, logical, workers) * reader.batch_size
        block = reader.shuffle_buffer if reader.split == "train" else 0
        key = (*block_key(reader.seed, epoch, reader.rank, plan.generation), logical)
        first = next(iter(worker_blocks(piece, block, key, skip)))
        return sorted({reader.shards[seg.shard]["name"] for seg in first.segments})
    except Exception:  # a stand-in reader, or a plan this does not follow: the message goes without
        return []
