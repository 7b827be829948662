"""`pipe train`'s settings: batch arithmetic, the unfreeze schedule, precedence, and the schema."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pipeline.core.config import load_section, resolve
from pipeline.core.errors import UsageError
from pipeline.core.schemas import load_schema
from pipeline.core.settings import declared
from train.config import LaunchConfig, TrainConfig, parse_unfreeze_at, resolve_batch, validate


@pytest.mark.parametrize("given, world, want", [
    ((None, None, None), 2, (16, 1, 32)),      # defaults
    ((8, None, None), 4, (8, 1, 32)),
    ((None, None, 4), 2, (16, 4, 128)),
    ((8, 64, None), 2, (8, 4, 64)),            # accum derived
    ((None, 64, 2), 4, (8, 2, 64)),            # per-rank batch derived
    ((None, 64, None), 8, (8, 1, 64)),
    ((4, 32, 2), 4, (4, 2, 32)),               # all three, consistent
])
def test_any_two_give_the_third(given, world, want):
    plan = resolve_batch(*given, world)
    assert (plan.batch_size, plan.accum, plan.global_batch) == want
    assert plan.global_batch == plan.batch_size * plan.world_size * plan.accum


@pytest.mark.parametrize("given, world, words", [
    ((8, 100, None), 2, "not a multiple of --batch-size 8 x 2 ranks = 16"),
    ((None, 100, 3), 2, "cannot be split over 2 ranks x --accum 3"),
    ((4, 64, 4), 2, "does not equal --batch-size 4 x 2 ranks x --accum 4 = 32"),
    ((0, None, None), 1, "--batch-size must be at least 1"),
])
def test_batch_sizes_that_do_not_divide_are_usage_errors(given, world, words):
    with pytest.raises(UsageError) as e:
        resolve_batch(*given, world)
    assert words in str(e.value)


def test_halving_keeps_the_global_batch():
    plan = resolve_batch(32, None, 2, 4)
    assert (plan.halved().batch_size, plan.halved().accum, plan.halved().global_batch) == (16, 4, plan.global_batch)


@pytest.mark.parametrize("text, want", [("2", (2, 0.0)), ("3:0.3", (3, 0.3)), (" 1:0 ", (1, 0.0)), (None, None)])
def test_unfreeze_at_parses(text, want):
    assert parse_unfreeze_at(text) == want


@pytest.mark.parametrize("text", ["two", "0", "2:1.5", "2:x", "-1"])
def test_bad_unfreeze_at_is_usage_error(text):
    with pytest.raises(UsageError, match="--unfreeze-at"):
        parse_unfreeze_at(text)


def _shards(tmp_path: Path) -> Path:
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "index.json").write_text("{}")
    return tmp_path / "shards"


def test_validate_names_the_problem(tmp_path):
    with pytest.raises(UsageError, match="no index.json"):
        validate(TrainConfig(shard_dir=tmp_path / "nothing", output=tmp_path / "run"))
    shards = _shards(tmp_path)
    with pytest.raises(UsageError, match="nothing to unfreeze"):
        validate(TrainConfig(shard_dir=shards, output=tmp_path / "run", freeze=0.3, unfreeze_at="2:0.5"))
    with pytest.raises(UsageError, match="--precision"):
        validate(TrainConfig(shard_dir=shards, output=tmp_path / "run", precision="fp8"))
    with pytest.raises(UsageError, match="--init-from"):
        validate(TrainConfig(shard_dir=shards, output=tmp_path / "run", init_from=tmp_path / "missing.pt"))
    with pytest.raises(UsageError, match="a folder, not a checkpoint file"):
        validate(TrainConfig(shard_dir=shards, output=tmp_path / "run", init_from=tmp_path))
    with pytest.raises(UsageError, match="--seed must be 0 or more"):
        validate(TrainConfig(shard_dir=shards, output=tmp_path / "run", seed=-1))
    with pytest.raises(UsageError, match="not a multiple"):
        validate(TrainConfig(shard_dir=shards, output=tmp_path / "run", batch_size=8, global_batch=20), world_size=2)
    assert validate(TrainConfig(shard_dir=shards, output=tmp_path / "run", freeze=0.7, unfreeze_at="2")).freeze == 0.7


def test_command_line_beats_toml_beats_defaults(tmp_path):
    toml = tmp_path / "pipe.toml"
    toml.write_text("[train]\nlr = 0.01\nepochs = 7\nprecision = \"bf16\"\n")
    file_values = load_section(toml, "train")
    cli = {"shard_dir": tmp_path, "output": tmp_path / "run", "lr": 0.5, "epochs": 3, "precision": "auto"}
    cfg = resolve(TrainConfig, cli, {"shard_dir", "output", "lr"}, file_values)
    assert (cfg.lr, cfg.epochs, cfg.precision, cfg.weight_decay) == (0.5, 7, "bf16", 0.05)


def test_unknown_or_mistyped_toml_keys_are_usage_errors(tmp_path):
    for body in ("[train]\nlearning_rate = 0.1\n", "[train]\nepochs = \"three\"\n", "[train]\nunfreeze_at = \"soon\"\n"):
        toml = tmp_path / "pipe.toml"
        toml.write_text(body)
        with pytest.raises(UsageError, match="config.schema.json"):
            load_section(toml, "train")


def test_every_setting_is_in_the_schema_and_documented():
    """The [train] table and the dataclass must not drift apart: a field the schema lacks could not
    be set from a file, a schema key the dataclass lacks would be silently ignored."""
    props = load_schema("config")["properties"]["train"]["properties"]
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(props) == fields
    assert all(p.get("description") for p in props.values())
    # a help text in every field's declaration (setting(), which replaced a docstring per field):
    # the one text --help and the schema show
    for cls in (LaunchConfig, TrainConfig):
        for d in declared(cls):
            assert d.setting.help.strip(), f"{d.name} has no help"


def test_fingerprint_covers_what_ranks_must_share(tmp_path):
    a = TrainConfig(shard_dir=tmp_path, output=tmp_path / "run")
    assert a.fingerprint() != TrainConfig(shard_dir=tmp_path, output=tmp_path / "run", lr=0.1).fingerprint()
    # where files live and how many loader workers a node runs may differ between nodes
    assert a.fingerprint() == TrainConfig(shard_dir=tmp_path / "elsewhere", output=tmp_path / "r2", workers=7).fingerprint()


def test_every_setting_is_either_kept_or_free_on_resume(tmp_path):
    """A new setting needs a decision: does changing it on --resume change the run's trajectory?"""
    from train.config import resume_conflict

    kept, free = set(TrainConfig.RESUME_SETTINGS), set(TrainConfig.RESUME_FREE)
    assert not kept & free
    assert kept | free == {f.name for f in dataclasses.fields(TrainConfig)}
    saved = {**TrainConfig(shard_dir=tmp_path).as_dict(), "global_batch": 16, "precision": "fp32"}
    same = {**TrainConfig(shard_dir=tmp_path / "x", workers=5, batch_size=8, accum=2).as_dict(), "global_batch": 16}
    assert resume_conflict(saved, same) is None  # the batch split, workers, paths, precision auto
    assert resume_conflict(saved, {**same, "precision": "fp32", "init_from": None}) is None
    assert resume_conflict(saved, {**same, "precision": "bf16"}) == (
        "--resume: this run was made with --precision fp32; got --precision bf16: pass the same settings, "
        "or start a new run directory")
    assert "grad_clip 1.0; got grad_clip 0.5" in resume_conflict(saved, {**same, "grad_clip": 0.5})
    assert "--init-from (not set); got --init-from" in resume_conflict(saved, {**same, "init_from": "w.pt"})
    assert resume_conflict({"lr": 0.001}, {**same, "epochs": 9}) is None  # an older checkpoint: what it has
