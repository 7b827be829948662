"""scripts/setup's choice of torch build, without installing anything (``--which-torch``): the CPU
build only where no NVIDIA GPU is seen and the CPU index answers, else the default build (what our
dev and CI machines take from their own disk), and PIPE_TORCH over both.

Each case runs a copy of the script in a folder of its own (it installs nothing there: no .venv
appears), with a fake ``nvidia-smi`` first on PATH, a fake /proc (``PIPE_SETUP_PROC``) and an index
URL (``PIPE_TORCH_CPU_INDEX``) that is a server on loopback, a closed port, or a 404.
"""

from __future__ import annotations

import http.server
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

PINS = "torch==2.14.1 torchvision==0.29.1"
GPU = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)"
NO_DRIVER = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."


@pytest.fixture(scope="module")
def index():
    """A CPU index on loopback: ``/cpu/torch/`` answers 200; anything else 404."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(200 if self.path == "/cpu/torch/" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _closed_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/cpu"  # nothing listens once it is closed


def _which(tmp_path: Path, *, smi: str | None, cpu_index: str, gpus: int = 0, uname: str | None = None,
           pipe_torch: str | None = None) -> tuple[str, str, float]:
    """(why, pip's arguments, seconds) that a copy of scripts/setup says under these conditions;
    ``smi``: what the fake nvidia-smi prints (exit 0), None: it fails as without a driver."""
    repo, bin_dir, proc = tmp_path / "repo", tmp_path / "bin", tmp_path / "proc"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup", repo / "scripts" / "setup")
    shutil.copy(REPO / "pyproject.toml", repo / "pyproject.toml")
    bin_dir.mkdir()
    (proc / "driver" / "nvidia" / "gpus").mkdir(parents=True)
    for i in range(gpus):
        (proc / "driver" / "nvidia" / "gpus" / f"0000:0{i}:00.0").mkdir()
    fake = f"#!/bin/sh\necho '{smi}'\n" if smi is not None else f"#!/bin/sh\necho '{NO_DRIVER}'\nexit 9\n"
    (bin_dir / "nvidia-smi").write_text(fake)
    if uname is not None:
        (bin_dir / "uname").write_text(f"#!/bin/sh\necho {uname}\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("PIPE_TORCH",)}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", PIPE_SETUP_PROC=str(proc), PIPE_TORCH_CPU_INDEX=cpu_index,
               **({"PIPE_TORCH": pipe_torch} if pipe_torch is not None else {}))
    t = time.monotonic()
    p = subprocess.run(["bash", str(repo / "scripts" / "setup"), "--which-torch"], capture_output=True, text=True,
                       env=env, timeout=60)
    seconds = time.monotonic() - t
    assert p.returncode == 0, p.stderr
    assert sorted(x.name for x in repo.iterdir()) == ["pyproject.toml", "scripts"]  # nothing installed, no .venv
    why, pip = p.stdout.strip().splitlines()
    assert why.startswith("torch: ") and pip.startswith("pip install ")
    return why.removeprefix("torch: "), pip.removeprefix("pip install "), seconds


def test_no_gpu_and_a_reachable_cpu_index_installs_the_cpu_build(tmp_path, index):
    why, pip, _ = _which(tmp_path, smi=None, cpu_index=f"{index}/cpu")
    assert pip == f"{PINS} --index-url {index}/cpu"
    assert why.startswith(f"the CPU build from {index}/cpu (no NVIDIA GPU here")


def test_a_gpu_keeps_the_default_build_whatever_the_index(tmp_path, index):
    for case, kw in {"nvidia-smi": {"smi": GPU}, "driver only": {"smi": None, "gpus": 1}}.items():
        why, pip, _ = _which(tmp_path / case, cpu_index=f"{index}/cpu", **kw)  # type: ignore[arg-type]
        assert pip == PINS, case
        assert why == "the default build, with CUDA (this machine has an NVIDIA GPU)", case


def test_an_unreachable_or_wrong_cpu_index_falls_back_to_the_default_build_at_once(tmp_path, index):
    """As on our dev and CI machines, which take the default build from their own disk."""
    for case, url in {"closed": _closed_port(), "404": f"{index}/nothing-here"}.items():
        why, pip, seconds = _which(tmp_path / case, smi="", cpu_index=url)  # nvidia-smi lists no GPU
        assert pip == PINS, case
        assert why == f"the default build, with CUDA libraries (no NVIDIA GPU here, but {url} is not reachable; " \
                      "it runs on the CPU)", case
        assert seconds < 20, (case, seconds)  # no 5 s waits: a refused connection fails at once


def test_pipe_torch_and_other_systems_are_taken_as_they_are(tmp_path, index):
    why, pip, _ = _which(tmp_path / "env", smi=None, cpu_index=f"{index}/cpu", pipe_torch="torch==2.9.1 torchvision==0.24.1")
    assert (why, pip) == ("PIPE_TORCH, as set", "torch==2.9.1 torchvision==0.24.1")
    why, pip, _ = _which(tmp_path / "mac", smi=None, cpu_index=f"{index}/cpu", uname="Darwin")
    assert pip == PINS and why == "the default build (Darwin: PyPI's torch has no CUDA libraries there)"


def test_setup_says_which_build_it_installs_with_what_pip_is_given_and_what_was_installed(tmp_path, index):
    """The whole script, its pip a stand-in that records its arguments (nothing is installed): the
    CPU build's index reaches pip, the choice and the installed versions are said, and a second
    run does nothing."""
    import os
    import sys

    repo, log = tmp_path / "repo", tmp_path / "pip.log"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup", repo / "scripts" / "setup")
    shutil.copy(REPO / "pyproject.toml", repo / "pyproject.toml")
    venv_bin = repo / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").write_text(f'#!/bin/sh\necho "$@" >> {log}\n[ "$1" = "-" ] && exec {sys.executable} -\nexit 0\n')
    (venv_bin / "python").chmod(0o755)
    proc = tmp_path / "proc"
    (proc / "driver" / "nvidia" / "gpus").mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PIPE_TORCH"}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", PIPE_SETUP_PROC=str(proc), PIPE_TORCH_CPU_INDEX=f"{index}/cpu")
    p = subprocess.run(["bash", str(repo / "scripts" / "setup")], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    said = p.stderr.splitlines()
    assert said[0] == f"setup: torch: the CPU build from {index}/cpu (no NVIDIA GPU here; set PIPE_TORCH to choose)"
    assert said[-1].startswith("setup: installed torch ") and ", torchvision " in said[-1]
    pip = [line for line in log.read_text().splitlines() if line.startswith("-m pip install")]
    assert pip == ["-m pip install -q --upgrade pip", f"-m pip install -q {PINS} --index-url {index}/cpu",
                   "-m pip install -q -e .[dev]"]
    log.unlink()
    again = subprocess.run(["bash", str(repo / "scripts" / "setup")], capture_output=True, text=True, env=env, timeout=60)
    assert again.returncode == 0 and again.stderr == "" and not log.exists()  # the stamp: nothing to do
