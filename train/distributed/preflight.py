"""Before the first step: do all ranks run the same software on the same data with the same config?

Every rank reports host, torch / CUDA / cuDNN / NCCL versions, device and free memory, the dataset
fingerprint (hash of index.json) and the resolved config's hash (with the input the model is fed:
its normalisation and size, `config_hash`). The reports are all-gathered,
so every rank reaches the same verdict from the same table: rank 0 prints it, and when a value
that must agree does not, every rank stops (exit 1) with a message naming the ranks that differ.
Mismatched torch or NCCL builds otherwise show up hours later as a hang or garbage gradients.
"""

from __future__ import annotations

import hashlib
import json
import socket
from collections import Counter

import torch
from rich.markup import escape

from pipeline.core.errors import StageFailed
from train.distributed.group import Dist, all_gather_object

# Values that must be the same on every rank; the rest (host, device, memory) is informational.
MUST_AGREE = ("torch", "cuda", "cudnn", "nccl", "dataset", "config")
COLUMNS = ("rank", "host", "torch", "cuda", "cudnn", "nccl", "device", "free_mem", "dataset", "config")


class PreflightFailed(StageFailed):
    """Ranks disagree on something that must be identical: exit 1 on every rank."""


def config_hash(config_fingerprint: str, model_input: dict) -> str:
    """The ``config`` value compared across ranks: the settings' hash (`TrainConfig.fingerprint`)
    and what the model is fed (normalisation, image size, tokens; `train.models.norm`), which
    comes from files on each node (a model folder's preprocessor_config.json) and so can differ."""
    doc = json.dumps({"config": config_fingerprint, "input": model_input}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def _nccl_version() -> str:
    try:
        if torch.cuda.is_available() and torch.distributed.is_nccl_available():
            v = torch.cuda.nccl.version()
            return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:  # a broken NCCL install is exactly what this table is for
        return "error"
    return "-"


def _device_and_memory(device: torch.device) -> tuple[str, str]:
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return torch.cuda.get_device_name(device), f"{free / 2**30:.1f}/{total / 2**30:.1f} GiB"
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        free = int(info["MemAvailable"].split()[0]) * 1024
        return "cpu", f"{free / 2**30:.1f} GiB"
    except (OSError, KeyError, ValueError):
        return "cpu", "?"


def local_report(d: Dist, dataset_fingerprint: str, config_hash: str) -> dict:
    device_name, free = _device_and_memory(d.device)
    return {
        "rank": d.rank,
        "host": socket.gethostname(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "-",
        "cudnn": str(torch.backends.cudnn.version() or "-") if torch.backends.cudnn.is_available() else "-",
        "nccl": _nccl_version(),
        "device": device_name,
        "free_mem": free,
        "dataset": dataset_fingerprint,
        "config": config_hash,
    }


def disagreements(reports: list[dict]) -> list[str]:
    """One sentence per value that is not the same everywhere, naming the ranks on each side."""
    problems = []
    for key in MUST_AGREE:
        by_value: dict[str, list[int]] = {}
        for r in reports:
            by_value.setdefault(str(r[key]), []).append(r["rank"])
        if len(by_value) > 1:
            majority = Counter({v: len(ranks) for v, ranks in by_value.items()}).most_common(1)[0][0]
            parts = [f"rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))} "
                     f"({', '.join(sorted({reports[i]['host'] for i in ranks}))}) {key}={value}"
                     for value, ranks in sorted(by_value.items(), key=lambda kv: (kv[0] != majority, kv[1][0]))]
            problems.append(f"{key} differs: " + " vs ".join(parts))
    return problems


def table(reports: list[dict]):
    from rich.table import Table

    t = Table(title="preflight", title_justify="left")
    for col in COLUMNS:
        t.add_column(col, justify="right" if col in ("rank", "free_mem") else "left")
    bad = {k for k in MUST_AGREE if len({str(r[k]) for r in reports}) > 1}
    for r in reports:
        t.add_row(*[f"[red]{r[c]}[/]" if c in bad else str(r[c]) for c in COLUMNS])
    return t


def run(d: Dist, dataset_fingerprint: str, config_hash: str, console=None) -> list[dict]:
    """All-gather the reports; rank 0 prints the table; raise PreflightFailed on every rank on mismatch."""
    reports = all_gather_object(local_report(d, dataset_fingerprint, config_hash), d)
    problems = disagreements(reports)
    if d.is_main and console is not None:
        console.print(table(reports))
        for p in problems:
            console.print(f"[red]preflight:[/] {escape(p)}")  # a path's "[" is no markup
    if problems:
        raise PreflightFailed("preflight: ranks disagree: " + "; ".join(problems))
    return reports
