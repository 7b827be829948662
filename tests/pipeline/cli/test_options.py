"""Each command's options are made from its declared settings: the command line, the `--config`
table and its schema are three views of one declaration, and must say the same."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from pipeline.cli import commands
from pipeline.core import schemas
from pipeline.core.errors import UsageError
from pipeline.core.settings import MISSING, check, declared
from train.config import TrainConfig

TABLES = {name: fn for name, fn in commands.functions().items() if getattr(fn, "table", None)}


def click_command(name: str):
    return typer.main.get_command(commands._app((name,))).commands[name]


def test_every_command_declares_its_settings_and_has_a_table():
    assert set(TABLES) == set(commands.COMMANDS)
    assert all(fn.table == name for name, fn in TABLES.items())


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_setting_has_its_option_and_its_schema_entry_and_no_option_lacks_one(name):
    fn = TABLES[name]
    params = {p.name: p for p in click_command(name).params}
    settings = declared(fn.config)
    command_only = {p.name for p in params.values()} - {d.name for d in settings} - {"config", "help"}
    flags = {d.name for d in own_flags(fn)}
    assert command_only == flags, f"{name}: options without a declaration: {command_only - flags}"
    assert all(not d.setting.toml for d in own_flags(fn)), name  # a command's own flags are no [table] key
    for d in settings:
        assert (d.name in params) == d.setting.cli, (name, d.name)
    table = schemas.load_schema("config")["properties"][name]["properties"]
    assert set(table) == {d.name for d in settings if d.setting.toml}, name
    assert "config" in params and name in params["config"].help


def own_flags(fn):
    """The command's own flags (--json...), declared beside it, never a setting of its stage."""
    return declared(fn.flags) if fn.flags is not None else ()


@pytest.mark.parametrize("name", sorted(TABLES))
def test_defaults_are_the_same_in_the_dataclass_the_command_line_and_the_schema(name):
    fn = TABLES[name]
    params = {p.name: p for p in click_command(name).params}
    table = schemas.load_schema("config")["properties"][name]["properties"]
    for d in declared(fn.config):
        if d.default is MISSING or d.setting.required:
            assert d.name not in params or params[d.name].required, (name, d.name)
            continue
        if d.name in params:
            assert params[d.name].default == d.default, (name, d.name, params[d.name].default, d.default)
        if d.name in table:
            want = str(d.default) if isinstance(d.default, Path) else d.default
            assert table[d.name].get("default") == want, (name, d.name)


@pytest.mark.parametrize("name", sorted(TABLES))
def test_each_commands_help_lists_each_of_its_settings(name):
    fn = TABLES[name]
    r = CliRunner().invoke(commands._app((name,)), [name, "--help"], env={"COLUMNS": "240"}, prog_name="pipe")
    assert r.exit_code == 0, r.output
    shown = set(re.findall(r"--[a-z][a-z-]*", r.output))
    for d in [*declared(fn.config), *own_flags(fn)]:
        if d.setting.cli and not d.setting.argument and not d.setting.hidden:
            assert d.flag in shown, (name, d.flag)
        if d.setting.cli and d.setting.argument:
            assert d.name in r.output, (name, d.name)


def test_a_help_text_is_shown_as_declared_brackets_and_all():
    """rich reads "[ray]" as markup: the command line escapes it, the schema keeps the plain text."""
    r = CliRunner().invoke(commands._app(("clean",)), ["clean", "--help"], env={"COLUMNS": "240"}, prog_name="pipe")
    assert "pip install 'pipe-ml[ray]'" in r.output
    assert "pip install 'pipe-ml[ray]'" in schemas.load_schema("config")["properties"]["clean"]["properties"]["executor"][
        "description"]


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_bracket_of_every_help_text_survives_on_the_command_line(name):
    """No command's help loses a `[...]` to rich's markup (`pipe-ml[ray]` once became `pipe-ml`):
    each bracketed word a setting's help declares is in the command's --help, and no `pipe-ml`
    is shown without its extra."""
    fn = TABLES[name]
    r = CliRunner().invoke(commands._app((name,)), [name, "--help"], env={"COLUMNS": "1000"}, prog_name="pipe")
    assert r.exit_code == 0, r.output
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", r.output).split())
    for d in [*declared(fn.config), *own_flags(fn)]:
        if d.setting.cli and not d.setting.hidden:
            for bracketed in re.findall(r"\S*\[[^\]\s]*\]\S*", d.setting.help):
                assert bracketed in text, (name, d.flag, bracketed)
    assert not re.search(r"pipe-ml(?!\[)", text), name


def test_a_declared_range_holds_on_the_command_line_and_in_the_file_alike(cli, tmp_path):
    (tmp_path / "raw").mkdir()
    r = cli("clean", tmp_path / "raw", "-o", tmp_path / "a", "--near-image-distance", "13")
    assert r.exit_code == 2 and "--near-image-distance must be between 0 and 12 bits, got 13" in r.stderr
    toml = tmp_path / "pipe.toml"
    toml.write_text("[clean]\nnear_image_distance = 13\n")
    r = cli("clean", tmp_path / "raw", "-o", tmp_path / "b", "--config", toml)
    assert r.exit_code == 2 and "near_image_distance" in r.stderr and "12" in r.stderr
    # a range only the schema had (the hand-written checks lacked it) now holds for a flag too
    toml.write_text("[train]\nshuffle_buffer = -1\n")
    r = cli("train", tmp_path / "shards", "-o", tmp_path / "run", "--config", toml)
    assert r.exit_code == 2 and "shuffle_buffer" in r.stderr
    with pytest.raises(UsageError, match="--shuffle-buffer must be 0 or more, got -1"):
        check(TrainConfig(shuffle_buffer=-1))


def test_a_file_sets_what_the_command_line_leaves_and_a_typed_flag_wins(cli, tmp_path):
    """--shards from [labels]: the table of a command that had no --config before."""
    toml = tmp_path / "pipe.toml"
    toml.write_text(f"[labels]\nshards = {str(tmp_path / 'elsewhere')!r}\n")
    (tmp_path / "run").mkdir()
    r = cli("labels", tmp_path / "run", "--config", toml)
    assert r.exit_code == 2 and "elsewhere" in r.stderr, r.stderr
    r = cli("labels", tmp_path / "run", "--config", toml, "--shards", tmp_path / "typed")
    assert r.exit_code == 2 and "typed" in r.stderr and "elsewhere" not in r.stderr, r.stderr


# values a README synopsis shows as an example rather than the default: (command, flag)
SYNOPSIS_EXAMPLES = {("train", "--freeze")}


def test_a_number_in_a_readme_synopsis_is_that_flags_default():
    """`[--nproc-per-node 2]` where the default is 1 reads as the default: every `[--flag NUMBER]`
    of the README's `pipe clean|shard|train` synopses is the setting's default (the --data-only
    one shows a data-only run's values; SYNOPSIS_EXAMPLES are examples on purpose)."""
    import dataclasses
    import re

    from pipeline.clean.config import CleanConfig
    from pipeline.shard.config import ShardConfig
    from tests.conftest import REPO
    from train.config import TrainConfig

    configs = {"clean": CleanConfig, "shard": ShardConfig, "train": TrainConfig}
    text = (REPO / "README.md").read_text(encoding="utf-8")
    checked = 0
    for block, command in re.findall(r"```\n(pipe (\w+) .*?)```", text, re.S):
        if command not in configs or "--data-only" in block.splitlines()[0]:
            continue
        defaults = {f.name: f.default for f in dataclasses.fields(configs[command])}
        for flag, value in re.findall(r"\[(--[a-z-]+) ([0-9][0-9.e-]*)[] ]", block):
            if (command, flag) in SYNOPSIS_EXAMPLES:
                continue
            default = defaults[flag[2:].replace("-", "_")]
            assert default is not None and float(value) == float(default), (command, flag, value, default)
            checked += 1
    assert checked >= 10
