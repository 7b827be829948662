"""Settings of `pipe train`: one typed dataclass, one precedence rule, one batch arithmetic.

Precedence is the project's: a flag typed on the command line > the ``[train]`` table of a
``--config`` TOML file (checked against ``schemas/config.schema.json``) > the defaults below.
`pipeline.core.config.resolve` applies it; `validate` turns every bad choice into one sentence
(`UsageError`, exit 2) before any process group or model exists.

This module imports no torch: the command line builds and checks a config without it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import UsageError

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
STRATEGIES = ("ddp", "fsdp")
BUILTIN_MODELS = ("image", "text", "image-text")


@dataclass
class LaunchConfig:
    """How the ranks are started and find each other (torchrun's flags of the same name)."""

    nproc_per_node: int = 1
    """Local ranks to start, through torch's elastic launcher; ignored under an external torchrun."""
    nnodes: int = 1
    """Machines taking part; each runs the same command with its own --node-rank."""
    node_rank: int = 0
    """This machine's number, 0..nnodes-1 (static rendezvous)."""
    master_addr: str = "127.0.0.1"
    """Address of node 0, reachable from every node."""
    master_port: int = 0
    """Rendezvous port on node 0; 0 picks a free one (single node only)."""
    backend: str = "auto"
    """Process-group backend: nccl, gloo, or auto (nccl when CUDA is there, gloo otherwise)."""
    max_restarts: int = 0
    """Times the elastic agent restarts the ranks after a failure (they resume from last.pt by themselves)."""
    rdzv_timeout: int = 900
    """Seconds to wait for every node to join the rendezvous before giving up with a message."""


@dataclass
class TrainConfig(LaunchConfig):
    """Settings of `pipe train` (flags of the same name; `[train]` in a `--config` file)."""

    shard_dir: str = "."
    """SHARD_DIR written by `pipe shard`, a local folder or a URL (object storage); its index.json is the only entry point."""
    output: Path = Path("run")
    """RUN_DIR: checkpoints (last.pt, best.pt), metrics.jsonl, tb/ (TensorBoard), config.json, keys/."""
    data_only: bool = False
    """Run only the data pipeline (no model) and report samples/s per rank."""
    record_keys: bool = False
    """Write the keys each rank consumed, per epoch, to RUN_DIR/keys/epoch{E}-rank{R}.txt."""
    verify: bool = False
    """Before training, check every shard's size and sha256 against index.json (reads each shard once)."""

    # -- schedule ---------------------------------------------------------------------------
    epochs: int = 3
    """Passes over the train split."""
    max_steps: int | None = None
    """Stop after this many optimizer steps in total, even mid-epoch (None: run every epoch)."""

    # -- batch arithmetic: give any two, the third is derived (see `resolve_batch`) ----------
    batch_size: int | None = None
    """Samples per rank per forward pass (the micro-batch). Default 16 when it cannot be derived."""
    global_batch: int | None = None
    """Samples per optimizer step over all ranks = batch_size x world size x accum."""
    accum: int | None = None
    """Micro-batches whose gradients add up before one optimizer step (gradient accumulation)."""

    # -- optimizer ----------------------------------------------------------------------------
    lr: float = 1e-3
    """Peak learning rate of AdamW, reached after the warmup and decayed by a cosine."""
    weight_decay: float = 0.05
    """AdamW's decoupled weight decay, on weight matrices and kernels only (not biases, norms)."""
    warmup: float = 0.05
    """Linear warmup: below 1 a fraction of all optimizer steps, from 1 up a number of steps."""
    min_lr_fraction: float = 0.1
    """Where the cosine ends, as a fraction of --lr."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this before each step (0: no clipping)."""

    # -- numerics and memory ------------------------------------------------------------------
    precision: str = "auto"
    """bf16, fp16 (with a gradient scaler) or fp32; auto: bf16 on a GPU that has it, else fp16 on GPU, fp32 on CPU."""
    grad_checkpoint: bool = False
    """Recompute block activations in the backward pass (non-reentrant): less memory, ~30% more compute."""
    strategy: str = "ddp"
    """ddp: a full copy of the model per rank, gradients all-reduced; fsdp: parameters, gradients and optimizer
    state sharded over the ranks per block (FSDP2), checkpoints through torch.distributed.checkpoint."""
    auto_micro_batch: bool = False
    """On a GPU, probe the per-rank batch before training; on out-of-memory halve it and double --accum (global batch kept)."""

    # -- model and fine-tuning -----------------------------------------------------------------
    model: str = "image"
    """image, text, image-text, torchvision:NAME, timm:NAME (built without weights: --init-from brings them),
    hf:PATH (a local Hugging Face folder), or package.module:factory (called as factory(num_classes=N))."""
    width: int = 32
    """Channels of the built-in models' first stage (later stages double it)."""
    resolution: int = 64
    """Side, in pixels, the built-in image model works at (inputs are area-resized to it when larger)."""
    init_from: Path | None = None
    """Start from these weights: a `pipe train` checkpoint, a state dict (.pt/.pth), a .safetensors file or a Hugging Face folder."""
    freeze: float = 0.0
    """Fraction of the model's blocks, counted from the input, that start frozen (0.7 = the first 70%)."""
    unfreeze_at: str | None = None
    """EPOCH[:FRACTION]: from this epoch on (epochs count from 1), only FRACTION (default 0) stays frozen."""
    sync_bn: bool = False
    """Convert BatchNorm to SyncBatchNorm (statistics over the global batch): for BatchNorm models trained from scratch across GPU ranks."""

    # -- data (the reader's knobs) ------------------------------------------------------------
    workers: int = 2
    """Dataloader worker processes per rank (0: decode in the training process)."""
    max_text_len: int = 256
    """Bytes of text the built-in models see per sample, tokens for hf: text models (longer texts are cut; hf: pads to it)."""
    shuffle_buffer: int = 512
    """Samples each worker shuffles at a time (memory: this many undecoded samples per worker)."""
    cache_dir: Path | None = None
    """Keep whole shards read from SHARD_DIR in this local folder (shared by the ranks and workers of a machine)."""
    cache_max_gb: float | None = None
    """Size cap of --cache-dir in GB (least recently used shards evicted); None: no cap."""

    # -- reproducibility, faults, launch ---------------------------------------------------------
    seed: int = 0
    """Seeds the model's initialisation, the data order (with the epoch) and every rank's RNG."""
    checkpoint_every: int = 200
    """Write last.pt every this many optimizer steps (0: only at the end of each epoch)."""
    resume: bool = False
    """Continue from RUN_DIR/last.pt (automatic after a restart under torchrun --max-restarts)."""
    log_every: int = 10
    """Optimizer steps between metric lines, TensorBoard points and the drift check."""

    def as_dict(self) -> dict:
        """JSON-ready values (paths as strings), e.g. for config.json and checkpoints."""
        return {f.name: (str(v) if isinstance(v, Path) else v)
                for f in dataclasses.fields(self) for v in [getattr(self, f.name)]}

    @property
    def cache_max_bytes(self) -> int | None:
        return None if self.cache_max_gb is None else int(self.cache_max_gb * 1e9)

    def launch_config(self) -> LaunchConfig:
        return LaunchConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(LaunchConfig)})

    # Settings that may differ between nodes without changing the run: where files live, how
    # many processes decode, when things are logged, how this node was launched. Everything
    # else must agree on every rank.
    LOCAL_SETTINGS = ("shard_dir", "output", "init_from", "workers", "resume", "log_every", "record_keys", "verify",
                      "cache_dir", "cache_max_gb",
                      "nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port", "max_restarts",
                      "rdzv_timeout")

    # Settings that shape the training trajectory (the schedule's length, the optimizer, the model,
    # the numerics, the data order's seed): a resumed run must keep the values it was started with,
    # or the restored scheduler and weights would silently follow the old ones while config.json
    # and last.pt claimed the new. The batch is compared as the global batch: how it is split
    # (--batch-size, --accum, ranks) may change, the reader restarts a mid-epoch position then.
    RESUME_SETTINGS = ("epochs", "max_steps", "global_batch", "lr", "weight_decay", "warmup", "min_lr_fraction",
                       "grad_clip", "precision", "strategy", "model", "width", "resolution", "init_from", "freeze",
                       "unfreeze_at", "sync_bn", "max_text_len", "seed")
    # Everything else may change on --resume: where files are, how ranks are launched, how the
    # batch is split and read (workers, shuffle buffer: a changed layout restarts the epoch in
    # progress, see `ShardReader.load_state_dict`), memory-saving recomputation, logging, checkpoints.
    RESUME_FREE = ("shard_dir", "output", "data_only", "record_keys", "verify", "batch_size", "accum", "grad_checkpoint",
                   "auto_micro_batch", "workers", "shuffle_buffer", "checkpoint_every", "resume", "log_every",
                   "nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port", "backend",
                   "max_restarts", "rdzv_timeout", "cache_dir", "cache_max_gb")

    def fingerprint(self) -> str:
        """Hash of the settings every rank must share; the preflight compares it across ranks."""
        shared = {k: v for k, v in self.as_dict().items() if k not in self.LOCAL_SETTINGS}
        return hashlib.sha256(json.dumps(shared, sort_keys=True).encode()).hexdigest()[:16]


TOML_ONLY = ("min_lr_fraction", "grad_clip")  # settings without a flag: named as their [train] key


def _setting(name: str, value) -> str:
    flag = name if name in TOML_ONLY else "--" + name.replace("_", "-")
    return f"{flag} {'(not set)' if value is None else value}"


def elastic_restart() -> bool:
    """True in a rank that torch's elastic agent restarted (torchrun --max-restarts): it continues
    RUN_DIR/last.pt by itself, --resume or not."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0


def continues_run(run_dir: Path, resume: bool, holds_run: bool) -> bool:
    """Whether this run continues RUN_DIR/last.pt (``holds_run``: that file exists). A run folder
    that holds a run is continued only on request, or after an elastic restart; --resume with
    nothing to continue is a mistake. The one check for `pipe train` (before any rank starts)
    and the loop (on every rank, after a restart too); the settings are `resume_conflict`'s."""
    restarted = elastic_restart()
    if not holds_run:
        if resume and not restarted:
            raise UsageError(f"--resume: {run_dir} has no last.pt to continue from")
        return False
    if not (resume or restarted):
        raise UsageError(f"{run_dir} already holds a run (last.pt); add --resume to continue it, or choose a new -o")
    return True


def resume_conflict(saved: dict, now: dict) -> str | None:
    """The usage error for resuming a run (``saved``: the resolved config in its last.pt) with
    settings ``now`` that change its trajectory (`TrainConfig.RESUME_SETTINGS`), or None.

    ``now`` has the batch arithmetic resolved (``global_batch`` set). ``--precision auto`` and a
    missing ``--init-from`` mean "as before" (the checkpoint records the resolved precision, and
    its weights replace any --init-from on resume). Keys an older checkpoint lacks are not compared.
    """
    old, new = [], []
    for name in TrainConfig.RESUME_SETTINGS:
        if name not in saved:
            continue
        a, b = saved[name], now.get(name)
        if name == "precision" and b == "auto":
            continue
        if name == "init_from":
            if b is None:
                continue
            same = a is not None and Path(a).resolve() == Path(b).resolve()
        else:
            same = a == b  # JSON-ready values: numbers, strings, None (1 == 1.0)
        if not same:
            old.append(_setting(name, a))
            new.append(_setting(name, b))
    if not old:
        return None
    return (f"--resume: this run was made with {' '.join(old)}; got {' '.join(new)}: pass the same settings, "
            "or start a new run directory")


@dataclass(frozen=True)
class BatchPlan:
    """The resolved batch arithmetic: global_batch = batch_size x world_size x accum."""

    batch_size: int
    world_size: int
    accum: int

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size * self.accum

    def halved(self) -> BatchPlan:
        """Half the micro-batch and twice the accumulation: the same global batch, less memory."""
        return BatchPlan(self.batch_size // 2, self.world_size, self.accum * 2)

    def describe(self) -> str:
        return (f"global batch {self.global_batch} = {self.batch_size} per rank x {self.world_size} "
                f"rank{'s' if self.world_size != 1 else ''} x {self.accum} accumulation step{'s' if self.accum != 1 else ''}")


DEFAULT_BATCH_SIZE = 16


def resolve_batch(batch_size: int | None, global_batch: int | None, accum: int | None, world_size: int) -> BatchPlan:
    """Derive the missing one of (batch_size, global_batch, accum) from the other two.

    Given none or one, the defaults fill in (batch 16, accum 1); given all three, they must agree.
    A global batch that the others do not divide is a usage error, never a silent rounding.
    """
    _check_batch_flags(batch_size, global_batch, accum)
    if global_batch is None:
        b, a = batch_size or DEFAULT_BATCH_SIZE, accum or 1
        return BatchPlan(b, world_size, a)
    if batch_size is not None and accum is not None:
        plan = BatchPlan(batch_size, world_size, accum)
        if plan.global_batch != global_batch:
            raise UsageError(f"--global-batch {global_batch} does not equal --batch-size {batch_size} x {world_size} "
                             f"ranks x --accum {accum} = {plan.global_batch}; give only two of the three")
        return plan
    if batch_size is not None:  # global and per-rank batch given: accum derived
        per_step = batch_size * world_size
        if global_batch % per_step:
            raise UsageError(f"--global-batch {global_batch} is not a multiple of --batch-size {batch_size} x {world_size} "
                             f"ranks = {per_step}; choose a global batch that is, or another --batch-size")
        return BatchPlan(batch_size, world_size, global_batch // per_step)
    a = accum or 1  # global (and maybe accum) given: per-rank batch derived
    if global_batch % (world_size * a):
        raise UsageError(f"--global-batch {global_batch} cannot be split over {world_size} ranks x --accum {a}; "
                         f"choose a multiple of {world_size * a}")
    return BatchPlan(global_batch // (world_size * a), world_size, a)


def _check_batch_flags(batch_size: int | None, global_batch: int | None, accum: int | None) -> None:
    for name, v in (("--batch-size", batch_size), ("--global-batch", global_batch), ("--accum", accum)):
        if v is not None and v < 1:
            raise UsageError(f"{name} must be at least 1, got {v}")


def check_epoch_fits(steps: int, plan: BatchPlan) -> None:
    """An epoch of ``steps`` per-rank batches must make at least one optimizer step (``accum`` of them)."""
    if steps < plan.accum:
        raise UsageError(f"one epoch gives each rank {steps} batches of {plan.batch_size}, fewer than one optimizer "
                         f"step needs (--accum {plan.accum}); lower --global-batch or --accum")


def _check_hf_folder(path: str) -> None:
    """--model hf:PATH names a local folder with a config, weights and a tokenizer or image processor."""
    from train.models.hf_files import folder_problem

    problem = folder_problem(path)
    if problem:
        raise UsageError(problem)


def parse_unfreeze_at(value: str | None) -> tuple[int, float] | None:
    """``"2"`` -> (2, 0.0); ``"3:0.3"`` -> (3, 0.3): from epoch 3 on, the first 30% stay frozen."""
    if value is None or str(value).strip() == "":
        return None
    text = str(value).strip()
    epoch_s, _, frac_s = text.partition(":")
    try:
        epoch = int(epoch_s)
        fraction = float(frac_s) if frac_s else 0.0
    except ValueError:
        raise UsageError(f"--unfreeze-at {text!r} is not EPOCH[:FRACTION], e.g. 2 or 3:0.3") from None
    if epoch < 1:
        raise UsageError(f"--unfreeze-at {text!r}: epochs count from 1")
    if not 0.0 <= fraction < 1.0:
        raise UsageError(f"--unfreeze-at {text!r}: FRACTION (the share that stays frozen) must be in [0, 1)")
    return epoch, fraction


def validate(cfg: TrainConfig, world_size: int | None = None) -> TrainConfig:
    """Check the operator's choices; every problem is one sentence and exit 2. The launch flags
    (ranks, nodes, port, backend) are `train.distributed.launch.validate`'s.

    With ``world_size`` known (the launcher knows it before any process starts) the batch
    arithmetic is checked too, so a global batch that does not divide fails before launch.
    """
    from pipeline.storage import local_path

    here = local_path(cfg.shard_dir)  # None: object storage, read (and judged) by train.command.check
    if here is not None and not (here / "index.json").is_file():
        raise UsageError(f"{cfg.shard_dir} has no index.json: run `pipe shard` first (it writes index.json last)")
    out = Path(cfg.output)
    if out.exists() and not out.is_dir():
        raise UsageError(f"the run folder {out} exists and is not a folder")
    checks = [
        (cfg.epochs >= 1, f"--epochs must be at least 1, got {cfg.epochs}"),
        (cfg.max_steps is None or cfg.max_steps >= 1, f"--max-steps must be at least 1, got {cfg.max_steps}"),
        (cfg.lr > 0, f"--lr must be positive, got {cfg.lr}"),
        (cfg.weight_decay >= 0, f"--weight-decay must be 0 or more, got {cfg.weight_decay}"),
        (cfg.warmup >= 0, f"--warmup must be 0 or more, got {cfg.warmup}"),
        (0 <= cfg.min_lr_fraction <= 1, f"min_lr_fraction must be in [0, 1], got {cfg.min_lr_fraction}"),
        (cfg.grad_clip >= 0, f"grad_clip must be 0 or more, got {cfg.grad_clip}"),
        (cfg.precision in PRECISIONS, f"--precision must be one of {', '.join(PRECISIONS)}, got {cfg.precision!r}"),
        (cfg.strategy in STRATEGIES, f"--strategy must be one of {', '.join(STRATEGIES)}, got {cfg.strategy!r}"),
        (cfg.model in BUILTIN_MODELS or ":" in cfg.model,
         f"--model must be one of {', '.join(BUILTIN_MODELS)}, torchvision:NAME, timm:NAME, hf:PATH or "
         f"package.module:factory, got {cfg.model!r}"),
        (cfg.width >= 4, f"width must be at least 4, got {cfg.width}"),
        (cfg.resolution >= 8, f"resolution must be at least 8, got {cfg.resolution}"),
        (0.0 <= cfg.freeze <= 1.0, f"--freeze must be a fraction in [0, 1], got {cfg.freeze}"),
        (cfg.workers >= 0, f"--workers must be 0 or more, got {cfg.workers}"),
        (cfg.max_text_len >= 1, f"--max-text-len must be at least 1, got {cfg.max_text_len}"),
        (cfg.checkpoint_every >= 0, f"--checkpoint-every must be 0 or more, got {cfg.checkpoint_every}"),
        (cfg.log_every >= 1, f"--log-every must be at least 1, got {cfg.log_every}"),
        (cfg.seed >= 0, f"--seed must be 0 or more, got {cfg.seed}"),
        (cfg.cache_max_gb is None or cfg.cache_max_gb > 0, f"--cache-max-gb must be positive, got {cfg.cache_max_gb}"),
        (cfg.cache_max_gb is None or cfg.cache_dir is not None, "--cache-max-gb needs --cache-dir"),
    ]
    for ok, message in checks:
        if not ok:
            raise UsageError(message)
    if cfg.model.startswith("hf:"):
        _check_hf_folder(cfg.model[3:])
    if cfg.init_from is not None and not Path(cfg.init_from).is_file():
        if not Path(cfg.init_from).is_dir():
            raise UsageError(f"--init-from {cfg.init_from}: no such file")
        if not (Path(cfg.init_from) / "config.json").is_file():
            raise UsageError(f"--init-from {cfg.init_from}: a folder, not a checkpoint file nor a Hugging Face model "
                             "folder (no config.json)")
    schedule = parse_unfreeze_at(cfg.unfreeze_at)
    if schedule is not None and schedule[1] >= cfg.freeze:
        raise UsageError(f"--unfreeze-at {cfg.unfreeze_at} would leave {schedule[1]:.0%} frozen, "
                         f"but --freeze {cfg.freeze} freezes only {cfg.freeze:.0%}: nothing to unfreeze")
    _check_batch_flags(cfg.batch_size, cfg.global_batch, cfg.accum)
    if world_size is not None:
        resolve_batch(cfg.batch_size, cfg.global_batch, cfg.accum, world_size)
    return cfg
