"""Start the ranks and tear them down in order.

`launch(config, entry, arg)` runs ``entry(arg)`` once per rank:

* under an external ``torchrun`` (its environment variables are set), this process *is* a rank:
  ``entry`` runs here;
* with ``--nproc-per-node N`` (or several nodes), torch's own elastic launcher
  (`torch.distributed.launcher.api.elastic_launch`, what torchrun uses) starts the local ranks;
* otherwise a single rank runs in this process.

Inside ``entry``, `train.distributed.group.process_group()` joins the group and, on the way out,
leaves it in the order that lets every finished run exit 0: the caller stops its dataloader
workers first, then a final barrier, then `destroy_process_group` (gloo aborts at interpreter exit
with "terminate called without an active exception" when a group is still alive).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from pipeline.core import settings
from pipeline.core.errors import StageFailed, Terminated, UsageError
from pipeline.core.ui import shown
from train.config import LaunchConfig

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def under_torchrun() -> bool:
    """True when this process was started as a rank by torchrun or an elastic agent."""
    return all(v in os.environ for v in TORCHRUN_VARS)


def world_size(config: LaunchConfig) -> int:
    """The world size the ranks will have (from torchrun's environment when there is one)."""
    if under_torchrun():
        return int(os.environ["WORLD_SIZE"])
    return config.nproc_per_node * config.nnodes


def validate(config: LaunchConfig) -> None:
    settings.check(config)  # the declared ranges and choices (LaunchConfig's fields)
    checks = [
        (config.node_rank < config.nnodes, f"--node-rank {config.node_rank} must be between 0 and --nnodes - 1"),
        (config.nnodes == 1 or config.master_port > 0, "with --nnodes above 1, give --master-port (and --master-addr) of node 0"),
    ]
    for ok, message in checks:
        if not ok:
            raise UsageError(message)


def quiet_cpp_logs() -> None:
    """Keep torch's C++ log lines off the console: c10d logs each rendezvous retry and failure with
    its C++ stack (~100 lines before our one-line message). Read once, when torch loads: call it
    before torch is imported (the ranks inherit it). PIPE_DEBUG=1 keeps them."""
    if not os.environ.get("PIPE_DEBUG"):
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
        os.environ.setdefault("TORCH_SHOW_CPP_STACKTRACES", "0")


class EveryRankStopped(StageFailed):
    """A failure every rank reached at the same step, knowing the others did too (a non-finite
    loss, more skipped samples than --max-skipped). A restart from the last checkpoint would meet
    it again on the same data, so under --max-restarts our launcher's ranks end normally with the
    message and the launcher raises it once, instead of the agent restarting them into it."""


STOPPED = "every_rank_stopped"
"""The key of a rank's result that carries an `EveryRankStopped` message to the launcher."""


def launch(config: LaunchConfig, entry: Callable[[Any], Any], arg: Any) -> dict[int, Any]:
    """Run ``entry(arg)`` on every rank; return {global rank: return value} of this node's ranks.

    ``entry`` and ``arg`` must be picklable (a module-level function, a dataclass): the elastic
    launcher starts fresh processes. A failed rank becomes `StageFailed` naming it.
    """
    validate(config)
    if under_torchrun():
        return {int(os.environ["RANK"]): _as_rank(entry, arg)}
    if config.nproc_per_node == 1 and config.nnodes == 1:
        return {0: _single_rank(entry, arg)}
    before_rendezvous(config)
    results = _elastic(config, entry, arg)
    stopped = next((r[STOPPED] for _, r in sorted(results.items()) if isinstance(r, dict) and STOPPED in r), None)
    if stopped is not None:
        raise StageFailed(stopped)
    return results


def before_rendezvous(config: LaunchConfig) -> None:
    """What would otherwise end in a rendezvous timeout minutes later, found in a moment: an
    address that does not resolve, and (on the node that hosts the store) a port already taken."""
    addr = config.master_addr
    try:
        socket.getaddrinfo(addr, None)
    except (socket.gaierror, UnicodeError) as e:
        raise UsageError(f"--master-addr: could not resolve {addr} ({getattr(e, 'strerror', None) or e}); "
                         "give node 0's address or a name this machine can resolve") from None
    hosts_store = config.nnodes == 1 or config.node_rank == 0
    if hosts_store and config.master_port:
        check_port_free(config.master_port)


def check_port_free(port: int) -> None:
    """The rendezvous store listens on ``port`` on every interface of this node: is it free?
    (SO_REUSEADDR, as the store uses: a port left in TIME_WAIT by a finished run counts as free.)"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as e:
            holder = port_holder(port)
            by = f" by {holder}" if holder else f" ({e.strerror or e})"
            raise UsageError(f"--master-port {port} is already in use on this machine{by}; choose another port "
                             "(this node hosts the rendezvous there)") from None


def port_holder(port: int) -> str | None:
    """``pid 1234 (python)`` for the process that has a TCP socket on ``port``, when this user
    may see it (Linux /proc); None otherwise."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if len(f) > 9 and int(f[1].rsplit(":", 1)[1], 16) == port and int(f[2].rsplit(":", 1)[1], 16) == 0:
                inodes.add(f"socket:[{f[9]}]")
    for fd_dir in _proc_fd_dirs() if inodes else ():
        try:
            if any(os.readlink(os.path.join(fd_dir, fd)) in inodes for fd in os.listdir(fd_dir)):
                pid = fd_dir.split("/")[2]
                with open(f"/proc/{pid}/comm") as comm:
                    return f"pid {pid} ({comm.read().strip()})"
        except OSError:
            continue
    return None


def _proc_fd_dirs() -> list[str]:
    try:
        return [f"/proc/{p}/fd" for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def _single_rank(entry: Callable[[Any], Any], arg: Any) -> Any:
    port = free_port()
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return entry(arg)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _elastic(config: LaunchConfig, entry: Callable[[Any], Any], arg: Any) -> dict[int, Any]:
    import uuid

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig as ElasticConfig
    from torch.distributed.launcher.api import elastic_launch

    if config.nnodes == 1:
        # like torchrun --standalone: a c10d store on a free port (or the one given)
        backend, endpoint, rdzv = "c10d", f"{config.master_addr}:{config.master_port}", {}
        run_id = str(uuid.uuid4())
    else:
        # like torchrun --nnodes N --node-rank R --master-addr A --master-port P (static rendezvous)
        backend, endpoint, rdzv = "static", f"{config.master_addr}:{config.master_port}", {"rank": config.node_rank}
        run_id = "pipe-train"
    if not os.environ.get("PIPE_DEBUG"):
        # the agent logs each failed rank's whole traceback; we report it in one line (PIPE_DEBUG=1 shows it)
        for name in ("torch.distributed.elastic.multiprocessing.api", "torch.multiprocessing.spawn"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    # OMP_NUM_THREADS is left alone: each rank sizes its own thread pool (train.components.device.cpu_threads),
    # knowing its dataloader workers, which this launcher does not.
    # The agent's rendezvous store is otherwise shared with the ranks and outlives a restart: a
    # restarted rank can read a dead rank's address and fail to connect (pytorch/pytorch#135712).
    # With it off, every attempt gets a fresh store, and --max-restarts really restarts.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    spec = ElasticConfig(min_nodes=config.nnodes, max_nodes=config.nnodes, nproc_per_node=config.nproc_per_node,
                         run_id=run_id, rdzv_backend=backend, rdzv_endpoint=endpoint, rdzv_configs=rdzv,
                         rdzv_timeout=config.rdzv_timeout, max_restarts=config.max_restarts,
                         monitor_interval=0.1, start_method="spawn")
    try:
        return elastic_launch(spec, _rank_entry)(entry, arg)
    except ChildFailedError as e:
        raise StageFailed(_describe_failures(e)) from None
    except SignalException as e:
        if e.sigval == signal.SIGTERM:
            # a preemption: the agent passed it on to the ranks, which wrote a checkpoint at their
            # next step boundary and ended (`train.components.stopping`), and waited for them (30 s)
            raise Terminated from None
        if e.sigval != signal.SIGINT:
            raise
        # Ctrl-C: the agent has already passed it on to the ranks and waited for them to end
        # (then killed what was left); to the command this is an interrupt like any other
        raise KeyboardInterrupt from None
    except Exception as e:
        if _is_rendezvous_failure(e):
            raise StageFailed(rendezvous_message(config, e)) from None
        raise


def _is_rendezvous_failure(e: BaseException) -> bool:
    """The store could not be reached or not every node joined in time (not a rank's own error)."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    return isinstance(e, (RendezvousError, dist.DistError, TimeoutError, ConnectionError))


def rendezvous_message(config: LaunchConfig, e: BaseException) -> str:
    """What failed, where, and what to check, instead of a hang or a C++ stack."""
    first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__).rstrip(".")
    where = f"{config.master_addr}:{config.master_port}"
    if config.nnodes > 1 and config.node_rank == 0:
        role = (f"node 0 waited {config.rdzv_timeout} s at {where} for all {config.nnodes} nodes to join "
                f"({first})")
        todo = (f"start the same command on every other node with --nnodes {config.nnodes}, its own --node-rank, "
                f"--master-addr {config.master_addr} --master-port {config.master_port}; ")
    else:
        role = f"node {config.node_rank} could not reach the rendezvous at {where} within {config.rdzv_timeout} s ({first})"
        todo = "check that node 0 is running (it must be started too) and that --master-addr is node 0's address; "
    return (f"rendezvous failed: {role}. {todo}check that {config.master_addr} is reachable from this machine "
            f"(e.g. nc -z {config.master_addr} {config.master_port}), that port {config.master_port} is open in "
            "node 0's firewall and not used by another job, and that the right network interface is used "
            "(set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME when machines have several); --rdzv-timeout sets the wait")


def _rank_entry(entry: Callable[[Any], Any], arg: Any) -> Any:
    """What each launched rank runs: the entry, with its exception recorded for the agent and
    said in one line on stderr (the agent itself only reports the first failure it notices).
    After a Ctrl-C nothing is a failure: the launcher says "interrupted" once for all ranks."""
    from torch.distributed.elastic.multiprocessing.errors import record

    _interrupts.rank_pid = os.getpid()
    signal.signal(signal.SIGINT, _interrupt_once)
    sys.unraisablehook = _interrupt_again_if_lost
    try:
        result = record(_as_rank)(entry, arg)
        if isinstance(result, dict) and result.get("interrupted"):
            _exit_after_handing_back()
        return result
    except EveryRankStopped as e:  # not a failure to restart from: handed back, said once by the launcher
        return {STOPPED: str(e)}
    except KeyboardInterrupt:
        _end_interrupted_rank()
    except BaseException as e:
        if _interrupts.seen:  # a dataloader worker or a peer that the same Ctrl-C stopped first
            _end_interrupted_rank()
        sys.stderr.write(f"pipe: rank {os.environ.get('RANK', '?')} failed: {shown(one_line(e))}\n")
        sys.stderr.flush()
        raise


def _exit_after_handing_back(seconds: float = 2.0) -> None:
    """A rank that a SIGTERM stopped (its checkpoint written, its result about to be handed back)
    ends on its own shortly after: torch's worker wrapper puts the result in a pipe and then waits
    for the agent to say it read it, which an agent that got the SIGTERM itself (and passed it on)
    never does: it would wait out its 30 s shutdown timeout and SIGKILL the rank. An agent that was
    not signalled reads the result at once and lets the rank end before this timer fires."""
    import threading

    def end() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    timer = threading.Timer(seconds, end)
    timer.daemon = True  # a rank the agent lets go first exits without waiting for it
    timer.start()


def _end_interrupted_rank() -> NoReturn:
    """End a rank that Ctrl-C stopped, once it has unwound (its dataloader workers stopped, its
    group left), without the interpreter's teardown: on a loaded machine that teardown took seconds
    the agent waits through, and a finalizer in it can print a stray traceback under the launcher's
    one "interrupted" line. 130 is what a shell reports for a command ended by SIGINT."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)


class _interrupts:
    rank_pid: int | None = None
    seen = False


def _interrupt_once(signum, frame) -> None:
    """A rank's Ctrl-C. The terminal sends it to every rank and to their dataloader workers (forked
    with this handler), and the launcher's agent passes it on again: a second one would break the
    rank's teardown (closing its dataloader and process group) with a traceback in the middle of
    it. The rank is interrupted once; its workers ignore it (the rank ends them as it closes)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.getpid() != _interrupts.rank_pid:
        return
    _interrupts.seen = True
    raise KeyboardInterrupt


def _interrupt_again_if_lost(unraisable: Any) -> None:
    """Python runs a signal handler wherever the main thread is, also inside a finalizer or a
    weakref callback (importlib's module locks have one), where the KeyboardInterrupt it raises
    is printed as "Exception ignored" and then dropped: the rank would train on, its Ctrl-C lost.
    Such an interrupt is delivered again, silently, a moment later (a timer's signal: raised here,
    it would be lost in this hook the same way), to land in the code that runs then."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _interrupts.seen and os.getpid() == _interrupts.rank_pid:
        signal.signal(signal.SIGALRM, _interrupt_once)
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        return
    sys.__unraisablehook__(unraisable)


def _as_rank(entry: Callable[[Any], Any], arg: Any) -> Any:
    """Run one rank; a rank that only lost its peers says so, after a pause that lets the
    launcher notice the rank that failed first (the cause) before this one."""
    import time

    try:
        return entry(arg)
    except Exception as e:
        if not peer_lost(e):
            raise
        time.sleep(2)
        raise StageFailed(f"rank {os.environ.get('RANK', '?')} lost contact with the other ranks: another rank failed "
                          f"first and said why ({one_line(e)[:100]})") from None


PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL communicator was aborted",
             "Socket Timeout", "Connection refused")


def peer_lost(e: BaseException | str) -> bool:
    """True for the errors a rank gets when *another* rank died (collateral, not the cause)."""
    text = e if isinstance(e, str) else str(e)
    return any(p in text for p in PEER_LOST)


def one_line(e: BaseException) -> str:
    """The exception's last line, scrubbed (a storage error may quote its endpoint's credentials)."""
    from pipeline.core.errors import StageFailed, UsageError
    from pipeline.storage.secrets import scrub

    last = scrub(next((ln.strip() for ln in reversed(str(e).splitlines()) if ln.strip()), ""))
    return last if isinstance(e, (StageFailed, UsageError)) else f"{type(e).__name__}: {last}"


def _describe_failures(e) -> str:
    """One line: each failed rank and the exception it recorded (or how it died)."""
    found = []
    for rank, failure in sorted(e.failures.items()):
        message = failure.message
        if isinstance(message, dict):  # written by record(): {"message": "Type: text", "extraInfo": ...}
            message = message.get("message", "")
        if not isinstance(message, str) or message.startswith("To enable traceback"):
            message = ""
        last = next((ln.strip() for ln in reversed(message.strip().splitlines()) if ln.strip()), "")
        last = re.sub(r"^(?:\w+\.)+(\w+: )", r"\1", last)  # train.data.reader.SampleDecodeError: -> SampleDecodeError:
        last = re.sub(r"^(StageFailed|UsageError|Refused): ", "", last)  # our own errors are already sentences
        what = last or (f"exit code {failure.exitcode}" if failure.exitcode >= 0 else f"killed by signal {-failure.exitcode}")
        found.append((peer_lost(what), f"rank {rank}: {what}"))
    causes = [text for lost, text in found if not lost]
    if not causes:  # only collateral failures were noticed: the cause is in a rank's line above
        return "; ".join(text for _, text in found) + " (a rank lost its peers: the rank that failed first said why above)"
    return "; ".join(causes) or str(e)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
