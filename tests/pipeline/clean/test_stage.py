"""`pipe clean` as a whole: one row per file, resume, refusal, outputs, schemas."""

import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.clean import stage as clean
from pipeline.clean.stage import CleanConfig
from pipeline.core import schemas
from tests.factories import image_bytes, noise_rgb, photo, write


def run(src: Path, out: Path, **kw) -> dict:
    return clean.run(CleanConfig(src, out, workers=kw.pop("workers", 2), **kw), show_progress=False)


def rows(out: Path) -> dict[str, dict]:
    return {r["source"]: r for r in pq.read_table(out / "manifest.parquet").to_pylist()}


@pytest.fixture
def raw(tmp_path) -> Path:
    src = tmp_path / "raw"
    for i in range(4):
        photo(src / "cats" / f"c{i}.jpg", seed=i)
    arr = noise_rgb(200, 150, seed=9)
    write(src / "dogs" / "d.png", image_bytes(arr, "PNG"))
    write(src / "dogs" / "d_copy.bmp", image_bytes(arr, "BMP"))  # same pixels, other container
    write(src / "dogs" / "empty.jpg", b"")
    write(src / "notes.zip", b"PK\x03\x04" + bytes(100))
    write(src / "cats" / "c0.txt", "a grey cat")
    return src


def test_one_row_per_file_and_schema_valid(raw, tmp_path):
    out = tmp_path / "clean"
    report = run(raw, out)
    files = sorted(p.relative_to(raw).as_posix() for p in raw.rglob("*") if p.is_file())
    got = rows(out)
    assert sorted(got) == files
    for r in got.values():
        assert schemas.errors(r, "manifest_row") == [], r
    assert schemas.errors(json.loads((out / "report.json").read_text()), "report") == []
    assert report["files"] == len(files)
    assert sum(report["by_status"].values()) == len(files)


def test_statuses_reasons_and_outputs(raw, tmp_path):
    out = tmp_path / "clean"
    run(raw, out)
    got = rows(out)
    assert got["dogs/empty.jpg"]["reason"] == "zero_bytes"
    assert got["notes.zip"]["reason"] == "unsupported_format"
    assert (out / "quarantine" / "unsupported_format" / "notes.zip").read_bytes() == (raw / "notes.zip").read_bytes()
    # the same pixels in PNG and BMP are one image: the first path is kept
    assert got["dogs/d.png"]["status"] == "kept"
    assert got["dogs/d_copy.bmp"]["status"] == "duplicate"
    assert got["dogs/d_copy.bmp"]["reason"] == "exact_duplicate"
    assert got["dogs/d_copy.bmp"]["duplicate_of"] == "dogs/d.png"
    kept = [r for r in got.values() if r["status"] == "kept"]
    assert {r["output"] for r in kept} == {p.relative_to(out).as_posix() for p in (out / "data").rglob("*") if p.is_file()}
    assert got["cats/c0.jpg"]["key"] == got["cats/c0.txt"]["key"]


def test_rerun_reuses_and_is_byte_identical(raw, tmp_path):
    out = tmp_path / "clean"
    run(raw, out)
    before = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "report.json"}
    report = run(raw, out)
    after = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "report.json"}
    assert before == after
    assert report["reused"] == report["files"]


def test_changed_input_is_redone_and_removed_input_swept(raw, tmp_path):
    out = tmp_path / "clean"
    run(raw, out)
    photo(raw / "cats" / "c1.jpg", w=400, h=300, seed=42)
    os.utime(raw / "cats" / "c1.jpg", ns=(1, 1))
    (raw / "cats" / "c2.jpg").unlink()
    report = run(raw, out)
    got = rows(out)
    assert "cats/c2.jpg" not in got
    assert not list((out / "data").rglob("cats__c2.*"))
    assert got["cats/c1.jpg"]["width"] == 400
    assert report["reused"] == report["files"] - 1


def test_a_same_size_rewrite_with_its_old_mtime_put_back_is_redone(raw, tmp_path):
    """Resume must not trust size and mtime alone: tools that copy or restore files put the old
    mtime back (cp -p, rsync -t, os.utime), and then only the ctime tells the file changed."""
    out = tmp_path / "clean"
    run(raw, out)
    target = raw / "cats" / "c1.jpg"
    st = target.stat()
    data = bytearray(target.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 200] = bytes(200)  # damaged, same size
    target.write_bytes(bytes(data))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    report = run(raw, out)
    fresh = run(raw, tmp_path / "fresh")
    assert report["reused"] == report["files"] - 1
    assert rows(out)["cats/c1.jpg"] == rows(tmp_path / "fresh")["cats/c1.jpg"]
    assert fresh["files"] == report["files"]


def test_refuses_foreign_or_mismatched_dir_unless_overwrite(raw, tmp_path, cli):
    foreign = tmp_path / "foreign"
    write(foreign / "keep.me", "x")
    r = cli("clean", raw, "-o", foreign)
    assert r.exit_code == 2 and "not written by pipe clean" in r.stderr
    out = tmp_path / "clean"
    assert cli("clean", raw, "-o", out, "--workers", "1").exit_code == 0
    r = cli("clean", raw, "-o", out, "--size", "256")
    assert r.exit_code == 2 and "--size 512 -> 256" in r.stderr
    r = cli("clean", raw, "-o", out, "--size", "256", "--overwrite", "--workers", "1")
    assert r.exit_code == 0, r.stderr
    from PIL import Image

    kept = next(v for v in rows(out).values() if v["kind"] == "image" and v["status"] == "kept")
    assert Image.open(out / kept["output"]).size == (256, 256)


def test_inputs_are_never_modified(raw, tmp_path):
    snapshot = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in raw.rglob("*") if p.is_file()}
    run(raw, tmp_path / "clean")
    assert snapshot == {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in raw.rglob("*") if p.is_file()}


def test_config_file_precedence(raw, tmp_path, cli):
    cfg = write(tmp_path / "pipe.toml", "[clean]\nsize = 64\nquality = 50\n")
    out = tmp_path / "clean"
    r = cli("clean", raw, "-o", out, "--config", cfg, "--size", "96", "--workers", "1", "--json")
    assert r.exit_code == 0, r.stderr
    settings = json.loads(r.stdout)["settings"]
    assert settings["size"] == 96  # the command line beats the file
    assert settings["quality"] == 50  # the file beats the default
    bad = write(tmp_path / "bad.toml", "[clean]\nsise = 64\n")
    r = cli("clean", raw, "-o", tmp_path / "c2", "--config", bad)
    assert r.exit_code == 2 and "sise" in r.stderr


def test_json_output_is_the_report(raw, tmp_path, cli):
    r = cli("clean", raw, "-o", tmp_path / "clean", "--json", "--workers", "1")
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    assert doc == json.loads((tmp_path / "clean" / "report.json").read_text()) | {"timings": doc["timings"]}
    assert np.isclose(sum(doc["by_status"].values()), doc["files"])


def test_workers_0_starts_one_worker_per_core_the_cpu_quota_allows(raw, tmp_path, monkeypatch):
    """Under `docker --cpus=2` on a 64-core host, `pipe clean --workers 0` starts 2 workers, not 64."""
    from pipeline.core import cores
    from pipeline.executors import local as executor  # where the local executor makes its pools

    (tmp_path / "cgroup").mkdir()
    (tmp_path / "cgroup" / "cpu.max").write_text("200000 100000\n")
    monkeypatch.setattr(cores, "CGROUP_ROOT", str(tmp_path / "cgroup"))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    started = []
    real_pool = executor.OrderedPool

    def pool(fn, workers, **kw):
        started.append(workers)
        return real_pool(fn, workers, **kw)

    monkeypatch.setattr(executor, "OrderedPool", pool)
    run(raw, tmp_path / "clean", workers=0)
    assert started == [2]


def test_overwrite_never_deletes_a_folder_pipe_clean_did_not_write(raw, tmp_path, pipe_proc):
    mine = tmp_path / "mine"
    write(mine / "data" / "mydata.csv", "a,b\n1,2\n")
    write(mine / "report.json", '{"my": "report"}')
    p = pipe_proc("clean", raw, "-o", mine, "--overwrite", "--workers", "1")
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "not written by pipe clean" in lines[0], p.stderr
    assert (mine / "data" / "mydata.csv").read_text() == "a,b\n1,2\n"
    assert (mine / "report.json").read_text() == '{"my": "report"}'
    assert sorted(p.relative_to(mine).as_posix() for p in mine.rglob("*")) == ["data", "data/mydata.csv", "report.json"]


def test_a_second_run_into_a_folder_being_written_stops_with_one_line(raw, tmp_path, cli):
    import fcntl

    out = tmp_path / "clean"
    run(raw, out)
    manifest = (out / "manifest.parquet").read_bytes()
    with open(out / ".pipe" / "lock", "a") as held:  # what a run in progress holds
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        for flags in ([], ["--overwrite"]):
            r = cli("clean", raw, "-o", out, "--workers", "1", *flags)
            lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
            assert r.exit_code == 1 and len(lines) == 1 and "being written by another run" in lines[0], r.stderr
            assert (out / "manifest.parquet").read_bytes() == manifest  # the run in progress is left alone
    assert cli("clean", raw, "-o", out, "--workers", "1").exit_code == 0  # free again once it ends
    assert schemas.errors(json.loads((out / ".pipe" / "state.json").read_text()), "state") == []


def test_names_at_the_file_system_limit_never_crash_a_run(tmp_path):
    src = tmp_path / "raw"
    long_zip = "z" * 251 + ".zip"  # 255 bytes: legal, but no room for a temporary name's affixes
    long_photo = "p" * 250 + ".jpg"
    write(src / "cats" / long_zip, b"PK\x03\x04" + bytes(100))
    write(src / "cats" / ("y" * 251 + ".zip"), b"PK\x03\x04" + bytes(101))  # same first bytes of name
    photo(src / "cats" / long_photo, seed=1)
    photo(src / "cats" / "short.jpg", seed=2)
    out = tmp_path / "clean"
    for _ in range(2):  # and again, resuming
        report = run(src, out)
        assert report["files"] == 4
        got = rows(out)
        assert got[f"cats/{long_zip}"]["reason"] == "unsupported_format"
        assert (out / "quarantine" / "unsupported_format" / "cats" / long_zip).read_bytes() == b"PK\x03\x04" + bytes(100)
        assert got[f"cats/{long_photo}"]["status"] == "kept"
        assert not list(out.rglob("*.tmp"))


def test_captioned_copies_are_deduplicated_as_images(tmp_path):
    """Issue 14.3, end to end: captions made every copy of a photo unique, so byte copies, re-encodes
    and the same photo in two class folders were all kept."""
    src = tmp_path / "raw"
    arr = noise_rgb(320, 240, seed=3)
    photo_bytes = image_bytes(arr, "JPEG", quality=95)
    write(src / "cats" / "p.jpg", photo_bytes)
    write(src / "cats" / "p.txt", "a grey cat")
    write(src / "cats" / "p_copy.jpg", photo_bytes)  # a byte copy under another caption
    write(src / "cats" / "p_copy.txt", "my cat on the sofa")
    write(src / "cats" / "p_q60.jpg", image_bytes(arr, "JPEG", quality=60))  # re-encoded, no caption
    write(src / "cats" / "other.jpg", image_bytes(noise_rgb(320, 240, seed=4), "JPEG"))
    write(src / "cats" / "other.txt", "a grey cat")  # same caption, another picture: its own sample
    twin = noise_rgb(320, 240, seed=5)
    write(src / "cats" / "t.jpg", image_bytes(twin, "JPEG"))
    write(src / "cats" / "t.txt", "a cat")
    write(src / "dogs" / "t.jpg", image_bytes(twin, "JPEG"))  # the same photo filed as a dog
    write(src / "dogs" / "t.txt", "a dog")
    out = tmp_path / "clean"
    run(src, out)
    got = {s: (r["status"], r["reason"], r["duplicate_of"]) for s, r in rows(out).items()}
    assert got["cats/p.jpg"][0] == got["cats/p.txt"][0] == "kept"
    assert got["cats/p_copy.jpg"] == ("duplicate", "exact_duplicate", "cats/p.jpg")
    assert got["cats/p_copy.txt"] == ("duplicate", "exact_duplicate", "cats/p.txt")
    assert got["cats/p_q60.jpg"] == ("duplicate", "near_duplicate", "cats/p.jpg")
    assert got["cats/other.jpg"][0] == got["cats/other.txt"][0] == "kept"
    for s in ("cats/t.jpg", "cats/t.txt", "dogs/t.jpg", "dogs/t.txt"):
        assert got[s][:2] == ("quarantined", "label_conflict"), s
    assert not (out / "data" / "cats" / "p_copy.txt").exists()


def test_white_artwork_on_transparency_is_kept_visible_and_flat_images_are_blank(tmp_path):
    """Two white logos on transparency under two labels were kept as two blank white squares
    and called exact duplicates of each other; flat images are blank_image, never duplicates."""
    from PIL import Image

    from tests.image_samples import png
    from tests.image_samples import transparent_logo as logo

    src = tmp_path / "raw"
    write(src / "cats" / "logo.png", logo((255, 255, 255), shape=0))
    write(src / "dogs" / "logo.png", logo((255, 255, 255), shape=1))
    write(src / "cats" / "white.png", png(Image.new("RGB", (200, 200), (255, 255, 255))))
    write(src / "dogs" / "white.png", png(Image.new("RGB", (300, 100), (255, 255, 255))))
    photo(src / "dogs" / "photo.jpg", seed=1)
    run(src, tmp_path / "out")
    got = rows(tmp_path / "out")
    assert got["cats/logo.png"]["status"] == got["dogs/logo.png"]["status"] == "kept", got
    assert "composited on #000000" in got["cats/logo.png"]["detail"]
    assert got["cats/white.png"]["reason"] == got["dogs/white.png"]["reason"] == "blank_image"
    assert got["dogs/photo.jpg"]["status"] == "kept"
    assert sorted(p.name for p in (tmp_path / "out" / "quarantine" / "blank_image").rglob("*.png")) == ["white.png"] * 2


def test_an_empty_caption_leaves_its_image_kept_without_a_caption(tmp_path):
    src = tmp_path / "raw"
    photo(src / "cats" / "a.jpg", seed=1)
    write(src / "cats" / "a.txt", " \n\t\n")  # nothing after normalisation
    photo(src / "cats" / "b.jpg", seed=2)
    write(src / "cats" / "b.txt", b"")  # a zero-byte caption file
    run(src, tmp_path / "out", workers=1)
    got = {s: (r["status"], r["reason"]) for s, r in rows(tmp_path / "out").items()}
    assert got == {"cats/a.jpg": ("kept", None), "cats/a.txt": ("quarantined", "empty_text"),
                   "cats/b.jpg": ("kept", None), "cats/b.txt": ("quarantined", "zero_bytes")}


def test_16_bit_scientific_images_keep_their_content_and_say_how(tmp_path, cli):
    """10- and 12-bit content in 16-bit files was scaled as if it used 0-65535: 12 bits came out
    in 16 grey levels, 10 bits as one flat colour quarantined as blank_image."""
    from tests import nasty
    from tests.tiffs import tiff

    rng = np.random.default_rng(4)
    src = tmp_path / "raw"
    for bits, name in ((10, "xray.png"), (12, "cells.tif"), (14, "stars.tif")):
        px = rng.integers(0, 2**bits, (96, 96)).astype(np.uint16)
        write(src / "scans" / name, nasty.png(px, 0, 16) if name.endswith(".png") else tiff(px))
    write(src / "scans" / "flat.png", nasty.png(np.full((96, 96), 700, np.uint16), 0, 16))
    r = cli("clean", src, "-o", tmp_path / "out", "--workers", "1", "--json")
    assert r.exit_code == 0, r.stderr
    got = rows(tmp_path / "out")
    for name, bits in (("xray.png", 10), ("cells.tif", 12), ("stars.tif", 14)):
        row = got[f"scans/{name}"]
        assert row["status"] == "kept" and f"rounded up to {bits} bits" in row["detail"], row
    assert got["scans/flat.png"]["reason"] == "blank_image"
    assert "every pixel of the 16-bit grey source has the same value 700" in got["scans/flat.png"]["detail"]
    assert json.loads(r.stdout)["settings"]["window"] == "auto"
    r = cli("clean", src, "-o", tmp_path / "out2", "--workers", "1", "--window", "0.5, 99.5", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["settings"]["window"] == "0.5,99.5"
    assert "0.5th to 99.5th percentile" in rows(tmp_path / "out2")["scans/cells.tif"]["detail"]
    r = cli("clean", src, "-o", tmp_path / "out3", "--window", "99,1")
    assert r.exit_code == 2 and "--window '99,1' is not a window" in r.stderr
    bad = write(tmp_path / "bad.toml", '[clean]\nwindow = "p1,p99"\n')
    assert cli("clean", src, "-o", tmp_path / "out4", "--config", bad).exit_code == 2


@pytest.mark.parametrize("names", [("a.jpg", "b.jpg"), ("a.jpg", "a.png")], ids=["first-keyed-by-its-slug", "first-slug-shared"])
def test_the_first_file_started_ahead_changes_nothing(tmp_path, monkeypatch, names):
    # a new CLEAN_DIR's first files are started before the listing is made, keyed by their slugs;
    # when another file shares a slug its key differs, and the work started ahead is dropped
    from pipeline.core.executor import OrderedPool

    src = tmp_path / "raw"
    for i, name in enumerate(names):
        photo(src / name, seed=i, fmt="PNG" if name.endswith(".png") else "JPEG")
    started = []
    ahead = OrderedPool.ahead
    monkeypatch.setattr(OrderedPool, "ahead", lambda self, first: (started.extend(c.key for c in first), ahead(self, first)))
    run(src, tmp_path / "with", workers=1)
    monkeypatch.setattr(OrderedPool, "ahead", lambda self, first: None)
    run(src, tmp_path / "without", workers=1)
    assert started == ["a", "b" if names[1] == "b.jpg" else "a"]

    def files(out: Path) -> dict[str, bytes]:
        return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
                if p.is_file() and p.name != "report.json" and ".pipe" not in p.parts}

    assert files(tmp_path / "with") == files(tmp_path / "without")
    assert ("data/a.jpg" in files(tmp_path / "with")) == (names[1] == "b.jpg")
