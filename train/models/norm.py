"""The input a model expects: the normalisation and image size it was trained with.

A pretrained model has seen images normalised with its own mean and std (ImageNet's, mostly);
fed the dataset's instead, it trains, but from a worse start and without a word: the same silent
mismatch as a node whose preprocessing lacks a step. So a model may say what it wants
(``model.input_norm``, an `InputNorm`); the reader then normalises with exactly that, the run
prints it and the preflight compares it across ranks. A model that says nothing (the built-ins,
trained from scratch here) gets the dataset's own mean and std from index.json.

Imports no torch: `train.config` and the command line may use it.
"""

from __future__ import annotations

from dataclasses import dataclass

# Well-known normalisations, named when printed so the operator recognises them.
KNOWN = {
    ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)): "ImageNet",
    ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)): "[-1, 1], Inception/ViT style",
    ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)): "CLIP/OpenAI",
}


@dataclass(frozen=True)
class InputNorm:
    """Per-channel ``(pixel / 255 - mean) / std`` at ``size`` px (None: whatever size comes);
    ``source`` says where it was read, for the line printed at start."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    size: int | None
    source: str
    enlarged: bool = True  # smaller images are enlarged to ``size`` in the model (False: it takes any size)

    def known_as(self) -> str | None:
        key = (tuple(round(v, 8) for v in self.mean), tuple(round(v, 8) for v in self.std))
        return next((name for (m, s), name in KNOWN.items()
                     if all(abs(a - b) < 1e-6 for a, b in zip(key[0] + key[1], m + s))), None)

    def describe(self, decoded: int | None = None, random_weights: bool = False) -> str:
        """e.g. ``224 px, mean/std from hf:PATH preprocessor_config.json (ImageNet: ...)``;
        ``decoded``: the side the reader decodes at, when it is not the model's. ``random_weights``:
        the model starts from random weights, so the line names the statistics as the recipe of
        weights that are *not* loaded (a line naming a weights release reads as if they were)."""
        size = f"{self.size} px" if self.size else f"{decoded} px" if decoded else "the stored size"
        if decoded and self.size and decoded != self.size:
            how = "and enlarged in the model" if self.enlarged else "which this model takes as it is"
            size = f"{self.size} px (decoded at {decoded} px, the shards' size, {how})"
        name = self.known_as()
        values = f"mean {_fmt(self.mean)} std {_fmt(self.std)}"
        if random_weights:
            return (f"{size}, {name + ' ' if name else ''}{values}, the normalisation of {self.source}; "
                    "the model's weights are random, not those (no --init-from)")
        return f"{size}, mean/std from {self.source} ({name}: {values})" if name else \
            f"{size}, mean/std from {self.source} ({values})"

    def as_dict(self) -> dict:
        """JSON-ready, for the preflight's config hash and config.json."""
        return {"mean": list(self.mean), "std": list(self.std), "size": self.size, "source": self.source}


def _fmt(values) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"


def from_index(index: dict) -> InputNorm:
    """The dataset's own mean and std (index.json), at no size of their own: the built-ins' input."""
    return InputNorm(tuple(index.get("mean") or (0.0, 0.0, 0.0)), tuple(index.get("std") or (1.0, 1.0, 1.0)),
                     None, "index.json (the dataset's own)")


def resolve(model, index: dict) -> InputNorm:
    """What the reader applies for ``model``: its ``input_norm`` when it declares one, else the index's."""
    norm = getattr(model, "input_norm", None)
    return norm if isinstance(norm, InputNorm) else from_index(index)
