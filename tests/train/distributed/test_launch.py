"""The launcher's rendezvous: a node that waits for others, or cannot reach node 0, ends within
--rdzv-timeout with a message that names the address, the port and what to check (no hang)."""

from __future__ import annotations

import time

import pytest

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


def test_node_0_waiting_for_a_node_that_never_comes(cli, shards, tmp_path):
    port = free_port()
    started = time.monotonic()
    r = cli("train", shards, "-o", tmp_path / "run", "--nnodes", "2", "--node-rank", "0", "--master-port", port,
            "--rdzv-timeout", "2", "--workers", "0", "--batch-size", "4")
    assert time.monotonic() - started < 60
    line = _one_line_failure(r)
    for words in (f"127.0.0.1:{port}", "all 2 nodes", "--node-rank", "firewall", f"port {port}", "GLOO_SOCKET_IFNAME"):
        assert words in line, line


def test_a_node_that_cannot_reach_node_0(cli, shards, tmp_path):
    port = free_port()  # nobody listens there
    r = cli("train", shards, "-o", tmp_path / "run", "--nnodes", "2", "--node-rank", "1", "--master-port", port,
            "--rdzv-timeout", "1", "--workers", "0", "--batch-size", "4")
    line = _one_line_failure(r)
    for words in (f"node 1 could not reach the rendezvous at 127.0.0.1:{port}", "node 0 is running",
                  f"nc -z 127.0.0.1 {port}", "firewall"):
        assert words in line, line
