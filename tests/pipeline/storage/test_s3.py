"""The S3 backend against real servers: URLs, credentials and errors as pipe's two exceptions,
one client per process, conditional writes, and no secret in anything it says."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from pipeline.core.errors import StageFailed, UsageError
from pipeline.storage import open_folder
from pipeline.storage import s3 as s3mod
from tests.s3server import ACCESS_KEY, SECRET_KEY, free_port


def test_url_names_bucket_and_prefix_only():
    f = open_folder("s3://my-bucket/a/b/")
    assert (f.bucket, f.prefix, f.url, f.local_path) == ("my-bucket", "a/b", "s3://my-bucket/a/b", None)
    assert open_folder("s3://my-bucket").url == "s3://my-bucket"


@pytest.mark.parametrize("url", [f"s3://{ACCESS_KEY}:{SECRET_KEY}@bucket/x", f"s3://bucket/x?secret={SECRET_KEY}",
                                 "s3://bucket/a/../b", "s3://", "s3:///x"])
def test_bad_urls_are_usage_errors_that_echo_no_secret(url):
    with pytest.raises(UsageError) as e:
        open_folder(url)
    assert SECRET_KEY not in str(e.value)


def test_missing_bucket_is_a_usage_error(s3_server, monkeypatch):
    s3_server.setenv(monkeypatch)
    with pytest.raises(UsageError, match="s3://no-such-bucket/x: the bucket no-such-bucket does not exist"):
        open_folder("s3://no-such-bucket/x").list()


def test_wrong_secret_is_a_usage_error_without_the_secret(s3_server, monkeypatch):
    s3_server.setenv(monkeypatch)
    bucket = s3_server.make_bucket("wrong-secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-" + SECRET_KEY)
    with pytest.raises(UsageError) as e:
        open_folder(bucket).write("x", b"1")
    assert "access refused" in str(e.value) and SECRET_KEY not in str(e.value)


def test_no_credentials_is_a_usage_error(s3_server, monkeypatch):
    s3_server.setenv(monkeypatch)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(UsageError, match="no AWS credentials"):
        open_folder("s3://any-bucket/x").list()


def test_an_unreachable_server_stops_the_stage_in_one_line_without_secrets(s3_server, monkeypatch):
    s3_server.setenv(monkeypatch)
    port = free_port("127.0.0.4")  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{ACCESS_KEY}:{SECRET_KEY}@127.0.0.4:{port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    with pytest.raises(StageFailed) as e:
        open_folder("s3://bucket/prefix").read("f")
    message = str(e.value)
    assert message.startswith("s3://bucket/prefix/f: ") and "\n" not in message
    assert SECRET_KEY not in message and ACCESS_KEY not in message


def test_scrub_removes_credentials_queries_and_secret_values(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    text = f"http://u:p@host/x?X-Amz-Signature=abc failed; key {SECRET_KEY}"
    assert s3mod.scrub(text) == "http://host/x failed; key ***"


def _child_client_is_new(parent_id):
    return id(s3mod.client()) != parent_id and list(s3mod._clients) == [k for k in s3mod._clients if k[0] == os.getpid()]


def test_one_client_per_process_made_again_after_fork(s3_server, monkeypatch):
    s3_server.setenv(monkeypatch)
    parent = s3mod.client()
    assert s3mod.client() is parent
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_child_client_is_new, (id(parent),))


def _read_in_worker(args):
    url, rel = args
    return open_folder(url).read(rel)


def test_workers_read_through_their_own_clients(s3_server, monkeypatch):
    s3_server.setenv(monkeypatch)
    url = s3_server.make_bucket("workers") + "/p"
    f = open_folder(url)
    for i in range(8):
        f.write(f"{i}", str(i).encode())
    s3mod.client()  # the parent has one before the fork
    with multiprocessing.get_context("fork").Pool(2) as pool:
        assert pool.map(_read_in_worker, [(url, str(i)) for i in range(8)]) == [str(i).encode() for i in range(8)]


def _race(args):
    url, i = args
    return open_folder(url).write_if_absent("manifest.parquet", f"run {i}".encode())


@pytest.mark.slow
def test_moto_conditional_write_race_has_one_winner(moto_conditional_server, monkeypatch):
    """moto's server mode, because rclone ignores If-None-Match: of 8 processes writing the same
    object with If-None-Match: *, exactly one creates it and the others are told it exists."""
    moto_conditional_server.setenv(monkeypatch)
    bucket = moto_conditional_server.make_bucket("race")
    for round_ in range(2):
        url = f"{bucket}/run{round_}"
        with multiprocessing.get_context("fork").Pool(8) as pool:
            won = pool.map(_race, [(url, i) for i in range(8)])
        assert won.count(True) == 1, won
        assert open_folder(url).read("manifest.parquet") == f"run {won.index(True)}".encode()


def test_rclone_restart_keeps_objects(s3_server, monkeypatch):
    s3_server.setenv(monkeypatch)
    f = open_folder(s3_server.make_bucket("restart") + "/p")
    f.write("kept", b"still here")
    s3_server.restart()
    assert f.read("kept") == b"still here"
