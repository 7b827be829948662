"""``--model hf:PATH --objective contrastive``: tiny random CLIP and SigLIP folders saved offline
(`tests.hf_clip`) are measured by pipe eval as transformers alone measures them, trained with
their own tokenizer and normalisation, and --lock-image leaves their vision tower alone."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from rich.console import Console  # noqa: E402

from pipeline.core.errors import UsageError  # noqa: E402
from pipeline.formats.sample import decode_image  # noqa: E402
from tests.conftest import REPO, pipe_env  # noqa: E402
from tests.hf_clip import save_clip, save_siglip  # noqa: E402
from tests.train_shards import make_shards  # noqa: E402
from train import loop  # noqa: E402
from train.components import checkpoint as ckpt  # noqa: E402
from train.config import TrainConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
SAVERS = {"clip": save_clip, "siglip": save_siglip}


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return make_shards(tmp_path_factory.mktemp("pairs"), n=60, classes=3, size=32)


@pytest.fixture(scope="module", params=["clip", "siglip"])
def folder(request, tmp_path_factory) -> tuple[str, Path]:
    return request.param, SAVERS[request.param](tmp_path_factory.mktemp(request.param) / "model")


def _val_samples(shards: Path) -> list[tuple[str, np.ndarray, int]]:
    """(key, RGB pixels, class) of every val sample, read with tarfile."""
    import tarfile

    index = json.loads((shards / "index.json").read_text())
    out = []
    for shard in (s for s in index["shards"] if s["split"] == "val"):
        members: dict[str, dict[str, bytes]] = {}
        with tarfile.open(shards / shard["name"]) as tar:
            for m in tar.getmembers():
                key, ext = m.name.split(".", 1)
                members.setdefault(key, {})[ext] = tar.extractfile(m).read()
        out += [(key, decode_image(m["jpg"], "jpg"), int(m["cls"])) for key, m in members.items()]
    return out


def _transformers_zero_shot(kind: str, path: Path, shards: Path) -> tuple[float, torch.Tensor]:
    """Zero-shot accuracy with transformers alone: AutoModel, AutoProcessor, 'a photo of a {}.'."""
    from PIL import Image
    from transformers import AutoModel, AutoProcessor

    model, processor = AutoModel.from_pretrained(path, local_files_only=True).eval(), AutoProcessor.from_pretrained(path)
    samples = _val_samples(shards)
    classes = json.loads((shards / "index.json").read_text())["classes"]
    # SiglipProcessor's documented use: padded to the positions the model has (and cut to them)
    pad = {"padding": "max_length", "truncation": True} if kind == "siglip" else {"padding": True}
    with torch.no_grad():
        pixels = processor(images=[Image.fromarray(a) for _, a, _ in samples], return_tensors="pt")["pixel_values"]
        images = model.get_image_features(pixel_values=pixels)
        prompts = processor(text=[f"a photo of a {c}." for c in classes], return_tensors="pt", **pad)
        texts = model.get_text_features(**{k: v for k, v in prompts.items() if kind == "clip" or k == "input_ids"})
    images = getattr(images, "pooler_output", images)
    texts = getattr(texts, "pooler_output", texts)
    scores = torch.nn.functional.normalize(images, dim=-1) @ torch.nn.functional.normalize(texts, dim=-1).T
    labels = torch.tensor([c for _, _, c in samples])
    return float((scores.argmax(1) == labels).double().mean()), images


def test_pipe_eval_of_an_hf_folder_is_what_transformers_computes(folder, shards):
    kind, path = folder
    p = subprocess.run([sys.executable, "-m", "pipeline", "eval", f"hf:{path}", str(shards), "--json"],
                       capture_output=True, text=True, env=pipe_env(), cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stderr
    metrics = json.loads(p.stdout)["metrics"]
    expected, _ = _transformers_zero_shot(kind, path, shards)
    assert metrics["zeroshot_acc"] == pytest.approx(expected, abs=1e-9)
    assert metrics["samples"] == len(_val_samples(shards))


def test_the_embeddings_are_the_folders_own(folder, shards):
    """Image embeddings pipe computes from the shards (its reader, the folder's normalisation) equal
    transformers' from the same pictures through the folder's image processor."""
    from train.data.reader import ShardReader
    from train.models import families
    from train.models.hf_clip import load_hf

    kind, path = folder
    model = load_hf(str(path), families.Options())
    norm = model.input_norm
    reader = ShardReader(shards, "val", batch_size=len(_val_samples(shards)), fields=("image", "text", "pairs"),
                         mean=norm.mean, std=norm.std, tokenize=model.tokenize)
    batch = next(iter(reader))
    with torch.no_grad():
        ours = model.encode_image(batch["image"])
    _, theirs = _transformers_zero_shot(kind, path, shards)
    at = {key: i for i, (key, _, _) in enumerate(_val_samples(shards))}
    theirs = theirs[[at[k] for k in batch["key"]]]
    # the same pixels up to float rounding (x/255 - mean) / std here, x * (1/255) then normalised there
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


def test_fine_tuning_with_lock_image_trains_the_text_tower_only(folder, shards, tmp_path):
    kind, path = folder
    cfg = TrainConfig(shard_dir=shards, output=tmp_path / "run", objective="contrastive", model=f"hf:{path}", loss=kind,
                      lock_image=True, epochs=1, batch_size=8, workers=0, lr=1e-3, log_every=5)
    out = io.StringIO()
    summary = loop.run(cfg, console=Console(file=out, width=300))
    assert summary["steps"] == 6 and "zeroshot" in out.getvalue()
    from safetensors.torch import load_file

    before = load_file(str(path / "model.safetensors"))
    after = {k.removeprefix("model."): v for k, v in ckpt.load(tmp_path / "run" / "last.pt")["model"].items()}
    vision = [k for k in before if k.startswith(("vision_model.", "visual_projection."))]
    text = [k for k in before if k.startswith("text_model.encoder.")]
    assert vision and all(torch.equal(before[k], after[k]) for k in vision)
    assert any(not torch.equal(before[k], after[k]) for k in text)


def test_a_folder_that_is_no_image_text_model_is_refused(tmp_path):
    from transformers import BertConfig, BertModel

    from tests.hf_clip import save_tokenizer
    from train.models import families
    from train.models.hf_clip import build_contrastive

    save_tokenizer(tmp_path, 16)
    BertModel(BertConfig(vocab_size=514, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(tmp_path)
    with pytest.raises(UsageError, match="not an image-text model"):
        build_contrastive(str(tmp_path), families.Options(objective="contrastive"))


def test_a_siglip_folder_trained_with_the_clip_loss_keeps_its_bias_out_of_training(tmp_path):
    """--loss clip on a SigLIP folder: the bias takes no part in the loss, so it does not train (DDP
    refuses a trainable parameter that gets no gradient); pipe eval uses the bias the folder has."""
    from train.models import families
    from train.models.hf_clip import build_contrastive, load_hf

    path = save_siglip(tmp_path / "siglip")
    trained = build_contrastive(str(path), families.Options(objective="contrastive", loss="clip"))
    assert trained.logit_bias is None and not trained.model.logit_bias.requires_grad
    assert build_contrastive(str(path), families.Options(objective="contrastive", loss="siglip")).logit_bias is not None
    assert load_hf(str(path), families.Options()).logit_bias is not None
