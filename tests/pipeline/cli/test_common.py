"""How a command ends: an interrupted command says honestly whether running it again resumes."""

import pytest


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("command, module, says, output", [
    ("shard", "pipeline.shard.stage", "run the same command again to resume", True),  # finished shards are kept
    ("clean", "pipeline.clean.stage", "run the same command again to resume", True),
    ("check", "pipeline.check.stage", "run the same command again to start over", False),
])
def test_an_interrupted_command_promises_only_what_it_does(cli, tmp_path, monkeypatch, command, module, says, output):
    monkeypatch.setattr(f"{module}.run", _interrupt)
    (tmp_path / "in").mkdir()
    r = cli(command, tmp_path / "in", *(["-o", tmp_path / "out"] if output else []))
    assert r.exit_code == 130
    assert r.stderr.strip() == f"interrupted: {says}"
