"""pipe train --objective contrastive end to end: a 10-class captioned dataset (captions in several
languages and legacy encodings, many repeated, through the real pipe clean and pipe shard) learned
on 2 CPU ranks to zero-shot accuracy >= 0.9, which pipe eval reports too; the usage errors; the
locked image tower; a bit-exact resume."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

from pipeline.core.errors import UsageError
from tests.conftest import REPO, pipe_env
from train import loop
from train.components import checkpoint as ckpt
from train.config import TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")

# what the 2-rank run trains with: 360 train samples, 11 steps of 32 per epoch
CONVERGE = ["--objective", "contrastive", "--model", "clip", "--nproc-per-node", "2", "--width", "16", "--resolution", "16",
            "--max-text-len", "32", "--batch-size", "16", "--epochs", "8", "--workers", "1", "--lr", "3e-3",
            "--log-every", "20"]


@pytest.fixture(scope="module")
def captioned(tmp_path_factory) -> Path:
    from tests.captioned import make_shards

    return make_shards(tmp_path_factory.mktemp("captioned"))[0]


def _pipe(*args, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], capture_output=True, text=True,
                          env=pipe_env(), cwd=REPO, timeout=timeout)


def _val_rows(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "val"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_ranks_learn_zero_shot_and_pipe_eval_measures_the_same(captioned, tmp_path):
    index = json.loads((captioned / "index.json").read_text())
    assert len(index["classes"]) == 10
    p = _pipe("train", captioned, "-o", tmp_path / "run", *CONVERGE)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = _val_rows(tmp_path / "run")
    last = rows[-1]
    # from 10-way chance (0.1) to >= 0.9 at its best epoch; 8 epochs at this lr overfit 360 samples a
    # little by the end (val loss rises after epoch 5), so the last epoch is held to 0.8
    assert max(r["val_zeroshot_acc"] for r in rows) >= 0.9 and last["val_zeroshot_acc"] >= 0.8, rows
    assert rows[0]["val_zeroshot_acc"] < 0.5, rows
    for key in ("val_recall_i2t@1", "val_recall_i2t@5", "val_recall_t2i@1", "val_recall_t2i@5"):
        assert 0.0 <= last[key] <= 1.0
    assert last["val_samples"] == index["counts"]["val"]["samples"]  # every val sample once, over both ranks
    # the same numbers from one process, by pipe eval, for the model that validation measured
    e = _pipe("eval", tmp_path / "run", captioned, "--which", "last", "--json")
    assert e.returncode == 0, e.stderr
    got = json.loads(e.stdout)["metrics"]
    assert got["zeroshot_acc"] == pytest.approx(last["val_zeroshot_acc"], abs=1e-9)
    for key in ("recall_i2t@1", "recall_i2t@5", "recall_t2i@1", "recall_t2i@5"):
        assert got[key] == pytest.approx(last[f"val_{key}"], abs=1e-9)
    assert got["loss"] == pytest.approx(last["val_loss"], rel=1e-4)
    tb = list((tmp_path / "run" / "tb").glob("events.out.tfevents.*"))
    assert tb and any(b"zeroshot" in f.read_bytes() and b"recall" in f.read_bytes() for f in tb)


# -- in one process, on small real shards ------------------------------------------------------------


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    from tests.train_shards import make_shards

    return make_shards(tmp_path_factory.mktemp("pairs"), n=60, classes=3, size=32)


def _cfg(shards: Path, out: Path, **over) -> TrainConfig:
    values = dict(shard_dir=shards, output=out, objective="contrastive", model="clip", width=8, resolution=16,
                  max_text_len=32, epochs=2, batch_size=8, workers=0, log_every=2, lr=3e-3)
    return TrainConfig(**{**values, **over})


def _run(cfg: TrainConfig) -> tuple[dict, str]:
    out = io.StringIO()
    return loop.run(cfg, console=Console(file=out, width=300)), out.getvalue()


def test_a_contrastive_run_reports_zero_shot_and_recall(shards, tmp_path):
    summary, printed = _run(_cfg(shards, tmp_path / "run", loss="siglip", zeroshot_prompt=["a picture of {}"]))
    assert "zeroshot" in printed and "recall_i2t@1" in printed
    row = _val_rows(tmp_path / "run")[-1]
    assert {"val_zeroshot_acc", "val_recall_i2t@5", "val_recall_t2i@1"} <= set(row)
    assert summary["val_acc"] == row["val_zeroshot_acc"]
    state = ckpt.load(tmp_path / "run" / "last.pt")
    assert "logit_bias" in state["model"] and state["config"]["objective"] == "contrastive"


def test_lock_image_keeps_the_image_tower_as_it_was(shards, tmp_path):
    from train.models.clip import ClipModel

    _run(_cfg(shards, tmp_path / "run", lock_image=True))
    torch.manual_seed(0)  # the loop builds the model from --seed 0
    start = ClipModel(8, 16, 32).state_dict()
    after = ckpt.load(tmp_path / "run" / "last.pt")["model"]
    image = [k for k in start if k.startswith("image_tower.")]
    text = [k for k in start if k.startswith("text_tower.")]
    assert image and all(torch.equal(start[k], after[k]) for k in image)
    assert any(not torch.equal(start[k], after[k]) for k in text)


def test_freeze_counts_the_blocks_of_each_tower_from_its_input_side(shards, tmp_path):
    """--freeze 0.5: the first floor(0.5 x 6) image blocks (stem and two residual blocks) and
    floor(0.5 x 5) text blocks (embedding and one block) stay as built; the rest train."""
    from train.models.clip import ClipModel

    _, printed = _run(_cfg(shards, tmp_path / "run", freeze=0.5, epochs=1, precision="bf16"))
    assert "frozen 5 of 11 blocks (50% asked)" in printed and "precision bf16" in printed
    torch.manual_seed(0)
    start = ClipModel(8, 16, 32).state_dict()
    after = ckpt.load(tmp_path / "run" / "last.pt")["model"]
    frozen = ("image_tower.encoder.stem.", "image_tower.encoder.blocks.0.", "image_tower.encoder.blocks.1.",
              "text_tower.encoder.embed.", "text_tower.encoder.blocks.0.")
    trained = ("image_tower.encoder.blocks.2.", "text_tower.encoder.blocks.1.", "image_tower.proj.", "text_tower.proj.")
    assert all(torch.equal(start[k], after[k]) for k in start if k.startswith(frozen))
    assert all(not torch.equal(start[k], after[k]) for k in start if k.startswith(trained) and k.endswith("weight"))


def test_resume_mid_epoch_ends_bit_identical(shards, tmp_path, monkeypatch):
    whole = _cfg(shards, tmp_path / "whole", checkpoint_every=2, accum=2, batch_size=4)
    _run(whole)

    def crash(run_dir, done, d):
        if done == 3:
            raise KeyboardInterrupt  # dies like Ctrl-C: only the last checkpoint (step 2) survives

    real = loop._maybe_inject_fault
    monkeypatch.setattr(loop, "_maybe_inject_fault", crash)
    with pytest.raises(KeyboardInterrupt):
        _run(_cfg(shards, tmp_path / "crashed", checkpoint_every=2, accum=2, batch_size=4))
    monkeypatch.setattr(loop, "_maybe_inject_fault", real)
    assert ckpt.load(tmp_path / "crashed" / "last.pt")["step"] == 2
    _, printed = _run(_cfg(shards, tmp_path / "crashed", checkpoint_every=2, accum=2, batch_size=4, resume=True))
    assert "resumed from" in printed
    a, b = ckpt.load(tmp_path / "whole" / "last.pt"), ckpt.load(tmp_path / "crashed" / "last.pt")
    assert a["step"] == b["step"]
    assert [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])] == []
    assert _val_rows(tmp_path / "whole")[-1] == {**_val_rows(tmp_path / "crashed")[-1], "time": _val_rows(tmp_path / "whole")[-1]["time"]}


@pytest.mark.parametrize("over, message", [
    (dict(objective="classify", model="clip"), "cannot be trained with --objective classify"),
    (dict(model="image"), "cannot be trained with --objective contrastive"),
    (dict(objective="classify", model="image", lock_image=True), "--lock-image is a setting of --objective contrastive"),
    (dict(zeroshot_prompt=["a photo"]), "has no {}"),
])
def test_settings_that_do_not_fit_the_objective_are_usage_errors(shards, tmp_path, over, message):
    from train.config import validate

    with pytest.raises(UsageError, match=message):
        validate(_cfg(shards, tmp_path / "run", **over))


def _mixed_shards(root: Path) -> Path:
    from pipeline.shard import stage
    from tests.clean_dirs import Spec, make_clean_dir

    specs = [Spec(key=f"l{i}", label=f"c{i % 2}", seed=i, text=f"labelled {i}") for i in range(12)]
    specs += [Spec(key=f"p{i}", label=None, seed=50 + i, text=f"a pair {i}") for i in range(12)]
    stage.run(stage.ShardConfig(make_clean_dir(root / "clean", specs), root / "shards", val_fraction=0.2),
              show_progress=False)
    return root / "shards"


def test_classify_refuses_pairs_without_labels_in_one_line_and_contrastive_takes_them(tmp_path):
    shards = _mixed_shards(tmp_path)
    p = _pipe("train", shards, "-o", tmp_path / "run", "--model", "image-text", "--epochs", "1", timeout=300)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert "image-caption pairs without a label" in lines[0] and "--objective contrastive" in lines[0]
    summary, _ = _run(_cfg(shards, tmp_path / "run2", epochs=1, batch_size=4))
    assert summary["steps"] > 0 and summary["val_acc"] is not None


def test_contrastive_refuses_train_samples_that_are_no_pairs_in_one_line(tmp_path):
    from pipeline.shard import stage
    from tests.clean_dirs import Spec, make_clean_dir

    specs = [Spec(key=f"s{i}", label=f"c{i % 2}", seed=i, text=f"caption {i}" if i % 3 else None) for i in range(24)]
    stage.run(stage.ShardConfig(make_clean_dir(tmp_path / "clean", specs), tmp_path / "shards"), show_progress=False)
    p = _pipe("train", tmp_path / "shards", "-o", tmp_path / "run", "--objective", "contrastive", "--model", "clip",
              timeout=300)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "are an image or a text alone" in lines[0], p.stderr
    assert "pipe shard CLEAN_DIR -o SHARD_DIR --pairs-only" in lines[0]  # the road it names is there:
    stage.run(stage.ShardConfig(tmp_path / "clean", tmp_path / "pairs", pairs_only=True), show_progress=False)
    from pipeline.formats import index
    from train.command import _check_labels

    _check_labels(TrainConfig(shard_dir=tmp_path / "pairs", output=tmp_path / "run", objective="contrastive"),
                  index.load(tmp_path / "pairs"))  # (nothing refused)


def test_pipe_eval_refuses_a_classifier_run_and_a_folder_that_is_no_model(shards, tmp_path):
    from tests.fake_data import fake_source, write_index

    write_index(tmp_path / "fake")
    cfg = TrainConfig(shard_dir=tmp_path / "fake", output=tmp_path / "classify", model="image", width=8, epochs=1,
                      batch_size=8, workers=0, max_steps=1)
    loop.run(cfg, open_data=fake_source(), console=Console(file=io.StringIO()))
    for model, message in ((tmp_path / "classify", "measures image-caption models"), (tmp_path, "neither hf:PATH nor")):
        p = _pipe("eval", model, shards, timeout=300)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert p.returncode == 2 and len(lines) == 1 and message in lines[0], p.stderr


# -- two ranks: FSDP (every block of both towers a unit) trains what DDP trains -----------------------

WORLD_RUN = dict(objective="contrastive", model="clip", width=8, resolution=16, max_text_len=32, epochs=2, batch_size=4,
                 accum=2, workers=0, lr=3e-3, log_every=2, checkpoint_every=0, grad_checkpoint=True)


def _rank_shards(workdir: Path) -> Path:
    """Each rank's own byte-identical copy (the preflight compares the index hashes)."""
    import os

    from tests.train_shards import make_shards

    return make_shards(workdir / f"data-rank{os.environ['RANK']}", n=60, classes=3, size=32)


def ddp_contrastive_scenario(workdir):
    loop.run(TrainConfig(shard_dir=_rank_shards(workdir), output=workdir / "ddp", **WORLD_RUN),
             console=Console(file=io.StringIO()))
    return str(workdir / "ddp")


def fsdp_contrastive_scenario(workdir):
    from train.distributed import fsdp

    units = []
    real = fsdp.units

    def spy(model):
        found = real(model)
        units.append(len(found))
        return found

    fsdp.units = spy
    try:
        loop.run(TrainConfig(shard_dir=_rank_shards(workdir), output=workdir / "fsdp", strategy="fsdp", **WORLD_RUN),
                 console=Console(file=io.StringIO()))
    finally:
        fsdp.units = real
    return {"run": str(workdir / "fsdp"), "units": units}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fsdp_shards_both_towers_and_trains_what_ddp_trains(tmp_path):
    """--strategy fsdp with --grad-checkpoint and --accum 2: every block of both towers (6 image, 5 text)
    is a unit, the weights end within float32 reordering of DDP's (as tests/train/distributed/
    test_fsdp.py measures for classifiers), the DCP checkpoint loads in one process for pipe eval."""
    import tempfile

    from tests.gloo import run_world
    from train.models.loading import load_model

    workdir = Path(tempfile.mkdtemp(prefix="pipe-clip-fsdp-"))
    specs = [f"{__name__}:ddp_contrastive_scenario", f"{__name__}:fsdp_contrastive_scenario"]
    ranks = run_world(specs, set(specs), workdir, timeout=600.0)
    fsdp_result = ranks[0][specs[1]]
    assert fsdp_result["units"] == [11]
    ddp_run, fsdp_run = Path(ranks[0][specs[0]]), Path(fsdp_result["run"])
    ddp_model, _ = load_model(str(ddp_run), which="last")
    fsdp_model, described = load_model(str(fsdp_run), which="last")
    assert "last.dcp" in described
    ddp_state, fsdp_state = ddp_model.state_dict(), fsdp_model.state_dict()
    assert set(ddp_state) == set(fsdp_state)
    for name, value in ddp_state.items():
        torch.testing.assert_close(fsdp_state[name], value, rtol=0, atol=5e-4, msg=name)
    ddp_val, fsdp_val = _val_rows(ddp_run)[-1], _val_rows(fsdp_run)[-1]
    assert fsdp_val["val_samples"] == ddp_val["val_samples"] and "val_recall_t2i@5" in fsdp_val
