"""One Folder interface, two backends: a local directory and a real S3 server (rclone serve s3)
behave the same for every call a stage makes."""

from __future__ import annotations

import itertools
import multiprocessing
import os
from pathlib import Path

import pytest

from pipeline.core.errors import UsageError
from pipeline.storage import Entry, TooLarge, open_folder

_buckets = itertools.count()
NAMES = ["b.txt", "B.txt", "a/z.bin", "a/b/c.txt", "a b/é.txt", "a-/x", "a0"]


@pytest.fixture(params=["local", "s3"])
def folder(request, tmp_path, monkeypatch):
    if request.param == "local":
        return open_folder(tmp_path / "root")
    server = request.getfixturevalue("s3_server")
    server.setenv(monkeypatch)
    bucket = server.make_bucket(f"folder-{next(_buckets)}")
    return open_folder(f"{bucket}/some/prefix")


def test_list_is_every_file_sorted_bytewise(folder):
    for i, name in enumerate(NAMES):
        folder.write(name, bytes(i))
    entries = folder.list()
    assert [e.rel for e in entries] == sorted(NAMES, key=lambda n: n.encode())
    assert all(isinstance(e, Entry) and e.size == NAMES.index(e.rel) and e.version for e in entries)


def test_both_backends_list_the_same_names(tmp_path, s3_server, monkeypatch):
    s3_server.setenv(monkeypatch)
    local, remote = open_folder(tmp_path / "l"), open_folder(s3_server.make_bucket("same-names"))
    for name in NAMES:
        local.write(name, b"x")
        remote.write(name, b"x")
    assert [e.rel for e in local.list()] == [e.rel for e in remote.list()]


def test_an_empty_or_absent_folder_lists_nothing(folder):
    assert folder.list() == []


def test_read_returns_what_write_wrote(folder):
    folder.write("d/x.bin", b"\x00\x01data")
    assert folder.read("d/x.bin") == b"\x00\x01data"
    folder.write("d/x.bin", b"new")
    assert folder.read("d/x.bin") == b"new"
    folder.write("empty", b"")
    assert folder.read("empty") == b"" and folder.read("empty", max_bytes=10) == b""


def test_read_refuses_a_file_past_max_bytes(folder):
    folder.write("big", b"x" * 1000)
    assert folder.read("big", max_bytes=1000) == b"x" * 1000
    with pytest.raises(TooLarge) as e:
        folder.read("big", max_bytes=999)
    assert e.value.size == 1000


def test_read_range(folder):
    folder.write("r", bytes(range(100)))
    assert folder.read_range("r", 10, 5) == bytes(range(10, 15))
    assert folder.read_range("r", 95, 10) == bytes(range(95, 100))
    assert folder.read_range("r", 100, 10) == b""
    assert folder.read_range("r", 3, 0) == b""


def test_a_missing_file_is_file_not_found(folder):
    with pytest.raises(FileNotFoundError):
        folder.read("nope")
    assert not folder.exists("nope")
    folder.delete("nope")  # no error


def test_exists_delete_child(folder):
    sub = folder.child("sub/dir")
    sub.write("f.txt", b"1")
    assert folder.exists("sub/dir/f.txt") and sub.exists("f.txt")
    assert folder.read("sub/dir/f.txt") == b"1"
    assert sub.url == folder.url + "/sub/dir"
    folder.delete("sub/dir/f.txt")
    assert not sub.exists("f.txt")


def test_move_renames_and_a_missing_source_is_file_not_found(folder):
    folder.write("data/a.jpg", b"pixels")
    folder.move("data/a.jpg", ".pipe/parked/data/a.jpg")
    assert not folder.exists("data/a.jpg") and folder.read(".pipe/parked/data/a.jpg") == b"pixels"
    with pytest.raises(FileNotFoundError):
        folder.move("data/a.jpg", "data/b.jpg")


def test_a_listing_and_an_opened_file_give_the_same_modification_time(folder):
    """What a rerun compares to tell an unchanged input: the listing's time against the one the
    worker recorded from the opened file (an object's Last-Modified on S3)."""
    folder.write("x.bin", b"12345")
    (entry,) = folder.list()
    with folder.open("x.bin") as f:
        st = f.stat() if hasattr(f, "stat") else os.fstat(f.fileno())  # as pipeline.clean.process does
    assert entry.mtime_ns > 0 and entry.size == st.st_size == 5
    # whole seconds on object storage, a listing's rounded and a header's truncated on some servers
    assert abs(entry.mtime_ns - st.st_mtime_ns) <= (1_000_000_000 if folder.url.startswith("s3://") else 0)


def test_local_write_if_absent_creates_once(tmp_path):
    """(rclone ignores If-None-Match: the S3 case runs against moto in test_s3.py)"""
    folder = open_folder(tmp_path)
    assert folder.write_if_absent("commit", b"first")
    assert not folder.write_if_absent("commit", b"second")
    assert folder.read("commit") == b"first"


@pytest.mark.parametrize("rel", ["../x", "/etc/passwd", "a//b", "a/./b", ""])
def test_paths_outside_the_folder_are_refused(folder, rel):
    with pytest.raises(UsageError):
        folder.write(rel, b"x")


def test_read_contained_reads_a_file_inside_whole_or_its_head(folder):
    folder.write("d/x.bin", bytes(range(100)))
    assert folder.read_contained("d/x.bin") == bytes(range(100))
    assert folder.read_contained("d/x.bin", head=10) == bytes(range(10))
    with pytest.raises(TooLarge):
        folder.read_contained("d/x.bin", max_bytes=99)
    with pytest.raises(FileNotFoundError):
        folder.read_contained("d/none")
    for rel in ("../x", "/etc/passwd", "a//b"):
        with pytest.raises(PermissionError):
            folder.read_contained(rel)


def test_read_contained_never_follows_a_link_out_nor_opens_a_fifo(tmp_path):
    """What a reader led by someone else's paths (pipe report's previews) must not do: read a
    file outside through a link (to a file, or through a linked folder), or block on a FIFO."""
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET")
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "inside.txt").write_text("fine")
    (root / "d" / "ok-link").symlink_to(root / "d" / "inside.txt")
    (root / "d" / "out-link").symlink_to(secret)
    (root / "linked-dir").symlink_to(tmp_path)
    os.mkfifo(root / "d" / "fifo")
    folder = open_folder(root)
    assert folder.read_contained("d/ok-link") == b"fine"  # a link to a file inside is that file
    for rel in ("d/out-link", "linked-dir/secret.txt", "d/fifo", "d"):
        with pytest.raises(PermissionError):
            folder.read_contained(rel)
        with pytest.raises(PermissionError):
            folder.read_contained(rel, head=4)


def test_read_contained_checks_the_file_it_opened(tmp_path, monkeypatch):
    """A link swapped in after the path was checked (a race an attacker can win) leads nowhere:
    the descriptor opened is checked too."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "x").write_text("inside")
    (tmp_path / "secret").write_text("TOPSECRET")
    folder = open_folder(root)
    real_open = os.open

    def swap_then_open(path, *args, **kwargs):
        if str(path).endswith("/x"):
            (root / "x").unlink()
            (root / "x").symlink_to(tmp_path / "secret")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", swap_then_open)
    with pytest.raises(PermissionError):
        folder.read_contained("x")


def test_local_writes_leave_no_temporary_files(tmp_path):
    f = open_folder(tmp_path)
    f.write("a/b", b"1")
    f.write_if_absent("a/c", b"2")
    f.write_if_absent("a/c", b"3")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b", "c"]


def test_local_folder_keeps_its_path(tmp_path):
    f = open_folder(tmp_path)
    assert f.local_path == tmp_path and f.url == str(tmp_path)
    assert open_folder(str(tmp_path)).local_path == Path(str(tmp_path))


def _race(args):
    url, i = args
    return open_folder(url).write_if_absent("commit", f"run {i}".encode())


def test_local_write_if_absent_race_has_one_winner(tmp_path):
    with multiprocessing.get_context("fork").Pool(4) as pool:
        for round_ in range(5):
            won = pool.map(_race, [(str(tmp_path / str(round_)), i) for i in range(8)])
            assert won.count(True) == 1, won
