"""A real 2-node Ray cluster on loopback addresses, for the tests of `--executor ray`.

The head listens on 127.0.0.2 and the worker node on 127.0.0.3, one CPU each, with a capped object
store, the dashboard off, usage stats off and token auth explicitly disabled (nothing listens
beyond loopback, so there is no one to authenticate). Ray silently swaps 127.0.0.1 for the
machine's routable address, which is why neither node uses it.

Ray 2.60 binds its gRPC servers (GCS, raylets, workers, drivers) to 0.0.0.0 whenever the node
address is not 127.0.0.1 (seen with `ss -tlnp`). So the whole cluster, and every driver the tests
start, runs in a network namespace of its own (`unshare --user --map-root-user --net`, no
privileges needed) whose only interface is loopback: "all addresses" there is loopback, and no
test traffic can leave the machine. `Cluster.listeners` checks both sides.

Each node is one `ray start --block` started in its own process group; it is stopped by killing
that group (and any process left holding the node's temp dir). `ray stop` is never called: it ends
every Ray process on the machine, other people's clusters included.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"
OBJECT_STORE_BYTES = 100 * 1024 * 1024
REPO = Path(__file__).resolve().parent.parent


def ray_env() -> dict[str, str]:
    """The environment of the nodes and of every driver the tests start."""
    env = dict(os.environ)
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled", RAY_DISABLE_DOCKER_CPU_WARNING="1",
               RAY_ENABLE_UV_RUN_RUNTIME_ENV="0", OPENBLAS_NUM_THREADS="1",
               # a killed node is noticed in seconds, not the default half minute
               RAY_health_check_initial_delay_ms="1000", RAY_health_check_period_ms="1000",
               RAY_health_check_timeout_ms="1000", RAY_health_check_failure_threshold="3",
               # the workers import this checkout's pipeline, not an installed one
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    return env


# Runs as the namespace's first process: bring loopback up (SIOCSIFFLAGS), say so, then wait.
HOLDER = """
import fcntl, signal, socket, struct, sys
with socket.socket() as s:
    fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", 0x1 | 0x8 | 0x40))  # IFF_UP|IFF_LOOPBACK|IFF_RUNNING
print("ready", flush=True)
signal.pause()
"""


@dataclass
class Namespace:
    """A network namespace with only loopback in it, held by one sleeping process."""

    holder: subprocess.Popen

    @classmethod
    def start(cls) -> Namespace:
        proc = subprocess.Popen(["unshare", "--user", "--map-root-user", "--net", "--", sys.executable, "-c", HOLDER],
                                stdout=subprocess.PIPE, start_new_session=True)
        if proc.stdout is None or proc.stdout.readline().strip() != b"ready":
            proc.kill()
            raise RuntimeError("could not make a network namespace (unshare --user --map-root-user --net)")
        return cls(proc)

    def prefix(self) -> list[str]:
        """Run a command inside the namespace."""
        return ["nsenter", "-t", str(self.holder.pid), "--user", "--net", "--preserve-credentials", "--"]

    def run(self, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run([*self.prefix(), *cmd], **kw)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.holder.pid, signal.SIGKILL)
        self.holder.wait()


def free_port(ns: Namespace, ip: str) -> int:
    probe = f"import socket; s = socket.socket(); s.bind(({ip!r}, 0)); print(s.getsockname()[1])"
    return int(ns.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)


@dataclass
class Node:
    ip: str
    proc: subprocess.Popen
    temp_dir: Path
    log: Path

    def pids(self) -> list[int]:
        """Every live process of this node: the descendants of its `ray start` (Ray retitles its
        workers and may give them their own process groups), its process group, and anything
        naming its temp dir."""
        parent: dict[int, int] = {}
        found = set()
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                pid = int(p.name)
                parent[pid] = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if os.getpgid(pid) == self.proc.pid or str(self.temp_dir) in (p / "cmdline").read_bytes().decode(errors="replace"):
                    found.add(pid)
            except (OSError, ProcessLookupError, ValueError, IndexError):
                pass
        changed = True
        while changed:
            more = {pid for pid, pp in parent.items() if pp in found or pp == self.proc.pid} - found
            found |= more
            changed = bool(more)
        return sorted(found)

    def kill(self) -> None:
        """SIGKILL the node (a machine that dies): its group, then any straggler that left it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


@dataclass
class Cluster:
    address: str
    head: Node
    worker: Node
    root: Path
    ns: Namespace
    env: dict[str, str] = field(default_factory=ray_env)

    def driver(self, args: list[str], **kw) -> subprocess.Popen:
        """Start `python -m pipeline ARGS` as a driver inside the cluster's namespace."""
        return subprocess.Popen([*self.ns.prefix(), sys.executable, "-m", "pipeline", *map(str, args)], env=self.env,
                                cwd=REPO, start_new_session=True, **kw)

    def pipe(self, args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
        """Run `python -m pipeline ARGS` inside the cluster's namespace to the end."""
        return self.ns.run([sys.executable, "-m", "pipeline", *map(str, args)], env=self.env, cwd=REPO,
                           capture_output=True, text=True, timeout=timeout)

    def worker_pids(self, node: Node) -> list[int]:
        """Ray worker processes (the ones that run tasks) of a node."""
        out = []
        for pid in node.pids():
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if any(b"default_worker.py" in c for c in cmd):
                    out.append(pid)
        return out

    def task_pids(self, name: str, node: Node | None = None) -> list[int]:
        """Worker processes running the task ``name`` now (Ray titles them ``ray::NAME``)."""
        out = []
        for n in [node] if node is not None else [self.head, self.worker]:
            for pid in n.pids():
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(f"ray::{name}".encode()):
                        out.append(pid)
        return out

    def listeners(self) -> tuple[list[str], list[str], list[str]]:
        """(interfaces of the cluster's namespace, addresses listened on in it, addresses the
        cluster's processes listen on in this machine's own namespace: `ss -tlnp` on both sides)."""
        probe = "import socket; print(' '.join(name for _, name in socket.if_nameindex()))"
        interfaces = self.ns.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
        inside = self.ns.run(["ss", "-tlnH"], capture_output=True, text=True, check=True).stdout
        pids = set(self.head.pids()) | set(self.worker.pids())
        outside = subprocess.run(["ss", "-tlnpH"], capture_output=True, text=True, check=True).stdout
        return (interfaces, [line.split()[3] for line in inside.splitlines()],
                [line.split()[3] for line in outside.splitlines() if any(f"pid={p}," in line for p in pids)])

    def stop(self) -> None:
        for node in (self.worker, self.head):
            node.kill()
        self.ns.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def _start_node(ns: Namespace, args: list[str], ip: str, root: Path, env: dict[str, str]) -> Node:
    temp_dir = root / ip.rsplit(".", 1)[-1]
    temp_dir.mkdir()
    log = root / f"start-{ip}.log"
    cmd = [*ns.prefix(), str(Path(sys.executable).parent / "ray"), "start", "--block", *args, "--node-ip-address", ip, "--num-cpus", "1",
           "--object-store-memory", str(OBJECT_STORE_BYTES), "--disable-usage-stats",
           "--temp-dir", str(temp_dir)]
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=root)
    return Node(ip, proc, temp_dir, log)


def _wait_for_nodes(ns: Namespace, address: str, n: int, env: dict[str, str], nodes: list[Node], timeout: float = 180) -> None:
    """Wait until `n` nodes are alive, asking from a short-lived driver (no state kept here)."""
    probe = ("import ray,sys; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False); "
             "print(sum(n['Alive'] for n in ray.nodes()))")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for node in nodes:
            if node.proc.poll() is not None:
                raise RuntimeError(f"ray start on {node.ip} exited: {node.log.read_text(errors='replace')[-3000:]}")
        r = ns.run([sys.executable, "-c", probe, address], capture_output=True, text=True, env=env, timeout=120)
        if r.returncode == 0 and r.stdout.strip().splitlines()[-1:] == [str(n)]:
            return
        time.sleep(1)
    raise RuntimeError(f"the Ray cluster at {address} did not reach {n} nodes in {timeout:.0f} s")


def start_cluster(ns: Namespace | None = None, env: dict[str, str] | None = None) -> Cluster:
    """Start the head on 127.0.0.2 and a worker node on 127.0.0.3; return once both are alive.
    ``ns``: a namespace already holding something the nodes need (an S3 server; the cluster
    owns it from now on); ``env``: more environment for the nodes and drivers (its endpoint)."""
    env = {**ray_env(), **(env or {})}
    root = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))  # short: Ray's socket paths must fit in 107 bytes
    ns = ns or Namespace.start()
    port = free_port(ns, HEAD_IP)
    address = f"{HEAD_IP}:{port}"
    head = _start_node(ns, ["--head", "--port", str(port), "--include-dashboard=false"], HEAD_IP, root, env)
    worker = None
    try:
        _wait_for_nodes(ns, address, 1, env, [head])
        worker = _start_node(ns, ["--address", address], WORKER_IP, root, env)
        _wait_for_nodes(ns, address, 2, env, [head, worker])
    except BaseException:
        if worker is not None:
            worker.kill()
        head.kill()
        ns.stop()
        shutil.rmtree(root, ignore_errors=True)
        raise
    return Cluster(address, head, worker, root, ns, env)


def restart_worker(cluster: Cluster) -> None:
    """Start a fresh worker node on 127.0.0.3 (after a test killed the old one)."""
    cluster.worker.kill()
    shutil.rmtree(cluster.worker.temp_dir, ignore_errors=True)
    cluster.worker = _start_node(cluster.ns, ["--address", cluster.address], WORKER_IP, cluster.root, cluster.env)
    _wait_for_nodes(cluster.ns, cluster.address, 2, cluster.env, [cluster.head, cluster.worker])


if __name__ == "__main__":  # python -m tests.raycluster: start one, show what listens, stop it
    t = time.monotonic()
    c = start_cluster()
    try:
        print(f"cluster at {c.address} up in {time.monotonic() - t:.1f} s")
        print("listening:", c.listeners())
        print("head pids", c.head.pids(), "worker pids", c.worker.pids())
        print(c.pipe(["--help"]).returncode)
    finally:
        c.stop()
