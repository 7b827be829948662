"""`pipe eval MODEL SHARD_DIR [--split val] [--zeroshot-prompt ...] [--json]`. Thin, like
`train/command.py`: `pipe --help` imports no torch; the work is `train/evaluate.py`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import typer

from pipeline.cli import options
from pipeline.cli.common import exits_cleanly
from pipeline.core.settings import setting
from pipeline.storage import FOLDER_HELP


@dataclass
class EvalConfig:
    """Settings of `pipe eval` (flags of the same name; `[eval]` in a `--config` file)."""

    model: str = setting(help="The model: hf:PATH (a Hugging Face CLIP or SigLIP folder), a RUN_DIR of pipe train "
                              "--objective contrastive, or a folder pipe export wrote.", argument=True, required=True,
                         toml=False)
    shard_dir: str = setting(help=f"SHARD_DIR written by pipe shard ({FOLDER_HELP}).", argument=True,
                             required=True, toml=False)
    split: str = setting("val", "The split to measure.", choices=("val", "train"))
    zeroshot_prompt: list[str] | None = setting(
        None, "A template for zero-shot accuracy, {} standing for the class name; repeatable, text embeddings averaged "
              "over them (default: 'a photo of a {}.', as pipe train's).", flags=("--zeroshot-prompt",),
        schema={"type": "array", "items": {"type": "string", "pattern": "[{][}]"}})
    which: str = setting("best", "From a RUN_DIR: best.pt (the lowest val loss; last.pt where there is none) or last.pt.",
                         choices=("best", "last"))


@dataclass
class EvalFlags:
    json: bool = setting(False, "Print {\"metrics\": {...}} as JSON instead of a table.", flags=("--json",), toml=False)


@options.command(EvalConfig, "eval", EvalFlags)
@exits_cleanly
def eval(ctx: typer.Context, **given: Any) -> None:  # noqa: A001 - the command's name
    """Measure an image-caption model on SHARD_DIR: zero-shot accuracy and recall@1/@5 both ways.

    The numbers pipe train --objective contrastive reports each epoch, computed by the same code,
    for any model pipe can load: the starting hf: model and the fine-tuned run side by side.
    """
    from pipeline.core import ui
    from pipeline.core.errors import UsageError
    from pipeline.core.settings import check

    cfg = options.read(ctx, EvalConfig, "eval", given)
    check(cfg)
    for template in cfg.zeroshot_prompt or ():
        if "{}" not in template:
            raise UsageError(f"--zeroshot-prompt {template!r} has no {{}} for the class name, e.g. 'a photo of a {{}}.'")
    from train.evaluate import evaluate

    result = evaluate(cfg.model, cfg.shard_dir, cfg.split, cfg.zeroshot_prompt, cfg.which)
    if given["json"]:
        ui.print_json({"metrics": result["metrics"], "model": result["model"], "split": result["split"]})
        return
    m = result["metrics"]
    rows: list[tuple[str, object]] = [("model", result["model"]), ("split", f"{result['split']} ({int(m['samples'])} samples)")]
    if "zeroshot_acc" in m:
        rows.append(("zero-shot accuracy", f"{m['zeroshot_acc']:.1%}"))
    rows += [(k.replace("recall_", "recall ").replace("i2t", "image->text").replace("t2i", "text->image"), f"{v:.1%}")
             for k, v in m.items() if k.startswith("recall_")]
    rows.append(("contrastive loss", f"{m['loss']:.4f}"))
    ui.summary_table(f"pipe eval {cfg.model} on {cfg.shard_dir}", rows)
