"""The contrastive losses over the global batch: N ranks x B give the loss and the gradients of
1 rank x N·B (real gloo ranks, DDP, fp32), for clip and siglip; pairs that are the same pair
twice over are masked; accumulation makes each micro-batch its own contrastive batch."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.gloo import scenario_results
from train.distributed import group as distributed
from train.models.clip import ClipModel
from train.objectives.losses import contrastive_loss, same_pairs

WORLD, B, ACCUM = 2, 4, 2
# captions 0 and 5 repeat, and samples 2 and 6 are one near-duplicate group: masked pairs across ranks
CAPTIONS = [0, 1, 2, 3, 4, 0, 6, 7, 8, 9, 10, 5, 12, 5, 14, 15]
GROUPS = [-1, -1, 7, -1, -1, -1, 7, -1, -1, 3, -1, -1, 3, -1, -1, -1]


def _model(loss: str) -> ClipModel:
    torch.manual_seed(0)
    model = ClipModel(width=8, resolution=16, max_text_len=12, loss=loss)
    if model.logit_bias is not None:  # SigLIP's -10 makes the negatives' gradients tiny: a test sees less
        model.logit_bias.data.fill_(0.0)
    return model


def _batch(n: int, seed: int = 3) -> dict:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 13, (n,), generator=g)
    text = torch.randint(1, 257, (n, 12), generator=g) * (torch.arange(12)[None] < lengths[:, None])
    return {"image": torch.randn(n, 3, 16, 16, generator=g), "text": text, "text_len": lengths,
            "caption_id": torch.tensor(CAPTIONS[:n]), "group_id": torch.tensor(GROUPS[:n])}


def _rows(batch: dict, sl: slice) -> dict:
    return {k: v[sl] for k, v in batch.items()}


def _loss(model, batch: dict, kind: str):
    out = model(image=batch["image"], text=batch["text"], text_len=batch["text_len"])
    return contrastive_loss(kind, out["image"], out["text"], out["scale"], out["bias"], batch["caption_id"], batch["group_id"])


def _step(model, wrapped, batch: dict, kind: str, accum: int) -> tuple[float, dict]:
    """One optimizer step's loss (mean over micro-batches) and gradients, each micro-batch of this
    rank's ``batch`` rows its own contrastive batch."""
    per = len(batch["caption_id"]) // accum
    total = 0.0
    for i in range(accum):
        res = _loss(wrapped, _rows(batch, slice(i * per, (i + 1) * per)), kind)
        (res.loss / accum).backward()
        total += float(res.loss.detach()) / accum
    return total, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def global_batch_scenario(d, workdir):
    """Each rank: its B (or, accumulated, ACCUM x B) rows of one global batch, under DDP."""
    out = {}
    for kind in ("clip", "siglip"):
        for accum in (1, ACCUM):
            model = _model(kind)
            ddp = distributed.wrap(model, d)
            n = WORLD * B * accum
            batch = _batch(n)
            # micro-batch i of the step is rows [i*WORLD*B, (i+1)*WORLD*B): rank r takes its B of each
            mine = torch.cat([torch.arange(i * WORLD * B + d.rank * B, i * WORLD * B + (d.rank + 1) * B)
                              for i in range(accum)])
            local = {k: v[mine] for k, v in batch.items()}
            out[(kind, accum)] = _step(model, ddp, local, kind, accum)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["clip", "siglip"])
@pytest.mark.parametrize("accum", [1, ACCUM])
def test_n_ranks_of_b_equal_one_rank_of_n_times_b(kind, accum):
    ranks, _ = scenario_results(global_batch_scenario)
    model = _model(kind)
    total, grads = _step(model, model, _batch(WORLD * B * accum), kind, accum)
    losses = [r[(kind, accum)][0] for r in ranks]
    # each rank's loss is its rows' share: their mean is the loss of the whole batch
    assert sum(losses) / WORLD == pytest.approx(total, rel=1e-6, abs=1e-7)
    for r in ranks:
        assert set(r[(kind, accum)][1]) == set(grads)
        for name, g in grads.items():
            # float32 sums in another order: equal to ~1e-6 of each tensor's largest gradient (measured:
            # at most 1.1e-6); a gather without gradients is off by up to 10x that largest gradient (clip)
            torch.testing.assert_close(r[(kind, accum)][1][name], g, rtol=1e-5, atol=1e-5 * g.abs().max().item(), msg=name)


def test_gradients_of_the_temperature_and_bias_flow():
    for kind in ("clip", "siglip"):
        model = _model(kind)
        _loss(model, _batch(8), kind).loss.backward()
        assert model.logit_scale.grad is not None and model.logit_scale.grad.abs().item() > 0
        if kind == "siglip":
            assert model.logit_bias is not None and model.logit_bias.grad is not None


def test_the_same_caption_and_the_same_group_are_masked_not_negatives():
    caption = torch.tensor([0, 1, 0, 2])
    group = torch.tensor([-1, 5, -1, 5])
    mask = same_pairs(caption, group, slice(0, 4))
    expect = torch.tensor([[0, 0, 1, 0], [0, 0, 0, 1], [1, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.bool)
    assert torch.equal(mask, expect)
    # two identical pairs: masked, the loss is that of the batch without the other copy's column
    image = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    text = image.clone()
    both = contrastive_loss("clip", image, text, torch.tensor(10.0), None, torch.tensor([0, 1, 0]), torch.tensor([-1, -1, -1]))
    copy = F.cross_entropy(torch.tensor([[10.0, 0.0]]), torch.tensor([0])).item()  # its twin's column left out
    other = F.cross_entropy(torch.tensor([[0.0, 10.0, 0.0]]), torch.tensor([1])).item()
    assert both.loss.item() == pytest.approx((2 * copy + other) / 3, rel=1e-5)
    # unmasked, each copy's identical twin would be a negative as close as its positive: log 2 at best
    unmasked = contrastive_loss("clip", image, text, torch.tensor(10.0), None, torch.tensor([0, 1, 2]), torch.tensor([-1, -1, -1]))
    assert unmasked.loss.item() > 2 / 3 * math.log(2)


def test_caption_margin_says_whether_another_image_fits_better():
    image = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    text = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])  # caption 2 describes image 0, not its own
    res = contrastive_loss("clip", image, text, torch.tensor(10.0), None, torch.arange(3), torch.full((3,), -1))
    assert res.caption_margin[0] > 0 and res.caption_margin[2] < 0
