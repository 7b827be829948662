"""The folder prior in `pipe clean`: a folder of short captions in one legacy code page is read in
it, the manifest says where the prior decided, a rerun is byte-identical, intruders keep theirs."""

import io
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.clean import stage as clean
from pipeline.clean.stage import CleanConfig
from pipeline.media.text.clean import clean_text, text_hash
from tests.conftest import pipe_env
from tests.factories import write
from tests.s3server import s3_server  # noqa: F401 - the fixture
from tests.text_samples import LANGUAGES


def _sentences(lang: str) -> list[str]:
    return [s.strip() + "." for s in LANGUAGES[lang][1].split(".") if len(s.strip()) > 20]


def _words(lang: str) -> list[str]:
    """One-word captions beyond ASCII: too little for a per-file detector to tell code pages apart."""
    return sorted({w.strip(".,:!") for w in LANGUAGES[lang][1].split()} - {""}, key=str)


def _captions(src: Path, folder: str, texts: list[str], enc: str) -> dict[str, str]:
    out = {}
    for i, t in enumerate(texts):
        if t.isascii() or len(t) <= 3:
            continue
        write(src / folder / f"{i:03d}.txt", t.encode(enc))
        out[f"{folder}/{i:03d}.txt"] = t
    return out


def _manifest(out: Path) -> dict[str, dict]:
    return {r["source"]: r for r in pq.read_table(out / "manifest.parquet").to_pylist()}


def test_a_folder_of_short_captions_is_read_in_its_code_page_and_says_so(tmp_path):
    src, out = tmp_path / "raw", tmp_path / "clean"
    truth = _captions(src, "ar", _sentences("ar") + _words("ar"), "cp1256")
    # a Russian folder in cp1251 holding one KOI8-R caption: a confident intruder keeps its reading
    ru = _sentences("ru")
    truth.update(_captions(src, "ru", ru[:-1] + _words("ru"), "cp1251"))
    write(src / "ru" / "zz_koi8.txt", ru[-1].encode("koi8_r"))
    alone = {s: clean_text((src / s).read_bytes()).text for s in truth}
    misread = {s for s, t in truth.items() if alone[s] != t}
    assert misread  # the case the prior is for: per file, some short captions read in a neighbour

    report = clean.run(CleanConfig(src, out, workers=1), show_progress=False)
    rows = _manifest(out)
    for s, t in truth.items():
        r = rows[s]
        assert r["status"] == "kept", r
        assert (out / r["output"]).read_text(encoding="utf-8") == t, s
        assert ("other files of its folder" in r["detail"]) == (s in misread), r
        if s in misread:  # (the others may name a code page that reads them the same: kz1048 for cp1251)
            assert r["encoding"] == ("cp1256" if s.startswith("ar/") else "cp1251"), r
    koi = rows["ru/zz_koi8.txt"]
    assert (koi["encoding"], koi["status"]) == ("koi8-r", "kept")
    assert (out / koi["output"]).read_text(encoding="utf-8") == ru[-1]
    assert "other files of its folder" not in koi["detail"]
    assert report["folder_prior"] == {"files": len(misread), "folders": len({s.split("/")[0] for s in misread})}

    manifest = (out / "manifest.parquet").read_bytes()
    outputs = {p: p.read_bytes() for p in (out / "data").rglob("*") if p.is_file()}
    again = clean.run(CleanConfig(src, out, workers=1), show_progress=False)
    assert again["reused"] == len(rows)  # (outputs the prior wrote are not the size their parts recorded)
    assert again["folder_prior"] == report["folder_prior"]

    parts = tmp_path / "in-parts"  # folders cut across parts read the same
    clean.run(CleanConfig(src, parts, workers=1, part_files=7), show_progress=False)
    assert pq.read_table(parts / "manifest.parquet").to_pylist() == pq.read_table(out / "manifest.parquet").to_pylist()
    assert (out / "manifest.parquet").read_bytes() == manifest
    assert {p: p.read_bytes() for p in (out / "data").rglob("*") if p.is_file()} == outputs


def test_where_the_prior_no_longer_decides_a_rerun_writes_back_the_files_own_reading(tmp_path):
    src, out = tmp_path / "raw", tmp_path / "clean"
    truth = _captions(src, "ar", _sentences("ar") + _words("ar"), "cp1256")
    first = clean.run(CleanConfig(src, out, workers=1), show_progress=False)
    decided = [s for s, r in _manifest(out).items() if "other files of its folder" in r["detail"]]
    assert first["folder_prior"]["files"] == len(decided) > 0
    for s in truth:  # the folder loses its evidence: only the files the prior decided are left
        if s not in decided:
            (src / s).unlink()
    report = clean.run(CleanConfig(src, out, workers=1), show_progress=False)
    assert report["reused"] == len(decided)
    rows = _manifest(out)
    assert sorted(rows) == sorted(decided)
    still = [s for s, r in rows.items() if "other files of its folder" in r["detail"]]
    assert len(still) < len(decided)  # some have lost the folder that decided them...
    for s, r in rows.items():
        own = clean_text((src / s).read_bytes())
        if s not in still:  # ...and are what they are on their own, output included
            assert (r["encoding"], r["content_hash"]) == (own.encoding, own.content_hash)
        if r["status"] == "kept":
            assert text_hash((out / r["output"]).read_text(encoding="utf-8")) == r["content_hash"]
    assert report.get("folder_prior", {}).get("files", 0) == len(still)


@pytest.mark.slow
def test_an_s3_input_and_output_get_the_local_runs_readings(s3_server, tmp_path, monkeypatch):  # noqa: F811
    """The prior re-reads the files through the input folder and writes through the output one:
    s3:// to s3:// gives the local run's manifest rows and outputs."""
    from pipeline.storage import open_folder

    src, out = tmp_path / "raw", tmp_path / "clean"
    _captions(src, "ar", _sentences("ar") + _words("ar"), "cp1256")
    local = clean.run(CleanConfig(src, out, workers=1), show_progress=False)
    assert local["folder_prior"]["files"] > 0
    s3_server.setenv(monkeypatch)
    bucket = s3_server.make_bucket("prior")
    raw = open_folder(f"{bucket}/raw")
    for p in sorted(src.rglob("*.txt")):
        raw.write(p.relative_to(src).as_posix(), p.read_bytes())
    env = {**pipe_env(), **s3_server.env}
    p = subprocess.run([sys.executable, "-m", "pipeline", "clean", f"{bucket}/raw", "-o", f"{bucket}/clean", "--workers", "1",
                        "--json"], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["folder_prior"] == local["folder_prior"]
    done = open_folder(f"{bucket}/clean")
    rows = pq.read_table(io.BytesIO(done.read("manifest.parquet"))).to_pylist()
    assert rows == pq.read_table(out / "manifest.parquet").to_pylist()
    for r in rows:
        assert done.read(r["output"]) == (out / r["output"]).read_bytes()
    assert done.read(".pipe/prior.json") == (out / ".pipe" / "prior.json").read_bytes()


def test_utf16_captions_without_a_byte_order_mark_misread_or_refused_alone_are_read_in_their_folder(tmp_path):
    src, out = tmp_path / "raw", tmp_path / "clean"
    truth = _captions(src, "ko", _sentences("ko") + _words("ko"), "utf-16-le")
    alone = {s: clean_text((src / s).read_bytes()) for s in truth}
    refused = {s for s, o in alone.items() if o.reason is not None}
    assert refused  # four Hangul syllables in UTF-16 read as something else, or as nothing, on their own
    clean.run(CleanConfig(src, out, workers=1), show_progress=False)
    rows = _manifest(out)
    right = {s for s, t in truth.items() if rows[s]["status"] == "kept"
             and (out / rows[s]["output"]).read_text(encoding="utf-8") == t}
    assert refused <= right
    assert right >= {s for s, o in alone.items() if o.text == truth[s]}  # never worse than each file alone
    assert len(right) > len(truth) - len(refused)
    for s in refused:
        assert rows[s]["encoding"] == "utf-16-le" and "other files of its folder" in rows[s]["detail"]
