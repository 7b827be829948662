"""`pipe train` from the command line: the README's fine-tuning walk-through on real shards, and
the mistakes caught before any rank starts (exit 2, one line)."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.shard import stage
from tests.clean_dirs import Spec, make_clean_dir
from tests.train_shards import make_shards
from train.components import checkpoint as ckpt

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def two_datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("walkthrough")
    return (make_shards(root / "a", n=60, classes=3, seed=1, prefix="a"),
            make_shards(root / "b", n=60, classes=4, seed=2, prefix="b"))


def _events(run, kind):
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


@pytest.mark.slow
def test_finetuning_walkthrough(cli, two_datasets, tmp_path):
    """README "Fine-tuning": train on one dataset, then start from its best checkpoint on another
    with the first 70% of blocks frozen for one epoch."""
    shards_a, shards_b = two_datasets
    r = cli("train", shards_a, "-o", tmp_path / "runs-a", "--epochs", "3", "--workers", "1")
    assert r.exit_code == 0, r.stderr
    assert "val accuracy" in r.stdout and (tmp_path / "runs-a" / "best.pt").exists()

    r = cli("train", shards_b, "-o", tmp_path / "runs-b", "--init-from", tmp_path / "runs-a" / "best.pt",
            "--freeze", "0.7", "--unfreeze-at", "2", "--epochs", "3", "--lr", "3e-4", "--workers", "1")
    assert r.exit_code == 0, r.stderr
    out = r.stderr
    assert "--init-from" in out and "pipe train checkpoint" in out
    assert "skipped (shape)" in out and "head.weight: file [3, 128] vs model [4, 128]" in out
    assert "head re-initialised" in out and "file has 3 classes, this dataset 4" in out
    assert "epoch 1: frozen 4 of 6 blocks (70% asked)" in out and "epoch 2: frozen 0 of 6 blocks" in out
    assert [(e["epoch"], e["frozen_blocks"]) for e in _events(tmp_path / "runs-b", "freeze")] == [(1, 4), (2, 0)]
    a = ckpt.load(tmp_path / "runs-a" / "best.pt")["model"]
    b = ckpt.load(tmp_path / "runs-b" / "last.pt")["model"]
    assert not torch.equal(a["image.stem.0.weight"], b["image.stem.0.weight"])  # unfrozen at epoch 2: it trained
    assert _events(tmp_path / "runs-b", "val")[-1]["val_acc"] > 0.5  # 4 classes: chance is 0.25


@pytest.mark.slow
def test_the_image_model_learns_from_real_shards(cli, tmp_path):
    """The guard against a run that silently stops learning (labels, decoding, resizing,
    normalisation, the model, the optimizer): real shards through the real reader, images only
    (no caption to lean on), decoded at the model's 16 px from the stored 64 px (a JPEG's
    DCT-domain half, then Lanczos-3). Three classes: chance is 1/3."""
    shards = make_shards(tmp_path / "data", n=90, classes=3, size=64, seed=3, prefix="l")
    run = tmp_path / "run"
    r = cli("train", shards, "-o", run, "--model", "image", "--resolution", "16", "--width", "8", "--epochs", "4",
            "--batch-size", "8", "--lr", "3e-3", "--workers", "0", "--log-every", "100")
    assert r.exit_code == 0, r.stderr
    assert "images decoded at 16 px (stored 64 px)" in r.stderr
    assert "val majority class" in r.stdout
    val = _events(run, "val")
    assert val[-1]["val_acc"] >= 0.8, [v["val_acc"] for v in val]


@pytest.mark.parametrize("flags, words", [
    (["--resume"], "has no last.pt to continue from"),
    (["--accum", "50"], "fewer than one optimizer step needs (--accum 50)"),
    (["--batch-size", "4", "--global-batch", "10"], "not a multiple of --batch-size 4"),
    (["--backend", "nccl"], "--backend nccl needs CUDA"),
    (["--unfreeze-at", "2"], "nothing to unfreeze"),
    (["--freeze", "1.5"], "--freeze must be a fraction"),
    (["--precision", "fp8"], "--precision must be one of"),
    (["--init-from", "nowhere.pt"], "--init-from nowhere.pt: no such file"),
])
def test_mistakes_stop_before_any_rank_starts(cli, two_datasets, tmp_path, flags, words):
    r = cli("train", two_datasets[0], "-o", tmp_path / "run", *flags)
    assert r.exit_code == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0], r.stderr


def test_a_finished_run_is_continued_only_with_resume_and_its_own_settings(cli, two_datasets, tmp_path):
    run = tmp_path / "run"
    flags = ("--epochs", "1", "--workers", "0", "--batch-size", "2", "--width", "8")
    assert cli("train", two_datasets[0], "-o", run, *flags).exit_code == 0
    r = cli("train", two_datasets[0], "-o", run, *flags)
    assert r.exit_code == 2 and "already holds a run" in r.stderr and "--resume" in r.stderr
    before = ckpt.load(run / "last.pt")

    # settings that shape the run (the schedule, the optimizer, the model) cannot change on resume:
    # the restored scheduler and weights would follow the old ones while last.pt claimed the new
    # (more --epochs is the one change allowed: the run goes on, tests/train/test_loop.py)
    r = cli("train", two_datasets[0], "-o", run, *flags, "--resume", "--lr", "0.5", "--max-steps", "2")
    assert r.exit_code == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert ("--resume: this run was made with --max-steps (not set) --lr 0.001; got --max-steps 2 --lr 0.5: pass "
            "the same settings, or start a new run directory") in lines[0]
    r = cli("train", two_datasets[0], "-o", run, *flags, "--resume", "--global-batch", "4")
    assert r.exit_code == 2 and "--global-batch 2; got --global-batch 4" in r.stderr
    r = cli("train", two_datasets[0], "-o", run, "--epochs", "1", "--workers", "0", "--batch-size", "2", "--resume")
    assert r.exit_code == 2 and "--width 8; got --width 32" in r.stderr  # a default differing counts too
    after = ckpt.load(run / "last.pt")
    assert after["config"] == before["config"] and after["step"] == before["step"]  # nothing ran
    assert json.loads((run / "config.json").read_text())["lr"] == 0.001

    # the same settings, or ones that only change how it runs (split of the batch, workers, logging)
    r = cli("train", two_datasets[0], "-o", run, *flags, "--resume", "--accum", "2", "--batch-size", "1",
            "--workers", "1", "--log-every", "3", "--checkpoint-every", "5", "--precision", "fp32")
    assert r.exit_code == 0, r.stderr
    assert "resumed from" in r.stderr and ckpt.load(run / "last.pt")["epoch"] == 1


def test_a_model_factory_that_does_not_import_is_one_line(cli, two_datasets, tmp_path):
    r = cli("train", two_datasets[0], "-o", tmp_path / "run", "--model", "no_such_pkg.models:make", "--workers", "0")
    assert r.exit_code == 2 and "cannot import no_such_pkg.models" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.fixture(scope="module")
def one_modality(tmp_path_factory):
    """Two SHARD_DIRs: images without captions, captions without images."""
    root = tmp_path_factory.mktemp("modalities")
    out = {}
    for name, specs in (("images", [Spec(f"i{i:03d}", f"c{i % 2}", seed=i) for i in range(24)]),
                        ("texts", [Spec(f"t{i:03d}", f"c{i % 2}", image=False, text=f"caption {i}") for i in range(24)])):
        clean = make_clean_dir(root / name / "clean", specs)
        stage.run(stage.ShardConfig(clean, root / name / "shards", val_fraction=0.2), show_progress=False)
        out[name] = root / name / "shards"
    return out


@pytest.mark.parametrize("data, model, words", [
    ("images", "text", "--model text needs texts, but {} has none (0 of {} train samples have a .txt): use --model image"),
    ("images", "image-text", "--model image-text needs texts, but {} has none (0 of {} train samples have a .txt): use --model image"),
    ("texts", "image", "--model image needs images, but {} has none (0 of {} train samples have an image): use --model text"),
    ("texts", "image-text", "--model image-text needs images, but {} has none (0 of {} train samples have an image): use --model text"),
])
def test_a_model_whose_input_the_data_lacks_stops_before_any_rank_starts(cli, one_modality, tmp_path, data, model, words):
    """A whole missing modality would train on zeros (an empty text, the mean colour) and exit 0."""
    shards = one_modality[data]
    n = json.loads((shards / "index.json").read_text())["counts"]["train"]["samples"]
    r = cli("train", shards, "-o", tmp_path / "run", "--model", model, "--workers", "0", "--batch-size", "2")
    assert r.exit_code == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and words.format(shards, n) in lines[0], r.stderr
    assert not (tmp_path / "run").exists()


def test_the_model_that_fits_the_data_trains(cli, one_modality, tmp_path):
    r = cli("train", one_modality["texts"], "-o", tmp_path / "run", "--model", "text", "--epochs", "1",
            "--workers", "0", "--batch-size", "2", "--width", "8")
    assert r.exit_code == 0, r.stderr


def test_verify_stops_on_a_shard_that_differs_from_the_index(cli, two_datasets, tmp_path):
    import shutil

    shards = shutil.copytree(two_datasets[0], tmp_path / "shards")
    index = json.loads((shards / "index.json").read_text())
    entry = next(s for s in index["shards"] if s["split"] == "train")
    name = entry["name"]
    data = bytearray((shards / name).read_bytes())
    data[entry["offsets"][0] + 600] ^= 0x01  # one bit of the first image: readers would not notice
    (shards / name).write_bytes(bytes(data))
    r = cli("train", shards, "-o", tmp_path / "run", "--verify", "--workers", "0")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 1 and len(lines) == 1, r.stderr
    assert name in lines[0] and "does not match index.json" in lines[0]
    assert not (tmp_path / "run" / "last.pt").exists()
    toml = tmp_path / "pipe.toml"
    toml.write_text("[train]\nverify = true\n")  # settable in TOML too, schema-checked
    r = cli("train", shards, "-o", tmp_path / "run", "--config", toml, "--workers", "0")
    assert r.exit_code == 1 and name in r.stderr
    data[entry["offsets"][0] + 600] ^= 0x01  # put back: the same shards verify and train
    (shards / name).write_bytes(bytes(data))
    r = cli("train", shards, "-o", tmp_path / "run", "--verify", "--epochs", "1", "--max-steps", "1", "--workers", "0")
    assert r.exit_code == 0, r.stderr


def test_decode_gpu_on_a_machine_without_one_says_the_workers_decode(cli, two_datasets, tmp_path):
    """--decode gpu where no rank has a GPU: the run trains as with cpu and says so, never silently."""
    r = cli("train", two_datasets[0], "-o", tmp_path / "run", "--epochs", "1", "--workers", "0", "--batch-size", "2",
            "--decode", "gpu")
    assert r.exit_code == 0, r.stderr
    assert "--decode gpu on a rank without a GPU: its dataloader workers decode the JPEGs" in r.stdout + r.stderr
    plain = cli("train", two_datasets[0], "-o", tmp_path / "plain", "--epochs", "1", "--workers", "0", "--batch-size", "2")
    assert "--decode gpu" not in plain.stdout + plain.stderr
