"""Settings of `pipe train`: one typed dataclass, one precedence rule, one batch arithmetic.

Precedence is the project's: a flag typed on the command line > the ``[train]`` table of a
``--config`` TOML file (checked against ``schemas/config.schema.json``) > the defaults below.
`pipeline.core.config.resolve` applies it; `validate` turns every bad choice into one sentence
(`UsageError`, exit 2) before any process group or model exists.

This module imports no torch: the command line builds and checks a config without it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

from pipeline.core import settings
from pipeline.core.errors import UsageError
from pipeline.core.settings import setting
from pipeline.storage import FOLDER_HELP
from train.models import families

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
DECODES = ("cpu", "gpu")  # `train.data.reader.DECODES`: where JPEGs are decoded
OBJECTIVES = ("classify", "contrastive")  # what each is: `train.objectives`
LOSSES = ("clip", "siglip")
STRATEGIES = ("ddp", "fsdp")
BACKENDS = ("auto", "nccl", "gloo")

# the panels of `pipe train --help`, in their order
OPTIM = "Optimization"
MODEL = "Model and fine-tuning"
DATA = "Data"
RUN = "Checkpoints and monitoring"
LAUNCH = "Launch"
PANELS = (OPTIM, MODEL, DATA, RUN, LAUNCH)


@dataclass
class LaunchConfig:
    """How the ranks are started and find each other (torchrun's flags of the same name)."""

    nproc_per_node: int = setting(1, "Local ranks to start, through torch's elastic launcher; ignored under an external "
                                     "torchrun.", minimum=1, panel=LAUNCH)
    nnodes: int = setting(1, "Machines taking part; each runs the same command with its own --node-rank.", minimum=1,
                          panel=LAUNCH)
    node_rank: int = setting(0, "This machine's number, 0..nnodes-1 (static rendezvous).", minimum=0, panel=LAUNCH)
    master_addr: str = setting("127.0.0.1", "Address of node 0, reachable from every node.", panel=LAUNCH)
    master_port: int = setting(0, "Rendezvous port on node 0 (0 = a free one, single node only).", minimum=0,
                               maximum=65535, panel=LAUNCH)
    backend: str = setting("auto", "Process-group backend: auto (nccl with CUDA, else gloo), nccl or gloo.",
                           choices=BACKENDS, panel=LAUNCH)
    max_restarts: int = setting(0, "Restarts of failed ranks by the elastic agent; they resume from last.pt by "
                                   "themselves.", minimum=0, panel=LAUNCH)
    rdzv_timeout: int = setting(900, "Seconds to wait for every node to join the rendezvous.", minimum=1, unit="seconds",
                                panel=LAUNCH)


@dataclass
class TrainConfig(LaunchConfig):
    """Settings of `pipe train` (flags of the same name; `[train]` in a `--config` file)."""

    shard_dir: str = setting(".", f"SHARD_DIR written by pipe shard: {FOLDER_HELP}; its index.json is the only entry "
                                  "point.", argument=True, required=True)
    more_shard_dirs: list[str] | None = setting(None, "More SHARD_DIRs to train on together with the first, mixed by "
                                                      "--mix: classes merged by name.", argument=True, remote=True,
                                                schema={"type": "array", "items": {"type": "string"}})
    output: Path = setting(Path("run"), "RUN_DIR to write: checkpoints (last.pt, best.pt), metrics.jsonl, tb/ "
                                        "(TensorBoard), config.json, keys/.", flags=("--output", "-o"), required=True)
    data_only: bool = setting(False, "Run only the data pipeline (no model) and print samples/s per rank.",
                              flags=("--data-only",), panel=DATA)
    record_keys: bool = setting(False, "Write the keys each rank trained on, in order, to RUN_DIR/keys/epoch{E}-rank{R}"
                                       "[-attempt{A}].txt with every checkpoint (what the checkpointed model saw; a "
                                       "skipped sample as 'KEY skipped'); under --data-only the keys each rank read.",
                                flags=("--record-keys",), panel=DATA)
    verify: bool = setting(False, "Before training, check every shard's size and sha256 against index.json; a mismatch "
                                  "stops the run naming the shard, exit 1.", flags=("--verify",), panel=DATA)
    mix: str | None = setting(None, "Weights of the SHARD_DIRs in every epoch, one per folder (3,1: three quarters from "
                                    "the first); default equal. A source up-sampled shows every sample once before any "
                                    "twice; one down-sampled continues its pass next epoch.",
                              pattern=r"^ *[0-9]*\.?[0-9]+( *, *[0-9]*\.?[0-9]+)* *$", panel=DATA)
    epoch_samples: int | None = setting(None, "Samples per epoch of a mix of SHARD_DIRs (default: all of theirs "
                                              "together).", minimum=1, panel=DATA)
    max_skipped: str = setting("0.1%", "Samples that do not read or decode are skipped (named in the log and "
                                       "RUN_DIR/skipped.jsonl); past this many distinct ones, N or P% of the train split "
                                       "(at least 1), the run stops, exit 1.", pattern=r"^([0-9]+|[0-9]*\.?[0-9]+%)$",
                               panel=DATA)

    # -- schedule ---------------------------------------------------------------------------
    epochs: int = setting(3, "Passes over the train split.", minimum=1, panel=OPTIM)
    max_steps: int | None = setting(None, "Stop after this many optimizer steps in total, even mid-epoch (default: run "
                                          "every epoch).", minimum=1, panel=OPTIM)

    # -- batch arithmetic: give any two, the third is derived (see `resolve_batch`) ----------
    batch_size: int | None = setting(None, "Samples per rank per forward pass, the micro-batch (default 16 unless "
                                           "derived).", minimum=1, panel=OPTIM)
    global_batch: int | None = setting(None, "Samples per optimizer step over all ranks (= batch x ranks x accum).",
                                       minimum=1, panel=OPTIM)
    accum: int | None = setting(None, "Micro-batches whose gradients add up before one optimizer step. Give any two of "
                                      "the three batch flags.", minimum=1, panel=OPTIM)

    # -- optimizer ----------------------------------------------------------------------------
    lr: float = setting(1e-3, "Peak AdamW learning rate, reached after the warmup and decayed by a cosine.", above=0,
                        panel=OPTIM)
    weight_decay: float = setting(0.05, "AdamW's decoupled weight decay, on weight matrices and kernels only (not biases "
                                        "and norms).", minimum=0, panel=OPTIM)
    warmup: float = setting(0.05, "Linear warmup: below 1 a fraction of all optimizer steps, else a step count.",
                            minimum=0, panel=OPTIM)
    min_lr_fraction: float = setting(0.1, "Where the cosine ends, as a fraction of --lr.", minimum=0, maximum=1, cli=False)
    grad_clip: float = setting(1.0, "Clip the global gradient norm to this before each step (0: no clipping).", minimum=0,
                               cli=False)

    # -- numerics and memory ------------------------------------------------------------------
    precision: str = setting("auto", "bf16, fp16 (with a gradient scaler) or fp32; auto: bf16 on a GPU that has it, else "
                                     "fp16 on GPU, fp32 on CPU.", choices=PRECISIONS, panel=OPTIM)
    grad_checkpoint: bool = setting(False, "Recompute block activations in the backward pass (non-reentrant): less "
                                           "memory, ~30% more compute.", flags=("--grad-checkpoint",), panel=OPTIM)
    strategy: str = setting("ddp", "ddp (a model copy per rank, gradients all-reduced) or fsdp (parameters, gradients and "
                                   "optimizer state sharded per block, FSDP2; checkpoints through "
                                   "torch.distributed.checkpoint).", choices=STRATEGIES, panel=OPTIM)
    auto_micro_batch: bool = setting(False, "On a GPU, probe the per-rank batch before training; on out-of-memory halve "
                                            "--batch-size and double --accum (global batch kept).",
                                     flags=("--auto-micro-batch",), panel=OPTIM)

    # -- model and fine-tuning -----------------------------------------------------------------
    objective: str = setting("classify", "classify (a head over the classes, cross-entropy) or contrastive (images and "
                                         "captions matched over the global batch: --model clip, or an hf: CLIP or SigLIP "
                                         "folder).", choices=OBJECTIVES, panel=MODEL)
    loss: str = setting("clip", "With --objective contrastive: clip (symmetric InfoNCE, learnable temperature) or siglip "
                                "(sigmoid, learnable bias).", choices=LOSSES, panel=MODEL)
    lock_image: bool = setting(False, "With --objective contrastive: the image tower frozen, its norm layers in eval mode; "
                                      "only the text tower learns (LiT).", flags=("--lock-image",), panel=MODEL)
    zeroshot_prompt: list[str] | None = setting(
        None, "With --objective contrastive: a template for zero-shot accuracy, {} standing for the class name; "
              "repeatable, text embeddings averaged over them (default: 'a photo of a {}.', CLIP's).",
        flags=("--zeroshot-prompt",), schema={"type": "array", "items": {"type": "string", "pattern": "[{][}]"}},
        panel=MODEL)
    model: str = setting("image", families.model_help(), panel=MODEL)  # each family checks its own syntax (resolve)
    width: int = setting(32, "Channels of the built-in models' first stage (later stages double it).", minimum=4,
                         panel=MODEL)
    resolution: int = setting(64, "Side, in pixels, the built-in image model works at (larger inputs are area-resized "
                                  "down to it).", minimum=8, panel=MODEL)
    init_from: Path | None = setting(None, "Start from these weights: a pipe train checkpoint (last.pt, or a last.dcp folder "
                                           "of --strategy fsdp), a folder pipe export wrote, a state dict (.pt/.pth), a "
                                           ".safetensors file or a Hugging Face folder.", panel=MODEL)
    freeze: float = setting(0.0, "Fraction of the model's blocks, counted from the input, frozen at start (0.7 = the "
                                 "first 70%).", minimum=0, maximum=1, panel=MODEL)
    unfreeze_at: str | None = setting(None, "EPOCH[:FRACTION]: from this epoch on (epochs count from 1), only FRACTION "
                                            "(default 0) stays frozen.", pattern=r"^[0-9]+(:[0-9]*\.?[0-9]+)?$",
                                      panel=MODEL)
    sync_bn: bool = setting(False, "SyncBatchNorm across GPU ranks (statistics over the global batch): for BatchNorm "
                                   "models trained from scratch.", flags=("--sync-bn",), panel=MODEL)

    # -- data (the reader's knobs) ------------------------------------------------------------
    workers: int = setting(2, "Dataloader workers per rank (0 = in the training process).", minimum=0, panel=DATA)
    decode: str = setting("cpu", "Where JPEGs are decoded: cpu (the dataloader workers) or gpu (nvJPEG on the rank's GPU, "
                                 "batched; the CPU decoder where there is no GPU or for an image nvJPEG refuses).",
                          choices=DECODES, panel=DATA)
    max_text_len: int = setting(256, "Bytes of text the built-in models see per sample; tokens for hf: text models "
                                     "(longer texts are cut; hf: pads to it).", minimum=1, panel=DATA)
    shuffle_buffer: int = setting(512, "Samples each worker shuffles at a time (memory: this many undecoded samples per "
                                       "worker).", minimum=0, panel=DATA)
    cache_dir: Path | None = setting(None, "Keep whole shards read from SHARD_DIR in this local folder (shared by the "
                                           "ranks and workers of a machine).", panel=DATA)
    cache_max_gb: float | None = setting(None, "Size cap of --cache-dir in GB; least recently used shards go first "
                                               "(default: no cap).", above=0, panel=DATA)
    stall_timeout: int = setting(600, "Seconds a rank may wait for its next batch (a read that does not return, a "
                                      "dataloader worker that stopped) before the run stops naming the rank, host and "
                                      "shard; 0 = wait forever.", minimum=0, unit="seconds", panel=DATA)

    # -- reproducibility, faults, launch ---------------------------------------------------------
    seed: int = setting(0, "Seed of the initialisation, the data order (with the epoch) and every rank's RNG.",
                        minimum=0, panel=DATA)
    checkpoint_every: int = setting(200, "Write last.pt every N optimizer steps (0 = at epoch ends only).", minimum=0,
                                    panel=RUN)
    resume: bool = setting(False, "Continue from RUN_DIR/last.pt (automatic after a restart under torchrun "
                                  "--max-restarts).", flags=("--resume",), panel=RUN)
    log_every: int = setting(10, "Optimizer steps between metric lines, TensorBoard points and the drift check.",
                             minimum=1, panel=RUN)

    def as_dict(self) -> dict:
        """JSON-ready values (paths as strings, secrets scrubbed), e.g. for config.json and checkpoints."""
        from pipeline.core import settings

        return settings.as_dict(self)

    @property
    def shard_dirs(self) -> list[str]:
        """Every SHARD_DIR of the run: the first, then the ones mixed in (`train.data.mix`)."""
        return [str(self.shard_dir), *map(str, self.more_shard_dirs or ())]

    @property
    def cache_max_bytes(self) -> int | None:
        return None if self.cache_max_gb is None else int(self.cache_max_gb * 1e9)

    def launch_config(self) -> LaunchConfig:
        return LaunchConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(LaunchConfig)})

    # Settings that may differ between nodes without changing the run: where files live, how
    # many processes decode, when things are logged, how this node was launched. Everything
    # else must agree on every rank.
    LOCAL_SETTINGS = ("shard_dir", "more_shard_dirs", "output", "init_from", "workers", "resume", "log_every", "record_keys", "verify",
                      "cache_dir", "cache_max_gb",
                      "nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port", "max_restarts",
                      "rdzv_timeout")

    # Settings that shape the training trajectory (the schedule's length, the optimizer, the model,
    # the numerics, the data order's seed): a resumed run must keep the values it was started with,
    # or the restored scheduler and weights would silently follow the old ones while config.json
    # and last.pt claimed the new. The batch is compared as the global batch: how it is split
    # (--batch-size, --accum, ranks) may change: the reader continues a mid-epoch position on the
    # new split.
    RESUME_SETTINGS = ("epochs", "max_steps", "mix", "epoch_samples", "global_batch", "lr", "weight_decay", "warmup", "min_lr_fraction",
                       "grad_clip", "precision", "strategy", "model", "width", "resolution", "init_from", "freeze",
                       "unfreeze_at", "sync_bn", "max_text_len", "seed", "objective", "loss", "lock_image")
    # Everything else may change on --resume: where files are, how ranks are launched, how the
    # batch is split and read (workers, shuffle buffer: a changed layout continues the epoch in
    # progress with its unread samples, see `ShardReader.load_state_dict`), memory-saving
    # recomputation, logging, checkpoints.
    RESUME_FREE = ("shard_dir", "more_shard_dirs", "output", "data_only", "record_keys", "verify", "max_skipped",
                   "batch_size", "accum", "grad_checkpoint", "auto_micro_batch", "workers", "shuffle_buffer",
                   "checkpoint_every", "resume", "log_every",
                   "nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port", "backend",
                   "max_restarts", "rdzv_timeout", "cache_dir", "cache_max_gb", "zeroshot_prompt", "stall_timeout", "decode")

    def fingerprint(self) -> str:
        """Hash of the settings every rank must share; the preflight compares it across ranks."""
        import hashlib  # here, not at the top: `pipe --help` imports this module for TrainConfig

        shared = {k: v for k, v in self.as_dict().items() if k not in self.LOCAL_SETTINGS}
        return hashlib.sha256(json.dumps(shared, sort_keys=True).encode()).hexdigest()[:16]


def _setting(name: str, value) -> str:
    """A setting as the command line names it (one without a flag by its [train] key) and its value."""
    return f"{settings.flag(TrainConfig, name)} {'(not set)' if value is None else value}"


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
    ``--epochs`` may grow: a run (finished or not) continued for more epochs.
    """
    old, new = [], []
    for name in TrainConfig.RESUME_SETTINGS:
        if name not in saved:
            continue
        a, b = saved[name], now.get(name)
        if name == "precision" and b == "auto":
            continue
        if name == "epochs" and isinstance(a, int) and isinstance(b, int) and b > a:
            continue  # more epochs: the run goes on, its schedule laid over the longer run (`optimizer.extend`)
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
    from pipeline.formats import index as shard_index
    from pipeline.storage import local_path

    for folder in cfg.shard_dirs:
        here = local_path(folder)  # None: object storage, read (and judged) by train.command.check
        if here is not None and not shard_index.exists(here):
            raise UsageError(f"{folder} has no index.json: run `pipe shard` first (it writes index.json last)")
    if (cfg.mix is not None or cfg.epoch_samples is not None) and len(cfg.shard_dirs) < 2:
        raise UsageError(f"{'--mix' if cfg.mix is not None else '--epoch-samples'} mixes several SHARD_DIRs; "
                         "give two or more")
    out = Path(cfg.output)
    if out.exists() and not out.is_dir():
        raise UsageError(f"the run folder {out} exists and is not a folder")
    settings.check(cfg)  # the declared ranges and choices
    checks = [
        (cfg.cache_max_gb is None or cfg.cache_dir is not None, "--cache-max-gb needs --cache-dir"),
    ]
    for ok, message in checks:
        if not ok:
            raise UsageError(message)
    families.resolve(cfg.model)  # a family it names; whether it can be built: train.command (families.check)
    _check_objective(cfg)
    if cfg.init_from is not None and not Path(cfg.init_from).is_file():
        if not Path(cfg.init_from).is_dir():
            raise UsageError(f"--init-from {cfg.init_from}: no such file")
        if not (Path(cfg.init_from) / "config.json").is_file() and not (Path(cfg.init_from) / ".metadata").is_file():
            raise UsageError(f"--init-from {cfg.init_from}: a folder, not a checkpoint file nor a checkpoint folder of "
                             "--strategy fsdp (no .metadata) nor a Hugging Face or pipe export folder (no config.json)")
    schedule = parse_unfreeze_at(cfg.unfreeze_at)
    if schedule is not None and schedule[1] >= cfg.freeze:
        raise UsageError(f"--unfreeze-at {cfg.unfreeze_at} would leave {schedule[1]:.0%} frozen, "
                         f"but --freeze {cfg.freeze} freezes only {cfg.freeze:.0%}: nothing to unfreeze")
    _check_batch_flags(cfg.batch_size, cfg.global_batch, cfg.accum)
    if world_size is not None:
        resolve_batch(cfg.batch_size, cfg.global_batch, cfg.accum, world_size)
    return cfg


def _check_objective(cfg: TrainConfig) -> None:
    """The model serves --objective, and the settings of one objective are not given to the other."""
    families.check_objective(cfg.model, cfg.objective)
    if cfg.objective == "contrastive":
        for template in cfg.zeroshot_prompt or ():
            if "{}" not in template:
                raise UsageError(f"--zeroshot-prompt {template!r} has no {{}} for the class name, e.g. 'a photo of a {{}}.'")
        return
    given = [flag for flag, on in (("--lock-image", cfg.lock_image), (f"--loss {cfg.loss}", cfg.loss != "clip"),
                                   ("--zeroshot-prompt", bool(cfg.zeroshot_prompt))) if on]
    if given:
        raise UsageError(f"{given[0]} is a setting of --objective contrastive (image-caption models); this run is "
                         f"--objective {cfg.objective}")
