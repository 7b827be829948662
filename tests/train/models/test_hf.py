"""`--model hf:PATH`: Hugging Face models from a local folder, fed what they were trained with.

The folders are made here (a tiny BERT with a WordPiece tokenizer built from a vocabulary file, a
tiny ViT with an image processor whose normalisation is ImageNet's), saved with save_pretrained
as a stand-in for downloaded weights. Nothing is downloaded.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from pipeline.formats import index as shard_index  # noqa: E402
from pipeline.formats.sample import decode_image  # noqa: E402
from tests.conftest import REPO, pipe_env  # noqa: E402
from tests.factories import write  # noqa: E402
from tests.train_shards import make_shards  # noqa: E402
from train.components import checkpoint as ckpt  # noqa: E402
from train.data.reader import ShardReader  # noqa: E402
from train.models import norm  # noqa: E402
from train.models.builtin import build_builtin, build_model  # noqa: E402
from train.models.finetune import Freezer, load_init  # noqa: E402

CLASS_WORDS = ["cat", "dog", "bird"]
FILLER = ("a the small big red green blue old new happy sad fast slow tall short warm cold near far "
          "bright dark quiet loud soft hard round flat young wild calm").split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])


pytestmark = pytest.mark.usefixtures("one_thread")


def _sentence(rng: random.Random, label: int) -> str:
    words = rng.sample(FILLER, 7)
    words.insert(rng.randrange(len(words) + 1), CLASS_WORDS[label])
    return " ".join(words)


def _pretrain(model, tokenizer, steps: int = 200, seed: int = 7) -> None:
    """A few steps on sentences like the captions (other ones): a stand-in for pretraining, so that
    fine-tuning for two epochs has an encoder that already reads the words (a random tiny BERT
    needs several epochs before its loss moves at all)."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # 3e-3 left some seeds unable to tell cat from dog
    model.train()
    for _ in range(steps):
        labels = [rng.randrange(3) for _ in range(8)]
        enc = tokenizer([_sentence(rng, c) for c in labels], padding=True, return_tensors="pt")
        loss = torch.nn.functional.cross_entropy(
            model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits, torch.tensor(labels))
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    """A tiny BERT (hidden 32, 2 layers, 2 heads) with its tokenizer, saved as a model for another
    task: its head has 2 classes."""
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    root = tmp_path_factory.mktemp("bert")
    vocab = write(root / "vocab.txt", "\n".join(SPECIALS + CLASS_WORDS + FILLER + ["fish"]) + "\n")
    tokenizer = BertTokenizerFast(str(vocab))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=3)
    model = BertForSequenceClassification(config)
    _pretrain(model, tokenizer)
    model.classifier = torch.nn.Linear(32, 2)  # the head of another task
    model.config.num_labels = 2
    folder = root / "tiny-bert"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def caption_shards(tmp_path_factory):
    """A SHARD_DIR made by the real `pipe clean` and `pipe shard` from folders of captions whose
    class is named by one word among random others."""
    from typer.testing import CliRunner

    from pipeline.cli.app import app

    root = tmp_path_factory.mktemp("captions")
    rng = random.Random(0)
    for i in range(90):
        label = i % 3
        write(root / "raw" / CLASS_WORDS[label] / f"t{i:03d}.txt", _sentence(rng, label) + "\n")
    runner = CliRunner()
    for args in (["clean", root / "raw", "-o", root / "clean", "--workers", "1"],
                 ["shard", root / "clean", "-o", root / "shards", "--val-fraction", "0.2"]):
        r = runner.invoke(app, [str(a) for a in args], prog_name="pipe")
        assert r.exit_code == 0, r.output
    return root / "shards"


@pytest.fixture(scope="module")
def vit_folder(tmp_path_factory):
    """A tiny ViT (32 px, patch 8) with a preprocessor_config.json whose mean/std are ImageNet's."""
    from transformers import ViTConfig, ViTForImageClassification

    folder = tmp_path_factory.mktemp("vit") / "tiny-vit"
    torch.manual_seed(0)
    config = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=64, num_labels=2)
    ViTForImageClassification(config).save_pretrained(folder)
    write(folder / "preprocessor_config.json", json.dumps({
        "image_processor_type": "ViTImageProcessor", "do_resize": True, "size": {"height": 32, "width": 32},
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": IMAGENET[0], "image_std": IMAGENET[1]}))
    return folder


@pytest.mark.slow
def test_a_tiny_bert_from_a_local_folder_fine_tunes_on_captions(cli, bert_folder, caption_shards, tmp_path):
    """The README walkthrough: the folder's tokenizer in the workers, its 2-class head replaced for
    the 3 classes (and the report says so), and the run beats guessing."""
    run = tmp_path / "run"
    r = cli("train", caption_shards, "-o", run, "--model", f"hf:{bert_folder}", "--nproc-per-node", "1",
            "--epochs", "2", "--batch-size", "4", "--lr", "3e-3", "--workers", "1", "--max-text-len", "16")
    assert r.exit_code == 0, r.stderr
    err = " ".join(r.stderr.split())  # the report's title may wrap
    assert f"--init-from hf:{bert_folder} (Hugging Face folder (model.safetensors))" in err
    assert "classifier.weight: file [2, 32] vs model [3, 32]" in err
    assert "head re-initialised" in err and "folder has 2 classes, this dataset 3" in err
    assert f"input: 16 tokens per text (cut and padded), tokenizer BertTokenizer from hf:{bert_folder}" in err
    val = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    acc = [row["val_acc"] for row in val if row["kind"] == "val"][-1]
    assert acc > 0.8, err  # three balanced classes: guessing scores 1/3
    saved = ckpt.load(run / "last.pt")
    assert saved["config"]["input"]["tokens"] == 16


def test_the_reader_tokenizes_in_the_workers_with_the_folders_tokenizer(bert_folder, caption_shards):
    index = shard_index.load(caption_shards)
    model = build_model(f"hf:{bert_folder}", 3, index=index, max_text_len=12)
    assert model.inputs == ("input_ids", "attention_mask")
    reader = ShardReader(caption_shards, "train", batch_size=4, fields=("text",), tokenize=model.tokenize)
    batch = next(iter(reader))
    assert batch["input_ids"].shape == (4, 12) and batch["attention_mask"].dtype == torch.int64
    tok = model.tokenize.tokenizer
    text = tok.decode(batch["input_ids"][0], skip_special_tokens=True)
    assert any(w in text.split() for w in CLASS_WORDS)
    assert "text" not in batch  # no byte ids beside the tokens
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    assert logits.shape == (4, 3)


def test_the_vit_is_fed_its_own_normalisation_not_the_datasets(cli, vit_folder, tmp_path):
    shards = make_shards(tmp_path / "data", n=30, classes=3, size=32)
    index = shard_index.load(shards)
    assert [round(v, 3) for v in index["mean"]] != [round(v, 3) for v in IMAGENET[0]]
    model = build_model(f"hf:{vit_folder}", 3, index=index)
    wanted = norm.resolve(model, index)
    assert list(wanted.mean) == pytest.approx(IMAGENET[0]) and list(wanted.std) == pytest.approx(IMAGENET[1])
    assert wanted.size == 32 and norm.resolve(build_builtin("image", 3, width=8), index).mean == tuple(index["mean"])

    # the reader applies exactly that: (pixel / 255 - ImageNet mean) / ImageNet std
    reader = ShardReader(shards, "val", batch_size=2, fields=("image",), image_size=model.image_size,
                         mean=wanted.mean, std=wanted.std)
    (valid, raw), = [next(reader.samples(0, 0, 0, 1))]
    batch = reader.collate([(valid, raw)])
    pixels = torch.from_numpy(np.array(decode_image(raw.fields[raw.image_ext], raw.image_ext))).permute(2, 0, 1).float()
    mean, std = torch.tensor(IMAGENET[0]).view(3, 1, 1), torch.tensor(IMAGENET[1]).view(3, 1, 1)
    assert torch.allclose(batch["image"][0], (pixels / 255 - mean) / std, atol=1e-5)

    # and a run prints it, records it, and the model trains on it
    run = tmp_path / "run"
    r = cli("train", shards, "-o", run, "--model", f"hf:{vit_folder}", "--epochs", "1", "--batch-size", "8",
            "--workers", "0")
    assert r.exit_code == 0, r.stderr
    err = " ".join(r.stderr.split())  # a long path may wrap the line
    assert f"input: 32 px, mean/std from hf:{vit_folder} preprocessor_config.json (ImageNet" in err
    recorded = json.loads((run / "config.json").read_text())["input"]
    assert recorded["mean"] == pytest.approx(IMAGENET[0]) and recorded["source"].endswith("preprocessor_config.json")


def test_the_preflight_config_hash_covers_the_models_input(vit_folder):
    """Ranks that would normalise differently (another preprocessor_config.json on one node) stop
    at the preflight, though their flags are the same."""
    from train.distributed import preflight

    theirs = norm.InputNorm((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), 32, f"hf:{vit_folder} preprocessor_config.json")
    from train.models.hf import read_input_norm

    ours = read_input_norm(vit_folder, f"hf:{vit_folder}")
    assert preflight.config_hash("abc", ours.as_dict()) != preflight.config_hash("abc", theirs.as_dict())
    assert preflight.config_hash("abc", ours.as_dict()) == preflight.config_hash("abc", dict(ours.as_dict()))


def test_freeze_counts_berts_embeddings_and_encoder_layers_from_the_input(bert_folder):
    model = build_model(f"hf:{bert_folder}", 3)
    bert = model.model.bert
    groups = model.block_groups()
    assert groups == [[bert.embeddings, *bert.encoder.layer]]
    state = Freezer(model).apply(0.7)  # 3 blocks: embeddings and layer 0 frozen
    assert (state.frozen_blocks, state.total_blocks) == (2, 3)
    assert not any(p.requires_grad for p in bert.embeddings.parameters())
    assert not any(p.requires_grad for p in bert.encoder.layer[0].parameters())
    assert all(p.requires_grad for p in bert.encoder.layer[1].parameters())
    assert all(p.requires_grad for p in model.head.parameters())


def test_init_from_a_safetensors_file_with_module_prefixes(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(1)
    source = build_builtin("image", 3, width=8)
    path = tmp_path / "ddp-weights.safetensors"
    save_file({f"module.{k}": v.contiguous() for k, v in source.state_dict().items()}, str(path))
    target = build_builtin("image", 5, width=8)
    report = load_init(target, path)
    assert report.kind == "safetensors"
    assert len(report.loaded) == len(source.state_dict()) - 2 and not report.missing and not report.unexpected
    assert {n for n, _, _ in report.skipped_shape} == {"head.weight", "head.bias"}
    assert report.head_reinitialised == "file has 3 classes, this dataset 5"
    assert torch.equal(target.image.stem[0].weight, source.image.stem[0].weight)


def test_init_from_a_hugging_face_folder_matches_through_the_wrapper(bert_folder):
    torch.manual_seed(5)
    model = build_model(f"hf:{bert_folder}", 3)
    with torch.no_grad():
        model.model.bert.embeddings.word_embeddings.weight.zero_()
    report = load_init(model, bert_folder)
    assert report.kind == "Hugging Face folder (model.safetensors)"
    assert "model.bert.embeddings.word_embeddings.weight" in report.loaded
    assert report.head_reinitialised == "file has 2 classes, this dataset 3"
    assert model.model.bert.embeddings.word_embeddings.weight.abs().sum() > 0


@pytest.mark.parametrize("make, words", [
    (lambda p: p, "no such folder"),
    (lambda p: (p.mkdir(), p)[1], "no config.json in it"),
])
def test_a_wrong_hf_folder_is_one_line_before_any_rank_starts(cli, tmp_path, make, words):
    shards = make_shards(tmp_path / "data", n=12, classes=2, size=16)
    folder = make(tmp_path / "not-a-model")
    r = cli("train", shards, "-o", tmp_path / "run", "--model", f"hf:{folder}", "--workers", "0")
    assert r.exit_code == 2 and words in r.stderr and "Traceback" not in r.stderr


def test_a_text_model_folder_on_shards_without_texts_stops_before_any_rank_starts(cli, bert_folder, tmp_path):
    """A tokenizer in the folder means the model reads texts: on image-only shards it would train on
    empty strings."""
    from pipeline.shard import stage
    from tests.clean_dirs import Spec, make_clean_dir

    clean = make_clean_dir(tmp_path / "clean", [Spec(f"i{i:03d}", f"c{i % 2}", seed=i, size=16) for i in range(12)])
    stage.run(stage.ShardConfig(clean, tmp_path / "shards", val_fraction=0.2), show_progress=False)
    r = cli("train", tmp_path / "shards", "-o", tmp_path / "run", "--model", f"hf:{bert_folder}", "--workers", "0")
    assert r.exit_code == 2 and f"--model hf:{bert_folder} needs texts" in " ".join(r.stderr.split())
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_transformers_is_imported_only_for_hf_models():
    code = ("import sys; import pipeline.cli.app, train.command, train.config, train.loop; "
            "from train.models.builtin import build_model; build_model('text', 3); "
            "print('transformers' in sys.modules, 'safetensors' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=pipe_env(), cwd=REPO,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.slow
def test_two_gloo_ranks_fine_tune_the_hf_model_and_agree_on_its_input(pipe_proc, bert_folder, caption_shards, tmp_path):
    """Two ranks under the launcher: each builds the model from the folder and tokenizes its own
    samples; the preflight's config hash (which covers the model's input) agrees, and the run learns.
    (No dataloader workers: the one-rank run covers them, and each costs a process here.)"""
    run = tmp_path / "run"
    p = pipe_proc("train", caption_shards, "-o", run, "--model", f"hf:{bert_folder}", "--nproc-per-node", "2",
                  "--epochs", "2", "--batch-size", "2", "--lr", "3e-3", "--workers", "0", "--max-text-len", "16",
                  timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "backend gloo" in p.stderr and "ranks disagree" not in p.stderr
    val = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    acc = [row["val_acc"] for row in val if row["kind"] == "val"][-1]
    assert acc > 0.8, p.stderr[-3000:]
    assert json.loads((run / "config.json").read_text())["world_size"] == 2
