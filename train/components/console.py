"""What a training run prints: one voice (rank 0), on stderr, except the closing table on stdout.

The loop says *when* something is worth a line; the wording lives here, so the loop reads as the
loop. Other ranks hold a `RunConsole` too, and it prints nothing. The per-step metric lines and
the drift warnings are `train.components.monitor`'s.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.ui import plain, shown
from train.config import BatchPlan, TrainConfig

TORCHRUN_STORE_WARNING = (
    "warning: torchrun shares its rendezvous store with the ranks; after a restart a rank can read a dead rank's "
    "address and fail to connect (pytorch/pytorch#135712): export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 before "
    "torchrun --max-restarts")


def stderr_console():
    """stderr; in logs (not a terminal) wide enough that tables keep whole hashes and versions."""
    from rich.console import Console

    c = Console(stderr=True)
    return c if c.is_terminal else Console(stderr=True, width=160)


class RunConsole:
    """Rank 0's lines through ``console`` (a rich Console); silent on every other rank."""

    def __init__(self, console, is_main: bool):
        self.console, self.is_main = console, is_main

    def say(self, message: str) -> None:
        """One line as it is: paths, model names and what a file held pass through `shown`, never as markup."""
        if self.is_main:
            self.console.print(shown(message), highlight=False, markup=False)

    def setup(self, cfg: TrainConfig, plan: BatchPlan, *, params: int, precision: str, backend: str | None,
              steps_per_epoch: int, total_steps: int, warmup: int, decoded_at: int | None, stored: int | None,
              threads: int) -> None:
        """The run's arithmetic before the first step: batch, model, schedule, and where images decode
        (``decoded_at``: the size the reader decodes images at, None when the model reads none)."""
        self.say(f"batch: {plan.describe()}")
        self.say(f"model: {cfg.model}, {params:,} parameters, precision {precision}, gradient "
                 f"checkpointing {'on' if cfg.grad_checkpoint else 'off'}, backend {backend or 'none (1 process)'}")
        self.say(f"schedule: {steps_per_epoch} steps per epoch, {total_steps} in total, warmup {warmup}, "
                 f"AdamW lr {cfg.lr:g} (cosine to {cfg.lr * cfg.min_lr_fraction:g}), weight decay "
                 f"{cfg.weight_decay:g}")
        if decoded_at:
            where = f"{cfg.workers} dataloader worker{'s' if cfg.workers != 1 else ''}" if cfg.workers else "the rank"
            self.say(f"data: images decoded at {decoded_at} px (stored {stored} px) in {where}; "
                     f"{threads} compute thread{'s' if threads != 1 else ''} per rank")

    def random_weights(self, model: str, pretrained_from: str) -> None:
        """A torchvision/timm model built without --init-from: its weights are random (pipe never
        downloads weights), which its name and its library's normalisation hide; said in bold
        before anything else about the model, with what to pass instead."""
        if not self.is_main:
            return
        from rich.text import Text

        self.console.print(Text(shown(f"warning: --model {model} starts from RANDOM weights (no --init-from; pipe "
                                      "downloads no weights): it trains from scratch, not a fine-tune. For its "
                                      f"pretrained weights: {pretrained_from}"), style="bold yellow"), highlight=False)

    def init_report(self, report) -> None:
        """What --init-from loaded into the model (`train.models.finetune.InitReport`), as a table."""
        if not self.is_main:
            return
        from rich.table import Table

        t = Table(title=plain(f"--init-from {report.source} ({report.kind})"), title_justify="left", show_header=False)
        t.add_column(style="bold")
        t.add_column()
        for status, detail in report.rows():  # the details name the file's tensors: its author chose them
            t.add_row(status, plain(detail))
        self.console.print(t)

    def freeze(self, epoch: int, state) -> None:
        """``epoch`` counts from 0; ``state`` is `train.models.finetune.FreezeState`."""
        self.say(f"epoch {epoch + 1}: {state.describe()}")

    def validation(self, epoch: int, loss: float, acc: float, samples: int, metrics: dict | None = None,
                   parts: dict[str, tuple[float, float, int]] | None = None) -> None:
        """``metrics``: the objective's own numbers (zero-shot, recall@K) in place of acc;
        ``parts``: each mixed source's own loss, accuracy and samples."""
        more = " ".join(f"{k.replace('_acc', '')} {v:.1%}" for k, v in metrics.items()) if metrics else f"acc {acc:.1%}"
        self.say(f"epoch {epoch + 1}: val loss {loss:.4f} {more} ({samples} samples, all ranks)")
        for name, (lo, ac, n) in (parts or {}).items():
            self.say(f"epoch {epoch + 1}:   {name}: val loss {lo:.4f} acc {ac:.1%} ({n} samples)")

    def layout_changed(self, saved: dict, reader, epoch: int) -> None:
        """A mid-epoch position continued on another layout (``saved``: the checkpoint's reader
        position; ``reader``: the train reader now; ``epoch`` counts from 0). Silent when the
        layout is the saved one, or the reader keeps no layouts (a stand-in)."""
        history = getattr(reader, "history", None)
        if history is None or len(history(epoch)) <= len(saved.get("history") or ()):
            return
        def layout(world: int, batch: int, workers: int) -> str:
            return f"{world} rank{'s' if world != 1 else ''} x batch {batch}, {workers} worker{'s' if workers != 1 else ''}"

        was = layout(saved["world_size"], saved["batch_size"], saved["num_workers"])
        now = layout(reader.world_size, reader.batch_size, max(1, reader.num_workers))
        left = reader.plan(epoch).steps * reader.batch_size * reader.world_size
        self.say(f"resume: epoch {epoch + 1} continues on another layout ({was} -> {now}): the {left} samples it has "
                 "not trained on yet, each once, in a new order (the same samples as the uninterrupted run, other "
                 "batches: weights agree closely, not bit for bit)")

    def extended(self, was: int, now: int, old_total: int | None, total: int, step: int, lr_before: float,
                 lr_now: float) -> None:
        """--resume with more --epochs (``was`` -> ``now``): the schedule laid over the longer run."""
        steps = f" ({old_total} -> {total} optimizer steps)" if old_total is not None else ""
        self.say(f"resume: the run goes on from {was} to {now} epochs{steps}: the cosine schedule now ends at step "
                 f"{total}, so from step {step} the learning rate is {lr_now:.3g} (it was {lr_before:.3g}), what a run "
                 f"of {now} epochs has there")

    def resumed(self, last: Path, epoch: int, step: int) -> None:
        self.say(f"resumed from {last}: epoch {epoch + 1}, step {step}")

    def stopped(self, signalled: list[int], epoch: int, step: int, last: Path | None) -> None:
        """A SIGTERM stopped every rank at one step (``signalled``: the ranks it reached)."""
        ranks = ", ".join(map(str, signalled))
        self.say(f"SIGTERM (rank{'s' if len(signalled) > 1 else ''} {ranks}): every rank stopped after step {step} "
                 f"(epoch {epoch + 1}); {last or 'the checkpoint'} holds it")

    def summary(self, run_dir: Path, s: dict, has_best: bool, sharded: bool = False) -> None:
        """The closing table, on stdout (the run's result, where a script reads it)."""
        if not self.is_main:
            return
        from rich.console import Console
        from rich.table import Table

        t = Table(title=plain(f"pipe train -> {run_dir}"), show_header=False, title_justify="left")
        t.add_column(style="bold")
        t.add_column(justify="right")
        rows = [("epochs", s["epochs"]), ("optimizer steps", s["steps"]), ("global batch", s["global_batch"]),
                ("samples/s", f"{s['samples_per_s']:.1f}")]
        if s["val_loss"] is not None:
            rows += [("val loss", f"{s['val_loss']:.4f}"), ("val accuracy", f"{s['val_acc']:.1%}")]
            if s["val_majority"] is not None:  # what always answering the commonest class would score
                rows.append(("val majority class", f"{s['val_majority']:.1%}"))
            rows.append(("best val loss", f"{s['best_val_loss']:.4f}"))
        if s.get("skipped"):
            rows.append(("samples skipped", f"{s['skipped']} (skipped.jsonl)"))
        rows += [("time", f"{s['seconds']:.1f} s"), ("checkpoints", ("last.dcp" + (", best.dcp" if has_best else "") if sharded
                                                           else "last.pt" + (", best.pt" if has_best else ""))),
                 ("metrics", "metrics.jsonl, tb/")]
        for k, v in rows:
            t.add_row(k, str(v))
        Console().print(t)
