"""``--model hf:PATH``: fine-tune a Hugging Face model from a local folder, nothing downloaded.

The folder is what ``save_pretrained`` writes (or what a user downloaded once): ``config.json``,
the weights (``model.safetensors``, ``pytorch_model.bin`` or their sharded forms) and either a
tokenizer (a text model) or a ``preprocessor_config.json`` (an image model). The model is built by
transformers' ``AutoModelForSequenceClassification`` / ``AutoModelForImageClassification`` with one
output per class of the dataset; a head trained for another class count is re-initialised
(``ignore_mismatched_sizes``) and the per-tensor report says so, as for --init-from.

`HFClassifier` wraps it in the contract `pipe train` trains (see `train.models.builtin`):

* ``inputs``: ``("input_ids", "attention_mask")`` for a text model, whose ``tokenize`` (the
  folder's tokenizer, truncating and padding to --max-text-len) runs in the dataloader workers;
  ``("image",)`` for an image model, whose ``input_norm`` (`train.models.norm.InputNorm`, from
  preprocessor_config.json) the reader applies instead of the dataset's mean/std.
* ``block_groups()``: the embeddings, then each layer of the encoder, for --freeze.
* ``head``: the classifier; ``forward`` returns the logits.

transformers is imported only here, and only when ``hf:`` is used. Every load passes
`hf_files.SAFE_LOAD` (``local_files_only=True``, ``trust_remote_code=False``) and the hub is switched
offline first: a missing file is an error, never a download; a folder whose JSON asks for its own
code is refused before transformers reads it, and pickled weights are read by
`train.components.safe_load` first (one line when refused, and their code never runs).
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.core.errors import UsageError
from train.components.safe_load import check_torch_file, refusal
from train.models import families
from train.models.finetune import InitReport
from train.models.hf_files import PREPROCESSOR, SAFE_LOAD, folder_problem, has_tokenizer, pickle_weights, weights_file
from train.models.norm import InputNorm

PREFIX = families.HF.prefix
HEAD_NAMES = ("classifier", "score", "head", "fc")


def _offline():
    """transformers with the hub off (set before its first import) and its own chatter quiet:
    the run prints one load report of its own."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    # the gate transformers puts on its own pickle.load calls (a RAG index; TransfoXL's vocabulary in
    # older releases): closed whatever the environment says, as trust_remote_code is on every load
    os.environ["TRUST_REMOTE_CODE"] = "False"
    # the tokenizer runs in forked dataloader workers: its Rust thread pool must not be started
    # in the parent first (it would deadlock the children; the library warns and disables it)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        import transformers
    except ImportError:
        raise UsageError("--model hf:PATH needs the transformers package (pip install 'pipe-ml[models]')") from None
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    return transformers


# -- input: the image processor's normalisation, the tokenizer -----------------------------------


def _side(value) -> int | None:
    if isinstance(value, int):
        return value
    if isinstance(value, dict):
        for key in ("height", "shortest_edge", "width"):
            if isinstance(value.get(key), int):
                return value[key]
    return None


def read_input_norm(folder: Path, label: str) -> InputNorm | None:
    """The normalisation and size preprocessor_config.json gives, as the reader's ``(x / 255 -
    mean) / std``; None without that file. HF computes ``(x * rescale_factor - mean) / std``: the
    same when rescale_factor is 1/255 (it is, almost always), rescaled otherwise."""
    path = folder / PREPROCESSOR
    if not path.is_file():
        return None
    try:
        conf = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"--model {label}: {PREPROCESSOR} is not readable JSON ({e})") from None
    mean, std = conf.get("image_mean", [0.0] * 3), conf.get("image_std", [1.0] * 3)
    if not conf.get("do_normalize", True):
        mean, std = [0.0] * 3, [1.0] * 3
    if isinstance(mean, (int, float)):
        mean = [float(mean)] * 3
    if isinstance(std, (int, float)):
        std = [float(std)] * 3
    factor = 255.0 * (float(conf.get("rescale_factor", 1 / 255)) if conf.get("do_rescale", True) else 1.0)
    size = _side(conf.get("crop_size")) if conf.get("do_center_crop") else None
    size = size or _side(conf.get("size"))
    return InputNorm(tuple(float(m) / factor for m in mean), tuple(float(s) / factor for s in std), size,
                     f"{label} {PREPROCESSOR}")


class Tokenize:
    """Texts -> ``input_ids`` and ``attention_mask`` [B, L] int64, padded and cut to L tokens.
    Runs in the dataloader workers (a forked copy of the tokenizer in each)."""

    def __init__(self, tokenizer, max_len: int, label: str):
        self.tokenizer, self.max_len, self.label = tokenizer, max_len, label

    def __call__(self, texts: list[str]) -> dict[str, torch.Tensor]:
        enc = self.tokenizer(texts, padding="max_length", truncation=True, max_length=self.max_len,
                             return_attention_mask=True, return_token_type_ids=False, return_tensors="pt")
        return {"input_ids": enc["input_ids"].to(torch.int64), "attention_mask": enc["attention_mask"].to(torch.int64)}

    def describe(self) -> str:
        return (f"{self.max_len} tokens per text (cut and padded), tokenizer {type(self.tokenizer).__name__} from "
                f"{self.label}, in the dataloader workers")


# -- the model --------------------------------------------------------------------------------


class HFClassifier(nn.Module):
    """A transformers classification model in `pipe train`'s model contract (logits out)."""

    model: Any  # a transformers PreTrainedModel (typed loosely: transformers is optional)

    def __init__(self, model: nn.Module, *, tokenize: Tokenize | None = None, input_norm: InputNorm | None = None):
        super().__init__()
        self.model = model
        self.tokenize = tokenize
        self.input_norm = input_norm
        self.inputs = ("input_ids", "attention_mask") if tokenize is not None else ("image",)
        self.init_report: InitReport | None = None

    @property
    def image_size(self) -> int | None:
        """The side the model was trained at (the reader decodes at most that)."""
        if self.tokenize is not None:
            return None
        size = self.input_norm.size if self.input_norm else None
        return size or getattr(self.model.config, "image_size", None)

    @property
    def head(self) -> nn.Module | None:
        """The classifier (a property, so it is not registered twice in the state dict)."""
        return next((m for n in HEAD_NAMES if isinstance(m := getattr(self.model, n, None), nn.Module)), None)

    def block_groups(self) -> list[list[nn.Module]]:
        """Embeddings, then the encoder's layers, from the input side."""
        base = getattr(self.model, "base_model", self.model)
        lists = [m for m in base.modules() if isinstance(m, nn.ModuleList) and len(m)]
        if not lists:
            return [[m for m in base.children()]]
        layers = max(lists, key=lambda ml: sum(p.numel() for p in ml.parameters()))
        embed = next((getattr(base, n) for n in ("embeddings", "embed_tokens", "wte", "embed") if
                      isinstance(getattr(base, n, None), nn.Module)), None)
        return [([embed] if embed is not None else []) + list(layers)]

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        if enable:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            self.model.gradient_checkpointing_disable()

    def forward(self, image=None, input_ids=None, attention_mask=None) -> torch.Tensor:
        if input_ids is not None:
            return self.model(input_ids=input_ids, attention_mask=attention_mask).logits
        size = self.image_size
        if size and (image.shape[-1] != size or image.shape[-2] != size):
            # shards stored smaller than the model's input: enlarged here (the reader never
            # enlarges); bilinear is linear, so it commutes with the per-channel normalisation
            image = F.interpolate(image, size=(size, size), mode="bilinear", align_corners=False)
        return self.model(pixel_values=image).logits


def _report(label: str, folder: Path, model: nn.Module, info: dict, num_classes: int) -> InitReport:
    """transformers' loading info as the per-tensor report --init-from prints."""
    mismatched = sorted(info.get("mismatched_keys") or [], key=lambda t: t[0])
    missing = sorted(info.get("missing_keys") or [])
    not_loaded = set(missing) | {k for k, _, _ in mismatched}
    report = InitReport(source=label, kind=f"Hugging Face folder ({weights_file(folder)})",
                        loaded=[k for k in model.state_dict() if k not in not_loaded],
                        skipped_shape=[(k, tuple(a), tuple(b)) for k, a, b in mismatched],
                        missing=missing, unexpected=sorted(info.get("unexpected_keys") or []))
    head = next((n for n in HEAD_NAMES if isinstance(getattr(model, n, None), nn.Module)), None)
    head_rows = [a for k, a, _ in mismatched if head and k.startswith(head + ".")]
    if head_rows:
        report.head_reinitialised = f"folder has {tuple(head_rows[0])[0]} classes, this dataset {num_classes}"
    return report


def _cannot_build(label: str, folder: Path, e: BaseException, what: str = "a classifier") -> UsageError:
    """One line for a folder transformers could not load from (a weights file it refused: `refusal`'s)."""
    if isinstance(e, pickle.UnpicklingError):
        return refusal(f"--model {label}: ", folder / (weights_file(folder) or ""), e)
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return UsageError(f"--model {label}: transformers cannot build {what} from it ({first})")


def build_hf(path: str, num_classes: int, options: families.Options | None = None) -> HFClassifier:
    """The classifier in the local folder ``path``, with one output per class of the dataset (the hf
    family's builder; ``options``: the index's class names, --max-text-len)."""
    options = options or families.Options()
    index, max_text_len = options.index, options.max_text_len
    label = PREFIX + str(path)
    problem = folder_problem(path)
    if problem:
        raise UsageError(problem)
    folder = Path(path)
    transformers = _offline()
    text = has_tokenizer(folder)
    auto = (transformers.AutoModelForSequenceClassification if text
            else transformers.AutoModelForImageClassification)
    classes = list((index or {}).get("classes") or [str(i) for i in range(num_classes)])
    pickled = pickle_weights(folder)
    for weights in pickled:  # before transformers unpickles them
        check_torch_file(weights, f"--model {label}: ")
    try:
        model, info = auto.from_pretrained(
            folder, num_labels=num_classes, id2label=dict(enumerate(classes)),
            label2id={c: i for i, c in enumerate(classes)}, ignore_mismatched_sizes=True, output_loading_info=True,
            dtype=torch.float32, use_safetensors=not pickled, **SAFE_LOAD)  # a .bin beside safetensors: never read
    except (OSError, ValueError, KeyError, pickle.UnpicklingError) as e:
        raise _cannot_build(label, folder, e) from None
    model.train()  # from_pretrained returns eval mode; the loop switches modes itself
    tokenize = input_norm = None
    if text:
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(folder, **SAFE_LOAD)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise _cannot_build(label, folder, e, "its tokenizer") from None
        limit = getattr(model.config, "max_position_embeddings", None) or max_text_len
        tokenize = Tokenize(tokenizer, min(max_text_len, limit), label)
    else:
        input_norm = read_input_norm(folder, label)
    wrapped = HFClassifier(model, tokenize=tokenize, input_norm=input_norm)
    wrapped.init_report = _report(label, folder, model, info, num_classes)
    return wrapped
