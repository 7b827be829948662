"""`pipe doctor`: is this machine ready for a long training run? Facts first, verdicts second.

`gather()` collects facts with small functions (Python, torch and what it was built with, the
NVIDIA driver, GPUs and how they connect, distributed backends, /dev/shm, CPUs, the rendezvous
port, disk space) into a plain `Facts` object; nothing there judges. `diagnose(facts)` turns the
facts into `Line`s, each with a verdict ok | warn | fail and, when not ok, what to do. Tests fake
the facts (no CUDA, two GPUs without peer access, a 64 MB /dev/shm) and check the verdicts.

torch is imported lazily, inside `torch_facts` only: `pipe --help` and the data commands stay
torch-free, and a machine without torch still gets a report (that says so).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import platform
import re
import shutil
import subprocess
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.cores import available_cores
from pipeline.core.settings import setting

OK, WARN, FAIL = "ok", "warn", "fail"
GB = 1000**3  # vendors label memory in decimal GB ("a 16 GB card")
MIB = 1024**2

MIN_GPU_MEMORY = 16 * GB  # below this, fine-tuning a real model needs bf16, checkpointing, small batches
SHM_FAIL, SHM_WARN = 256 * MIB, 2 * 1024 * MIB  # Docker's default is 64 MB
DISK_FAIL, DISK_WARN = 2 * GB, 20 * GB
DEFAULT_PORT = 29500  # torchrun's default --master-port


@dataclass
class DoctorConfig:
    """Settings of `pipe doctor` (flags of the same name; `[doctor]` in a `--config` file)."""

    port: int = setting(DEFAULT_PORT, "Rendezvous port the run will use (torchrun --master-port).", minimum=1,
                        maximum=65535)
    run_dir: Path = setting(Path("."), "Where the run will write checkpoints and logs (free space and writability are "
                                       "checked there).")


@dataclass
class GPU:
    index: int
    name: str
    memory_bytes: int
    capability: tuple[int, int] | None = None


@dataclass
class Facts:
    """What `gather` found. Every field has a plain value; None means "could not be found out"."""

    python: str = ""
    platform: str = ""
    torch: str | None = None
    torch_error: str | None = None
    torch_cuda: str | None = None
    """CUDA version torch was built with; None for a CPU build."""
    torch_arch_list: list[str] = field(default_factory=list)
    """GPU architectures the torch build has kernels for (sm_80, ...)."""
    cuda_available: bool = False
    cuda_error: str | None = None
    driver: str | None = None
    """NVIDIA driver version, from nvidia-smi."""
    driver_cuda: str | None = None
    """Newest CUDA version the installed driver supports (cuDriverGetVersion), e.g. "12.4"."""
    cudnn: str | None = None
    nccl: str | None = None
    gpus: list[GPU] = field(default_factory=list)
    peer_access: dict[str, bool] = field(default_factory=dict)
    """"i-j" -> whether GPU i can read GPU j's memory directly (torch.cuda.can_device_access_peer)."""
    topology: dict[str, str] = field(default_factory=dict)
    """"i-j" -> link type from nvidia-smi topo -m: NV# (NVLink), PIX, PXB, PHB, NODE, SYS."""
    backends: dict[str, bool] = field(default_factory=dict)
    shm_total: int | None = None
    shm_free: int | None = None
    cpus: int = 1
    port: int = DEFAULT_PORT
    port_free: bool | None = None
    port_error: str | None = None
    run_dir: str = "."
    disk_free: int | None = None
    run_dir_writable: bool | None = None
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Line:
    name: str
    verdict: str
    value: str
    advice: str = ""


# --------------------------------------------------------------------------- facts


def gather(port: int = DEFAULT_PORT, run_dir: Path = Path(".")) -> Facts:
    f = Facts(python=platform.python_version(), platform=f"{platform.system()} {platform.release()} {platform.machine()}")
    torch_facts(f)
    f.driver_cuda = driver_cuda_version()
    f.driver = nvidia_smi(["--query-gpu=driver_version", "--format=csv,noheader"]).split("\n")[0].strip() or None
    if len(f.gpus) > 1:
        f.topology = parse_topology(nvidia_smi(["topo", "-m"]))
    f.shm_total, f.shm_free = shm_size()
    f.cpus = available_cores()
    f.port, (f.port_free, f.port_error) = port, port_free(port)
    f.run_dir = str(run_dir)
    f.disk_free, f.run_dir_writable = disk_facts(run_dir)
    f.env = {k: v for k, v in sorted(os.environ.items())
             if k.startswith(("NCCL_", "CUDA_", "TORCH_", "MASTER_")) or k in ("OMP_NUM_THREADS", "WORLD_SIZE")}
    return f


def torch_facts(f: Facts) -> None:
    """Versions torch was built with, its view of the GPUs, and the distributed backends."""
    try:
        import torch
        import torch.distributed as dist
    except Exception as e:  # noqa: BLE001 - ImportError, or a broken install raising anything
        f.torch_error = f"{type(e).__name__}: {e}"
        return
    f.torch, f.torch_cuda = torch.__version__, torch.version.cuda
    f.backends = {"gloo": dist.is_available() and dist.is_gloo_available(),
                  "nccl": dist.is_available() and dist.is_nccl_available(),
                  "mpi": dist.is_available() and dist.is_mpi_available()}
    if f.torch_cuda is None:
        return
    with warnings.catch_warnings(record=True) as caught:  # "driver too old" arrives as a warning
        warnings.simplefilter("always")
        f.cuda_available = torch.cuda.is_available()
    if not f.cuda_available and caught:
        f.cuda_error = str(caught[-1].message).strip().splitlines()[0]
    f.torch_arch_list = list(torch.cuda.get_arch_list()) if f.cuda_available else []
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    f.cudnn = f"{cudnn // 10000}.{cudnn // 100 % 100}.{cudnn % 100}" if cudnn and cudnn >= 10000 else (str(cudnn) if cudnn else None)
    f.nccl = _nccl_version(torch) if f.backends["nccl"] else None
    if f.cuda_available:
        _gpu_facts(torch, f)


def _nccl_version(torch) -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - absent in CPU builds and some custom builds
        return None
    if isinstance(v, tuple):
        return ".".join(map(str, v[:3]))
    return f"{v // 1000}.{v // 100 % 10}.{v % 100}" if v < 10000 else f"{v // 10000}.{v // 100 % 100}.{v % 100}"


def _gpu_facts(torch, f: Facts) -> None:
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        f.gpus.append(GPU(i, p.name, int(p.total_memory), (p.major, p.minor)))
    for a in range(len(f.gpus)):
        for b in range(len(f.gpus)):
            if a != b:
                f.peer_access[f"{a}-{b}"] = bool(torch.cuda.can_device_access_peer(a, b))


def driver_cuda_version() -> str | None:
    """The newest CUDA the driver supports, asked of libcuda itself (works without nvidia-smi)."""
    import ctypes  # here, not at the top: `pipe --help` imports this module for DoctorConfig

    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll", "libcuda.dylib"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        v = ctypes.c_int(0)
        try:
            if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 and v.value:
                return f"{v.value // 1000}.{v.value % 1000 // 10}"
        except AttributeError:
            pass
    return None


def nvidia_smi(args: list[str]) -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ""
    try:
        return subprocess.run([exe, *args], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_topology(text: str) -> dict[str, str]:
    """``nvidia-smi topo -m`` -> {"0-1": "NV12", ...} for every pair of GPUs."""
    lines = [_ANSI.sub("", ln) for ln in text.splitlines()]
    header = next((ln for ln in lines if re.match(r"^\s+GPU0\b", ln)), None)
    if header is None:
        return {}
    cols = [c.strip() for c in header.strip().split("\t")]
    out = {}
    for ln in lines:
        m = re.match(r"^GPU(\d+)\s", ln)
        if not m:
            continue
        cells = [c.strip() for c in ln.split("\t")[1:]]
        for col, cell in zip(cols, cells):
            n = re.fullmatch(r"GPU(\d+)", col)
            if n and n.group(1) != m.group(1):
                out[f"{m.group(1)}-{n.group(1)}"] = cell
    return out


def shm_size(path: str = "/dev/shm") -> tuple[int | None, int | None]:
    try:
        st = os.statvfs(path)
    except OSError:
        return None, None
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def port_free(port: int) -> tuple[bool | None, str | None]:
    """Can a rendezvous store listen on ``port``? (SO_REUSEADDR like torch's TCPStore, so TIME_WAIT is no problem.)"""
    import socket  # here, not at the top: `pipe --help` imports this module for DoctorConfig

    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 here
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return False, f"{host} port {port}: {e.strerror}"
            if e.errno in (errno.EACCES, errno.EPERM):
                return False, f"port {port}: {e.strerror}"
            if family == socket.AF_INET:
                return None, str(e)
        finally:
            s.close()
    return True, None


def disk_facts(run_dir: Path) -> tuple[int | None, bool | None]:
    """Free bytes and writability where the run will go (its nearest existing parent if not made yet)."""
    p = Path(run_dir).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free, os.access(p, os.W_OK)
    except OSError:
        return None, None


# --------------------------------------------------------------------------- verdicts


def diagnose(f: Facts) -> list[Line]:
    lines = [python_line(f), torch_line(f)]
    if f.torch is not None:
        lines += [cuda_line(f), cudnn_line(f), nccl_line(f), *gpu_lines(f), peer_line(f), backends_line(f)]
    lines += [shm_line(f), cpu_line(f), port_line(f), disk_line(f)]
    return lines


def _ver(s: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", s or "")[:2])


def python_line(f: Facts) -> Line:
    if _ver(f.python) < (3, 10):
        return Line("python", FAIL, f.python, "pipe needs Python 3.10 or newer")
    return Line("python", OK, f"{f.python} ({f.platform})")


def torch_line(f: Facts) -> Line:
    if f.torch is None:
        return Line("torch", FAIL, f"not importable: {f.torch_error}", "install torch (scripts/setup, or pip install torch)")
    build = f"CUDA {f.torch_cuda}" if f.torch_cuda else "CPU-only"
    return Line("torch", OK, f"{f.torch} ({build} build)")


def cuda_line(f: Facts) -> Line:
    """Does the driver run what torch was built with? CUDA 11.1+ keeps minor-version compatibility."""
    if f.torch_cuda is None:
        return Line("cuda", OK, "not used: CPU-only torch build; training runs on CPU with gloo",
                    "" if not f.driver_cuda
                    else f"this machine has an NVIDIA driver (CUDA {f.driver_cuda}): install a CUDA build of torch to use its GPUs")
    built, drv = _ver(f.torch_cuda), _ver(f.driver_cuda)
    value = f"torch built with CUDA {f.torch_cuda}; driver {f.driver or '?'} supports CUDA {f.driver_cuda or '?'}"
    if not f.driver_cuda:
        return Line("cuda", WARN, f"torch built with CUDA {f.torch_cuda}; no NVIDIA driver found",
                    "without a driver (libcuda) training runs on CPU; install the NVIDIA driver, or a CPU build of torch")
    if drv[:1] < built[:1]:
        return Line("cuda", FAIL, value, f"the driver is too old for this torch: upgrade the driver to one supporting CUDA "
                                         f"{f.torch_cuda}, or install torch built for CUDA {drv[0]}.x")
    if not f.cuda_available:
        return Line("cuda", FAIL, f"{value}; CUDA unavailable: {f.cuda_error or 'no GPU visible'}",
                    "check nvidia-smi and CUDA_VISIBLE_DEVICES" + ("" if "CUDA_VISIBLE_DEVICES" not in f.env else
                                                                    f" (set to {f.env['CUDA_VISIBLE_DEVICES']!r})"))
    if drv < built:
        return Line("cuda", WARN, value, "the driver is older than the CUDA minor version torch was built with: minor-version "
                                         "compatibility runs most kernels, but PTX JIT and newer features fail; upgrade the driver")
    return Line("cuda", OK, value)


def cudnn_line(f: Facts) -> Line:
    if f.torch_cuda is None:
        return Line("cudnn", OK, "not used (CPU build)")
    if f.cudnn is None:
        return Line("cudnn", WARN, "not available", "convolutions fall back to slow kernels: reinstall a torch build that bundles cuDNN")
    return Line("cudnn", OK, f.cudnn)


def nccl_line(f: Facts) -> Line:
    if not f.gpus:
        return Line("nccl", OK, f"{f.nccl or 'not used'}: no GPUs, gloo does the all-reduce")
    if f.nccl is None or not f.backends.get("nccl"):
        verdict = FAIL if len(f.gpus) > 1 else WARN
        return Line("nccl", verdict, "missing from this CUDA build",
                    "multi-GPU DDP needs NCCL: install an official CUDA build of torch (it bundles NCCL)")
    return Line("nccl", OK, f.nccl)


def gpu_lines(f: Facts) -> list[Line]:
    if not f.gpus:
        return [Line("gpus", WARN if f.torch_cuda else OK, "none visible",
                     "training runs on CPU (slow for real models)" if f.torch_cuda else "")]
    out = []
    for g in f.gpus:
        value = f"{g.name}, {g.memory_bytes / GB:.1f} GB" + (f", sm_{g.capability[0]}{g.capability[1]}" if g.capability else "")
        arch = _arch_problem(g, f.torch_arch_list)
        if arch:
            out.append(Line(f"gpu {g.index}", FAIL, value, arch))
        elif g.memory_bytes < MIN_GPU_MEMORY:
            out.append(Line(f"gpu {g.index}", WARN, value, "under 16 GB: fine-tuning may run out of memory; use --precision bf16, "
                                                           "--grad-checkpoint, a smaller --batch-size with --accum"))
        else:
            out.append(Line(f"gpu {g.index}", OK, value))
    if len({(g.name, g.memory_bytes) for g in f.gpus}) > 1:
        out.append(Line("gpus", WARN, f"{len(f.gpus)} GPUs of different kinds",
                        "DDP steps at the pace of the slowest GPU and the batch must fit the smallest; "
                        "pin CUDA_VISIBLE_DEVICES to one kind"))
    return out


def _arch_problem(g: GPU, arch_list: list[str]) -> str:
    """Has torch kernels for this GPU? sm_XY cubins run on the same major with minor >= Y."""
    if not arch_list or g.capability is None:
        return ""
    major, minor = g.capability
    sms = [tuple(map(int, m.groups())) for a in arch_list if (m := re.fullmatch(r"sm_(\d+?)(\d)a?", a))]
    if any(M == major and m <= minor for M, m in sms):
        return ""
    ptx = [tuple(map(int, m.groups())) for a in arch_list if (m := re.fullmatch(r"compute_(\d+?)(\d)a?", a))]
    if any(v <= (major, minor) for v in ptx):
        return ""  # PTX is JIT-compiled for newer GPUs (a slow first start, but it runs)
    return f"this torch has kernels for {', '.join(arch_list)} but not sm_{major}{minor}: install a torch build that supports this GPU"


def peer_line(f: Facts) -> Line:
    n = len(f.gpus)
    if n < 2:
        return Line("peer access", OK, f"{'one GPU' if n else 'no GPUs'}: nothing to connect")
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    links = {f"{a}-{b}": f.topology.get(f"{a}-{b}", "?") for a, b in pairs}
    nvlink = sum(v.startswith("NV") for v in links.values())
    kind = f"NVLink on {nvlink} of {len(pairs)} pairs" if f.topology else "topology unknown (no nvidia-smi)"
    no_p2p = [f"{a}-{b}" for a, b in pairs if not (f.peer_access.get(f"{a}-{b}") and f.peer_access.get(f"{b}-{a}"))]
    if no_p2p:
        via = ", ".join(f"{p} ({links[p]})" for p in no_p2p[:6])
        return Line("peer access", WARN, f"no peer-to-peer between GPUs {via}; {kind}",
                    "NCCL then copies through host memory (slower all-reduce). Typical causes: GPUs on different CPU "
                    "sockets (SYS), IOMMU/ACS in VMs. If the first all-reduce hangs, try NCCL_P2P_DISABLE=1")
    return Line("peer access", OK, f"peer-to-peer between all {n} GPUs; {kind}")


def backends_line(f: Facts) -> Line:
    have = [b for b in ("gloo", "nccl", "mpi") if f.backends.get(b)]
    value = ", ".join(have) or "none"
    if not f.backends.get("gloo"):
        return Line("backends", FAIL, value, "torch.distributed without gloo cannot train on CPU or run the preflight: reinstall torch")
    if f.gpus and not f.backends.get("nccl"):
        return Line("backends", FAIL, value, "GPU training needs the nccl backend: install a CUDA build of torch")
    return Line("backends", OK, value)


def shm_line(f: Facts) -> Line:
    total, free = f.shm_total, f.shm_free  # shm_size() finds both or neither
    if total is None or free is None:
        return Line("/dev/shm", WARN, "not found", "dataloader workers share batches through /dev/shm; use --workers 0 if they crash")
    value = f"{free / MIB:,.0f} MiB free of {total / MIB:,.0f} MiB"
    fix = ("dataloader workers pass batches through shared memory and die with 'Bus error' when it is full: "
           "run the container with --shm-size=16g (or --ipc=host), or use --workers 0")
    if free < SHM_FAIL:
        return Line("/dev/shm", FAIL, value, fix)
    if free < SHM_WARN:
        return Line("/dev/shm", WARN, value, fix)
    return Line("/dev/shm", OK, value)


def suggested_workers(f: Facts) -> int:
    """Dataloader workers per rank: the CPUs left per rank after its main process, at most 8."""
    ranks = max(1, len(f.gpus))
    return max(0, min(8, f.cpus // ranks - 1))


def cpu_line(f: Facts) -> Line:
    ranks = max(1, len(f.gpus))
    w = suggested_workers(f)
    value = f"{f.cpus} CPUs for {ranks} rank{'s' * (ranks > 1)}: pipe train --workers {w}"
    if f.shm_free is not None and f.shm_free < SHM_FAIL:
        value += " (0 until /dev/shm is larger)"
    if f.cpus < 2 * ranks:
        return Line("cpus", WARN, value,
                    "fewer than 2 CPUs per rank: data loading will likely starve the GPUs (pipe train --data-only measures it)")
    return Line("cpus", OK, value)


def port_line(f: Facts) -> Line:
    if f.port_free is None:
        return Line("port", WARN, f"{f.port}: could not test ({f.port_error})")
    if not f.port_free:
        return Line("port", FAIL, f"{f.port} in use ({f.port_error})",
                    "another torchrun (or service) holds it: stop it, or pick a free one with --master-port / doctor --port")
    return Line("port", OK, f"{f.port} free for the rendezvous")


def disk_line(f: Facts) -> Line:
    if f.disk_free is None:
        return Line("disk", WARN, f"{f.run_dir}: unknown free space")
    value = f"{f.disk_free / GB:,.1f} GB free at {f.run_dir}"
    if f.run_dir_writable is False:
        return Line("disk", FAIL, value + " (not writable)", "checkpoints and logs go here: choose a writable --run-dir")
    if f.disk_free < DISK_FAIL:
        return Line("disk", FAIL, value, "checkpoints will not fit: free space or choose another --run-dir")
    if f.disk_free < DISK_WARN:
        return Line("disk", WARN, value, "checkpoints of a large model need tens of GB: keep fewer, or choose another --run-dir")
    return Line("disk", OK, value)


def exit_code(lines: list[Line]) -> int:
    return 1 if any(ln.verdict == FAIL for ln in lines) else 0


def to_dict(f: Facts, lines: list[Line]) -> dict:
    return {"schema_version": 1, "ok": exit_code(lines) == 0, "facts": dataclasses.asdict(f),
            "suggested_workers": suggested_workers(f), "lines": [dataclasses.asdict(ln) for ln in lines]}


