"""`pipe export RUN_DIR -o DIR [--which best|last] [--wise ALPHA]`. Thin, like `train/command.py`:
`pipe --help` imports no torch; the work is `train/export.py`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from pipeline.cli import options
from pipeline.cli.common import exits_cleanly
from pipeline.core import settings
from pipeline.core.settings import setting

WHICH = ("best", "last")  # train.components.weights.WHICH, without importing torch


@dataclass
class ExportConfig:
    """Settings of `pipe export` (flags of the same name; `[export]` in a `--config` file)."""

    run_dir: Path = setting(help="RUN_DIR written by pipe train.", argument=True, required=True, toml=False)
    output: Path = setting(Path("export"), "DIR to write: a Hugging Face folder for hf: models, else model.safetensors "
                                           "and config.json.", flags=("--output", "-o"), required=True, toml=False)
    which: str = setting("best", "The checkpoint: best (the best validation) or last.", choices=WHICH)
    wise: float | None = setting(None, "WiSE-FT: write (1 - ALPHA) x the weights the run started from + ALPHA x the "
                                       "fine-tuned ones (1: fine-tuned, 0: the start).", minimum=0, maximum=1)
    overwrite: bool = setting(False, "Replace DIR when an earlier pipe export wrote it.", flags=("--overwrite",))


@options.command(ExportConfig, "export")
@exits_cleanly
def export(ctx: typer.Context, **given: Any) -> None:
    """Write a run's model as a folder its library loads without pipe.

    An hf: model becomes a Hugging Face folder (AutoModel.from_pretrained and AutoProcessor.from_pretrained
    load it); the built-in, torchvision, timm and factory models become model.safetensors and a config.json
    that pipe eval and pipe train --init-from read. FSDP runs export their full weights.
    """
    from train import export as stage

    cfg = options.read(ctx, ExportConfig, "export", given)
    settings.check(cfg)  # --wise's range
    done = stage.run(cfg.run_dir, cfg.output, which=cfg.which, wise=cfg.wise, overwrite=cfg.overwrite)
    lines = [f"exported {done.checkpoint} of {cfg.run_dir} to {done.folder}: {', '.join(sorted(done.files))}"]
    if done.note:
        lines.append(f"note: {done.note}")
    if done.wise is not None:
        lines.append(f"--wise {done.wise}: {1 - done.wise:g} x the start ({done.start}) + {done.wise:g} x fine-tuned")
        if done.fresh:
            lines.append(f"note: {done.fresh} tensors did not come from pretrained weights (a head re-initialised for "
                         "this dataset's classes): their start is the seed's random values")
    typer.echo("\n".join(lines))
