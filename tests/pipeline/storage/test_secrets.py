"""The one scrubber: every URL pipe prints or records is parsed and loses its credentials, query
and fragment; the secrets of the environment are masked in any encoding. The attacks are built:
an endpoint whose password holds a "/" (raw and percent-encoded), live and dead, a Ray address
with a password, and a library that warns and logs with the secret in its line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.settings import as_dict
from pipeline.storage import open_folder
from pipeline.storage.secrets import scrub, scrub_json, scrub_url
from tests.conftest import pipe_env
from tests.factories import photo
from tests.s3server import free_port

SECRET = "se/cret-0f1e2d3c"  # an AWS-style secret: it holds a "/"
FORMS = (SECRET, "se%2Fcret-0f1e2d3c", "se%2fcret-0f1e2d3c", "cret-0f1e2d3c")  # any of these in any output is a leak


@pytest.mark.parametrize(("url", "clean"), [
    ("http://KEY:se/cret@127.0.0.4:9000", "http://127.0.0.4:9000"),
    ("http://KEY:se%2Fcret@127.0.0.4:9000/bucket/k", "http://127.0.0.4:9000/bucket/k"),
    ("https://host/k?X-Amz-Signature=abc&X-Amz-Credential=AKIA#frag", "https://host/k"),
    ("ray://user:pw@10.0.0.1:10001", "ray://10.0.0.1:10001"),
    ("http://[::1]:80/p?q=1", "http://[::1]:80/p"),
    ("s3://bucket/team@x/raw", "s3://bucket/team@x/raw"),  # a bucket URL's "@" in a key is no userinfo
    ("s3://bucket/prefix", "s3://bucket/prefix"),
    ("http://[unbalanced/x", "http://***"),
])
def test_a_url_loses_userinfo_query_and_fragment_by_its_grammar(url, clean):
    assert scrub_url(url) == clean


def test_urls_in_sentences_and_percent_encoded_urls_are_scrubbed(monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    said = ("Custom endpoint `http://KEY:se/cret@h:1` was not a valid URI; "
            'Could not connect to the endpoint URL: "http://KEY:se%2Fcret@h:1/b". '
            "redirect=http%3A%2F%2FKEY%3Ase%252Fcret%40h%2Fx%3Fsig%3D1 (see http://h/a?b).")
    clean = scrub(said)
    assert "cret" not in clean and "sig" not in clean and "?b" not in clean
    assert "`http://h:1`" in clean and '"http://h:1/b".' in clean and "(see http://h/a)." in clean
    plain = "no url here: /data/cats/a.jpg, a caption? yes; s3://bucket/p"
    assert scrub(plain) == plain


def test_the_environment_s_secrets_are_masked_in_every_form(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCY")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://KEY:{SECRET}@h:1")
    for form in ("wJalrXUtnFEMI/K7MDENG+bPxRfiCY", "wJalrXUtnFEMI%2FK7MDENG%2BbPxRfiCY", *FORMS[:3]):
        assert scrub(f"said {form} here") == "said *** here", form


def test_settings_are_recorded_scrubbed():
    from dataclasses import dataclass

    @dataclass
    class Cfg:
        input: Path
        ray_address: str
        size: int

    doc = as_dict(Cfg(Path("/data/raw"), "ray://u:pw@10.0.0.1:10001?token=t", 512))
    assert doc == {"input": "/data/raw", "ray_address": "ray://10.0.0.1:10001", "size": 512}
    assert scrub_json({"a": ["http://u:p@h/x?y", 1, None]}) == {"a": ["http://h/x", 1, None]}


def test_what_a_library_warns_or_logs_on_its_own_is_scrubbed():
    """The Ray client warns with its address, urllib3 logs through logging's last resort: a real
    interpreter with the hooks a command installs, its stderr read back."""
    code = ("from pipeline.storage.secrets import install; install(); import logging, warnings\n"
            f"warnings.warn('connect to ray://u:{SECRET}@10.0.0.1:1 timed out')\n"
            f"logging.getLogger('urllib3').warning('retrying http://u:%s@h:1/b?sig=1', {SECRET!r})\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=pipe_env(), timeout=60)
    assert p.returncode == 0, p.stderr
    assert "ray://10.0.0.1:1 timed out" in p.stderr and "retrying http://h:1/b" in p.stderr
    assert not [f for f in FORMS if f in p.stderr], p.stderr


def _pipe(env: dict, *args, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], capture_output=True, text=True,
                          env={**pipe_env(), **env}, timeout=300, cwd=cwd)


def _leaks(*texts: str | bytes) -> list[str]:
    found = []
    for text in texts:
        data = text.encode() if isinstance(text, str) else text
        found += [f for f in FORMS if f.encode() in data]
    return found


@pytest.fixture
def raw_in_bucket(s3_server, monkeypatch, tmp_path) -> str:
    s3_server.setenv(monkeypatch)
    url = s3_server.make_bucket("secrets") + "/raw"
    folder = open_folder(url)
    for i in range(2):
        photo(tmp_path / f"{i}.jpg", seed=i)
        folder.write(f"cats/{i}.jpg", (tmp_path / f"{i}.jpg").read_bytes())
    return url


@pytest.mark.parametrize("live", [True, False], ids=["live-endpoint", "dead-endpoint"])
def test_an_endpoint_password_with_a_slash_is_refused_in_one_line_without_it(s3_server, raw_in_bucket, tmp_path, live):
    port = s3_server.port if live else free_port(s3_server.host)
    env = {**s3_server.env, "AWS_ENDPOINT_URL": f"http://KEY:{SECRET}@{s3_server.host}:{port}", "AWS_MAX_ATTEMPTS": "1"}
    p = _pipe(env, "clean", raw_in_bucket, "-o", tmp_path / "out", "--workers", "1")
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "AWS_ENDPOINT_URL is no valid URL" in p.stderr, p.stderr
    assert not _leaks(p.stdout, p.stderr)


@pytest.mark.slow
def test_a_percent_encoded_endpoint_password_is_in_nothing_said_or_written(s3_server, raw_in_bucket, tmp_path):
    """The password written as %2F works against the live server: nothing the run prints or
    writes (local output, the bucket's objects) holds it in any form; against a dead port the
    one line that says so does not either."""
    live = {**s3_server.env, "AWS_ENDPOINT_URL": f"http://KEY:se%2Fcret-0f1e2d3c@{s3_server.host}:{s3_server.port}"}
    out_url = raw_in_bucket.rsplit("/", 1)[0] + "/clean"
    runs = [_pipe(live, "clean", raw_in_bucket, "-o", tmp_path / "local", "--workers", "1", "--json"),
            _pipe(live, "clean", raw_in_bucket, "-o", out_url, "--workers", "1"),
            _pipe(live, "shard", out_url, "-o", tmp_path / "shards", "--workers", "1"),
            _pipe(live, "check", out_url, "--json")]
    assert [p.returncode for p in runs] in ([0, 0, 0, 0], [0, 0, 0, 1]), [p.stderr for p in runs]  # (check: a policy verdict)
    dead = {**live, "AWS_ENDPOINT_URL": f"http://KEY:se%2Fcret-0f1e2d3c@{s3_server.host}:{free_port(s3_server.host)}",
            "AWS_MAX_ATTEMPTS": "1"}
    failed = _pipe(dead, "clean", raw_in_bucket, "-o", tmp_path / "never", "--workers", "1")
    assert failed.returncode == 1 and len(failed.stderr.strip().splitlines()) == 1, failed.stderr
    assert "Could not connect" in failed.stderr
    written = [p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()]
    bucket = open_folder(raw_in_bucket.rsplit("/", 1)[0])
    written += [bucket.read(e.rel) for e in bucket.list()]
    assert not _leaks(*[p.stdout + p.stderr for p in [*runs, failed]], *written)


def test_a_ray_address_password_is_in_no_report_marker_or_line(tmp_path):
    raw = tmp_path / "raw"
    photo(raw / "cats" / "a.jpg", seed=1)
    address = f"ray://u:{SECRET}@127.0.0.9:1?token={SECRET}"
    p = _pipe({}, "clean", raw, "-o", tmp_path / "out", "--workers", "1", "--ray-address", address, "--json")
    assert p.returncode == 0, p.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["settings"]["ray_address"] == "ray://127.0.0.9:1"
    written = [f.read_bytes() for f in (tmp_path / "out").rglob("*") if f.is_file()]
    assert not _leaks(p.stdout, p.stderr, *written)
