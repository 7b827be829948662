"""--init-from loads what matches and says what did not; --freeze counts blocks; files with code are refused."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from torch import nn

from pipeline.core.errors import UsageError
from train.components.checkpoint import CHECKPOINT_FORMAT
from train.models.builtin import build_model
from train.models.finetune import Freezer, FreezeSchedule, load_init, read_state_dict


def _model(classes: int = 3, seed: int = 0, **kw) -> nn.Module:
    torch.manual_seed(seed)
    return build_model("image", classes, width=8, **kw)


def test_a_plain_state_dict_loads_and_a_head_for_other_classes_is_reinitialised(tmp_path):
    source = _model(3, seed=1)
    torch.save(source.state_dict(), tmp_path / "weights.pt")
    target = _model(5, seed=2)
    report = load_init(target, tmp_path / "weights.pt")
    assert report.kind == "state dict"
    assert {name for name, _, _ in report.skipped_shape} == {"head.weight", "head.bias"}
    assert report.missing == [] and report.unexpected == []
    assert report.head_reinitialised == "file has 3 classes, this dataset 5"
    for name, tensor in source.state_dict().items():
        if not name.startswith("head."):
            assert torch.equal(target.state_dict()[name], tensor), name
    assert not torch.equal(target.head.weight[:3], source.head.weight)


def test_a_pipe_checkpoint_and_wrapped_names_are_understood(tmp_path):
    source = _model(3, seed=1)
    wrapped = {f"module.{k}": v for k, v in source.state_dict().items()}  # saved from a DDP wrapper
    torch.save({"format": CHECKPOINT_FORMAT, "model": wrapped, "epoch": 2, "step": 40}, tmp_path / "last.pt")
    target = _model(3, seed=2)
    report = load_init(target, tmp_path / "last.pt")
    assert report.kind == "pipe train checkpoint (epoch 2, step 40)"
    assert len(report.loaded) == len(source.state_dict()) and not report.head_reinitialised
    torch.save({"state_dict": source.state_dict(), "epoch": 3}, tmp_path / "lightning.ckpt")
    assert read_state_dict(tmp_path / "lightning.ckpt")[1] == "state dict (under 'state_dict')"


def test_report_lists_missing_and_unexpected(tmp_path):
    source = _model(3)
    state = {k: v for k, v in source.state_dict().items() if not k.startswith("image.blocks.4.")}
    state["extra.weight"] = torch.zeros(2)
    torch.save(state, tmp_path / "partial.pt")
    report = load_init(_model(3), tmp_path / "partial.pt")
    assert report.missing and all(k.startswith("image.blocks.4.") for k in report.missing)
    assert report.unexpected == ["extra.weight"]
    statuses = [status for status, _ in report.rows()]
    assert statuses[:1] == ["loaded"] and "missing (kept fresh)" in statuses and "not in model (ignored)" in statuses


class Payload:
    """Unpickling this would run code (here: create a file)."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_a_file_that_would_run_code_is_refused_unrun(tmp_path):
    marker = tmp_path / "pwned"
    with open(tmp_path / "evil.pt", "wb") as f:
        pickle.dump({"model": Payload(str(marker))}, f)
    with pytest.raises(UsageError, match="weights_only"):
        load_init(_model(), tmp_path / "evil.pt")
    assert not marker.exists()


def test_not_a_torch_file_or_nothing_matching_are_usage_errors(tmp_path):
    (tmp_path / "junk.pt").write_bytes(b"\x00garbage")
    with pytest.raises(UsageError, match="not a readable torch file"):
        load_init(_model(), tmp_path / "junk.pt")
    torch.save({"encoder.w": torch.zeros(3)}, tmp_path / "other.pt")
    with pytest.raises(UsageError, match="none of its 1 tensors matches"):
        load_init(_model(), tmp_path / "other.pt")
    torch.save({"model": [1, 2, 3]}, tmp_path / "list.pt")
    with pytest.raises(UsageError, match="no state dict"):
        load_init(_model(), tmp_path / "list.pt")


def _trainable_blocks(model) -> list[bool]:
    return [all(p.requires_grad for p in b.parameters()) for b in model.image.block_list()]


def test_freeze_counts_blocks_from_the_input_and_never_the_head():
    model = _model()
    freezer = Freezer(model)
    state = freezer.apply(0.7)  # 6 blocks (stem + 5): floor(4.2) = 4 frozen
    assert _trainable_blocks(model) == [False, False, False, False, True, True]
    assert all(p.requires_grad for p in model.head.parameters())
    assert (state.frozen_blocks, state.total_blocks) == (4, 6)
    assert state.trainable_params == sum(p.numel() for p in model.parameters() if p.requires_grad)
    freezer.apply(0.0)
    assert all(_trainable_blocks(model))
    freezer.apply(1.0)  # a linear probe: only the head trains
    assert not any(_trainable_blocks(model)) and model.head.weight.requires_grad


def test_freeze_applies_to_each_encoder_of_a_fused_model():
    torch.manual_seed(0)
    model = build_model("image-text", 3, width=8)
    state = Freezer(model).apply(0.5)
    assert state.frozen_blocks == 3 + 2  # half of 6 image blocks, half of 5 text blocks (floor)
    assert not any(p.requires_grad for p in model.text.embed.parameters())


def test_parameters_the_model_froze_itself_stay_frozen():
    model = _model()
    model.image.blocks[4].conv1.weight.requires_grad_(False)  # e.g. a user's fixed filter
    freezer = Freezer(model)
    freezer.apply(0.7)
    freezer.apply(0.0)
    assert not model.image.blocks[4].conv1.weight.requires_grad


def test_schedule_unfreezes_from_the_epoch_counted_from_one():
    s = FreezeSchedule(0.7, unfreeze_epoch=2, unfreeze_to=0.2)
    assert [s.fraction_at(i) for i in range(4)] == [0.7, 0.2, 0.2, 0.2]
    assert FreezeSchedule(0.5).fraction_at(9) == 0.5


def test_tensor_names_from_an_init_from_file_are_printed_escaped(cli, tmp_path):
    """The --init-from report lists the file's tensor names (its author's choice): ESC, BEL and bidi
    overrides in them reach the terminal escaped, and brackets are not markup."""
    from tests.train_shards import make_shards

    shards = make_shards(tmp_path / "data", n=12, classes=2, size=16)
    state = {"\x1b]0;pwned\x07\x1b[2Jhead.weight": torch.zeros(2), "[link=https://x]evil\u202e": torch.zeros(1),
             **_model(2).state_dict()}
    torch.save(state, tmp_path / "init.pt")
    r = cli("train", shards, "-o", tmp_path / "run", "--model", "image", "--width", "8", "--workers", "0",
            "--max-steps", "1", "--batch-size", "4", "--init-from", tmp_path / "init.pt")
    assert r.exit_code == 0, r.output
    assert not any(c in r.output for c in ("\x1b", "\x07", "\u202e"))
    text = " ".join(r.stderr.split())
    assert "\\x1b]0;pwned\\x07\\x1b[2Jhead.weight" in text and "[link=https://x]evil\\u202e" in text
