"""Shared test fixtures. Every test builds its own data in a temporary folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def cli():
    """Invoke `pipe ...` in-process; returns the click Result (exit_code, stdout, stderr)."""
    from pipeline.cli.app import app

    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, [str(a) for a in args], prog_name="pipe")

    return invoke


def pipe_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def pipe_in_fresh_interpreter(*args, before: str = "", after: str = "", exit_codes=(None, 0)) -> subprocess.CompletedProcess:
    """Run ``pipe ARGS`` through its real entry point in a new interpreter, with Python code
    ``before`` it (patches) and ``after`` it (assertions on that interpreter: ``sys.modules``).
    What a command imports or starts can only be seen in a process that has imported nothing."""
    code = (f"import sys\n{before}\nfrom pipeline.cli.app import main\nsys.argv = ['pipe'] + sys.argv[1:]\n"
            f"try:\n    main()\nexcept SystemExit as e:\n    assert e.code in {tuple(exit_codes)!r}, e.code\n{after}\n")
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=pipe_env())


@pytest.fixture
def pipe_proc():
    """Run `python -m pipeline ...` as a real process (for signals, exit codes, import cost)."""

    def run(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], capture_output=True, text=True,
                              env=pipe_env(), timeout=timeout, **kw)

    return run


def pytest_collection_modifyitems(config, items):
    """Without Ray installed (the optional `ray` extra), the tests marked `ray` are deselected,
    and said to be: the rest of the suite needs nothing extra. CI installs the extra (with CI=true
    a missing Ray stops the run instead)."""
    import importlib.util

    if importlib.util.find_spec("ray") is not None:
        return
    if os.environ.get("CI") == "true":  # CI installs every extra: a missing one is a broken setup
        raise pytest.UsageError("Ray is not installed, and CI runs the tests marked ray")
    dropped = [item for item in items if item.get_closest_marker("ray")]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not item.get_closest_marker("ray")]
        sys.stderr.write(f"\n{len(dropped)} tests marked ray deselected: Ray is not installed (pip install 'pipe-ml[ray]')\n")
