"""A setting declared once (`setting()`): the checks and the schema read from the declaration."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest

from pipeline.core.errors import UsageError
from pipeline.core.settings import check, declared, flag, json_schema, setting


@dataclass
class Example:
    """Settings of an example command."""

    input: Path = setting(help="INPUT.", argument=True, required=True, toml=False)
    size: int = setting(512, "Side in pixels.", minimum=8, maximum=8192, unit="pixels")
    mode: str = setting("pad", "How.", choices=("pad", "crop"))
    share: float = setting(0.1, "A share.", minimum=0, below=1)
    freeze: float = setting(0.0, "A fraction.", minimum=0, maximum=1)
    lr: float = setting(1e-3, "Positive.", above=0)
    workers: int = setting(0, "Zero or more.", minimum=0)
    timeout: int = setting(900, "Seconds.", minimum=1, unit="seconds")
    steps: int | None = setting(None, "Unset or at least 1.", minimum=1)
    grad_clip: float = setting(1.0, "No flag.", minimum=0, cli=False)
    name: str = setting("x", "A pattern the schema checks.", pattern="^[a-z]+$", flags=("--name", "-n"))
    on: bool = setting(True, "A switch.")


def example(**kw):
    return Example(input=Path("in"), **kw)


@pytest.mark.parametrize("values, message", [
    ({"size": 4}, "--size must be between 8 and 8192 pixels, got 4"),
    ({"mode": "zoom"}, "--mode must be one of pad, crop, got 'zoom'"),
    ({"share": 1.0}, "--share must be at least 0 and below 1, got 1.0"),
    ({"freeze": 1.5}, "--freeze must be a fraction in [0, 1], got 1.5"),
    ({"lr": 0.0}, "--lr must be positive, got 0.0"),
    ({"workers": -1}, "--workers must be 0 or more, got -1"),
    ({"timeout": 0}, "--timeout must be at least 1 second, got 0"),  # one second, not "1 seconds"
    ({"steps": 0}, "--steps must be at least 1, got 0"),
    ({"grad_clip": -1.0}, "grad_clip must be 0 or more, got -1.0"),  # no flag: named by its TOML key
])
def test_a_value_outside_its_declared_range_or_choices_is_a_usage_error_naming_its_flag(values, message):
    with pytest.raises(UsageError) as e:
        check(example(**values))
    assert str(e.value) == message


def test_values_inside_pass_and_an_unset_setting_is_not_checked():
    check(example(size=8, share=0.0, freeze=1.0, steps=None, workers=0))
    check(example(steps=1))


def test_flags_are_the_declared_ones_or_the_name_with_dashes():
    assert flag(Example, "name") == "--name" and flag(Example, "workers") == "--workers"
    assert flag(Example, "grad_clip") == "grad_clip" and flag(Example, "input") == "INPUT"


def test_the_schema_of_a_table_is_closed_and_says_types_bounds_choices_and_defaults():
    schema = json_schema(Example)
    assert schema["additionalProperties"] is False and schema["description"] == "Settings of an example command."
    props = schema["properties"]
    assert "input" not in props  # toml=False: on the command line only
    assert props["size"] == {"type": "integer", "minimum": 8, "maximum": 8192, "description": "Side in pixels.",
                             "default": 512}
    assert props["mode"]["enum"] == ["pad", "crop"] and props["share"]["exclusiveMaximum"] == 1
    assert props["lr"]["exclusiveMinimum"] == 0 and props["steps"] == {"type": "integer", "minimum": 1,
                                                                        "description": "Unset or at least 1."}
    assert props["on"]["type"] == "boolean" and props["name"]["pattern"] == "^[a-z]+$"
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid({"size": 64, "mode": "crop", "grad_clip": 0.5})
    for bad in ({"size": 4}, {"mode": "zoom"}, {"sise": 64}, {"name": "A"}, {"size": "64"}):
        assert not validator.is_valid(bad), bad


def test_a_field_not_declared_with_setting_is_refused():
    @dataclass
    class Half:
        size: int = setting(512, "Declared.")
        other: int = 3

    with pytest.raises(TypeError, match="Half.other is not declared"):
        declared(Half)


def test_declared_follows_the_field_order_a_base_class_first():
    @dataclass
    class More(Example):
        extra: int = setting(1, "More.")

    assert [d.name for d in declared(More)] == [f.name for f in dataclasses.fields(More)]
    assert declared(More)[-1].name == "extra"
