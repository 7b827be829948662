"""`pipe train SHARD_DIR -o RUN_DIR`. Imports no torch at module level: `pipe --help` stays fast.

The command is thin: flags -> `TrainConfig` (command line > TOML > defaults) -> checks that
need no torch (exit 2 on a mistake, before any rank starts) -> `launch(config, entry, config)`,
where the entry is `train.loop.main` (training) or `train.data_only.main` (--data-only).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import typer

from pipeline.cli import options
from pipeline.cli.common import exits_cleanly
from train.config import PANELS, TrainConfig


@options.command(TrainConfig, "train", panels=PANELS)
@exits_cleanly
def train(ctx: typer.Context, **given: Any) -> None:
    """Fine-tune a model on SHARD_DIR with DDP (torchrun, or --nproc-per-node local ranks).

    Checkpoints (last.pt, best.pt), metrics.jsonl and TensorBoard logs (tb/) go to RUN_DIR;
    --resume continues from last.pt. --data-only runs just the streaming data pipeline under the
    same launcher and prints samples/s per rank; --record-keys writes the keys each rank trained on.
    Several SHARD_DIRs are trained on together, mixed by --mix.
    """
    from train.distributed.launch import launch, quiet_cpp_logs

    quiet_cpp_logs()  # before check() or the entry's module loads torch
    cfg = check(options.read(ctx, TrainConfig, "train", given))

    if cfg.data_only:
        from train import data_only as data_only_entry  # the module, not the --data-only flag of the same name

        launch(cfg.launch_config(), data_only_entry.main, cfg)
    else:
        from pipeline.core.errors import Terminated
        from train import loop

        results = launch(cfg.launch_config(), loop.main, cfg)
        if any((r or {}).get("interrupted") for r in results.values()):  # a SIGTERM: every rank saved and stopped
            raise Terminated


def check(cfg):
    """Mistakes found before any rank starts: one line, exit 2. Returns the config with the
    batch arithmetic resolved (--batch-size, --global-batch and --accum all set)."""
    from pipeline.core.errors import UsageError
    from train.config import check_epoch_fits, resolve_batch
    from train.config import validate as validate_train
    from train.data import sources
    from train.data.plan import epoch_plan
    from train.data.skips import parse_limit
    from train.distributed.launch import validate, world_size

    validate(cfg.launch_config())
    dataset = None
    if len(cfg.shard_dirs) > 1:  # a mix (`train.data.mix`): its folders read, its weights and classes checked
        if cfg.data_only:
            raise UsageError("--data-only reads one SHARD_DIR; give the folders of a mix one at a time")
        from train.data.loaders import mixed

        dataset = mixed(cfg)
        index = dataset.index
    else:
        index, _ = sources.read_index(cfg.shard_dir)
    world = world_size(cfg.launch_config())
    validate_train(cfg, world)
    if cfg.backend == "nccl":
        import torch

        from train.distributed.group import choose_backend

        choose_backend("nccl", torch.cuda.is_available())  # without CUDA: a usage error here, not in every rank
    if not cfg.data_only:
        _check_model(cfg, index)
        if cfg.init_from is not None:  # read through the restricted unpickler here, not first in every rank
            from train.models.finetune import check_init

            check_init(cfg.init_from)
    plan = resolve_batch(cfg.batch_size, cfg.global_batch, cfg.accum, world)
    parse_limit(cfg.max_skipped, index["counts"]["train"]["samples"])  # --max-skipped 150%: one line, exit 2
    cfg = dataclasses.replace(cfg, batch_size=plan.batch_size, accum=plan.accum, global_batch=plan.global_batch)
    counts = [s["count"] for s in (dataset.shards("train") if dataset else index["shards"]) if s["split"] == "train"]
    mix = dataset.mix("train") if dataset else None
    try:
        steps = epoch_plan(counts, world, plan.batch_size, cfg.seed, 0, mix=mix).steps
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not cfg.data_only:
        check_epoch_fits(steps, plan)
    _check_run_dir(cfg)
    if cfg.verify:
        for folder, folder_index in zip(cfg.shard_dirs, dataset.indexes if dataset else [index]):
            verify_shards(folder, folder_index)
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


def _check_model(cfg, index: dict) -> None:
    """The model's family says whether it can be built (a torchvision:/timm: name the package knows, an
    hf: folder with a config, weights and a tokenizer or image processor: nothing built, nothing
    downloaded) and which inputs it reads; --sync-bn has GPUs to run on: found before any rank starts."""
    from pipeline.core.errors import UsageError
    from train.models import families

    families.check(cfg.model)  # a wrong name, folder or a missing package: one line, exit 2
    if cfg.sync_bn:
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--sync-bn needs CUDA ranks: torch's SyncBatchNorm runs on GPUs only (on CPU each rank's "
                             "BatchNorm normalises with its own batch; leave --sync-bn out)")
    _check_modalities(cfg, index, families.inputs(cfg.model) or (), families.resolve(cfg.model).family is families.BUILTIN)
    _check_labels(cfg, index)


def _check_labels(cfg, index: dict) -> None:
    """--objective classify needs a class for every sample: a dataset with image-caption pairs
    without a label (`pipe shard` keeps them) is refused, not trained on in part (the reader's
    plan counts every sample; skipping some would make ranks' steps differ). --objective
    contrastive needs every train sample to be a pair (an image without a caption has nothing to
    be matched with)."""
    from pipeline.core.errors import UsageError

    counts = index["counts"]
    if cfg.objective == "classify":
        loose = {split: counts[split]["samples"] - sum(counts[split]["per_class"].values()) for split in ("train", "val")}
        if any(loose.values()):
            raise UsageError(f"{cfg.shard_dir} holds {sum(loose.values())} image-caption pairs without a label "
                             f"({loose['train']} train, {loose['val']} val): --objective classify needs a class for "
                             "every sample; train them with --objective contrastive, or label them (pipe clean "
                             "--labels) and shard again")
        return
    train = counts["train"]
    lacking = train["samples"] - min(train["images"], train["texts"])
    if lacking:
        raise UsageError(f"--objective contrastive matches images with their captions, but {lacking} of "
                         f"{train['samples']} train samples in {cfg.shard_dir} are an image or a text alone: "
                         "shard the image-caption pairs on their own (pipe shard CLEAN_DIR -o SHARD_DIR --pairs-only)")


def _check_modalities(cfg, index: dict, needs: tuple[str, ...], builtin: bool) -> None:
    """A model whose input the train split lacks entirely would train on zeros (a missing image is
    the mean colour, a missing text an empty one: fine for some samples, by design, but a whole
    missing modality makes that encoder dead weight and a text model a constant): refused. A model
    whose family knows its inputs only once it is built (--model package.module:factory) is not
    checked here; an hf: folder says by its files: a tokenizer (texts) or an image processor (images)."""
    from pipeline.core.errors import UsageError

    train = index["counts"]["train"]
    have = {"image": train["images"] if index.get("image_size") is not None else 0, "text": train["texts"]}
    for field in needs:
        if have[field]:
            continue
        other = "text" if field == "image" else "image"
        hint = f": use --model {other}" if have[other] and builtin else ""
        member = "a .txt" if field == "text" else "an image"
        raise UsageError(f"--model {cfg.model} needs {field}s, but {cfg.shard_dir} has none "
                         f"(0 of {train['samples']} train samples have {member}){hint}")


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
