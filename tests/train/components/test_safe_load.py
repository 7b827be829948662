"""A planted pickle in any checkpoint or model file pipe reads never runs (issue 24, items 1 and 9).

Each test builds the attack as someone with write access to a run or model folder would: a real
run folder written by `pipe train` (one process; DDP's last.pt/best.pt, FSDP's DCP folder), then a
file in it replaced by a pickle whose unpickling creates a marker file; then the command that reads
it. The command must end with one line (exit 2) and the marker must not exist. Each attack is also
shown to be live: the reader pipe used before (torch's DCP reader, a plain unpickler) runs it.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, pipe_env
from tests.train_shards import make_shards
from train.components import checkpoint as ckpt
from train.components import safe_load

pytestmark = pytest.mark.usefixtures("one_thread")

TRAIN = ("--model", "image", "--width", "8", "--epochs", "1", "--max-steps", "2", "--batch-size", "4", "--workers", "0",
         "--checkpoint-every", "1")


class Payload:
    """Unpickling this creates ``path`` (a stand-in for any code: the pickle names Path.touch)."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def _payload_bytes(marker: Path, wrap=lambda p: p) -> bytes:
    """What torch.save writes for an object holding the payload (a zip with data.pkl)."""
    buf = io.BytesIO()
    torch.save(wrap(Payload(marker)), buf)
    return buf.getvalue()


def _refused(r, marker: Path, words: str, alone: bool = True) -> None:
    """Exit 2, one error line saying ``words`` and nothing else (``alone``: refused before any rank
    started; else a rank's setup lines may come before it), no traceback, and the payload never ran."""
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("pipe:")]
    assert r.exit_code == 2, r.stderr[-3000:]
    assert len(errors) == 1 and words in errors[0], r.stderr[-3000:]
    assert r.stderr.rstrip().endswith(errors[0].rstrip())
    if alone:
        assert [ln for ln in r.stderr.splitlines() if ln.strip()] == errors, r.stderr[-3000:]
    assert "Traceback" not in r.output
    assert not marker.exists(), "the planted pickle ran"


def _live(marker: Path, load) -> None:
    """The attack is real: ``load`` (what read the file before) runs the payload."""
    assert not marker.exists()
    try:
        load()
    except Exception:  # noqa: BLE001 - what the payload returned broke the reader afterwards: it ran
        pass
    assert marker.exists(), "the planted pickle is not live: the test proves nothing"
    marker.unlink()


# -- the run folders -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return make_shards(tmp_path_factory.mktemp("data"), n=24, classes=2, size=16)


def _train(shards: Path, out: Path, *extra: str) -> None:
    from typer.testing import CliRunner

    from pipeline.cli.app import app

    r = CliRunner().invoke(app, ["train", str(shards), "-o", str(out), *TRAIN, *extra], prog_name="pipe")
    assert r.exit_code == 0, r.output


@pytest.fixture(scope="module")
def ddp_run(shards, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("ddp") / "run"
    _train(shards, run)
    assert (run / ckpt.LAST).is_file() and (run / ckpt.BEST).is_file()
    return run


@pytest.fixture(scope="module")
def fsdp_run(shards, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("fsdp") / "run"
    _train(shards, run, "--strategy", "fsdp")
    assert (run / ckpt.LAST_DCP).is_symlink()
    return run


def _copy(run: Path, to: Path) -> Path:
    shutil.copytree(run, to, symlinks=True)
    return to


def _resume(cli, shards: Path, run: Path, *extra: str):
    return cli("train", shards, "-o", run, *TRAIN, "--resume", *extra)


# -- DDP: last.pt, best.pt, --init-from files ----------------------------------------------------------


def test_a_planted_last_pt_is_refused_unrun_on_resume(cli, shards, ddp_run, tmp_path):
    run, marker = _copy(ddp_run, tmp_path / "run"), tmp_path / "pwned"
    (run / ckpt.LAST).unlink()  # best.pt is a hard link to it: a new file, not a write through the link
    (run / ckpt.LAST).write_bytes(_payload_bytes(marker, lambda p: {"format": ckpt.CHECKPOINT_FORMAT, "model": p}))
    _refused(_resume(cli, shards, run), marker, "refused by weights_only=True")
    _live(marker, lambda: torch.load(run / ckpt.LAST, weights_only=False))


@pytest.mark.parametrize("name", [ckpt.BEST, "weights.pth", "legacy.pt"])
def test_a_planted_init_from_file_is_refused_unrun(cli, shards, ddp_run, tmp_path, name):
    """best.pt of another run (or any .pt/.pth, or a bare pickle: torch's legacy format) as
    --init-from: refused, one line."""
    marker = tmp_path / "pwned"
    planted = tmp_path / name
    if name == "legacy.pt":
        planted.write_bytes(pickle.dumps({"state_dict": {"w": Payload(marker)}}))
    else:
        planted.write_bytes(_payload_bytes(marker, lambda p: {"state_dict": {"w": p}}))
    r = cli("train", shards, "-o", tmp_path / "new", *TRAIN, "--init-from", planted)
    _refused(r, marker, f"--init-from {planted}: refused by weights_only=True")


def test_a_last_pt_link_out_of_the_run_folder_is_refused(cli, shards, ddp_run, tmp_path):
    run = _copy(ddp_run, tmp_path / "run")
    elsewhere = tmp_path / "elsewhere.pt"
    shutil.copyfile(run / ckpt.LAST, elsewhere)
    (run / ckpt.LAST).unlink()
    os.symlink(elsewhere, run / ckpt.LAST)
    _refused(_resume(cli, shards, run), tmp_path / "none", "outside its run folder")


# -- FSDP: a DCP folder's .metadata, its items, state.pt, the last.dcp link --------------------------------


def _folder(run: Path) -> Path:
    return Path(os.path.realpath(run / ckpt.LAST_DCP))


def _rewrite_metadata(folder: Path, change) -> None:
    """Read the folder's real metadata, let ``change`` edit it, write it back (legitimate types only:
    what a planter who knows DCP would write to get past a type check)."""
    metadata = safe_load.dcp_metadata(folder)
    change(metadata)
    with open(folder / safe_load.METADATA, "wb") as f:
        pickle.dump(metadata, f)


def _point_item(folder: Path, want, data: bytes) -> str:
    """Put ``data`` in a new data file and point the first item ``want(entry)`` accepts at it."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    (folder / "__9_0.distcp").write_bytes(data)
    chosen: list[str] = []

    def change(metadata) -> None:
        for index in metadata.storage_data:
            if want(metadata.state_dict_metadata[index.fqn]) and not chosen:
                metadata.storage_data[index] = _StorageInfo("__9_0.distcp", 0, len(data))
                chosen.append(index.fqn)

    _rewrite_metadata(folder, change)
    assert chosen
    return chosen[0]


def _dcp_to_torch_save(folder: Path, tmp_path: Path):
    """torch's own DCP reader and default planner, on the whole folder (what pipe used before)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    def load():
        try:
            dcp_to_torch_save(folder, tmp_path / "gathered.pt")
        except BaseException as e:  # noqa: BLE001 - DCP wraps failures in a BaseException; _live asserts the rest
            raise RuntimeError(str(e)[:200]) from None

    return load


def test_a_planted_dcp_metadata_is_refused_unrun_on_resume(cli, shards, fsdp_run, tmp_path):
    run, marker = _copy(fsdp_run, tmp_path / "run"), tmp_path / "pwned"
    folder = _folder(run)
    with open(folder / safe_load.METADATA, "wb") as f:
        pickle.dump(Payload(marker), f)
    _refused(_resume(cli, shards, run, "--strategy", "fsdp"), marker, ".metadata: refused")
    from torch.distributed.checkpoint import FileSystemReader

    _live(marker, lambda: FileSystemReader(str(folder)).read_metadata())


def test_a_planted_dcp_bytes_item_is_refused_unrun(cli, shards, fsdp_run, tmp_path):
    """A non-tensor item (an optimizer setting) pointed at a pickle: torch's planner loads those with
    weights_only=False."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    run, marker = _copy(fsdp_run, tmp_path / "run"), tmp_path / "pwned"
    fqn = _point_item(_folder(run), lambda e: isinstance(e, BytesStorageMetadata), _payload_bytes(marker))
    _refused(_resume(cli, shards, run, "--strategy", "fsdp"), marker, f"DCP item {fqn!r}: refused by weights_only=True")
    _live(marker, _dcp_to_torch_save(_folder(run), tmp_path))


def test_a_planted_dcp_tensor_item_is_refused_unrun(cli, shards, fsdp_run, tmp_path):
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    run, marker = _copy(fsdp_run, tmp_path / "run"), tmp_path / "pwned"
    _point_item(_folder(run), lambda e: isinstance(e, TensorStorageMetadata), _payload_bytes(marker))
    _refused(_resume(cli, shards, run, "--strategy", "fsdp"), marker, "a tensor item refused by weights_only=True",
             alone=False)  # tensors are read by the ranks only


def test_a_planted_dcp_state_pt_is_refused_unrun(cli, shards, fsdp_run, tmp_path):
    run, marker = _copy(fsdp_run, tmp_path / "run"), tmp_path / "pwned"
    state = _folder(run) / ckpt.DCP_STATE
    state.write_bytes(_payload_bytes(marker, lambda p: {"format": ckpt.CHECKPOINT_FORMAT, "rng": [p]}))
    _refused(_resume(cli, shards, run, "--strategy", "fsdp"), marker, "state.pt: refused by weights_only=True")
    _live(marker, lambda: torch.load(state, weights_only=False))


@pytest.mark.parametrize("name", ["../../../../../../etc/hostname", "/etc/hostname", ".."])
def test_a_dcp_item_in_a_file_outside_the_folder_is_refused(cli, shards, fsdp_run, tmp_path, name):
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    run = _copy(fsdp_run, tmp_path / "run")

    def change(metadata) -> None:
        index = next(iter(metadata.storage_data))
        metadata.storage_data[index] = _StorageInfo(name, 0, 16)

    _rewrite_metadata(_folder(run), change)
    _refused(_resume(cli, shards, run, "--strategy", "fsdp"), tmp_path / "none", "not a file in the checkpoint folder")


def test_a_dcp_data_file_linked_out_of_the_folder_is_refused(cli, shards, fsdp_run, tmp_path):
    run = _copy(fsdp_run, tmp_path / "run")
    data = next(_folder(run).glob("*.distcp"))
    shutil.move(data, tmp_path / "outside.distcp")
    os.symlink(tmp_path / "outside.distcp", data)
    _refused(_resume(cli, shards, run, "--strategy", "fsdp"), tmp_path / "none", "a link out of the checkpoint folder")


def test_a_last_dcp_link_out_of_the_run_folder_is_refused(cli, shards, fsdp_run, tmp_path):
    """last.dcp pointed at a checkpoint folder elsewhere (here a real one: only where it is is wrong)."""
    run = _copy(fsdp_run, tmp_path / "run")
    elsewhere = shutil.copytree(_folder(run), tmp_path / "elsewhere")
    (run / ckpt.LAST_DCP).unlink()
    os.symlink(elsewhere, run / ckpt.LAST_DCP)
    _refused(_resume(cli, shards, run, "--strategy", "fsdp"), tmp_path / "none", "outside its run folder")


def test_the_metadata_reader_builds_nothing_but_a_dcp_checkpoints_types(fsdp_run, tmp_path):
    """The allow-list, directly: a real checkpoint's metadata loads and drives a real load; a global
    outside it (any module's function, a builtin) is refused before it is called."""
    metadata = safe_load.dcp_metadata(_folder(fsdp_run))
    assert metadata.storage_data and metadata.state_dict_metadata
    for module, name in [("os", "system"), ("builtins", "eval"), ("torch", "load"), ("torch", "Tensor"),
                         ("pathlib", "Path.touch")]:
        evil = pickle.PROTO + b"\x04" + pickle.SHORT_BINUNICODE + bytes([len(module)]) + module.encode() + \
            pickle.SHORT_BINUNICODE + bytes([len(name)]) + name.encode() + pickle.STACK_GLOBAL + pickle.STOP
        with pytest.raises(pickle.UnpicklingError, match="not a type a DCP checkpoint holds"):
            safe_load.MetadataUnpickler(io.BytesIO(evil)).load()


# -- the launcher and the elastic restart: every rank, and nobody typing --resume ---------------------------


def _pipe(*args, env_extra: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pipeline", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**pipe_env(), **(env_extra or {})}, cwd=REPO, **kw)


@pytest.mark.slow
def test_two_ranks_resuming_a_planted_dcp_folder_are_refused_before_they_start(shards, fsdp_run, tmp_path):
    """pipe train --nproc-per-node 2 --strategy fsdp --resume (a real process): the launcher reads the
    checkpoint's metadata through the same gate before any rank starts."""
    run, marker = _copy(fsdp_run, tmp_path / "run"), tmp_path / "pwned"
    with open(_folder(run) / safe_load.METADATA, "wb") as f:
        pickle.dump(Payload(marker), f)
    p = _pipe("train", shards, "-o", run, *TRAIN, "--strategy", "fsdp", "--nproc-per-node", "2", "--resume")
    out, err = p.communicate(timeout=240)
    assert p.returncode == 2, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and ".metadata: refused" in lines[0] and "Traceback" not in err
    assert not marker.exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_elastic_restart_refuses_a_dcp_folder_planted_while_the_run_was_down(shards, tmp_path):
    """--max-restarts resumes by itself: 2 FSDP ranks, rank 1 SIGKILLed after step 3 (checkpoint
    every step); the moment it dies, the checkpoint last.dcp points to gets a planted .metadata. Both
    restarted ranks read it through the gate: the run fails naming the refusal (exit 1, no
    traceback) and the payload never runs."""
    run, marker = tmp_path / "run", tmp_path / "pwned"
    p = _pipe("train", shards, "-o", run, "--model", "image", "--width", "8", "--epochs", "1", "--batch-size", "2",
              "--workers", "0", "--checkpoint-every", "1", "--strategy", "fsdp", "--nproc-per-node", "2",
              "--max-restarts", "1", env_extra={"PIPE_FAULT_KILL_AT_STEP": "3:1", "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 400
    while not (run / ".fault-injected").exists():
        assert p.poll() is None, p.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the fault was never injected"
        time.sleep(0.01)
    # rank 0 may still be finishing step 3's checkpoint (renaming it, re-pointing last.dcp): plant in
    # every checkpoint folder there is, for a while, so that whichever last.dcp ends at is planted
    planted = Payload(marker)
    until = time.monotonic() + 5
    while time.monotonic() < until:
        for folder in (run / ckpt.DCP_FOLDER).iterdir():
            with contextlib.suppress(OSError):  # a folder being renamed or pruned
                if (folder / safe_load.METADATA).read_bytes() != pickle.dumps(planted):
                    (folder / safe_load.METADATA).write_bytes(pickle.dumps(planted))
        time.sleep(0.05)
    out, err = p.communicate(timeout=400)
    assert p.returncode == 1, err[-3000:]
    assert "Traceback" not in err
    for rank in (0, 1):  # each restarted rank read it through the gate and said so
        assert any(ln.startswith(f"pipe: rank {rank} failed: ") and ".metadata: refused" in ln for ln in err.splitlines())
    final = [ln for ln in err.splitlines() if ln.startswith("pipe: failed:")]
    assert len(final) == 1 and ".metadata: refused" in final[0] and "Refused:" not in final[0], err[-3000:]
    assert not marker.exists()
