"""Packaging: the wheel works when installed, away from the repository.

Every other test imports pipe from the checkout, so none of them can see a file the wheel forgets
(``pipe check`` once crashed on the missing ``schemas/`` after ``pip install pipe_ml-*.whl``).
This test builds the wheel, installs it non-editable into a fresh virtualenv, and runs
clean -> shard -> check -> ``train --data-only`` from a folder outside the repo with PYTHONPATH
unset, so the only ``pipe`` the commands can import is the installed one.

To stay fast and offline, the fresh venv borrows this venv's third-party packages (torch, numpy,
...) through a ``.pth`` file that names this venv's site-packages. A plain path line does not run
the ``.pth`` files in that folder, so the editable install's finder, which would lead back to the
repo, stays off; the test asserts that ``pipeline`` and ``train`` come from the fresh venv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.factories import photo, write

pytestmark = [pytest.mark.packaging, pytest.mark.slow]

TOP_LEVEL = {"pipeline", "train"}  # the only packages a user installs; tests/, bench/, data_samples/ stay home


def _source_copy(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked plus untracked, not ignored), copied to dest.

    Built from a copy, the wheel cannot pick up a stale ``build/lib`` (setuptools reuses it and
    would ship modules that were since moved or deleted), and the test leaves no ``build/`` or
    ``*.egg-info`` in the checkout.
    """
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def _build_wheel(tmp: Path) -> Path:
    """``pip wheel`` with this venv's setuptools (no build isolation: no download, a few seconds)."""
    src = _source_copy(tmp / "src")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(tmp / "dist"), str(src)], cwd=tmp)
    (wheel,) = (tmp / "dist").glob("pipe_ml-*.whl")
    return wheel


def _fresh_venv(where: Path, wheel: Path) -> Path:
    """A new venv with the wheel installed (not editable), then this venv's site-packages borrowed.

    The ``.pth`` is written after the install so pip never sees this venv's editable pipe-ml.
    """
    venv.create(where, with_pip=False)
    python = where / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
         str(wheel)], cwd=where)
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    borrowed = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "borrowed-from-dev-venv.pth").write_text("".join(f"{p}\n" for p in borrowed))
    return where / "bin"


def run(args, cwd: Path, **kw) -> subprocess.CompletedProcess:
    """Run a command outside the repo with PYTHONPATH unset; fail with its output on a non-zero exit."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    p = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180, **kw)
    assert p.returncode == 0, f"{args} exited {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def _raw_dataset(root: Path) -> Path:
    """Two classes of small photos, a few with captions: enough for every stage and the default policy."""
    for c, label in enumerate(("cat", "dog")):
        for i in range(16):
            photo(root / label / f"{label}{i:02d}.jpg", 48, 40, seed=100 * c + i)
            if i % 3 == 0:
                write(root / label / f"{label}{i:02d}.txt", f"a photo of a {label}, number {i}")
    return root


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    assert REPO not in tmp.resolve().parents, "the test must run outside the repo"
    wheel = _build_wheel(tmp)
    return wheel, _fresh_venv(tmp / "venv", wheel), tmp


def test_wheel_carries_the_packages_schemas_and_markers_and_nothing_else(installed):
    wheel, _, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == TOP_LEVEL, f"the wheel must hold only {sorted(TOP_LEVEL)}, not {sorted(tops - TOP_LEVEL)}"
    for name in ("pipeline/py.typed", "train/py.typed"):
        assert name in names
    schemas = {p.name for p in (REPO / "schemas").glob("*.schema.json")}
    assert schemas and {f"pipeline/schemas/{s}" for s in schemas} <= set(names)
    source_py = {p.relative_to(REPO).as_posix() for top in TOP_LEVEL for p in (REPO / top).rglob("*.py")}
    assert source_py <= set(names), sorted(source_py - set(names))


def test_installed_pipe_runs_every_stage_outside_the_repo(installed):
    _, bin_dir, tmp = installed
    work = tmp / "work"
    raw = _raw_dataset(work / "raw")
    where = run([bin_dir / "python", "-c", "import pipeline, train; print(pipeline.__file__); print(train.__file__)"],
                cwd=work).stdout.splitlines()
    for f in where:
        assert Path(f).resolve().is_relative_to((tmp / "venv").resolve()), f"imported from {f}, not the installed wheel"

    pipe = bin_dir / "pipe"
    run([pipe, "clean", raw, "-o", work / "clean", "--workers", "1"], cwd=work)
    run([pipe, "shard", work / "clean", "-o", work / "shards", "--seed", "0", "--val-fraction", "0.2",
         "--max-count", "8"], cwd=work)
    report = json.loads(run([pipe, "check", work / "clean", work / "shards", "--json"], cwd=work).stdout)
    schema_checks = [c for folder in report["folders"] for c in folder["checks"] if c["name"] == "schema"]
    assert report["ok"] and len(schema_checks) == 2 and all(c["passed"] for c in schema_checks), schema_checks
    trained = run([pipe, "train", work / "shards", "-o", work / "run", "--data-only", "--workers", "0",
                   "--batch-size", "2"], cwd=work)
    assert "epoch 0 rank 0 " in trained.stdout, trained.stdout
