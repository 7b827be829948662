"""`pipe labels` end to end: a run on shards with known flipped labels flags mostly those, the
records survive a resume without loss or duplicates, clean data gets few flags, and 2 ranks'
records merge into one per sample and epoch."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from rich.console import Console

from pipeline.shard import stage
from tests.clean_dirs import Spec, make_clean_dir
from tests.gloo import scenario_results
from tests.train.test_loop import reference_run_scenario
from tests.train_shards import class_image
from train import labels, loop
from train.config import TrainConfig

CLASSES = ["cat", "dog", "fox"]


pytestmark = pytest.mark.usefixtures("one_thread")


def noisy_shards(root: Path, n: int = 150, flip: float = 0.1, seed: int = 0,
                 classes: list[str] = CLASSES) -> tuple[Path, set[str]]:
    """A SHARD_DIR whose images show their true class (a colour in a quadrant, under noise) while
    ``flip`` of the labels name another class; returns it and the flipped keys."""
    rng = np.random.default_rng(seed)
    flipped = set(rng.choice(n, size=int(round(flip * n)), replace=False).tolist())
    specs, true = [], {}
    for i in range(n):
        label = i % len(classes)
        given = (label + 1 + int(rng.integers(len(classes) - 1))) % len(classes) if i in flipped else label
        specs.append(Spec(key=f"k{i:04d}", label=classes[given], seed=seed * 100_000 + i, size=16,
                          phash=((seed * 100_000 + i) * 0x9E3779B97F4A7C15) & (2**64 - 1)))
        true[specs[-1].key] = label
    clean = make_clean_dir(root / "clean", specs)
    for s in specs:
        (clean / "data" / s.label / f"{s.key}.jpg").write_bytes(class_image(true[s.key], s.seed, 16))
    stage.run(stage.ShardConfig(clean, root / "shards", val_fraction=0.2, seed=seed), show_progress=False)
    return root / "shards", {f"k{i:04d}" for i in flipped}


def train(shards: Path, out: Path, **over) -> dict:
    values = dict(shard_dir=shards, output=out, model="image", width=8, resolution=16, epochs=6, batch_size=8,
                  workers=0, lr=3e-3, log_every=50, checkpoint_every=0, seed=0)
    return loop.run(TrainConfig(**{**values, **over}), console=Console(file=io.StringIO()))


def recorded(run_dir: Path) -> list[tuple[int, str]]:
    """Every (epoch, key) in the run's train records, duplicates included, sorted."""
    files = [p for split, _, _, p in labels.record_files(run_dir) if split == "train"]
    rows = [r for p in files for r in pq.read_table(p, columns=["epoch", "key"]).to_pylist()]
    return sorted((r["epoch"], r["key"]) for r in rows)


# -- confident learning, by hand ----------------------------------------------------------------


def test_confident_learning_counts_calibrates_and_prunes_by_hand():
    """10 samples labelled 0, 10 labelled 1; 2 of the 0s look clearly like 1. Thresholds are the
    classes' mean self-probabilities, the 2 land in C[0, 1], the calibrated joint puts 2/20 off the
    diagonal, and exactly those 2 are flagged."""
    probs = np.array([[0.9, 0.1]] * 8 + [[0.1, 0.9]] * 2 + [[0.2, 0.8]] * 10)
    given = np.array([0] * 10 + [1] * 10)
    assert labels.per_class_thresholds(probs, given) == pytest.approx([0.74, 0.8])
    joint = labels.confident_joint(probs, given)
    assert joint.tolist() == [[8, 2], [0, 10]]
    q = labels.calibrated_joint(joint, given)
    assert labels.noise_rate(q) == pytest.approx(0.1)
    assert labels.prune_by_noise_rate(probs, given, q).tolist() == [8, 9]


# -- end to end ------------------------------------------------------------------------------------


def test_a_run_on_flipped_labels_flags_mostly_the_flipped_ones(tmp_path, cli):
    """150 images of 3 well-separated classes, 10% of labels flipped (15): trained 5 epochs, pipe
    labels flags mostly flipped samples (measured: precision 1.0, recall 0.67-0.73 over two seeds;
    the noise rate comes from only 29 val samples, so it is estimated low) and says where each
    came from and what it looks like."""
    shards, flipped = noisy_shards(tmp_path, n=150, flip=0.1)
    train(shards, tmp_path / "run", epochs=5, batch_size=16)
    result = cli("labels", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    table = pq.read_table(tmp_path / "run" / labels.ISSUES)
    assert table.column_names == ["rank", "key", "source", "split", "given", "suggested", "score"]
    rows = table.to_pylist()
    keys = {r["key"] for r in rows}
    assert len(keys & flipped) / len(keys) >= 0.8
    assert len(keys & flipped) / len(flipped) >= 0.5
    assert [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
    assert [r["score"] for r in rows] == sorted((r["score"] for r in rows), reverse=True)
    assert {r["split"] for r in rows} <= {"train", "val"}
    for r in rows:  # the file it came from, in the folder of its (wrong) label; a different suggestion
        assert r["source"] == f"{r['given']}/{r['key']}.jpg" and r["suggested"] in CLASSES and r["suggested"] != r["given"]
    summary = json.loads((tmp_path / "run" / labels.SUMMARY).read_text())
    assert 0.03 < summary["estimated_noise_rate"] < 0.2
    assert summary["flagged"]["total"] == len(rows)
    assert sum(p["count"] for p in summary["pairs"]) == len(rows)
    top = summary["pairs"][0]
    assert f"{top['count']} labelled {top['given']} look like {top['suggested']}" in result.output
    assert "nothing was removed" in result.output
    assert summary["finding"] is None and "finding:" not in result.output  # a model that learned


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    """An uninterrupted run on the loop tests' stand-in data (every label right), 2 epochs of 6 steps
    with checkpoints at steps 4 and 8 besides the epoch ends."""
    from tests.fake_data import fake_source, write_index

    tmp = tmp_path_factory.mktemp("clean")
    cfg = _fake_cfg(tmp, write_index(tmp / "shards"))
    before = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:  # one thread, as in the tests (same float sums as the resumed run)
        mp.setenv("OMP_NUM_THREADS", "1")
        torch.set_num_threads(1)
        loop.run(cfg, open_data=fake_source(n_train=48), console=Console(file=io.StringIO()))
    torch.set_num_threads(before)
    return cfg


def _fake_cfg(tmp: Path, shards: Path, name: str = "whole", **over) -> TrainConfig:
    values = dict(shard_dir=shards, output=tmp / name, epochs=2, batch_size=8, workers=0, width=8, log_every=50,
                  model="image", resolution=16, lr=5e-3, checkpoint_every=4)
    return TrainConfig(**{**values, **over})


def test_every_train_sample_is_recorded_once_per_epoch_and_val_once(clean_run):
    keys = {f"train{i:06d}" for i in range(48)}
    assert recorded(clean_run.output) == sorted((e, k) for e in (0, 1) for k in keys)
    val = labels.load_val(clean_run.output)
    assert sorted(val.keys) == [f"val{i:06d}" for i in range(30)] and val.epoch == 1
    assert val.probs.shape == (30, 3) and np.allclose(val.probs.sum(axis=1), 1, atol=1e-5)


def test_clean_labels_get_few_flags(clean_run):
    findings = labels.run(clean_run.output)
    assert findings.rate <= 0.05
    assert len(findings.rows) <= 0.05 * (findings.train_samples + findings.val_samples)


def test_resume_after_a_crash_records_the_same_as_an_uninterrupted_run(clean_run, tmp_path, monkeypatch):
    """Killed after step 9 (last checkpoint: step 8, mid-epoch 2), with records of step 9 on disk as a
    crash between the records and the checkpoint leaves them: --resume drops those and records the
    lost steps again; every (epoch, key) once, with the uninterrupted run's margins, bit for bit."""
    from tests.fake_data import fake_source

    def crash(run_dir, done, d):
        if done == 9:
            raise KeyboardInterrupt

    cfg = _fake_cfg(tmp_path, clean_run.shard_dir, "crashed")
    real = loop._maybe_inject_fault
    monkeypatch.setattr(loop, "_maybe_inject_fault", crash)
    with pytest.raises(KeyboardInterrupt):
        loop.run(cfg, open_data=fake_source(n_train=48), console=Console(file=io.StringIO()))
    folder = cfg.output / labels.RECORDS
    stale = folder / labels.record_name("train", 0, 9)
    stale.write_bytes((folder / labels.record_name("train", 0, 8)).read_bytes())
    monkeypatch.setattr(loop, "_maybe_inject_fault", real)
    loop.run(_fake_cfg(tmp_path, clean_run.shard_dir, "crashed", resume=True), open_data=fake_source(n_train=48),
             console=Console(file=io.StringIO()))
    assert not stale.exists()
    assert recorded(cfg.output) == recorded(clean_run.output)
    a, b = labels.load_train(clean_run.output), labels.load_train(cfg.output)
    assert a.keys == b.keys and np.array_equal(a.aum, b.aum) and np.array_equal(a.prob, b.prob)


@pytest.mark.slow
def test_two_ranks_records_merge_without_loss_or_duplicates():
    """The loop tests' 2-rank gloo run on real shards (48 train samples, 24 per rank, 12 val): both
    ranks wrote records; together they hold each train sample once per epoch and each val sample once."""
    shards, workdir = scenario_results(reference_run_scenario)
    run_dir = workdir / "whole"
    assert {rank for _, rank, _, _ in labels.record_files(run_dir)} == {0, 1}
    from pipeline.formats import index as shard_index

    index = shard_index.load(Path(shards[0]))
    train_count = sum(s["count"] for s in index["shards"] if s["split"] == "train")
    rows = recorded(run_dir)
    assert len(rows) == len(set(rows)) == 2 * train_count == 96
    val = labels.load_val(run_dir)
    assert len(val.keys) == len(set(val.keys)) == 12


def _signals(aum: list[float], accuracy: float) -> labels.TrainSignals:
    n = len(aum)
    return labels.TrainSignals(keys=[f"t{i}" for i in range(n)], label=np.zeros(n, dtype=np.int64), aum=np.array(aum),
                               prob=np.full(n, 0.5), rival=np.ones(n, dtype=np.int64), epochs=3,
                               last_epoch_accuracy=accuracy)


def test_a_memorised_training_set_still_gets_a_ranking_and_a_warning():
    """Every margin positive (the model learned every label, wrong ones too): a threshold at 0 would
    flag nothing; the ranking still flags the estimated share, lowest AUM first, and warns."""
    probs = np.array([[0.9, 0.1]] * 8 + [[0.1, 0.9]] * 2 + [[0.2, 0.8]] * 10)
    val = labels.ValSignals(keys=[f"v{i}" for i in range(20)], label=np.array([0] * 10 + [1] * 10), probs=probs, epoch=2)
    found = labels.analyse(_signals([5.0, 0.5, 4.0, 3.0, 6.0, 0.2, 7.0, 8.0, 9.0, 2.0], 1.0), val, ["a", "b"])
    assert [r["key"] for r in found.rows if r["split"] == "train"] == ["t5"]  # 10% of 10, the lowest AUM
    assert {r["key"] for r in found.rows if r["split"] == "val"} == {"v8", "v9"}
    assert any("memorised" in w for w in found.warnings)
    assert not any("memorised" in w for w in labels.analyse(_signals([1.0] * 10, 0.9), val, ["a", "b"]).warnings)
    # 20 val samples: the rate (10%) is only known to +-13 points, and the user is told so
    assert any("only 20 val samples (10.0% +- 13.1%)" in w for w in found.warnings)


def test_without_val_predictions_the_rate_is_the_negative_margin_share_and_says_so():
    found = labels.analyse(_signals([-1.0, -0.5, 2.0, 3.0], 0.5), None, ["a", "b"])
    assert found.rate == 0.5 and sorted(r["key"] for r in found.rows) == ["t0", "t1"]
    assert any("no validation predictions" in w for w in found.warnings)


def test_pipe_labels_does_not_import_torch(clean_run):
    import subprocess
    import sys

    from tests.conftest import pipe_env

    code = ("import sys; from pathlib import Path; from train import labels; "
            f"labels.run(Path({str(clean_run.output)!r})); assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, env=pipe_env())


# -- hostile or broken runs (issue 24, item 5) ----------------------------------------------------------


def _rewrite(path: Path, **columns) -> None:
    """Replace columns of a record file, as a run whose outputs went NaN writes them (or a planter)."""
    import pyarrow as pa

    table = pq.read_table(path)
    for name, values in columns.items():
        column = values(table)
        column = column if isinstance(column, (pa.Array, pa.ChunkedArray)) else pa.array(column)
        table = table.set_column(table.column_names.index(name), name, column)
    pq.write_table(table, path)


def _copy_run(run: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(run, to)
    for name in (labels.ISSUES, labels.SUMMARY):  # an earlier test's pipe labels on the shared run
        (to / name).unlink(missing_ok=True)
    return to


@pytest.mark.parametrize("split, column", [("train", "margin"), ("train", "prob"), ("val", "probs")])
def test_a_run_whose_outputs_went_nan_is_refused(clean_run, tmp_path, cli, split, column):
    """The last records of a run whose loss went NaN (NaN margins, probabilities): pipe labels said
    "estimated noise rate 0.0%, 0 flagged", exit 0. Now one line, exit 2, and no result files."""
    import pyarrow as pa

    run = _copy_run(clean_run.output, tmp_path / "run")
    last = [p for s, _, _, p in labels.record_files(run) if s == split][-1]
    if column == "probs":
        _rewrite(last, probs=lambda t: pa.FixedSizeListArray.from_arrays(
            pa.array(np.full(t.num_rows * 3, np.nan, dtype=np.float32)), 3))
    else:
        _rewrite(last, **{column: lambda t: pa.array(np.where(np.arange(t.num_rows) % 2, np.nan, np.inf).astype(np.float32))})
    r = cli("labels", run, "--shards", clean_run.shard_dir)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert f"{split} records hold NaN or inf" in lines[0] and "diverged" in lines[0]
    assert not (run / labels.ISSUES).exists() and not (run / labels.SUMMARY).exists()


@pytest.mark.parametrize("damage, words", [
    (lambda p: p.write_bytes(b"PAR1 not really"), "is not a readable train record"),
    (lambda p: _rewrite(p, epoch=lambda t: pq.read_table(p).column("key")), "column 'epoch' is string, not integer"),
    (lambda p: _rewrite(p, label=lambda t: np.full(t.num_rows, 7, dtype=np.int32)), "records name class 7, the SHARD_DIR has 3"),
    (lambda p: _rewrite(p, epoch=lambda t: np.full(t.num_rows, -2, dtype=np.int32)), "has the epoch -2"),
])
def test_a_record_file_pipe_train_did_not_write_is_one_line(clean_run, tmp_path, cli, damage, words):
    run = _copy_run(clean_run.output, tmp_path / "run")
    damage([p for s, _, _, p in labels.record_files(run) if s == "train"][-1])
    r = cli("labels", run, "--shards", clean_run.shard_dir)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and words in lines[0], r.output


def test_a_model_near_chance_on_its_training_data_is_a_finding_not_a_footnote(tmp_path, cli):
    """Correct labels, a model that learned nothing (lr 1e-7): every margin is low, so the lowest are
    flagged with confident "x look like y" lines. pipe labels now says first that the model is near
    chance and that its flags are not evidence, prints no such line, and records the finding."""
    shards, flipped = noisy_shards(tmp_path, n=90, flip=0.0)
    assert not flipped
    train(shards, tmp_path / "run", epochs=2, batch_size=16, lr=1e-7)
    r = cli("labels", tmp_path / "run")
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "run" / labels.SUMMARY).read_text())
    assert summary["last_epoch_train_accuracy"] < 0.5
    assert summary["finding"] and "near chance on its own training data" in summary["finding"]
    assert r.stdout.startswith("finding: the model is near chance on its own training data")
    assert "look like" not in r.output


HOSTILE = ["cat\x1b[31mRED\x1b[0m", "dog\x1b]0;pwned\x07", "fox\u202eeulb"]  # colours, a window title, a bidi override
RAW = ("\x1b", "\x07", "\u202e")


@pytest.mark.slow
def test_class_names_with_terminal_escapes_reach_the_terminal_escaped(tmp_path):
    """Class folders named with ESC sequences (Rich passes ESC): pipe labels, a real process, prints
    its "x look like y" lines with the names escaped as pipe check does, and nothing raw."""
    import subprocess
    import sys

    from tests.conftest import REPO, pipe_env

    shards, flipped = noisy_shards(tmp_path, n=90, flip=0.15, classes=HOSTILE)
    train(shards, tmp_path / "run", epochs=4, batch_size=16)
    p = subprocess.run([sys.executable, "-m", "pipeline", "labels", str(tmp_path / "run")], capture_output=True,
                       text=True, env=pipe_env(), cwd=REPO, timeout=120)
    assert p.returncode == 0, p.stderr
    assert not any(c in p.stdout + p.stderr for c in RAW)
    pairs = [ln for ln in p.stdout.splitlines() if " look like " in ln]
    assert pairs and all("\\x1b" in ln or "\\u202e" in ln for ln in pairs), p.stdout


def test_an_error_naming_a_planted_path_is_escaped(tmp_path, cli):
    """RUN_DIR/config.json names the SHARD_DIR; one with escapes in it comes back in the error line
    escaped (every error line passes the same helper)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"shard_dir": "/nowhere/\x1b]0;pwned\x07\x1b[2J"}))
    r = cli("labels", run)
    assert r.exit_code == 2 and not any(c in r.output for c in RAW)
    assert "/nowhere/\\x1b]0;pwned\\x07\\x1b[2J has no readable index.json" in r.stderr
