"""What a local Hugging Face model folder holds, checked from its files alone (no torch, no
transformers): the command line refuses a wrong ``--model hf:PATH`` before any rank starts.

A model folder is input like any other: whoever could write to it may have put code there. Two
ways transformers would run it are closed here: ``auto_map`` in one of its JSON files (the
folder's own Python classes, which transformers imports after a ``y`` at its prompt, and piped
input answers it) is refused (`remote_code`), and every transformers load passes `SAFE_LOAD`
(``trust_remote_code=False``, nothing downloaded). Pickled weights (pytorch_model.bin) are read
by `train.components.safe_load` before transformers sees them (`pickle_weights`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

# The weights, in the order transformers prefers them (one file, or an index over shards).
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                   "sentencepiece.bpe.model")
PREPROCESSOR = "preprocessor_config.json"
SAFE_LOAD = {"local_files_only": True, "trust_remote_code": False}
"""What every transformers ``from_pretrained`` (model, tokenizer, processor, config) is given."""
REMOTE_CODE_KEYS = ("auto_map", "custom_pipelines")
MAX_JSON = 16 * 2**20  # a config larger than this is not a config; not read for the auto_map check


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
    weights = pickle_weights(Path(path))
    if weights:  # pickled: read through the restricted unpickler before any rank starts (torch only then)
        from train.components.safe_load import check_torch_file

        for f in weights:
            check_torch_file(f, f"--model hf:{path}: ")


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
    remote = remote_code(folder)
    if remote:
        return (f"--model hf:{path}: {remote} asks for the folder's own Python code; pipe builds only transformers' "
                "own classes and never runs code from a model folder (trust_remote_code=False): refused")
    shards = weight_shards(folder)
    if isinstance(shards, str):
        return f"--model hf:{path}: {shards}"
    return None


def remote_code(folder: Path) -> str | None:
    """``config.json's auto_map`` (or the like) when a JSON file of the folder names Python code of
    its own for transformers to import; None when none does."""
    for p in sorted(Path(folder).glob("*.json")):
        try:
            if not p.is_file() or p.stat().st_size > MAX_JSON:
                continue
            doc = json.loads(p.read_bytes())
        except (OSError, ValueError):
            continue  # unreadable: transformers says so when it reads it, if it does
        for key in REMOTE_CODE_KEYS if isinstance(doc, dict) else ():
            if doc.get(key):
                return f"{p.name}'s {key}"
    return None


def weight_shards(folder: Path) -> list[str] | str:
    """The weight files the folder's index lists (a sharded model), each a plain file name in the
    folder; [] without an index; a sentence when the index is unreadable or names other files."""
    name = weights_file(folder)
    if name is None or not name.endswith(".index.json"):
        return []
    try:
        files = json.loads((Path(folder) / name).read_text())["weight_map"].values()
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"{name} is not a readable weights index ({type(e).__name__})"
    bad = [f for f in files if not isinstance(f, str) or not f or "/" in f or "\\" in f or f in (".", "..")]
    if bad:
        return f"{name} names {bad[0]!r}, not a file in the folder"
    return sorted(set(files))


def pickle_weights(folder: Path) -> list[Path]:
    """The pickled weight files transformers would read from the folder (pytorch_model.bin, or the
    .bin shards its index lists); none when it holds safetensors (which transformers prefers)."""
    name = weights_file(folder)
    if name is None or "safetensors" in name:
        return []
    shards = weight_shards(folder)
    files = shards if isinstance(shards, list) and shards else [name]
    return [Path(folder) / f for f in files if not f.endswith(".safetensors")]
