"""pipe clean, shard and check with s3:// folders against a real S3 server (rclone serve s3 on
127.0.0.4): the same input gives the same manifest rows, outputs, shards and index.json bytes as
a local run, no secret lands in anything written or said, and a committed output is protected.
The commit race runs against moto's server mode (rclone ignores If-None-Match)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.storage import open_folder
from tests.conftest import pipe_env
from tests.factories import photo, write
from tests.s3server import ACCESS_KEY, SECRET_KEY


def _raw(root: Path) -> Path:
    raw = root / "raw"
    for i in range(3):
        photo(raw / "cats" / f"c{i}.jpg", seed=i)
        photo(raw / "dogs" / f"d{i}.png", seed=10 + i, fmt="PNG")
    photo(raw / "dogs" / "copy.jpg", seed=1)  # the same picture as cats/c1.jpg: a label conflict
    write(raw / "cats" / "broken.jpg", b"\xff\xd8\xff\xe0garbage")
    write(raw / "cats" / "note.txt", "a cat sat on the mat")
    write(raw / "dogs" / "empty.txt", b"")
    write(raw / ".git" / "HEAD", "ref: refs/heads/main\n")
    return raw


def _upload(raw: Path, url: str) -> None:
    folder = open_folder(url)
    for p in sorted(raw.rglob("*")):
        if p.is_file():
            folder.write(p.relative_to(raw).as_posix(), p.read_bytes())


def _pipe(server, *args, tmpdir: Path | None = None, **kw) -> subprocess.Popen | subprocess.CompletedProcess:
    env = {**pipe_env(), **server.env, **({"TMPDIR": str(tmpdir)} if tmpdir else {})}
    argv = [sys.executable, "-m", "pipeline", *map(str, args)]
    if kw.pop("background", False):
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)


def _objects(url: str) -> dict[str, bytes]:
    folder = open_folder(url)
    return {e.rel: folder.read(e.rel) for e in folder.list()}


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _rows(data: bytes) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(io.BytesIO(data)).to_pylist()


@pytest.fixture(scope="module")
def runs(s3_server, tmp_path_factory):
    """The same raw folder cleaned and sharded twice: all local, and from s3:// to s3://."""
    root = tmp_path_factory.mktemp("stages")
    raw = _raw(root)
    old = {k: os.environ.get(k) for k in s3_server.env}
    os.environ.update(s3_server.env)
    try:
        bucket = s3_server.make_bucket("stages")
        _upload(raw, f"{bucket}/raw")
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    done = {"root": root, "raw": raw, "bucket": bucket, "procs": []}
    steps = [("clean", raw, root / "clean", "--workers", "1"),
             ("clean", f"{bucket}/raw", f"{bucket}/clean", "--workers", "1"),
             ("clean", raw, f"{bucket}/clean-of-local", "--workers", "1"),
             ("shard", root / "clean", root / "shards", "--workers", "1", "--max-count", "3"),
             ("shard", f"{bucket}/clean", f"{bucket}/shards", "--workers", "1", "--max-count", "3"),
             # 2 workers, a shard a sample (helper processes share many parts: `LocalExecutor.run_parts`)
             ("shard", f"{bucket}/clean", f"{bucket}/shards-two", "--workers", "2", "--max-count", "1")]
    for command, src, dst, *flags in steps:
        p = _pipe(s3_server, command, src, "-o", dst, *flags, "--json")
        assert p.returncode == 0, (command, src, dst, p.stderr)
        done["procs"].append(p)
    return done


@pytest.fixture
def aws_env(s3_server, monkeypatch):
    s3_server.setenv(monkeypatch)


@pytest.mark.slow
def test_clean_on_s3_writes_what_a_local_clean_writes(runs, aws_env):
    remote = _objects(f"{runs['bucket']}/clean")
    local = _files(runs["root"] / "clean")
    assert _rows(remote.pop("manifest.parquet")) == _rows(local.pop("manifest.parquet"))
    outputs = {k: v for k, v in local.items() if k.startswith(("data/", "quarantine/"))}
    assert outputs and {k: v for k, v in remote.items() if k.startswith(("data/", "quarantine/"))} == outputs
    assert any(k.startswith("quarantine/") for k in outputs)
    assert sorted(k for k in remote if not k.startswith(("data/", "quarantine/"))) == [".pipe/state.json", "report.json"]
    assert b'"output": "s3://stages/clean"' in remote["report.json"]
    assert b'"input": "s3://stages/raw"' in remote[".pipe/state.json"]


def test_a_local_input_cleaned_into_s3_gives_the_same_objects(runs, aws_env):
    from_s3 = _objects(f"{runs['bucket']}/clean")
    from_local = _objects(f"{runs['bucket']}/clean-of-local")
    assert _rows(from_local.pop("manifest.parquet")) == _rows(from_s3.pop("manifest.parquet"))
    outputs = {k: v for k, v in from_s3.items() if k.startswith(("data/", "quarantine/"))}
    assert {k: v for k, v in from_local.items() if k.startswith(("data/", "quarantine/"))} == outputs


def test_shard_on_s3_writes_the_same_shards_and_index(runs, aws_env):
    remote = _objects(f"{runs['bucket']}/shards")
    local = {k: v for k, v in _files(runs["root"] / "shards").items() if not k.startswith(".pipe/")}
    assert "index.json" in local and len(local) > 2
    assert {k: v for k, v in remote.items() if not k.startswith(".pipe/")} == local


def test_shard_on_s3_with_helper_processes_writes_what_one_process_writes(runs, s3_server, aws_env, tmp_path):
    p = _pipe(s3_server, "shard", runs["root"] / "clean", "-o", tmp_path / "one", "--workers", "1", "--max-count", "1")
    assert p.returncode == 0, p.stderr
    local = {k: v for k, v in _files(tmp_path / "one").items() if not k.startswith(".pipe/")}
    remote = {k: v for k, v in _objects(f"{runs['bucket']}/shards-two").items() if not k.startswith(".pipe/")}
    assert len([k for k in local if k.endswith(".tar")]) > 2 and remote == local


@pytest.mark.slow
def test_check_on_s3_gives_the_local_verdicts(runs, s3_server):
    import json

    def verdicts(*dirs):
        p = _pipe(s3_server, "check", *dirs, "--json")
        assert p.returncode in (0, 1), p.stderr
        doc = json.loads(p.stdout)
        return p.returncode, [[(c["name"], c["status"]) for c in f["checks"]] for f in doc["folders"]], [f["path"] for f in doc["folders"]]

    code, remote, paths = verdicts(f"{runs['bucket']}/clean", f"{runs['bucket']}/shards")
    local_code, local, _ = verdicts(runs["root"] / "clean", runs["root"] / "shards")
    assert (code, remote) == (local_code, local)
    assert paths == ["s3://stages/clean", "s3://stages/shards"]


def test_an_s3_input_cleaned_into_a_local_folder(runs, s3_server, tmp_path):
    p = _pipe(s3_server, "clean", f"{runs['bucket']}/raw", "-o", tmp_path / "out", "--workers", "1", "--json")
    assert p.returncode == 0, p.stderr
    local = _files(runs["root"] / "clean")
    assert _rows((tmp_path / "out" / "manifest.parquet").read_bytes()) == _rows(local["manifest.parquet"])


def test_no_secret_in_any_output_or_message(runs, s3_server, aws_env):
    failed = _pipe(s3_server, "clean", "s3://no-such-bucket/raw", "-o", f"{runs['bucket']}/elsewhere")
    assert failed.returncode == 2 and "does not exist" in failed.stderr
    said = [p.stdout + p.stderr for p in [*runs["procs"], failed]]
    written = [*_objects(runs["bucket"]).values(), *_files(runs["root"]).values()]
    for secret in (SECRET_KEY, ACCESS_KEY):
        assert not [s for s in said if secret in s]
        assert not [w for w in written if secret.encode() in w]


@pytest.mark.slow
def test_a_complete_s3_output_is_replaced_only_with_overwrite(runs, s3_server, aws_env):
    url = f"{runs['bucket']}/clean"
    again = _pipe(s3_server, "clean", f"{runs['bucket']}/raw", "-o", url, "--workers", "1")
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1
    assert "already holds a complete output of pipe clean" in again.stderr
    before = _objects(url)
    redo = _pipe(s3_server, "clean", f"{runs['bucket']}/raw", "-o", url, "--workers", "1", "--overwrite", "--json")
    assert redo.returncode == 0, redo.stderr
    after = _objects(url)
    assert _rows(after.pop("manifest.parquet")) == _rows(before.pop("manifest.parquet"))
    assert {k for k in after} == {k for k in before}


def test_a_prefix_pipe_did_not_write_is_refused_even_with_overwrite(runs, s3_server, aws_env):
    url = f"{runs['bucket']}/someones"
    open_folder(url).write("notes.txt", b"mine")
    p = _pipe(s3_server, "clean", runs["raw"], "-o", url, "--workers", "1", "--overwrite")
    assert p.returncode == 2 and "was not written by pipe clean" in p.stderr
    assert _objects(url) == {"notes.txt": b"mine"}


def _wait_for_staging(tmpdir: Path, proc: subprocess.Popen) -> None:
    """Until the run has claimed the output (it makes its staging folder right after)."""
    deadline = time.monotonic() + 300
    while not list(tmpdir.glob("pipe-clean-*")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.mark.slow
def test_moto_two_cleans_into_one_s3_output_exactly_one_commits(moto_conditional_server, tmp_path, monkeypatch):
    """moto's server mode, since rclone ignores If-None-Match. Both runs claim the output before
    either commits (the first is paused until the second has claimed it too): exactly one
    commits, the other exits 1 with one line saying why."""
    moto_conditional_server.setenv(monkeypatch)
    raw = tmp_path / "raw"
    for i in range(3):
        photo(raw / "cats" / f"{i}.jpg", seed=i)
    url = moto_conditional_server.make_bucket("race") + "/clean"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _pipe(moto_conditional_server, "clean", raw, "-o", url, "--workers", "1", tmpdir=tmp_path / "a", background=True)
    _wait_for_staging(tmp_path / "a", first)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        second = _pipe(moto_conditional_server, "clean", raw, "-o", url, "--workers", "1", tmpdir=tmp_path / "b", background=True)
        _wait_for_staging(tmp_path / "b", second)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    results = [(p.wait(timeout=600), p.communicate()[1]) for p in (first, second)]
    assert sorted(code for code, _ in results) == [0, 1], results
    loser = next(err for code, err in results if code == 1)
    assert len(loser.strip().splitlines()) == 1 and "committed by another run" in loser, loser
    assert open_folder(url).exists("manifest.parquet")


def test_report_reads_s3_folders_as_it_reads_local_ones(runs, s3_server, tmp_path):
    """pipe report through the same Folder road: the same sections and previews from the bucket."""
    pages = {}
    for side, dirs in (("s3", [f"{runs['bucket']}/clean", f"{runs['bucket']}/shards"]),
                       ("local", [runs["root"] / "clean", runs["root"] / "shards"])):
        out = tmp_path / f"{side}.html"
        p = _pipe(s3_server, "report", *dirs, "-o", out)
        assert p.returncode == 0, p.stderr
        pages[side] = out.read_text(encoding="utf-8")
    assert "s3://stages/clean" in pages["s3"] and "s3://stages/shards" in pages["s3"]
    for side in pages:
        assert pages[side].count("data:image/jpeg;base64,") > 3, side
    assert pages["s3"].count("data:image/jpeg;base64,") == pages["local"].count("data:image/jpeg;base64,")


@pytest.mark.slow
def test_moto_every_object_with_content_is_one_row_whatever_its_key(moto_conditional_server, tmp_path, monkeypatch):
    """Keys no file path can be (moto holds them, rclone's file-backed store cannot): one ending in
    "/" with content, "../", "./", "//" parts. Each is a row saying what its name is (never "a
    hidden or tool folder", never dropped, no class made of ".."); only an empty "folder/"
    marker is no file. Nothing is read through such a name or copied into quarantine/."""
    moto_conditional_server.setenv(monkeypatch)
    photo(tmp_path / "p.jpg", seed=3)
    jpeg = (tmp_path / "p.jpg").read_bytes()
    bucket = moto_conditional_server.make_bucket("hostile-keys")
    c = moto_conditional_server.client()
    keys = {"raw/cats/a.jpg": jpeg, "raw/cats/": b"bytes", "raw/cats/b.jpg/": jpeg, "raw/../evil.jpg": jpeg,
            "raw/cats/../up.jpg": jpeg, "raw/./dot.jpg": jpeg, "raw/cats//double.jpg": jpeg, "raw/.git/HEAD": b"ref",
            "raw/dogs/": b""}
    for key, body in keys.items():
        c.put_object(Bucket="hostile-keys", Key=key, Body=body)
    p = _pipe(moto_conditional_server, "clean", f"{bucket}/raw", "-o", tmp_path / "out", "--workers", "1", "--json")
    assert p.returncode == 0, p.stderr
    rows = {r["source"]: r for r in _rows((tmp_path / "out" / "manifest.parquet").read_bytes())}
    assert sorted(rows) == ["../evil.jpg", "./dot.jpg", ".git", "cats/", "cats/../up.jpg", "cats//double.jpg",
                            "cats/a.jpg", "cats/b.jpg/"]  # 9 keys, one an empty marker: 8 files, 8 rows
    assert rows["cats/a.jpg"]["status"] == "kept"
    for source in ("cats/", "cats/b.jpg/"):
        assert rows[source]["status"] == "quarantined" and "key ending in '/'" in rows[source]["detail"]
    for source in ("../evil.jpg", "./dot.jpg", "cats/../up.jpg", "cats//double.jpg"):
        assert rows[source]["status"] == "quarantined" and "'..' part is no file path" in rows[source]["detail"], source
    assert "hidden or tool folder" in rows[".git"]["detail"]
    assert rows["../evil.jpg"]["label"] is None and rows["./dot.jpg"]["label"] is None
    assert not (tmp_path / "out" / "quarantine").exists() and not (tmp_path / "evil.jpg").exists()
