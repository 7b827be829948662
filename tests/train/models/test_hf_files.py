"""A hostile Hugging Face model folder (issue 24, items 8 and 9): code it asks transformers to run
(``auto_map``) is refused before transformers reads it, and pickled weights are refused in one
line, unrun. The folders are real ones (a tiny BERT saved by transformers), then changed as someone
with write access to them would."""

from __future__ import annotations

import ast
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from tests.conftest import REPO, pipe_env  # noqa: E402
from tests.train_shards import make_shards  # noqa: E402
from train.models import hf_files  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


class Payload:
    """Unpickling this creates ``path`` (the pickle names Path.touch)."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def tiny_bert(folder: Path) -> Path:
    """A real (random, tiny) BERT classifier folder: config.json, model.safetensors, vocab.txt."""
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    folder.mkdir(parents=True)
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] +
                                                [f"w{i}" for i in range(27)]) + "\n")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=1, intermediate_size=8,
                        max_position_embeddings=32, num_labels=2)
    BertForSequenceClassification(config).save_pretrained(folder)
    BertTokenizerFast(str(folder / "vocab.txt")).save_pretrained(folder)
    return folder


def with_custom_code(folder: Path, marker: Path, where: str) -> None:
    """What a planter adds: a model type of its own, ``auto_map`` naming a module in the folder, and
    the module (importing it creates ``marker``)."""
    (folder / "evil.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).touch()\n"
        "from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast\n"
        "class EvilConfig(BertConfig):\n    model_type = 'evilbert'\n"
        "class EvilModel(BertForSequenceClassification):\n    config_class = EvilConfig\n"
        "class EvilTokenizer(BertTokenizerFast):\n    pass\n")
    doc = json.loads((folder / where).read_text())
    if where == "config.json":
        doc["model_type"] = "evilbert"
        doc["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForSequenceClassification": "evil.EvilModel"}
    else:
        doc["auto_map"] = {"AutoTokenizer": [None, "evil.EvilTokenizer"]}
        doc["tokenizer_class"] = "EvilTokenizer"
    (folder / where).write_text(json.dumps(doc))


def with_pickled_weights(folder: Path, marker: Path, sharded: bool = False) -> Path:
    """model.safetensors replaced by a pytorch_model.bin (or a shard of one) that runs code when unpickled."""
    (folder / "model.safetensors").unlink()
    buf = io.BytesIO()
    torch.save({"bert.embeddings.word_embeddings.weight": Payload(marker)}, buf)
    name = "pytorch_model-00001-of-00001.bin" if sharded else "pytorch_model.bin"
    (folder / name).write_bytes(buf.getvalue())
    if sharded:
        (folder / "pytorch_model.bin.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": {"bert.embeddings.word_embeddings.weight": name}}))
    return folder / name


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """Caption shards (the text model needs texts)."""
    return make_shards(tmp_path_factory.mktemp("data"), n=12, classes=2, size=16)


def _train(*args) -> subprocess.CompletedProcess:
    """`pipe train` as a real process, "y" on its stdin for every prompt transformers might show."""
    return subprocess.run([sys.executable, "-m", "pipeline", "train", *map(str, args), "--workers", "0", "--epochs", "1",
                           "--max-steps", "1", "--batch-size", "2"], input="y\n" * 8, capture_output=True, text=True,
                          env=pipe_env(), cwd=REPO, timeout=300)


def _one_line(p, words: str) -> None:
    """Exit 2 and one line (a process, or the in-process CLI's result)."""
    code = p.returncode if isinstance(p, subprocess.CompletedProcess) else p.exit_code
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert code == 2, p.stderr[-3000:]
    assert len(lines) == 1 and words in lines[0], p.stderr[-3000:]


def _train_here(cli, *args):
    return cli("train", *args, "--workers", "0", "--epochs", "1", "--max-steps", "1", "--batch-size", "2")


@pytest.mark.parametrize("where", ["config.json", "tokenizer_config.json"])
def test_a_folder_asking_for_its_own_code_is_refused_before_transformers_reads_it(shards, tmp_path, where):
    marker = tmp_path / "pwned"
    folder = tiny_bert(tmp_path / "model")
    with_custom_code(folder, marker, where)
    p = _train(shards, "-o", tmp_path / "run", "--model", f"hf:{folder}")
    _one_line(p, f"{where}'s auto_map asks for the folder's own Python code")
    assert "Do you wish to run the custom code" not in p.stderr + p.stdout
    assert not marker.exists()


@pytest.mark.slow
def test_transformers_runs_nothing_from_the_folder_with_the_options_pipe_passes(tmp_path):
    """Past the refusal (another caller, a check someone loosens): `hf_files.SAFE_LOAD` alone keeps
    transformers from importing the folder's code, prompt answered "y" or not; without it, it does
    (the attack is live)."""
    marker = tmp_path / "pwned"
    model, tokenizer = tiny_bert(tmp_path / "model"), tiny_bert(tmp_path / "tokenizer")
    with_custom_code(model, marker, "config.json")
    with_custom_code(tokenizer, marker, "tokenizer_config.json")
    code = ("import os, sys, transformers\nos.environ['HF_HUB_OFFLINE'] = '1'\n"
            "kw = eval(sys.argv[3])\n"
            "for load, folder in ((transformers.AutoModelForSequenceClassification, sys.argv[1]),\n"
            "                     (transformers.AutoTokenizer, sys.argv[2])):\n"
            "    try:\n        load.from_pretrained(folder, **kw)\n    except Exception as e:\n"
            "        print(type(e).__name__)\n")

    def load(kw: dict) -> None:
        subprocess.run([sys.executable, "-c", code, str(model), str(tokenizer), repr(kw)], input="y\n" * 8,
                       capture_output=True, text=True, env=pipe_env(), cwd=REPO, timeout=300)

    load(hf_files.SAFE_LOAD)
    assert not marker.exists()
    load({"local_files_only": True})
    assert marker.exists(), "the planted code is not live: the test proves nothing"


def test_every_transformers_load_passes_trust_remote_code_false():
    """Every ``from_pretrained`` call in pipe's code passes `hf_files.SAFE_LOAD` (or
    trust_remote_code=False itself): a load added later without it fails here."""
    calls = []
    for path in sorted((REPO / "train").rglob("*.py")) + sorted((REPO / "pipeline").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "from_pretrained":
                safe = any(k.arg is None and isinstance(k.value, ast.Name) and k.value.id == "SAFE_LOAD" for k in node.keywords)
                safe |= any(k.arg == "trust_remote_code" and isinstance(k.value, ast.Constant) and k.value.value is False
                            for k in node.keywords)
                calls.append((f"{path.relative_to(REPO)}:{node.lineno}", safe))
    assert calls, "no transformers load found: the test looks in the wrong place"
    assert [where for where, safe in calls if not safe] == []


@pytest.mark.parametrize("sharded", [False, True])
def test_pickled_weights_in_an_hf_folder_are_the_one_line_refusal_init_from_gives(cli, shards, tmp_path, sharded):
    """A pickle pytorch_model.bin (or a .bin shard its index lists): --model hf: and --init-from of
    the folder both refuse it in --init-from's words, before any rank starts; it never runs."""
    marker = tmp_path / "pwned"
    folder = tiny_bert(tmp_path / "model")
    planted = with_pickled_weights(folder, marker, sharded)
    p = _train_here(cli, shards, "-o", tmp_path / "run", "--model", f"hf:{folder}")
    _one_line(p, f"--model hf:{folder}: {planted}: refused by weights_only=True")
    p = _train_here(cli, shards, "-o", tmp_path / "run2", "--model", "text", "--init-from", folder)
    _one_line(p, f"--init-from {planted}: refused by weights_only=True")
    assert not marker.exists()
    torch.load(planted, weights_only=False)
    assert marker.exists(), "the planted pickle is not live: the test proves nothing"


def test_a_weights_index_naming_files_outside_the_folder_is_refused(cli, shards, tmp_path):
    folder = tiny_bert(tmp_path / "model")
    (folder / "model.safetensors").rename(tmp_path / "elsewhere.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"bert.embeddings.word_embeddings.weight": "../elsewhere.safetensors"}}))
    assert hf_files.folder_problem(folder) == (f"--model hf:{folder}: model.safetensors.index.json names "
                                               "'../elsewhere.safetensors', not a file in the folder")
    p = _train_here(cli, shards, "-o", tmp_path / "run", "--model", "text", "--init-from", folder)
    _one_line(p, "names '../elsewhere.safetensors', not a file in the folder")
