"""The model families ``--model`` names, declared once (torchtitan's ``_supported_models`` is the model).

Each `Family` says how ``--model`` names one of its models (a prefix such as ``torchvision:``, the
built-in names, or ``package.module:factory`` for anything else with a colon), a line of help,
and its hooks as ``"module:function"`` references, imported only when that family is used: a
built-in run never imports torchvision, timm or transformers, and this module imports no torch
(``pipe --help`` reads `model_help`).

* ``build(arg, num_classes, options)``: the model, in the contract `train.models.builtin` spells out;
* ``check(arg)``: before any rank starts, a wrong name, folder or missing package as one line (exit 2);
* ``inputs(arg)``: the batch fields the model reads, when known before it is built (the command
  refuses a model whose input the shards lack);
* ``load(arg, options)``: for ``pipe eval``, a saved model of the family (`train.models.loading`:
  a run folder's best or last checkpoint, an export folder, an ``hf:`` folder), in eval mode;
* ``export(arg, job, folder)``: for ``pipe export``, write the model (`train.models.exported.Job`: the
  weights and what the run knew) into ``folder`` as its library loads it; the names written;
* ``objectives``: what ``--objective`` it serves (`train.objectives`): a classifier's head, or
  image and text embeddings (the contrastive contract, `train.models.clip`).

Everything that asks which family a ``--model`` is (its help, the checks before launch, the
model built in every rank, what the loop and ``--data-only`` do differently for the built-ins)
asks `resolve`. An unknown name is one line that lists the families (`unknown`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from pipeline.core.errors import UsageError


@dataclass(frozen=True)
class Options:
    """What a builder may take besides the name and the class count: the dataset's index, the
    built-ins' size settings (--width, --resolution, --max-text-len) and what the model is for
    (--objective, and --loss: a SigLIP head has a learnable bias)."""

    index: dict | None = None
    width: int = 32
    resolution: int = 64
    max_text_len: int = 256
    objective: str = "classify"
    loss: str = "clip"


@dataclass(frozen=True)
class Family:
    name: str
    syntax: str
    """How --model names one, for help and messages: ``torchvision:NAME``."""
    help: str
    """One line: what these models are."""
    build: str
    """``module:function``: ``build(arg, num_classes, options) -> nn.Module``."""
    prefix: str = ""
    """--model starts with it; ARG is the rest."""
    names: tuple[str, ...] = ()
    """Or --model is one of these (ARG is the name). Neither prefix nor names: the catch-all,
    any other --model with a colon (ARG is all of it)."""
    check: str | None = None
    """``module:function``: ``check(arg)``, a UsageError when the model cannot be built; builds nothing."""
    inputs: str | None = None
    """``module:function``: ``inputs(arg)``, the batch fields the model reads (image, text); unset:
    known only once built (its ``inputs`` attribute)."""
    own_modules: bool = False
    """Our own modules: channels-last on CPU is safe (no .view() of a feature map), and images are
    read at --resolution."""
    load: str | None = None
    """``module:function`` for pipe eval: ``load(arg, options)``, a saved model of this family."""
    export: str | None = None
    """``module:function`` for pipe export: ``export(arg, job, folder)`` writes a model of this family
    as its library loads it."""
    objectives: tuple[str, ...] = ("classify",)
    """The --objective values its models serve."""

    def parse(self, spec: str) -> str | None:
        """ARG when ``spec`` names a model of this family, else None."""
        if self.prefix:
            return spec[len(self.prefix):] if spec.startswith(self.prefix) else None
        if self.names:
            return spec if spec in self.names else None
        return spec if ":" in spec else None

    def shown(self) -> str:
        return f"{self.syntax} ({self.help})"


BUILTIN_INPUTS = {"image": ("image",), "text": ("text",), "image-text": ("image", "text")}

EXPORT_STATE = "train.models.exported:export_builtin"  # model.safetensors + config.json, pipe's names
EXPORT_LIBRARY = "train.models.exported:export_library"  # the same, the library's own names

BUILTIN = Family("built-in", ", ".join(BUILTIN_INPUTS), "small, trained from scratch, no download",
                 "train.models.builtin:build_named", names=tuple(BUILTIN_INPUTS),
                 inputs="train.models.families:builtin_inputs", own_modules=True, export=EXPORT_STATE)
CLIP = Family("clip", "clip", "built-in image-caption model for --objective contrastive, byte-level captions, no download",
              "train.models.clip:build_clip", names=("clip",), inputs="train.models.clip:clip_inputs", own_modules=True,
              load="train.models.loading:load_saved", export=EXPORT_STATE, objectives=("contrastive",))
FACTORY = Family("factory", "package.module:factory", "your own: called as factory(num_classes=N)",
                 "train.models.builtin:build_from_factory", export=EXPORT_STATE, objectives=("classify", "contrastive"))
TORCHVISION = Family("torchvision", "torchvision:NAME", "its classifiers, built without weights: --init-from brings them",
                     "train.models.vision:build_torchvision", prefix="torchvision:",
                     check="train.models.vision:check_torchvision", export=EXPORT_LIBRARY)
TIMM = Family("timm", "timm:NAME", "its models, likewise without weights", "train.models.vision:build_timm", prefix="timm:",
              check="train.models.vision:check_timm", export=EXPORT_LIBRARY)
HF = Family("hf", "hf:PATH", "a local Hugging Face folder (a CLIP or SigLIP one for --objective contrastive)",
            "train.models.hf_clip:build", prefix="hf:", check="train.models.hf_files:check_folder",
            inputs="train.models.hf_files:folder_inputs", load="train.models.hf_clip:load_hf",
            export="train.models.hf_export:export_hf", objectives=("classify", "contrastive"))

FAMILIES: tuple[Family, ...] = (BUILTIN, FACTORY, TORCHVISION, TIMM, HF, CLIP)
"""In the order help lists them; `resolve` tries the catch-all last."""


@dataclass(frozen=True)
class Spec:
    """A --model value resolved: its family and the rest of it."""

    family: Family
    arg: str


def resolve(spec: str) -> Spec:
    """The family ``spec`` names; a UsageError (`unknown`) when none does."""
    for family in sorted(FAMILIES, key=lambda f: not (f.prefix or f.names)):  # the catch-all last
        arg = family.parse(spec)
        if arg is not None:
            return Spec(family, arg)
    raise unknown(spec)


def unknown(spec: str) -> UsageError:
    others = [f.syntax for f in FAMILIES if f is not BUILTIN]
    return UsageError(f"--model {spec!r} is neither a built-in model ({BUILTIN.syntax}) nor "
                      f"{', '.join(others[:-1])} or {others[-1]}")


def model_help() -> str:
    """--model's help: every family, one after another."""
    return "; ".join(f.shown() for f in FAMILIES) + "."


def call(ref: str, *args: Any) -> Any:
    """Import ``module:function`` (only now) and call it."""
    module, _, function = ref.partition(":")
    return getattr(importlib.import_module(module), function)(*args)


def build(spec: str, num_classes: int, options: Options) -> Any:
    """The model ``spec`` names (an ``nn.Module``), built by its family."""
    s = resolve(spec)
    return call(s.family.build, s.arg, num_classes, options)


def check(spec: str) -> None:
    """Refuse a model that cannot be built, before any rank starts (one line, exit 2)."""
    s = resolve(spec)
    if s.family.check is not None:
        call(s.family.check, s.arg)


def inputs(spec: str) -> tuple[str, ...] | None:
    """The batch fields the model reads, where its family knows them before it is built."""
    s = resolve(spec)
    return None if s.family.inputs is None else tuple(call(s.family.inputs, s.arg))


def builtin_inputs(name: str) -> tuple[str, ...]:
    return BUILTIN_INPUTS[name]


def check_objective(spec: str, objective: str) -> None:
    """A model that cannot serve ``objective`` (--model image with --objective contrastive, --model
    clip with classify): one line naming those that can."""
    family = resolve(spec).family
    if objective in family.objectives:
        return
    able = [f.syntax for f in FAMILIES if objective in f.objectives]
    what = "a classifier" if objective == "classify" else "image and caption embeddings"
    raise UsageError(f"--model {spec} cannot be trained with --objective {objective} ({what}); "
                     f"--objective {objective} takes --model {', '.join(able[:-1])} or {able[-1]}")


def load(spec: str, options: Options) -> Any:
    """A saved model of ``spec``'s family for pipe eval (`Family.load`), or a UsageError."""
    s = resolve(spec)
    if s.family.load is None:
        raise UsageError(f"pipe eval cannot load --model {spec} models ({s.family.name}): it measures image-caption "
                         "models (a run folder of --objective contrastive, its export, an hf: CLIP or SigLIP folder)")
    return call(s.family.load, s.arg, options)
