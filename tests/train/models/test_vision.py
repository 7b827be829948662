"""``--model torchvision:NAME`` / ``timm:NAME``: built without weights, fed what their weights were
trained with, fine-tuned from a file the user has.

The "downloaded weights" are made here: a randomly initialised torchvision ResNet-18 saved as a
``.pth`` and timm's small ``test_vit`` saved as ``.safetensors``, both with the 1000-class ImageNet
head, the way the files people download look. Nothing is downloaded.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F

from tests.gloo import scenario_results
from tests.train_shards import make_shards


def _vision_libraries() -> bool:
    try:
        import timm  # noqa: F401
        import torchvision  # noqa: F401
    except (ImportError, RuntimeError):  # RuntimeError: a torchvision built for another torch
        return False
    return True


# Without the models extra (or with a torchvision built for another torch) these are skipped, except
# in CI (CI=true), which installs the pair and must run them: there they fail instead.
needs_vision = pytest.mark.skipif(not _vision_libraries() and os.environ.get("CI") != "true",
                                  reason="torchvision/timm not importable beside this torch")
pytestmark = pytest.mark.usefixtures("one_thread")

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("vision") / "data", n=60, classes=3, size=32)


@pytest.fixture(scope="module")
def resnet_pth(tmp_path_factory):
    """torchvision's ResNet-18 with its 1000-class head, as torch.save(model.state_dict()) writes it."""
    import torchvision

    torch.manual_seed(3)
    path = tmp_path_factory.mktemp("weights") / "resnet18-imagenet.pth"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), path)
    return path


def _pretrain_vit(model, steps: int = 50) -> None:
    """A stand-in for pretraining: steps on pictures like the dataset's (other ones), fed as the run
    feeds them (32 px enlarged to 160, [-1, 1]), into 3 of the 1000 ImageNet outputs. A ViT from
    random weights needs far more than two epochs of 48 images; one that has features does not."""
    import io

    import numpy as np
    from PIL import Image

    from tests.train_shards import class_image

    rng = np.random.default_rng(1)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    for _ in range(steps):
        labels = [int(rng.integers(3)) for _ in range(8)]
        pixels = np.stack([np.asarray(Image.open(io.BytesIO(class_image(c, 500_000 + int(rng.integers(10**6)), 32)))
                                      .convert("RGB")) for c in labels])
        x = (torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 255 - 0.5) / 0.5
        x = F.interpolate(x, size=(160, 160), mode="bilinear", align_corners=False)
        loss = F.cross_entropy(model(x), torch.tensor(labels))
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.fixture(scope="module")
def vit_safetensors(tmp_path_factory):
    """timm's test_vit (160 px, 6 blocks, 64 wide) with its 1000-class head, briefly pretrained, as
    .safetensors."""
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(4)
    model = timm.create_model("test_vit", pretrained=False)
    _pretrain_vit(model)
    path = tmp_path_factory.mktemp("weights") / "test_vit.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def _val_acc(run) -> float:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["val_acc"] for r in rows if r["kind"] == "val"][-1]


@pytest.mark.slow
@needs_vision
@pytest.mark.timeout(600)  # three processes import torch and torchvision: minutes on a loaded 2-core machine
def test_a_resnet18_from_a_pth_fine_tunes_on_two_ranks_with_its_frozen_batchnorm_untouched(
        pipe_proc, shards, resnet_pth, tmp_path):
    """The ImageNet head is replaced for 3 classes (the report says so), the reader normalises with
    torchvision's ImageNet constants, the frozen stem and layer1 keep their BatchNorm statistics
    bit for bit, and two epochs beat guessing."""
    import torchvision

    run = tmp_path / "run"
    p = pipe_proc("train", shards, "-o", run, "--model", "torchvision:resnet18", "--init-from", resnet_pth,
                  "--freeze", "0.5", "--nproc-per-node", "2", "--epochs", "2", "--batch-size", "8", "--lr", "2e-3",
                  "--workers", "0", timeout=540)
    assert p.returncode == 0, p.stderr[-3000:]
    err = " ".join(p.stderr.split())
    assert "model.fc.weight: file [1000, 512] vs model [3, 512]" in err
    assert "head re-initialised" in err and "file has 1000 classes, this dataset 3" in err
    # a CNN is not enlarged: it takes the stored 32 px as they are
    assert "input: 224 px (decoded at 32 px, the shards' size, which this model takes as it is)" in err
    assert "mean/std from torchvision:resnet18 (ResNet18_Weights.IMAGENET1K_V1 transforms) (ImageNet" in err
    assert "frozen 3 of 6 blocks (50% asked)" in err and "5 BatchNorm layers frozen in eval mode" in err

    # the normalisation used is the weights' own, recorded for every rank
    meta = torchvision.models.ResNet18_Weights.DEFAULT.transforms()
    recorded = json.loads((run / "config.json").read_text())["input"]
    assert recorded["mean"] == pytest.approx(meta.mean) and recorded["std"] == pytest.approx(meta.std)
    assert recorded["mean"] + recorded["std"] == pytest.approx(IMAGENET[0] + IMAGENET[1])

    # frozen blocks (conv1, bn1, layer1): BatchNorm statistics bit-identical; trained ones moved
    before = torch.load(resnet_pth, weights_only=True)
    after = torch.load(run / "last.pt", weights_only=False)["model"]
    for name in ("bn1", "layer1.0.bn1", "layer1.1.bn2"):
        for buf in ("running_mean", "running_var", "num_batches_tracked"):
            assert torch.equal(after[f"model.{name}.{buf}"], before[f"{name}.{buf}"]), f"{name}.{buf} moved"
    assert not torch.equal(after["model.layer3.0.bn1.running_mean"], before["layer3.0.bn1.running_mean"])
    assert torch.equal(after["model.layer1.0.conv1.weight"], before["layer1.0.conv1.weight"])
    assert _val_acc(run) > 0.6, err[-2000:]  # three balanced classes: guessing scores 1/3


@pytest.mark.slow
@needs_vision
@pytest.mark.timeout(600)
def test_a_timm_vit_from_safetensors_fine_tunes_on_two_ranks_at_its_own_size_and_normalisation(
        pipe_proc, shards, vit_safetensors, tmp_path):
    import timm

    run = tmp_path / "run"
    p = pipe_proc("train", shards, "-o", run, "--model", "timm:test_vit", "--init-from", vit_safetensors,
                  "--nproc-per-node", "2", "--epochs", "2", "--batch-size", "8", "--lr", "2e-3", "--workers", "0",
                  timeout=540)
    assert p.returncode == 0, p.stderr[-3000:]
    err = " ".join(p.stderr.split())
    assert "model.head.weight: file [1000, 64] vs model [3, 64]" in err
    assert "file has 1000 classes, this dataset 3" in err
    # timm's pretrained_cfg: [-1, 1] normalisation at 160 px; the 32 px shards are enlarged in the model
    assert "input: 160 px (decoded at 32 px, the shards' size, and enlarged in the model), mean/std from " \
           "timm:test_vit pretrained_cfg" in err
    cfg = timm.create_model("test_vit", pretrained=False).pretrained_cfg
    recorded = json.loads((run / "config.json").read_text())["input"]
    assert recorded["mean"] == pytest.approx(cfg["mean"]) and recorded["std"] == pytest.approx(cfg["std"])
    assert recorded["size"] == cfg["input_size"][-1] == 160
    assert _val_acc(run) > 0.6, err[-2000:]


@needs_vision
@pytest.mark.parametrize("spec, head, blocks", [
    ("torchvision:resnet50", "fc", ["conv1", "bn1", "layer1", "layer2", "layer3", "layer4"]),
    ("torchvision:vit_b_16", "heads.head", ["conv_proj"] + [f"encoder.layers.encoder_layer_{i}" for i in range(12)]),
    ("torchvision:efficientnet_b0", "classifier.1", [f"features.{i}" for i in range(9)]),
    ("timm:resnet18", "fc", ["conv1", "bn1", "layer1", "layer2", "layer3", "layer4"]),
    ("timm:test_vit", "head", ["patch_embed"] + [f"blocks.{i}" for i in range(6)]),
])
def test_the_head_and_the_blocks_are_the_models_real_ones(spec, head, blocks):
    from train.models.builtin import build_model

    model = build_model(spec, 7)
    names = {m: n for n, m in model.model.named_modules()}
    assert model.head_path == head and model.head.out_features == 7
    assert [names[b] for b in model.block_groups()[0]] == blocks


@needs_vision
def test_freezing_a_vit_freezes_its_class_token_and_position_embedding_with_the_patch_embedding():
    from train.models.builtin import build_model
    from train.models.finetune import Freezer

    model = build_model("torchvision:vit_b_16", 3)
    freezer = Freezer(model)
    state = freezer.apply(0.7)  # 13 blocks: the patch embedding and 8 encoder layers
    assert (state.frozen_blocks, state.total_blocks) == (9, 13)
    vit = model.model
    assert not vit.class_token.requires_grad and not vit.encoder.pos_embedding.requires_grad
    assert not any(p.requires_grad for p in vit.encoder.layers[7].parameters())
    assert all(p.requires_grad for p in vit.encoder.layers[8].parameters()) and vit.heads.head.weight.requires_grad
    freezer.apply(0.0)
    assert vit.class_token.requires_grad and all(p.requires_grad for p in vit.parameters())


@needs_vision
def test_frozen_batchnorm_stays_in_eval_mode_after_every_train_call():
    from train.models.builtin import build_model
    from train.models.finetune import Freezer

    model = build_model("torchvision:resnet18", 3)
    freezer = Freezer(model)
    state = freezer.apply(0.5)  # conv1, bn1, layer1
    assert state.frozen_bn == 5 and state.trainable_bn == 15
    assert "5 BatchNorm layers frozen in eval mode (running statistics kept)" in state.describe()
    before = {k: v.clone() for k, v in model.state_dict().items() if "running" in k}
    x = torch.randn(4, 3, 32, 32) * 3 + 1
    for _ in range(2):
        freezer.train_mode()
        F.cross_entropy(model(x), torch.tensor([0, 1, 2, 0])).backward()
        model.eval()
    after = model.state_dict()
    assert torch.equal(after["model.bn1.running_mean"], before["model.bn1.running_mean"])
    assert torch.equal(after["model.layer1.1.bn2.running_var"], before["model.layer1.1.bn2.running_var"])
    assert not torch.equal(after["model.layer2.0.bn1.running_mean"], before["model.layer2.0.bn1.running_mean"])
    freezer.train_mode()
    assert not model.model.bn1.training and model.model.layer2[0].bn1.training


@needs_vision
def test_init_from_the_original_models_file_loads_all_but_the_head(resnet_pth):
    from train.models.builtin import build_model
    from train.models.finetune import load_init

    model = build_model("torchvision:resnet18", 5)
    report = load_init(model, resnet_pth)
    assert report.kind == "state dict" and not report.missing and not report.unexpected
    assert {n for n, _, _ in report.skipped_shape} == {"model.fc.weight", "model.fc.bias"}
    assert report.head_reinitialised == "file has 1000 classes, this dataset 5"
    saved = torch.load(resnet_pth, weights_only=True)
    assert torch.equal(model.model.layer4[1].conv2.weight, saved["layer4.1.conv2.weight"])


def test_a_wrong_name_or_missing_library_is_one_line_before_any_rank_starts(cli, shards, tmp_path):
    r = cli("train", shards, "-o", tmp_path / "run", "--model", "torchvision:resnet51", "--workers", "0")
    err = " ".join(r.stderr.split())
    assert r.exit_code == 2 and "Traceback" not in r.stderr
    if _vision_libraries():
        assert "--model torchvision:resnet51: torchvision has no classification model 'resnet51'" in err
    else:  # what CI without a matching torchvision sees
        assert "--model torchvision:resnet51" in err and "torchvision" in err


@needs_vision
@pytest.mark.parametrize("spec, inner", [("torchvision:resnet18", "layer2.0.conv1"), ("timm:test_vit", "blocks.1.attn.qkv")])
def test_grad_checkpoint_recomputes_each_block_with_the_same_gradients_names_and_batchnorm_statistics(spec, inner):
    """--grad-checkpoint on a library model: every block's forward runs again in the backward pass,
    the gradients are exactly those of a plain step, the state-dict names are the model's own
    (checkpoints and --init-from files still match), and BatchNorm counts the step once."""
    from train.models.builtin import build_model

    def one_step(grad_checkpoint: bool):
        torch.manual_seed(0)
        model = build_model(spec, 3, grad_checkpoint=grad_checkpoint)
        calls = []
        model.model.get_submodule(inner).register_forward_hook(lambda *_: calls.append(1))
        model.train()
        x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
        F.cross_entropy(model(x), torch.tensor([0, 1, 2, 0])).backward()
        return model, len(calls)

    plain, forwards = one_step(False)
    recomputed, forwards_recomputed = one_step(True)
    assert (forwards, forwards_recomputed) == (1, 2)
    state = plain.state_dict()
    assert list(recomputed.state_dict()) == list(state)
    assert all(torch.equal(v, state[k]) for k, v in recomputed.state_dict().items())  # running stats moved once
    for (name, p), q in zip(plain.named_parameters(), recomputed.parameters()):
        assert torch.equal(p.grad, q.grad), name


def test_sync_bn_without_cuda_is_a_usage_error(cli, shards, tmp_path):
    r = cli("train", shards, "-o", tmp_path / "run", "--sync-bn", "--workers", "0")
    assert r.exit_code == 2 and "--sync-bn needs CUDA ranks" in " ".join(r.stderr.split())


@needs_vision
def test_sync_bn_converts_every_batchnorm_and_keeps_the_parameters():
    from train.models.builtin import build_model
    from train.models.finetune import Freezer, batch_norms, sync_batch_norm

    model = build_model("torchvision:resnet18", 3)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    assert sync_batch_norm(model) == 20
    assert all(isinstance(m, torch.nn.SyncBatchNorm) for m in batch_norms(model))
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert isinstance(Freezer(model).groups[0][1], torch.nn.SyncBatchNorm)  # the Freezer sees the new layers


# -- two ranks: parameters identical after an unfreeze, BatchNorm model --------------------------


def bn_unfreeze_scenario(d, workdir):
    """Each rank fine-tunes a torchvision ResNet-18 on its own data: half frozen, then unfrozen
    (the DDP wrapper rebuilt, as the loop does). None where torchvision does not load."""
    if not _vision_libraries():
        return None
    from train.distributed import group as distributed
    from train.models.builtin import build_model
    from train.models.finetune import Freezer

    torch.manual_seed(0)
    model = build_model("torchvision:resnet18", 3)
    initial = {n: t.detach().clone() for n, t in model.state_dict().items()}
    freezer = Freezer(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def train(wrapper, seed: int) -> None:
        for s in range(2):
            g = torch.Generator().manual_seed(100 * seed + 10 * s + d.rank)  # every rank its own data
            x, y = torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 3, (4,), generator=g)
            freezer.train_mode()
            F.cross_entropy(wrapper(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    freezer.apply(0.5)
    ddp = distributed.wrap(model, d)
    train(ddp, 1)
    frozen_phase = {n: t.detach().clone() for n, t in model.state_dict().items()}
    freezer.apply(0.0)
    train(distributed.rewrap(ddp, d), 2)
    return {"initial": initial, "frozen_phase": frozen_phase,
            "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


@pytest.mark.slow
@needs_vision
def test_ranks_hold_identical_resnet_parameters_after_an_unfreeze():
    (r0, r1), _ = scenario_results(bn_unfreeze_scenario)
    if r0 is None and os.environ.get("CI") != "true":
        pytest.skip("torchvision does not load in the spawned ranks")
    assert r0 is not None, "torchvision does not load in the spawned ranks"
    for name, p in r0["params"].items():
        assert torch.equal(p, r1["params"][name]), f"ranks differ on {name}"
        assert not torch.equal(p, r0["initial"][name]), f"{name} never trained"
    # while frozen, the stem's BatchNorm statistics did not move on either rank
    for r in (r0, r1):
        assert torch.equal(r["frozen_phase"]["model.bn1.running_mean"], r["initial"]["model.bn1.running_mean"])
        assert not torch.equal(r["frozen_phase"]["model.layer4.0.bn1.running_mean"],
                               r["initial"]["model.layer4.0.bn1.running_mean"])


@needs_vision
@pytest.mark.parametrize("spec, url", [
    ("torchvision:resnet18", "https://download.pytorch.org/models/resnet18-f37072fd.pth"),
    ("timm:test_vit", "https://huggingface.co/timm/test_vit.r160_in1k/resolve/main/model.safetensors"),
])
def test_a_library_model_knows_where_its_pretrained_weights_are_and_says_it_is_random_without_them(spec, url):
    """Built without weights, a library model carries where its normalisation's weights come from;
    the run's lines say the weights are random and what to pass, and the input line names the
    statistics as a recipe, not as weights that were loaded."""
    import io

    from rich.console import Console

    from train.components.console import RunConsole
    from train.models.builtin import build_model

    model = build_model(spec, 3, index={"classes": ["a", "b", "c"], "image_size": 32})
    assert url in model.pretrained_from and f"--init-from {url.rsplit('/', 1)[-1]}" in model.pretrained_from
    buf = io.StringIO()
    RunConsole(Console(file=buf, width=400), is_main=True).random_weights(spec, model.pretrained_from)
    said = buf.getvalue()
    assert said.startswith(f"warning: --model {spec} starts from RANDOM weights (no --init-from") and url in said
    silent = io.StringIO()
    RunConsole(Console(file=silent), is_main=False).random_weights(spec, model.pretrained_from)
    assert silent.getvalue() == ""
    loaded, random = model.input_norm.describe(32), model.input_norm.describe(32, random_weights=True)
    assert f"mean/std from {model.input_norm.source}" in loaded and "random" not in loaded
    assert "mean/std from" not in random and random.endswith("the model's weights are random, not those (no --init-from)")
    assert random.split(",")[0] == loaded.split(",")[0]  # the same size, the same numbers


@pytest.mark.slow
@needs_vision
@pytest.mark.timeout(600)
def test_a_torchvision_model_without_init_from_says_loudly_its_weights_are_random(pipe_proc, shards, tmp_path):
    p = pipe_proc("train", shards, "-o", tmp_path / "run", "--model", "torchvision:resnet18", "--epochs", "1",
                  "--batch-size", "16", "--workers", "0", timeout=540)
    assert p.returncode == 0, p.stderr[-3000:]
    err = " ".join(p.stderr.split())
    assert "warning: --model torchvision:resnet18 starts from RANDOM weights" in err
    assert "download https://download.pytorch.org/models/resnet18-f37072fd.pth, then --init-from " \
           "resnet18-f37072fd.pth" in err
    assert "(ResNet18_Weights.IMAGENET1K_V1 transforms); the model's weights are random, not those" in err
    assert "mean/std from torchvision" not in err
