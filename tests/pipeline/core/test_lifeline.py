"""The fork server's first import: it dies with its caller, and exits without its teardown."""

import subprocess
import sys

from tests.conftest import pipe_env


def test_the_fork_server_exits_without_tearing_down_its_interpreter():
    """Its exit (when the caller closes the "alive" pipe: a SystemExit) goes through os._exit
    before the interpreter tears numpy and the decoders down, which the caller waited for."""
    code = ("import os, sys\nimport pipeline.core.lifeline\n"
            "class Teardown:\n    def __del__(self):\n        print('torn down', flush=True)\n"
            "kept = Teardown()\nraise SystemExit\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=pipe_env())
    assert p.returncode == 0 and "torn down" not in p.stdout, (p.stdout, p.stderr)
    p = subprocess.run([sys.executable, "-c", code.replace("import pipeline.core.lifeline\n", "")],
                       capture_output=True, text=True, env=pipe_env())
    assert "torn down" in p.stdout, (p.stdout, p.stderr)  # what the check above would miss
