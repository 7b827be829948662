"""The launcher's rendezvous: a node that waits for others, or cannot reach node 0, ends within
--rdzv-timeout with a message that names the address, the port and what to check (no hang)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import pipe_env
from tests.gloo import free_port
from tests.train_shards import make_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("rdzv"), n=30, classes=3)


def _one_line_failure(r) -> str:
    assert r.exit_code == 1, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("pipe: failed: rendezvous failed:"), r.stderr
    return last


@pytest.mark.slow
def test_node_0_waiting_for_a_node_that_never_comes(cli, shards, tmp_path):
    port = free_port()
    started = time.monotonic()
    r = cli("train", shards, "-o", tmp_path / "run", "--nnodes", "2", "--node-rank", "0", "--master-port", port,
            "--rdzv-timeout", "2", "--workers", "0", "--batch-size", "4")
    assert time.monotonic() - started < 60
    line = _one_line_failure(r)
    for words in (f"127.0.0.1:{port}", "all 2 nodes", "--node-rank", "firewall", f"port {port}", "GLOO_SOCKET_IFNAME"):
        assert words in line, line


@pytest.mark.slow
def test_a_node_that_cannot_reach_node_0(cli, shards, tmp_path):
    port = free_port()  # nobody listens there
    r = cli("train", shards, "-o", tmp_path / "run", "--nnodes", "2", "--node-rank", "1", "--master-port", port,
            "--rdzv-timeout", "1", "--workers", "0", "--batch-size", "4")
    line = _one_line_failure(r)
    for words in (f"node 1 could not reach the rendezvous at 127.0.0.1:{port}", "node 0 is running",
                  f"nc -z 127.0.0.1 {port}", "firewall"):
        assert words in line, line



@pytest.mark.slow
def test_a_node_that_cannot_reach_node_0_says_so_in_one_line_without_cpp_stacks(shards, tmp_path, pipe_proc):
    port = free_port()  # nobody listens there
    r = pipe_proc("train", shards, "-o", tmp_path / "run", "--nnodes", "2", "--node-rank", "1", "--master-port", port,
                  "--rdzv-timeout", "1", "--workers", "0", "--batch-size", "4")
    assert r.returncode == 1
    assert r.stderr.splitlines() == [r.stderr.strip()] and r.stderr.startswith("pipe: failed: rendezvous failed:"), r.stderr


@pytest.mark.slow
def test_a_taken_port_is_named_at_once_with_what_holds_it(cli, shards, tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        started = time.monotonic()
        r = cli("train", shards, "-o", tmp_path / "run", "--nproc-per-node", "2", "--master-port", port,
                "--rdzv-timeout", "5", "--workers", "0", "--batch-size", "4")
    assert time.monotonic() - started < 30
    assert r.exit_code == 2
    assert r.stderr.strip() == (f"pipe: error: --master-port {port} is already in use on this machine by pid {os.getpid()} "
                                f"({Path('/proc/self/comm').read_text().strip()}); choose another port (this node hosts "
                                "the rendezvous there)")


def test_an_address_that_does_not_resolve_is_named_at_once(cli, shards, tmp_path):
    started = time.monotonic()
    r = cli("train", shards, "-o", tmp_path / "run", "--nnodes", "2", "--node-rank", "1", "--master-addr",
            "node0.pipe-test.invalid", "--master-port", free_port(), "--rdzv-timeout", "5", "--workers", "0",
            "--batch-size", "4")
    assert time.monotonic() - started < 30
    assert r.exit_code == 2
    assert r.stderr.strip().startswith("pipe: error: --master-addr: could not resolve node0.pipe-test.invalid (")


# -- Ctrl-C -------------------------------------------------------------------------------------------


def _group_alive(pgid: int) -> list[int]:
    """Pids still running (not zombies) in a process group."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


@pytest.mark.slow
def test_ctrl_c_of_a_multi_rank_train_says_interrupted_and_ends_every_rank(shards, tmp_path):
    """Like Ctrl-C in a terminal: SIGINT to the launcher, its ranks and their workers at once."""
    p = subprocess.Popen([sys.executable, "-m", "pipeline", "train", str(shards), "-o", str(tmp_path / "run"),
                          "--nproc-per-node", "2", "--workers", "0", "--batch-size", "4", "--epochs", "1000"],
                         env=pipe_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(p.stderr), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240
        while not any(ln.startswith("epoch 1/") for ln in lines) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert p.poll() is None, "".join(lines)
        os.killpg(p.pid, signal.SIGINT)
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _group_alive(p.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    reader.join(10)  # every process that holds stderr has ended: what it said is all here
    err = "".join(lines)
    assert rc == 130, err
    assert err.strip().splitlines()[-1] == ("interrupted: run the same command with --resume to continue from "
                                            "RUN_DIR/last.pt, the last checkpoint written"), err
    assert "internal error" not in err and "Traceback" not in err and "failed" not in err, err
    assert _group_alive(p.pid) == []  # no rank left behind


def test_a_ctrl_c_that_lands_in_a_finalizer_still_interrupts_the_rank(capsys):
    """Python runs the handler wherever the main thread is; inside a weakref callback its
    KeyboardInterrupt would be printed as "Exception ignored" and dropped (seen in CI: the rank
    trained on). It is delivered again and interrupts the code that runs next, silently."""
    import weakref

    from train.distributed import launch

    class Thing:
        pass

    def callback(_):
        os.kill(os.getpid(), signal.SIGINT)  # the Ctrl-C arrives while the callback runs
        for _ in range(1000):  # bytecode: the handler runs here, inside the callback
            pass

    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGALRM)
    saved = handlers + (sys.unraisablehook, launch._interrupts.rank_pid, launch._interrupts.seen)
    try:
        launch._interrupts.rank_pid, launch._interrupts.seen = os.getpid(), False
        signal.signal(signal.SIGINT, launch._interrupt_once)
        sys.unraisablehook = launch._interrupt_again_if_lost
        thing = Thing()
        ref = weakref.ref(thing, callback)
        with pytest.raises(KeyboardInterrupt):
            del thing
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # the code after the finalizer, where the interrupt lands
                pass
        assert ref() is None and launch._interrupts.seen
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # once interrupted, a second Ctrl-C is ignored
    finally:
        signal.signal(signal.SIGINT, saved[0])
        signal.signal(signal.SIGALRM, saved[1])
        sys.unraisablehook, launch._interrupts.rank_pid, launch._interrupts.seen = saved[2:]
    assert "Exception ignored" not in capsys.readouterr().err
