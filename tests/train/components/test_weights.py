"""A run's weights read back whole and safely: a --strategy fsdp checkpoint of real gloo ranks put
together in one process (the same tensors as torch's own converter gives), exported, and taken by
--init-from; a DCP folder whose metadata pickles anything else is refused before it runs."""

from __future__ import annotations

import atexit
import functools
import io
import os
import pickle
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from rich.console import Console

from pipeline.core.errors import UsageError
from tests.fake_data import open_fake, write_index
from tests.gloo import run_world
from train import export, loop
from train.components import checkpoint as ckpt
from train.components import weights
from train.config import TrainConfig, validate
from train.models import exported
from train.models.builtin import build_model
from train.models.finetune import load_init

pytestmark = pytest.mark.usefixtures("one_thread")

RUN = dict(model="image-text", width=8, lr=5e-3, workers=0, log_every=2, seed=0, checkpoint_every=0, epochs=1,
           max_steps=3, batch_size=4, strategy="fsdp", freeze=0.5)


def fsdp_run_scenario(workdir):
    shards = write_index(Path(workdir) / "shards")
    loop.run(TrainConfig(shard_dir=shards, output=Path(workdir) / "run", **RUN), open_data=open_fake,
             console=Console(file=io.StringIO(), width=200))
    return str(workdir)


@functools.cache
def _fsdp_run() -> Path:
    workdir = Path(tempfile.mkdtemp(prefix="pipe-weights-"))
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    spec = f"{__name__}:fsdp_run_scenario"
    run_world([spec], {spec}, workdir, timeout=600.0)
    return workdir / spec.replace(":", ".") / "run"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_fsdp_run_exports_its_full_weights_and_init_from_takes_its_dcp_folder(tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    run = _fsdp_run()
    assert not (run / ckpt.LAST).exists() and (run / ckpt.LAST_DCP).is_dir()
    found, note = weights.run_checkpoint(run, "last")
    assert found.sharded and note is None
    whole = found.model_state()
    dcp_to_torch_save(os.path.realpath(run / ckpt.LAST_DCP), tmp_path / "oracle.pt")  # torch's own, unrestricted
    oracle = torch.load(tmp_path / "oracle.pt", weights_only=False)["model"]
    assert set(whole) == set(oracle) and all(torch.equal(whole[k], oracle[k]) for k in oracle)

    export.run(run, tmp_path / "out", which="last")
    again = exported.load(tmp_path / "out").state_dict()
    assert all(torch.equal(again[k], oracle[k]) for k in oracle)

    validate(TrainConfig(shard_dir=run.parent / "shards", output=tmp_path / "next", init_from=run / ckpt.LAST_DCP))
    fresh = build_model("image-text", 3, width=8)
    report = load_init(fresh, run / ckpt.LAST_DCP)
    assert len(report.loaded) == len(oracle) and not report.missing
    assert "fsdp" in report.kind


class Planted:
    def __reduce__(self):
        return (os.system, (f"touch {PLANTED}",))


PLANTED = Path(tempfile.gettempdir()) / f"pipe-planted-{os.getpid()}"


def _dcp_folder(folder: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    model = build_model("image", 3, width=8)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": model.state_dict()}, checkpoint_id=str(folder))
    (folder / ckpt.DCP_COMPLETE).write_text("step 1\n")
    return folder


def test_a_dcp_folder_is_read_without_unpickling_anything_else(tmp_path):
    folder = _dcp_folder(tmp_path / "ok")
    state = weights.read_dcp_model(folder)
    assert set(state) == set(build_model("image", 3, width=8).state_dict())

    bad = _dcp_folder(tmp_path / "bad")
    (bad / weights.DCP_METADATA).write_bytes(pickle.dumps(Planted()))
    PLANTED.unlink(missing_ok=True)
    with pytest.raises(UsageError, match="refused: posix.system is not a type"):
        weights.read_dcp_model(bad)
    with pytest.raises(UsageError, match="refused"):
        load_init(build_model("image", 3, width=8), bad)
    assert not PLANTED.exists()

    (folder / ckpt.DCP_COMPLETE).unlink()
    with pytest.raises(UsageError, match="not a complete checkpoint"):
        weights.read_dcp_model(folder)


def test_a_checkpoint_link_out_of_the_run_folder_is_refused(tmp_path):
    elsewhere = _dcp_folder(tmp_path / "elsewhere")
    run = tmp_path / "run"
    run.mkdir()
    (run / ckpt.LAST_DCP).symlink_to(elsewhere)
    with pytest.raises(UsageError, match="points out of"):
        weights.run_checkpoint(run, "last")
