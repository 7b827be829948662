"""The built-in models and the --model contract: shapes, batch independence, checkpointing, factories."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.core.errors import UsageError
from train.models.builtin import build_model, forward, reader_fields

pytestmark = pytest.mark.usefixtures("one_thread")


def _batch(n: int = 4, side: int = 32, length: int = 40, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, length + 1, (n,), generator=g)
    text = torch.randint(1, 257, (n, length), generator=g)
    text[torch.arange(length)[None, :] >= lens[:, None]] = 0  # padding after each text
    return {"image": torch.randn(n, 3, side, side, generator=g), "text": text, "text_len": lens,
            "label": torch.randint(0, 3, (n,), generator=g)}


def _model(name: str, **kw) -> nn.Module:
    torch.manual_seed(0)
    return build_model(name, 5, width=8, resolution=16, **kw)


@pytest.mark.parametrize("name, fields", [("image", ("image",)), ("text", ("text",)), ("image-text", ("image", "text"))])
def test_builtin_models_give_one_logit_per_class(name, fields):
    model = _model(name)
    assert forward(model, model, _batch()).shape == (4, 5)
    assert reader_fields(model) == fields


def test_a_sample_gets_the_same_output_alone_or_in_a_batch():
    """No batch statistics: what makes N micro-batches of b equal one batch of N x b."""
    model = _model("image-text").eval()
    batch = _batch(6)
    together = forward(model, model, batch)
    alone = torch.cat([forward(model, model, {k: v[i:i + 1] for k, v in batch.items()}) for i in range(6)])
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)


def test_text_output_does_not_depend_on_how_far_the_batch_was_padded():
    model = _model("text").eval()
    batch = _batch(3, length=20)
    padded = {**batch, "text": F.pad(batch["text"], (0, 50))}  # 50 more padding bytes
    torch.testing.assert_close(forward(model, model, batch), forward(model, model, padded), rtol=1e-5, atol=1e-6)


def test_an_empty_text_gives_finite_logits():
    model = _model("text")
    batch = _batch(2)
    batch["text_len"] = torch.tensor([0, 3])
    assert torch.isfinite(forward(model, model, batch)).all()


def _grads(model, batch) -> dict:
    F.cross_entropy(forward(model, model, batch), batch["label"]).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ["image", "text"])
def test_gradient_checkpointing_gives_the_same_gradients(name):
    batch = _batch()
    plain = _grads(_model(name), batch)
    checkpointed_model = _model(name, grad_checkpoint=True)
    assert any(getattr(m, "grad_checkpoint", False) for m in checkpointed_model.modules())
    checkpointed = _grads(checkpointed_model, batch)
    assert plain.keys() == checkpointed.keys()
    for k in plain:
        torch.testing.assert_close(checkpointed[k], plain[k], rtol=1e-6, atol=1e-7, msg=k)


def test_checkpointing_behind_a_frozen_block_still_trains_the_rest():
    """Non-reentrant checkpointing: the reentrant kind drops gradients when a checkpointed block's
    input does not require grad, which is exactly the case behind frozen blocks."""
    model = _model("image", grad_checkpoint=True)
    for p in model.image.stem.parameters():
        p.requires_grad_(False)
    grads = _grads(model, _batch())
    assert any(k.startswith("image.blocks.0.") for k in grads) and not any(k.startswith("image.stem") for k in grads)


# -- --model package.module:factory -----------------------------------------------------------------


class Positional(nn.Module):
    """A torchvision-style model: forward(images), no `inputs`, no block_groups."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.LazyLinear(8))
        self.head = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.head(self.body(x))


def positional_factory(num_classes: int):
    return Positional(num_classes)


def index_factory(num_classes: int, index: dict):
    model = Positional(num_classes)
    model.seen_index = index
    return model


def not_a_module(num_classes: int):
    return "a string"


def test_a_user_factory_is_called_with_the_class_count_and_index():
    model = build_model("tests.train.models.test_builtin:index_factory", 7, index={"image_size": 8})
    assert model.head.out_features == 7 and model.seen_index == {"image_size": 8}
    assert forward(model, model, _batch(2, side=8)).shape == (2, 7)  # called positionally with the images
    assert reader_fields(model) == ("image",)


@pytest.mark.parametrize("spec, words", [
    ("no_such_module_xyz:make", "cannot import no_such_module_xyz"),
    ("tests.train.models.test_builtin:missing", "has no callable 'missing'"),
    ("tests.train.models.test_builtin:not_a_module", "returned str, not a torch.nn.Module"),
    ("test_builtin", "neither a built-in model (image, text, image-text) nor package.module:factory"),
])
def test_a_bad_factory_is_a_usage_error(spec, words):
    with pytest.raises(UsageError) as e:
        build_model(spec, 3)
    assert words in str(e.value)


def test_grad_checkpoint_on_a_model_without_support_is_a_usage_error():
    with pytest.raises(UsageError, match="set_grad_checkpointing"):
        build_model("tests.train.models.test_builtin:positional_factory", 3, grad_checkpoint=True)


def kwargs_factory(num_classes: int, **kwargs):
    """Like every torchvision and timm constructor: extra keywords go on to the model class."""
    return Positional(num_classes, **kwargs)


def index_factory_that_fails(num_classes: int, index: dict):
    raise ValueError("no such backbone")


def test_a_kwargs_factory_gets_no_index_it_did_not_ask_for():
    model = build_model("tests.train.models.test_builtin:kwargs_factory", 5, index={"image_size": 8})
    assert model.head.out_features == 5


def test_a_failing_factory_is_told_what_pipe_passed():
    with pytest.raises(UsageError) as e:
        build_model("tests.train.models.test_builtin:index_factory_that_fails", 3, index={"image_size": 8})
    message = str(e.value)
    assert "index_factory_that_fails(num_classes=3, index=" in message and "no such backbone" in message
