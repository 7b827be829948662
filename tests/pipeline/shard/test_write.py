"""The shard writer's direct I/O: where the file system refuses it (at open, or a write it
cannot take), the shard goes through the page cache instead, byte for byte the same."""

from __future__ import annotations

import errno
import os

import pytest

from pipeline.shard import stage, write
from tests.pipeline.shard.test_golden import GOLDEN, SETTINGS, digests, golden_clean_dir


def shard(tmp_path):
    clean = golden_clean_dir(tmp_path / "clean")
    stage.run(stage.ShardConfig(clean, tmp_path / "out", workers=1, **SETTINGS["small shards"]), show_progress=False)
    return digests(tmp_path / "out")


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no direct I/O on this system")
def test_a_file_system_without_direct_io_gets_the_same_bytes(tmp_path, monkeypatch):
    opened = []
    real_open = os.open

    def no_direct(path, flags, *args, **kw):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        opened.append(path)
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(write.os, "open", no_direct)
    assert shard(tmp_path) == GOLDEN["small shards"]
    assert any(str(p).endswith(".tmp") for p in opened)  # the shards were opened without it


def _direct_io_on(folder) -> bool:
    """Whether ``folder``'s file system opens files for direct I/O (tmpfs on older kernels does not)."""
    try:
        os.close(os.open(folder / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644))
    except OSError as e:
        if e.errno == errno.EINVAL:
            return False
        raise
    finally:
        (folder / "probe").unlink(missing_ok=True)
    return True


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no direct I/O on this system")
def test_a_write_direct_io_refuses_goes_through_the_page_cache(tmp_path, monkeypatch):
    if not _direct_io_on(tmp_path):
        pytest.skip("the test folder's file system refuses direct I/O at open (the test above covers that)")
    refused = []
    real_write = os.write

    def refuse_direct(fd, data):
        import fcntl

        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(write.os, "write", refuse_direct)
    assert shard(tmp_path) == GOLDEN["small shards"]
    assert refused  # every shard's first write was refused, the rest went through the page cache
