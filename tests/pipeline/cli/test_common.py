"""How a command ends: an interrupted command says honestly whether running it again resumes."""

import pytest


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("command, module, says", [
    ("shard", "pipeline.shard.stage", "run the same command again to start over"),
    ("clean", "pipeline.clean.stage", "run the same command again to resume"),
])
def test_an_interrupted_command_promises_only_what_it_does(cli, tmp_path, monkeypatch, command, module, says):
    monkeypatch.setattr(f"{module}.run", _interrupt)
    (tmp_path / "in").mkdir()
    r = cli(command, tmp_path / "in", "-o", tmp_path / "out")
    assert r.exit_code == 130
    assert r.stderr.strip() == f"interrupted: {says}"
