"""The model families, one table: --help lists every one, every --model resolves to exactly one,
an unknown one is a line naming them all, and each hook the table names exists."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from pipeline.core.errors import UsageError
from tests.conftest import REPO, pipe_env
from train.models import families


@pytest.mark.parametrize("spec, family, arg", [
    ("image", families.BUILTIN, "image"), ("image-text", families.BUILTIN, "image-text"),
    ("torchvision:resnet18", families.TORCHVISION, "resnet18"), ("timm:vit_tiny", families.TIMM, "vit_tiny"),
    ("hf:/models/bert", families.HF, "/models/bert"), ("hf:", families.HF, ""),
    ("my.pkg:make", families.FACTORY, "my.pkg:make"), ("torchvision.models:resnet18", families.FACTORY, "torchvision.models:resnet18"),
])
def test_every_model_spec_resolves_to_one_family(spec, family, arg):
    assert families.resolve(spec) == families.Spec(family, arg)
    assert sum(f.parse(spec) is not None for f in families.FAMILIES if f.prefix or f.names) <= 1


@pytest.mark.parametrize("spec", ["resnet18", "imagetext", ""])
def test_an_unknown_family_is_one_line_naming_every_family(spec):
    with pytest.raises(UsageError) as e:
        families.resolve(spec)
    message = str(e.value)
    assert "\n" not in message and repr(spec) in message
    for f in families.FAMILIES:
        assert f.syntax in message, f.name


def test_every_family_is_in_the_help_of_pipe_train():
    """`pipe train --help` (wide enough not to wrap) lists each family's syntax and its line of help."""
    r = subprocess.run([sys.executable, "-m", "pipeline", "train", "--help"], capture_output=True, text=True,
                       env={**pipe_env(), "COLUMNS": "2000", "TERMINAL_WIDTH": "2000"}, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    help_text = " ".join(r.stdout.split())
    for f in families.FAMILIES:
        assert f.shown() in help_text, f.name


@pytest.mark.parametrize("family", families.FAMILIES, ids=lambda f: f.name)
def test_every_hook_the_table_names_exists(family):
    for ref in (family.build, family.check, family.inputs, family.load, family.export):
        if ref is None:
            continue
        module, _, function = ref.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), ref


def test_the_table_imports_no_torch():
    code = "import sys, train.models.families; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=pipe_env(), cwd=REPO, timeout=120)
    assert r.stdout.strip() == "False", r.stderr


def test_inputs_known_before_building():
    assert families.inputs("image-text") == ("image", "text")
    assert families.inputs("torchvision:resnet18") is None and families.inputs("my.pkg:make") is None
