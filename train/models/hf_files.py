"""What a local Hugging Face model folder holds, checked from its file names alone (no torch, no
transformers): the command line refuses a wrong ``--model hf:PATH`` before any rank starts."""

from __future__ import annotations

import os
from pathlib import Path

# The weights, in the order transformers prefers them (one file, or an index over shards).
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                   "sentencepiece.bpe.model")
PREPROCESSOR = "preprocessor_config.json"


def weights_file(folder: Path) -> str | None:
    return next((n for n in WEIGHTS if (Path(folder) / n).is_file()), None)


def has_tokenizer(folder: Path) -> bool:
    return any((Path(folder) / n).is_file() for n in TOKENIZER_FILES)


def check_folder(path: str) -> None:
    """The hf family's check: a usable folder, or one line (exit 2)."""
    from pipeline.core.errors import UsageError

    problem = folder_problem(path)
    if problem:
        raise UsageError(problem)


def folder_inputs(path: str) -> tuple[str, ...]:
    """What the folder's model reads: texts with a tokenizer, images with an image processor."""
    return ("text",) if has_tokenizer(Path(path)) else ("image",)


def folder_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` is not a usable Hugging Face model folder for ``--model hf:PATH``, or None."""
    folder = Path(path)
    if not folder.is_dir():
        return f"--model hf:{path}: no such folder (hf: takes a local Hugging Face model folder; nothing is downloaded)"
    if not (folder / "config.json").is_file():
        return f"--model hf:{path}: no config.json in it (is it a folder save_pretrained wrote?)"
    if weights_file(folder) is None:
        return f"--model hf:{path}: no weights in it ({', '.join(WEIGHTS)})"
    if not has_tokenizer(folder) and not (folder / PREPROCESSOR).is_file():
        return f"--model hf:{path}: neither a tokenizer nor a {PREPROCESSOR} in it: which input it takes is unknown"
    return None
