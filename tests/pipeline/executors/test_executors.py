"""--executor: ray without Ray installed is one line saying how to install it, and an unknown one
is refused (that local runs never import Ray: tests/pipeline/cli/test_app.py)."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import pipe_env, pipe_in_fresh_interpreter


def test_executor_ray_without_ray_is_one_line_saying_how_to_install_it(tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.txt").write_text("hello")
    for cmd in (["clean", tmp_path / "raw", "-o", tmp_path / "out"], ["shard", tmp_path / "clean", "-o", tmp_path / "shards"]):
        # a Ray that cannot be imported, as on a machine without the extra; pipe exits 2
        p = pipe_in_fresh_interpreter(*cmd, "--executor", "ray", before="sys.modules['ray'] = None", exit_codes=(2,))
        assert p.returncode == 0, p.stderr
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "pip install 'pipe-ml[ray]'" in lines[0], p.stderr
    assert not (tmp_path / "out").exists()


def test_an_unknown_executor_is_refused(pipe_proc, tmp_path):
    (tmp_path / "raw").mkdir()
    p = pipe_proc("clean", tmp_path / "raw", "-o", tmp_path / "out", "--executor", "dask")
    assert p.returncode == 2 and "--executor must be one of local, ray" in p.stderr


def test_the_toml_config_sets_the_executor_and_its_schema_refuses_others(pipe_proc, tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.txt").write_text("hello")
    good = tmp_path / "pipe.toml"
    good.write_text('[clean]\nexecutor = "ray"\nray_address = "127.0.0.9:1"\npart_files = 10\n')
    code = ("import sys\nsys.modules['ray'] = None\nfrom pipeline.cli.app import main\n"
            "sys.argv = ['pipe'] + sys.argv[1:]\nmain()\n")
    p = subprocess.run([sys.executable, "-c", code, "clean", str(tmp_path / "raw"), "-o", str(tmp_path / "out"), "--config", str(good)],
                       capture_output=True, text=True, env=pipe_env())
    assert p.returncode == 2 and "pip install 'pipe-ml[ray]'" in p.stderr, p.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text('[shard]\nexecutor = "spark"\n')
    p = pipe_proc("shard", tmp_path / "clean", "-o", tmp_path / "shards", "--config", bad)
    assert p.returncode == 2 and "executor" in p.stderr, p.stderr


# -- the registry, and any stage's parts on any executor ----------------------------------------


def test_executor_choices_and_help_come_from_the_registry(cli):
    from pipeline import executors

    assert tuple(executors.EXECUTORS) == ("local", "ray")
    for command in ("clean", "shard"):
        r = cli(command, "--help")
        text = "".join(re.sub(r"[│╭╮╰╯─]", " ", r.stdout).split())  # the words, as wrapped in rich's boxes
        assert "".join(executors.HELP.split()) in text, r.stdout


def test_the_local_executor_runs_a_fake_stages_parts():
    """A stage it has never heard of: items squared in worker processes (one crashing its worker,
    pinned on that item alone), each part finished where it ran, whole parts with a later step."""
    from pipeline.executors import get
    from tests import fake_stage

    assert fake_stage.run(get("local", workers=2)) == fake_stage.EXPECTED
