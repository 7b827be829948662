"""One run at a time in an object-store output whose server ignores conditional writes.

Where the server honours ``If-None-Match: *``, two runs into one output may work side by side and
meet at the commit, where exactly one wins (`Folder.commit`). Some S3-compatible servers ignore the
header (rclone's ``serve s3`` does): there both runs "won", both exited 0, and the manifest of one
stood over the files of the other. So each run asks the server first, once
(`honours_conditional_writes`: an object created conditionally, then again; a server that honours
the header refuses the second), and where it does not, the run takes a lease instead:

* it writes its own claim, ``.pipe/lease/<token>`` (a name no other run writes: no conditional
  write needed), renews it every `RENEW_S` from a thread (each renewal changes its bytes, so its
  ETag), then lists the claims. None other: the folder is this run's. Others: it watches them
  (renewing its own meanwhile); one that is renewed belongs to a live run, which holds the folder or
  is taking it, and this run deletes its claim and stops with the one busy line
  (`pipeline.core.files.output_busy`, exit 1), within about `RENEW_S`. Claims that vanish were
  released; claims not renewed for `STALE_S` were left by runs that died: they are removed and the
  folder taken. Of two runs the second to list always sees the first's claim (the store reads its
  own writes, as S3 has since 2020), so two never both hold it; two that start within a round trip
  of each other may both stop, and a rerun settles it.
* liveness is judged by renewals seen, never by the server's clock: a server may report any
  Last-Modified (rclone with ``--no-modtime`` reports the time of the listing).
* before its commit a holder checks its claim is still there (a run stopped for longer than
  `STALE_S`, e.g. with SIGSTOP, may have been taken over: it then stops instead of committing).

A lease is no fence: a run stopped for longer than `STALE_S` between that check and its commit
could still commit over its successor's work. The conditional write has no such gap; where the
server offers it, it is what is used.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, Protocol

from pipeline.core.errors import StageFailed
from pipeline.core.files import LOCK_NAME, STATE_DIR, output_busy

LOCK = f"{STATE_DIR}/{LOCK_NAME}"  # the lock file of a local output
LEASES = f"{STATE_DIR}/lease"  # the claims of runs holding (or taking) an output: one object each
PROBE = f"{STATE_DIR}/probe-"  # the object a run writes twice to learn whether conditional writes hold
RENEW_S = 5.0  # a run rewrites its claim this often...
STALE_S = 90.0  # ...and one not rewritten for this long was left by a run that died (a renewal may wait out
#                 the client's retries, ~30 s)
POLL_S = 1.0  # how often a run waiting on others' claims looks again


class Store(Protocol):
    """What a lease needs of a `pipeline.storage.Folder` (named here, not imported: Folder uses this module)."""

    url: str

    def write(self, rel: str, data: bytes, durable: bool = False) -> None: ...

    def write_if_absent(self, rel: str, data: bytes) -> bool: ...

    def read(self, rel: str, max_bytes: int | None = None) -> bytes: ...

    def exists(self, rel: str) -> bool: ...

    def delete(self, rel: str) -> None: ...

    def child(self, rel: str) -> Any: ...


def pipe_own(rel: str) -> bool:
    """Whether ``rel`` is bookkeeping of a run holding the folder (the lock file, a lease claim, a
    probe), not content: an output holding only these is empty."""
    return rel == LOCK or rel.startswith((LEASES + "/", PROBE))


def honours_conditional_writes(folder: Store) -> bool:
    """Ask the server, with a probe object of this run's own: created only if absent, then again.
    A server that honours If-None-Match refuses the second write; one that ignores it accepts
    both, and one that rejects the header fails the first (neither can commit conditionally)."""
    rel = f"{PROBE}{uuid.uuid4().hex}"
    try:
        return folder.write_if_absent(rel, b"1") and not folder.write_if_absent(rel, b"2")
    except StageFailed:  # e.g. 501 NotImplemented for the header: no conditional writes here
        return False
    finally:
        with contextlib.suppress(OSError, StageFailed):
            folder.delete(rel)


class Lease:
    """This run's claim on ``folder`` (see the module's docstring)."""

    def __init__(self, folder: Store, tool: str):
        self.folder, self.tool = folder, tool
        self.rel = f"{LEASES}/{uuid.uuid4().hex}"
        self.lost = False
        self._renewals = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _claim(self) -> bytes:
        self._renewals += 1
        return json.dumps({"tool": self.tool, "host": socket.gethostname(), "pid": os.getpid(),
                           "renewal": self._renewals}).encode()

    def acquire(self) -> None:
        """Hold the folder, or stop with the busy line when another run holds it."""
        self.folder.write(self.rel, self._claim())
        self._thread = threading.Thread(target=self._renew, name="pipe-lease", daemon=True)
        self._thread.start()
        try:
            self._wait_for_others()
        except BaseException:
            self.release()
            raise

    def _others(self) -> dict[str, str]:
        """The other claims now: path -> version (its ETag: it changes with each renewal)."""
        return {rel: e.version for e in self.folder.child(LEASES).list()
                for rel in [f"{LEASES}/{e.rel}"] if rel != self.rel}

    def _wait_for_others(self) -> None:
        """Until the claims listed first are gone or stale; the busy line at the first renewed one.
        Claims that appear later belong to runs that saw this one's claim: they stop themselves.
        A live holder answers within `RENEW_S`; a wait longer than twice that is said, once."""
        watched = self._others()
        start = time.monotonic()
        said = False
        while watched:
            waited = time.monotonic() - start
            if waited >= STALE_S:  # none renewed: left by runs that died
                for rel in watched:
                    self.folder.delete(rel)
                return
            if not said and waited > 2 * RENEW_S:
                said = True
                sys.stderr.write(f"pipe: {self.folder.url}: {', '.join(sorted(watched))} has not been renewed for "
                                 f"{waited:.0f} s; taking the folder over if it is not within {STALE_S:.0f} s "
                                 "(a run that died leaves its lease behind)\n")
            time.sleep(min(POLL_S, RENEW_S))
            now = self._others()
            renewed = sorted(rel for rel, version in watched.items() if rel in now and now[rel] != version)
            if renewed:
                raise output_busy(self.folder.url, self.tool, f"{self._holder(renewed[0])} holds its lease {renewed[0]}")
            watched = {rel: version for rel, version in watched.items() if rel in now}

    def _holder(self, rel: str) -> str:
        try:
            who = json.loads(self.folder.read(rel, max_bytes=4096))
            return f"{who['tool']} on {who['host']}, pid {who['pid']},"
        except (OSError, ValueError, KeyError, TypeError, StageFailed):
            return "a run"

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_S):
            try:
                if not self.folder.exists(self.rel):  # taken over while this run was stopped
                    self.lost = True
                    return
                self.folder.write(self.rel, self._claim())
            except Exception:  # noqa: BLE001 - a thread's traceback is no message: the run's own calls say what is wrong
                continue

    def confirm(self) -> None:
        """Before the commit: still held (StageFailed, one line, when another run took it over)."""
        if self.lost or not self.folder.exists(self.rel):
            self.lost = True
            raise StageFailed(f"{self.folder.url}: another run took this output over while this run was stopped "
                              f"for longer than its lease ({STALE_S:.0f} s); this run's output was not committed")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if not self.lost:
            with contextlib.suppress(OSError, StageFailed):
                self.folder.delete(self.rel)


_HELD: dict[str, Lease] = {}  # folder URL -> this process's lease on it (a Folder may be pickled: the lease stays here)


@contextlib.contextmanager
def hold(folder: Store, tool: str) -> Iterator[None]:
    """For the block: nothing where the server honours conditional writes (runs meet at the
    commit), else this run's lease, which `held` finds for `Folder.commit` to confirm."""
    if honours_conditional_writes(folder):
        yield
        return
    lease = Lease(folder, tool)
    lease.acquire()
    _HELD[folder.url] = lease
    try:
        yield
    finally:
        _HELD.pop(folder.url, None)
        lease.release()


def held(folder: Store) -> Lease | None:
    """This process's lease on ``folder``, if it holds one."""
    return _HELD.get(folder.url)
