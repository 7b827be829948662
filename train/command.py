"""`pipe train SHARD_DIR -o RUN_DIR`. Imports no torch at module level: `pipe --help` stays fast.

The command is thin: flags -> `TrainConfig` (command line > TOML > defaults) -> checks that
need no torch (exit 2 on a mistake, before any rank starts) -> `launch(config, entry, config)`,
where the entry is `train.loop.main` (training) or `train.data_only.main` (--data-only).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli.common import exits_cleanly
from pipeline.storage import FOLDER_HELP

DATA = "Data"
LAUNCH = "Launch"
OPTIM = "Optimization"
MODEL = "Model and fine-tuning"
RUN = "Checkpoints and monitoring"


@exits_cleanly
def train(
    ctx: typer.Context,
    shard_dir: Annotated[str, typer.Argument(
        help=f"SHARD_DIR written by pipe shard: {FOLDER_HELP}.", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="RUN_DIR to write (checkpoints, metrics.jsonl, tb/).", show_default=False)],
    # -- schedule and batch -------------------------------------------------------------------
    epochs: Annotated[int, typer.Option(help="Passes over the train split.", rich_help_panel=OPTIM)] = 3,
    max_steps: Annotated[int | None, typer.Option(help="Stop after this many optimizer steps in total.", rich_help_panel=OPTIM)] = None,
    batch_size: Annotated[int | None, typer.Option(
        help="Samples per rank per forward pass (default 16 unless derived).", rich_help_panel=OPTIM)] = None,
    global_batch: Annotated[int | None, typer.Option(
        help="Samples per optimizer step over all ranks (= batch x ranks x accum).", rich_help_panel=OPTIM)] = None,
    accum: Annotated[int | None, typer.Option(
        help="Micro-batches per optimizer step. Give any two of the three batch flags.", rich_help_panel=OPTIM)] = None,
    lr: Annotated[float, typer.Option(help="Peak AdamW learning rate (warmup, then cosine decay).", rich_help_panel=OPTIM)] = 1e-3,
    weight_decay: Annotated[float, typer.Option(help="AdamW weight decay (not on biases and norms).", rich_help_panel=OPTIM)] = 0.05,
    warmup: Annotated[float, typer.Option(
        help="Warmup: below 1 a fraction of all steps, else a step count.", rich_help_panel=OPTIM)] = 0.05,
    precision: Annotated[str, typer.Option(help="auto, bf16, fp16 (with a grad scaler) or fp32.", rich_help_panel=OPTIM)] = "auto",
    grad_checkpoint: Annotated[bool, typer.Option(
        "--grad-checkpoint", help="Recompute activations in backward: less memory.", rich_help_panel=OPTIM)] = False,
    strategy: Annotated[str, typer.Option(
        help="ddp (a model copy per rank) or fsdp (parameters and optimizer state sharded per block).",
        rich_help_panel=OPTIM)] = "ddp",
    auto_micro_batch: Annotated[bool, typer.Option(
        "--auto-micro-batch", help="On GPU out-of-memory, halve --batch-size and double --accum (global batch kept).",
        rich_help_panel=OPTIM)] = False,
    # -- model ------------------------------------------------------------------------------------
    model: Annotated[str, typer.Option(
        help="image, text, image-text, torchvision:NAME, timm:NAME, hf:PATH (a local Hugging Face folder), or package.module:factory.",
        rich_help_panel=MODEL)] = "image",
    width: Annotated[int, typer.Option(help="Channels of the built-in models' first stage.", rich_help_panel=MODEL)] = 32,
    resolution: Annotated[int, typer.Option(
        help="Side the built-in image model works at (larger inputs are resized down).", rich_help_panel=MODEL)] = 64,
    init_from: Annotated[Path | None, typer.Option(
        help="Start from a pipe train checkpoint, a state dict (.pt/.pth), a .safetensors file or a Hugging Face folder.",
        rich_help_panel=MODEL)] = None,
    freeze: Annotated[float, typer.Option(
        help="Fraction of blocks, from the input, frozen at start (0.7 = first 70%).", rich_help_panel=MODEL)] = 0.0,
    unfreeze_at: Annotated[str | None, typer.Option(
        help="EPOCH[:FRACTION]: from this epoch (counted from 1) only FRACTION stays frozen.", rich_help_panel=MODEL)] = None,
    sync_bn: Annotated[bool, typer.Option(
        "--sync-bn", help="SyncBatchNorm across GPU ranks: for BatchNorm models trained from scratch.", rich_help_panel=MODEL)] = False,
    # -- data ---------------------------------------------------------------------------------------
    workers: Annotated[int, typer.Option(help="Dataloader workers per rank (0 = in the training process).", rich_help_panel=DATA)] = 2,
    seed: Annotated[int, typer.Option(help="Seed of the initialisation, the shard order and the shuffle.", rich_help_panel=DATA)] = 0,
    shuffle_buffer: Annotated[int, typer.Option(help="Samples each worker shuffles at a time.", rich_help_panel=DATA)] = 512,
    max_text_len: Annotated[int, typer.Option(
        help="Bytes of text the built-in models see per sample; tokens for hf: text models.", rich_help_panel=DATA)] = 256,
    data_only: Annotated[bool, typer.Option(
        "--data-only", help="Run only the data pipeline and print samples/s per rank.", rich_help_panel=DATA)] = False,
    record_keys: Annotated[bool, typer.Option(
        "--record-keys", help="Write RUN_DIR/keys/epoch{E}-rank{R}.txt (--data-only).", rich_help_panel=DATA)] = False,
    verify: Annotated[bool, typer.Option(
        "--verify", help="Check every shard's sha256 against index.json before training.", rich_help_panel=DATA)] = False,
    cache_dir: Annotated[Path | None, typer.Option(
        help="Keep whole shards read from SHARD_DIR here (shared by this machine's ranks).", rich_help_panel=DATA)] = None,
    cache_max_gb: Annotated[float | None, typer.Option(
        help="Size cap of --cache-dir in GB; least recently used shards go first.", rich_help_panel=DATA)] = None,
    # -- checkpoints and monitoring -------------------------------------------------------------------
    checkpoint_every: Annotated[int, typer.Option(
        help="Write last.pt every N optimizer steps (0 = at epoch ends only).", rich_help_panel=RUN)] = 200,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from RUN_DIR/last.pt.", rich_help_panel=RUN)] = False,
    log_every: Annotated[int, typer.Option(help="Optimizer steps between metric lines and drift checks.", rich_help_panel=RUN)] = 10,
    # -- launch -------------------------------------------------------------------------------------
    nproc_per_node: Annotated[int, typer.Option(help="Local ranks to start (torch's elastic launcher).", rich_help_panel=LAUNCH)] = 1,
    nnodes: Annotated[int, typer.Option(help="Machines taking part.", rich_help_panel=LAUNCH)] = 1,
    node_rank: Annotated[int, typer.Option(help="This machine's number, 0..nnodes-1.", rich_help_panel=LAUNCH)] = 0,
    master_addr: Annotated[str, typer.Option(help="Address of node 0.", rich_help_panel=LAUNCH)] = "127.0.0.1",
    master_port: Annotated[int, typer.Option(help="Rendezvous port on node 0 (0 = a free one, single node).", rich_help_panel=LAUNCH)] = 0,
    backend: Annotated[str, typer.Option(help="auto (nccl with CUDA, else gloo), nccl or gloo.", rich_help_panel=LAUNCH)] = "auto",
    max_restarts: Annotated[int, typer.Option(
        help="Restarts of failed ranks by the elastic agent; they resume from last.pt.", rich_help_panel=LAUNCH)] = 0,
    rdzv_timeout: Annotated[int, typer.Option(help="Seconds to wait for every node to join.", rich_help_panel=LAUNCH)] = 900,
    config: Annotated[Path | None, typer.Option(help="TOML file whose \\[train] table sets any of these flags.")] = None,
) -> None:
    """Fine-tune a model on SHARD_DIR with DDP (torchrun, or --nproc-per-node local ranks).

    Checkpoints (last.pt, best.pt), metrics.jsonl and TensorBoard logs (tb/) go to RUN_DIR;
    --resume continues from last.pt. --data-only runs just the streaming data pipeline under the
    same launcher and prints samples/s per rank; --record-keys writes the keys each rank consumed.
    """
    from pipeline.core.config import explicit_params, load_section, resolve
    from train.config import TrainConfig

    values = {k: v for k, v in locals().items() if k not in ("ctx", "config")}
    from train.distributed.launch import launch, quiet_cpp_logs

    quiet_cpp_logs()  # before check() or the entry's module loads torch
    cfg = check(resolve(TrainConfig, values, explicit_params(ctx), load_section(config, "train")))

    if cfg.data_only:
        from train import data_only as data_only_entry  # the module, not the --data-only flag of the same name

        launch(cfg.launch_config(), data_only_entry.main, cfg)
    else:
        from train import loop

        launch(cfg.launch_config(), loop.main, cfg)


def check(cfg):
    """Mistakes found before any rank starts: one line, exit 2. Returns the config with the
    batch arithmetic resolved (--batch-size, --global-batch and --accum all set)."""
    from pipeline.core.errors import UsageError
    from train.config import check_epoch_fits, resolve_batch
    from train.config import validate as validate_train
    from train.data import sources
    from train.data.plan import epoch_plan
    from train.distributed.launch import validate, world_size

    validate(cfg.launch_config())
    index, _ = sources.read_index(cfg.shard_dir)
    world = world_size(cfg.launch_config())
    validate_train(cfg, world)
    if cfg.backend == "nccl":
        import torch

        from train.distributed.group import choose_backend

        choose_backend("nccl", torch.cuda.is_available())  # without CUDA: a usage error here, not in every rank
    if not cfg.data_only:
        _check_modalities(cfg, index)
        _check_vision_model(cfg)
    plan = resolve_batch(cfg.batch_size, cfg.global_batch, cfg.accum, world)
    cfg = dataclasses.replace(cfg, batch_size=plan.batch_size, accum=plan.accum, global_batch=plan.global_batch)
    counts = [s["count"] for s in index["shards"] if s["split"] == "train"]
    try:
        steps = epoch_plan(counts, world, plan.batch_size, cfg.seed, 0).steps
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not cfg.data_only:
        check_epoch_fits(steps, plan)
    _check_run_dir(cfg)
    if cfg.verify:
        verify_shards(cfg.shard_dir, index)
    try:
        cfg.output.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create RUN_DIR {cfg.output}: {e.strerror or e}") from None
    return cfg


def verify_shards(shard_dir: str, index: dict) -> None:
    """--verify: every shard's size and sha256 as index.json records them, before any rank reads one.

    The reader trusts the index's offsets and decodes what it finds; a shard changed or damaged
    since `pipe shard` (or swapped by someone else) would be trained on silently. Here it stops the
    run naming the shard: StageFailed, exit 1 (the data is bad, not the command). Runs where the
    command runs: once per node under the built-in launcher, on each rank under an outside torchrun.
    Shards are read from where they are (a folder or object storage), a few MiB per read, reads retried."""
    import hashlib

    from pipeline.core.errors import StageFailed
    from train.data import sources
    from train.data.ranges import Read, SampleDecodeError, read_with_retries

    source = sources.open_source(shard_dir)
    try:
        for entry in index["shards"]:
            digest, size, name = hashlib.sha256(), 0, entry["name"]
            try:
                for at in range(0, entry["bytes"] + 1, source.cap):  # one byte past the indexed end: a longer file
                    data = read_with_retries(source, Read(name, at, source.cap, ()), exact=False)
                    digest.update(data)
                    size += len(data)
                    if len(data) < source.cap:
                        break
            except (OSError, SampleDecodeError) as e:
                raise StageFailed(f"--verify: shard {name} cannot be read: {getattr(e, 'strerror', None) or e}") from None
            if size != entry["bytes"] or digest.hexdigest() != entry["sha256"]:
                raise StageFailed(f"--verify: shard {name} does not match index.json ({size} bytes, sha256 "
                                  f"{digest.hexdigest()[:12]}...; indexed {entry['bytes']} bytes, sha256 {entry['sha256'][:12]}...): "
                                  f"it changed since pipe shard wrote it; restore it or run pipe shard again")
    finally:
        source.close()


def _check_modalities(cfg, index: dict) -> None:
    """A built-in model whose input the train split lacks entirely would train on zeros (a missing
    image is the mean colour, a missing text an empty one: fine for some samples, by design, but a
    whole missing modality makes that encoder dead weight and a text model a constant): refused.
    A --model package.module:factory declares its inputs only once built; it is not checked here.
    An hf: folder says by its files: a tokenizer (texts) or an image processor (images)."""
    from pipeline.core.errors import UsageError

    needs = {"image": ("image",), "text": ("text",), "image-text": ("image", "text")}.get(cfg.model, ())
    if cfg.model.startswith("hf:"):  # a folder with a tokenizer reads texts, one with an image processor images
        from train.models.hf_files import has_tokenizer

        needs = ("text",) if has_tokenizer(cfg.model[3:]) else ("image",)
    train = index["counts"]["train"]
    have = {"image": train["images"] if index.get("image_size") is not None else 0, "text": train["texts"]}
    for field in needs:
        if have[field]:
            continue
        other = "text" if field == "image" else "image"
        hint = f": use --model {other}" if have[other] and not cfg.model.startswith("hf:") else ""
        member = "a .txt" if field == "text" else "an image"
        raise UsageError(f"--model {cfg.model} needs {field}s, but {cfg.shard_dir} has none "
                         f"(0 of {train['samples']} train samples have {member}){hint}")


def _check_vision_model(cfg) -> None:
    """torchvision:/timm: models: the package is there and builds the name (no weights, nothing
    downloaded), and --sync-bn has GPUs to run on: found before any rank starts."""
    from pipeline.core.errors import UsageError

    if cfg.sync_bn:
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--sync-bn needs CUDA ranks: torch's SyncBatchNorm runs on GPUs only (on CPU each rank's "
                             "BatchNorm normalises with its own batch; leave --sync-bn out)")
    if cfg.model.startswith(("torchvision:", "timm:")):
        from train.models.vision import check_spec

        check_spec(cfg.model)  # a wrong name or a missing package: one line, exit 2


def _check_run_dir(cfg) -> None:
    """The run folder's checks (`train.config.continues_run`, `resume_conflict`) before any rank
    starts; the loop makes them again on every rank, which also catches an elastic restart (skipped
    here). ``cfg`` has its batch resolved."""
    from pipeline.core.errors import UsageError
    from train.config import continues_run, elastic_restart, resume_conflict

    if cfg.data_only or elastic_restart():
        return
    holds_run = any((Path(cfg.output) / name).exists() for name in ("last.pt", "last.dcp"))  # no torch import without a run
    if continues_run(cfg.output, cfg.resume, holds_run):
        from train.components import checkpoint as ckpt

        last = ckpt.last_checkpoint(cfg.output)
        conflict = resume_conflict(ckpt.load(last, mmap=True).get("config") or {}, cfg.as_dict()) if last else None
        if conflict:
            raise UsageError(conflict)
