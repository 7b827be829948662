"""Shards written today are byte for byte the shards pipe shard wrote before its writer was
rebuilt for speed (main at 55e288f): the digests below were taken from that code on this very
CLEAN_DIR. Readers, resumed runs and a user's checksums all rely on the bytes staying the same.

The CLEAN_DIR is made of bytes the test chooses (no image encoder involved, so no library
version moves them) and holds what the writer must get right: images of every extension and
of sizes around the 512-byte block (0, 511, 512, 513), texts, image+text pairs, a labels-file
caption, keys that need making safe (and two that then collide), a key too long for a tar
name, unlabelled and not-kept rows, non-ASCII labels, sources and texts, near-duplicate
hashes, sources and labels JSON must escape, missing or odd numbers, and pixel sums recorded
by pipe clean.
"""

import hashlib
import json
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.formats.manifest import COLUMNS
from pipeline.shard import stage

EXTS = ("jpg", "png", "webp", "JPEG")
SIZES = (0, 1, 511, 512, 513, 1024, 1500, 2900)


def blob(seed: int, n: int) -> bytes:
    out, i = b"", 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}/{i}".encode()).digest()
        i += 1
    return out[:n]


def row(**kw) -> dict:
    base = {name: None for name in COLUMNS.names}
    base.update(status="kept", reason=None, detail="", duplicate_of=None, bytes=1, sha256="0" * 64, caption="")
    base.update(kw)
    return base


def put(root, rel: str, data: bytes) -> str:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_bytes(data)
    return rel


def image_row(root, key: str, label, i: int, **kw) -> dict:
    ext = EXTS[i % len(EXTS)]
    out = put(root, f"data/{label or 'none'}/{key}.{ext}", blob(i, SIZES[i % len(SIZES)] + (i % 5) * 97))
    return row(source=f"{label or 'none'}/{key}.{ext}", key=key, kind="image", label=label, output=out,
               width=None if i % 11 == 0 else 40 + i, height=30 + i, phash=f"{(i * 0x9E3779B97F4A7C15) % 2**64:016x}",
               output_width=16, output_height=16, pixel_sums=[i * 7, i * 11 + 3, 4000 - i],
               pixel_squares=[i * i * 50, i * 900 + 7, 900_000 - i]) | kw


def text_row(root, key: str, label, i: int, **kw) -> dict:
    out = put(root, f"data/{label or 'none'}/{key}.txt", f"text {i} — ünïcode ✓ {'x' * (i * 37 % 700)}".encode())
    return row(source=f"{label or 'none'}/{key}.txt", key=key, kind="text", label=label, output=out,
               encoding="utf-8" if i % 3 else "cp1252", encoding_confidence=round(0.5 + i / 200, 3)) | kw


def golden_clean_dir(root):
    rows = []
    labels = ["cat", "dog", "élan"]
    for i in range(72):
        key, label = f"s{i:03d}", labels[i % 3]
        if i % 4 != 3:
            rows.append(image_row(root, key, label, i))
        if i % 4 in (2, 3):
            rows.append(text_row(root, key, label, i))
    rows.append(image_row(root, "cap01", "dog", 80, caption=put(root, "data/dog/cap01.caption.txt", "a caption ✓".encode())))
    near = int(rows[0]["phash"], 16)
    rows.append(image_row(root, "near1", "cat", 81))
    rows[-1]["phash"] = f"{near ^ 0b101:016x}"  # 2 bits from s000: one side of the split together
    rows.append(image_row(root, "a.b", "cat", 82))  # shard key a_b ...
    rows.append(image_row(root, "a_b", "cat", 83))  # ... taken: this one gets a hash tail
    rows.append(text_row(root, "we ird/key", "dog", 84))
    rows.append(image_row(root, "k" * 95, "élan", 85))
    rows.append(image_row(root, "nolabel", None, 86))
    rows.append(text_row(root, "emptylabel", "", 87))
    odd = image_row(root, "odd1", "cat", 88)
    odd.update(source='cat/we"ird\\na\tme.jpg', width=None, height=None, phash="ABCDEF0123456789")
    rows.append(odd)
    rows.append(image_row(root, "pair2", "dog", 89, caption=put(root, "data/dog/pair2.caption.txt", b"ignored: the text row wins")))
    rows.append(text_row(root, "pair2", "dog", 89, encoding=None, encoding_confidence=None))
    rows.append(text_row(root, "nan1", "qu\"ote", 90, encoding_confidence=float("nan")))
    rows.append(text_row(root, "tiny1", "qu\"ote", 91, encoding_confidence=1e-05))
    rows.append(image_row(root, "ключ", "élan", 92))  # made safe: "x" ...
    rows.append(image_row(root, "ключ2", "élan", 93, phash="0x0123456789abcd"))  # ... "2"; and a phash int() reads
    rows.append(row(source="cat/bad.jpg", key="bad", kind="image", label="cat", status="quarantined", reason="corrupt", output=""))
    rows.append(row(source="cat/dup.jpg", key="dup", kind="image", label="cat", status="duplicate", reason="exact_duplicate",
                    output="", duplicate_of="cat/s000.jpg"))
    pq.write_table(pa.Table.from_pylist(rows, schema=COLUMNS), root / "manifest.parquet")
    return root


def digests(out) -> dict:
    """sha256 of every file in SHARD_DIR; index.json without what names the pipe version and the Parquet writer."""
    found = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir() if p.suffix == ".tar"}
    index = json.loads((out / "index.json").read_text())
    del index["manifest_sha256"], index["created_by"]
    found["index.json"] = hashlib.sha256(json.dumps(index, sort_keys=True).encode()).hexdigest()
    return found


SETTINGS = {
    "small shards": {"max_count": 7, "val_fraction": 0.2, "seed": 5},
    "by size": {"max_size": 24_576, "val_fraction": 0.1, "seed": 0},
}
GOLDEN: dict[str, dict[str, str]] = {'by size': {'index.json': 'c6e3c8c2a26b71267b80bc9c38d67c1f9a7209aa838d260ef460993cb95512f8',
             'train-000000.tar': 'd757f33dd059520cdc2387f15d97b8164f97c64fbbc4224660f5edecec5a2f9f',
             'train-000001.tar': '18a9eea1cef9e861241b2d692c0766b347be1f4d73f8c10b2c6e46e976b32878',
             'train-000002.tar': '2fdbc0f149bd8f11b6f1c3da0346abffcedb4fbbcce5a2f902c9c15c11004be7',
             'train-000003.tar': '03a31d9f8fe71e0967e1ae40e54414c69859a3a1a5a1442f357a3ee3481fa0a9',
             'train-000004.tar': '3bd8a43a22374b4fcb7adea8fca894c7f7428eb10f43af078c90f9d0f8043528',
             'train-000005.tar': '17b81c3e86fe1f53e4a16fd9711776627061695936a8d640798e3f4ae8cf458b',
             'train-000006.tar': '555b0267b8b2df9cb846aec5096e504388d9dc791fedc02c760f64b0675bd0c9',
             'train-000007.tar': '89afc8e6e345830da1d4a6bfa0b0f70dd47adc1a55825a619d3b9a69a6bf8c96',
             'train-000008.tar': 'e1496a45a234cf0b55d9c662d393bf3df4a6729f17b8997674210b0e9ac32738',
             'train-000009.tar': '7f5d58271e7f95b0eace3d941574348f9d7d53c17635255fdd944f3483a7bddb',
             'train-000010.tar': 'c0899dd6abcece948366dbe1a92c78479741f4a452c0d4f443cce7110928a83d',
             'train-000011.tar': 'b2f7bfb663a0430a1589902f9eda8355b098467c0a26ba7ec29affa12efdb188',
             'train-000012.tar': '9f3682eec386e0545721e45aaa97910c6ff27bfbfa1442c889ff53df1698eb59',
             'val-000000.tar': 'b19c864871587f334a6abcfb57be284314d4032270531306757bac65d26d6896',
             'val-000001.tar': '4191546be97e08e63575edad20723893372ed09a6557c2c5d47e1c8bae961614'},
 'small shards': {'index.json': '68dcb1fd004b2e8573c208dad48c9a09e23c14826af9883e372e8dfbce92932e',
                  'train-000000.tar': 'd6bcc68753e68c402d8eff2157093f84a245da9ab42ce371e5d92c55ec25b94f',
                  'train-000001.tar': 'ae1d9364996026cd68e00a8efe9d6e26176592d4aa93c20d425bbe9343d28048',
                  'train-000002.tar': 'd8cf8295c879ccc01e991e24e19b023d3ed5d97cc89b3b0b6b05794b2417b0bd',
                  'train-000003.tar': 'e3a2e6ea0366a5d7726a7304d5e0774c43717422582c3c9d2a929f92e9bb12e6',
                  'train-000004.tar': '05471721f6064bc7e72f4be1b31936422e27d7a3b60231c2a981ebad64fa560d',
                  'train-000005.tar': '91751c09d65f7829f1f6cf6febb6f609bd0befe1985c20514d3768cd9c449ed9',
                  'train-000006.tar': 'f51a561bb173630a538c39d31d56122a327c432077f01e28af90fc3a1d5be875',
                  'train-000007.tar': '73136a12a3f9dfcc6893cd4c09d3d7568354b609f23199157b4b2c4311a6bf07',
                  'train-000008.tar': '788b9fb9c41a4e5d05ef7ccdc57df6b20b41f7421b660750fa4f2df222fb40fc',
                  'train-000009.tar': '6a3d200657118fe7efbd83702be54643206a87dd105f828bee48844ee999a5e6',
                  'val-000000.tar': '635e125e4f784658d8c6fca5b02d63b7901dd2fd543c64c05105d2f6385f020e',
                  'val-000001.tar': 'de8103d908829e32528371a1e5c3ba1f411c7b70f7b77b07ca60d5bab6e19e06',
                  'val-000002.tar': 'c3de8d5ff38490f75f3e61c8b91d650b7c7b70e052bfea8dd0a60dc969643804'}}  # from main at 55e288f


@pytest.mark.parametrize("settings", SETTINGS)
def test_shards_are_byte_identical_to_those_of_the_writer_before(tmp_path, settings):
    clean = golden_clean_dir(tmp_path / "clean")
    stage.run(stage.ShardConfig(clean, tmp_path / "out", workers=1, **SETTINGS[settings]), show_progress=False)
    assert digests(tmp_path / "out") == GOLDEN[settings]


def test_files_larger_than_the_write_window_give_the_same_bytes(tmp_path, monkeypatch):
    """A member larger than the writer's window is streamed through it (big images, long texts)."""
    from pipeline.shard import write

    monkeypatch.setattr(write, "WINDOW", 1024)  # most files here are larger: streamed; the rest share windows
    clean = golden_clean_dir(tmp_path / "clean")
    stage.run(stage.ShardConfig(clean, tmp_path / "out", workers=1, **SETTINGS["small shards"]), show_progress=False)
    assert digests(tmp_path / "out") == GOLDEN["small shards"]


def test_shards_written_by_two_processes_are_the_bytes_one_writes(tmp_path, monkeypatch):
    """Many shards on 2 workers: this process and a helper write them (`LocalExecutor.run_parts`);
    shards, index.json and the journal are the bytes one process writes."""
    from pipeline.core.prestart import warm_up
    from pipeline.executors import local

    clean = golden_clean_dir(tmp_path / "clean")
    settings = {**SETTINGS["small shards"], "max_count": 1}  # a shard a sample: many parts
    stage.run(stage.ShardConfig(clean, tmp_path / "one", workers=1, **settings), show_progress=False)
    monkeypatch.setattr(local, "SHARED_PARTS", 0)
    warm_up((stage.__name__,))  # the helper's fork server ready, so that it takes parts before they run out
    taken, take = [], local._Helpers.take

    def counted(helpers, i, call):  # this process waits a little on its parts while the helper starts
        if take(helpers, i, call):
            taken.append(i)
            return True
        if not helpers.pool.ready():
            time.sleep(0.1)
        return False

    monkeypatch.setattr(local._Helpers, "take", counted)
    stage.run(stage.ShardConfig(clean, tmp_path / "two", workers=2, **settings), show_progress=False)
    assert taken, "no part was written by the helper: the comparison below would say nothing"
    assert digests(tmp_path / "two") == digests(tmp_path / "one")
    assert (tmp_path / "two/.pipe/shards.jsonl").read_bytes() == (tmp_path / "one/.pipe/shards.jsonl").read_bytes()
