"""`pipe check`: hold a clean dir or a shard dir to a quality policy, the CI data-quality gate.

For each folder: recognise what it is (a clean dir has ``manifest.parquet``, a shard dir has
``index.json``), load it once, run every check of its kind, and set each result's severity from
the policy. The report says pass/fail per check; the exit code is 1 when any check whose severity
is ``error`` failed, 0 otherwise (warnings allowed), 2 for usage errors (missing folder, bad policy).
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from pipeline import __version__
from pipeline.check import clean_dir, registry
from pipeline.check.config import CheckConfig
from pipeline.check.policy import Policy
from pipeline.check.policy import load as load_policy
from pipeline.check.result import ERROR, FAIL, PASS, SKIP, WARNING, CheckResult, fail
from pipeline.core.errors import UsageError
from pipeline.core.settings import check as check_settings
from pipeline.formats import index as shard_index
from pipeline.storage import Folder, Location, open_folder

F = TypeVar("F")  # the loaded folder (CleanDir or ShardDir) that a check reads


@dataclass
class FolderReport:
    path: Location  # as it was given: a local path, or a URL
    kind: str  # clean | shard
    results: list[CheckResult]
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"path": str(self.path), "kind": self.kind, "seconds": round(self.seconds, 3),
                "checks": [r.to_dict() for r in self.results]}


@dataclass
class CheckReport:
    folders: list[FolderReport]
    policy: Policy
    deep: bool
    counts: dict = field(default_factory=dict)

    @property
    def results(self) -> list[CheckResult]:
        return [r for f in self.folders for r in f.results]

    @property
    def exit_code(self) -> int:
        return 1 if any(r.blocking for r in self.results) else 0

    def summary(self) -> dict:
        rs = self.results
        return {
            "checks": len(rs),
            "passed": sum(r.status == PASS for r in rs),
            "errors": sum(r.status == FAIL and r.severity == ERROR for r in rs),
            "warnings": sum(r.status == FAIL and r.severity == WARNING for r in rs),
            "skipped": sum(r.status == SKIP for r in rs),
        }

    def to_dict(self) -> dict:
        return {
            "schema_version": 1, "tool": f"pipe {__version__}", "ok": self.exit_code == 0,
            "exit_code": self.exit_code, "deep": self.deep, "summary": self.summary(),
            "policy": self.policy.as_dict(), "folders": [f.to_dict() for f in self.folders],
        }


def detect(folder: Folder) -> str:
    """``clean`` or ``shard``; anything else is a UsageError that says what the folder lacks."""
    path = folder.url
    state = folder.state()
    if state == "absent":
        raise UsageError(f"folder not found: {path}")
    if state == "file":
        raise UsageError(f"{path} is not a folder (pipe check takes a clean dir or a shard dir)")
    if shard_index.exists(folder):
        return "shard"
    if clean_dir.is_clean_dir(folder):
        return "clean"
    if clean_dir.looks_unfinished(folder):
        raise UsageError(f"{path} is an unfinished pipe clean output (no manifest.parquet yet): run pipe clean again")
    if any("/" not in e.rel and e.rel.endswith(".tar") for e in folder.list()):
        raise UsageError(f"{path} holds .tar files but no index.json: pipe shard did not finish, or these are not pipe shards")
    raise UsageError(f"{path} is neither a clean dir (manifest.parquet from pipe clean) nor a shard dir (index.json from pipe shard)")


def run(cfg: CheckConfig, show_progress: bool = False) -> CheckReport:
    if not cfg.dirs:
        raise UsageError("give at least one folder to check")
    check_settings(cfg)  # the declared ranges (check/config.py)
    if cfg.input is not None and open_folder(cfg.input).state() != "folder":
        raise UsageError(f"--input {open_folder(cfg.input).url} is not a folder")
    policy = load_policy(cfg.policy)  # a bad policy stops us before any work
    kinds = [(d, open_folder(d)) for d in cfg.dirs]
    checked = [(d, f, detect(f)) for d, f in kinds]  # so does a bad folder, even the last one
    folders = []
    for given, folder, kind in checked:
        t = time.perf_counter()
        results = run_folder(folder, kind, policy, cfg, show_progress)
        folders.append(FolderReport(given, kind, results, time.perf_counter() - t))
    return CheckReport(folders, policy, cfg.deep)


def run_folder(folder: Folder, kind: str, policy: Policy, cfg: CheckConfig, show_progress: bool = False) -> list[CheckResult]:
    if kind == "clean":
        clean = clean_dir.load(folder, cfg.deep, cfg.input, cfg.workers)
        return [run_one(c, clean, policy) for c in registry.checks(kind)]
    from pipeline.check import shard_dir

    with _shard_progress(folder.url, show_progress) as advance:
        shard = shard_dir.load(folder, cfg.deep, policy, cfg.workers, advance)
    return [run_one(c, shard, policy) for c in registry.checks(kind)]


@contextmanager
def _shard_progress(path: str, enabled: bool):
    """A bar on stderr over the shards being read (the long part of checking a shard dir); plain
    lines now and then when stderr is a log."""
    from pipeline.core.ui import progress

    with progress(f"check {path}", None, enabled, counts=False, transient=True) as advance:
        yield lambda: advance(True)


def run_one(check: registry.Check, folder: F, policy: Policy) -> CheckResult:
    name = check.name
    t = time.perf_counter()
    try:
        result = check.run(folder, policy)
    except Exception as e:  # noqa: BLE001 - data odd enough to crash a check fails that check, loudly
        if os.environ.get("PIPE_DEBUG"):
            raise
        result = fail(name, f"the check crashed: {type(e).__name__}: {e} (PIPE_DEBUG=1 shows the traceback)")
    result.severity = policy.severity_of(result.name)
    result.seconds = time.perf_counter() - t
    return result
