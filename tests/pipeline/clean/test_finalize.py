"""pipe clean's last phase: what a rejected input costs in quarantine/."""

from __future__ import annotations

import errno
import json
import os

import pyarrow.parquet as pq

from tests.factories import photo, write


def _rows(out) -> dict[str, dict]:
    return {r["source"]: r for r in pq.read_table(out / "manifest.parquet").to_pylist()}


def _raw(tmp_path):
    raw = tmp_path / "raw"
    photo(raw / "cat" / "a.jpg", seed=1)
    write(raw / "cat" / "big.txt", "a long, long caption " * 40)  # 840 bytes > --max-text-bytes 200
    write(raw / "cat" / "broken.jpg", (raw / "cat" / "a.jpg").read_bytes()[:200])
    return raw


def test_an_input_too_large_is_linked_into_quarantine_not_copied(cli, tmp_path):
    """Its bytes are not written a second time (a 1 GB text cost another 1 GB): the quarantine
    entry is the input itself, by a hard link; any other rejected input is still copied."""
    raw, out = _raw(tmp_path), tmp_path / "clean"
    r = cli("clean", raw, "-o", out, "--max-text-bytes", "200", "--workers", "1")
    assert r.exit_code == 0, r.output
    assert _rows(out)["cat/big.txt"]["reason"] == "too_large"
    linked = out / "quarantine" / "too_large" / "cat" / "big.txt"
    assert os.path.samefile(linked, raw / "cat" / "big.txt")
    copied = out / "quarantine" / "truncated" / "cat" / "broken.jpg"
    assert copied.read_bytes() == (raw / "cat" / "broken.jpg").read_bytes()
    assert not os.path.samefile(copied, raw / "cat" / "broken.jpg")
    r = cli("clean", raw, "-o", out, "--max-text-bytes", "200", "--workers", "1")  # a rerun keeps the link
    assert r.exit_code == 0, r.output and os.path.samefile(linked, raw / "cat" / "big.txt")


def test_where_no_link_can_be_made_the_manifest_row_is_the_reference(cli, tmp_path, monkeypatch):
    """Another file system (or object storage, which links nothing): nothing is copied; the row
    keeps where the input is, its size and sha256, and the page reads it from there."""
    raw, out = _raw(tmp_path), tmp_path / "clean"

    link = os.link

    def cross_device(src, dst, *args, **kwargs):  # the input on another file system than CLEAN_DIR
        if str(src).startswith(str(raw)):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return link(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", cross_device)
    r = cli("clean", raw, "-o", out, "--max-text-bytes", "200", "--workers", "1")
    assert r.exit_code == 0, r.output
    row = _rows(out)["cat/big.txt"]
    assert row["reason"] == "too_large" and row["bytes"] == 840 and len(row["sha256"]) == 64
    assert not (out / "quarantine" / "too_large").exists()
    assert (out / "quarantine" / "truncated" / "cat" / "broken.jpg").is_file()
    assert not any(p.name.startswith(".") for p in out.rglob("*") if p.is_file() and ".pipe" not in p.parts)
    report = json.loads((out / "report.json").read_text())
    assert report["by_reason"]["too_large"] == 1
