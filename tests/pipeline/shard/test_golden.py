"""Shards written today are byte for byte the shards pipe shard wrote before its writer was
rebuilt for speed (main at 55e288f): the digests below were taken from that code on this very
CLEAN_DIR. Readers, resumed runs and a user's checksums all rely on the bytes staying the same.

The CLEAN_DIR is made of bytes the test chooses (no image encoder involved, so no library
version moves them) and holds what the writer must get right: images of every extension and
of sizes around the 512-byte block (0, 511, 512, 513), texts, image+text pairs, a labels-file
caption, keys that need making safe (and two that then collide), a key too long for a tar
name, unlabelled and not-kept rows, non-ASCII labels, sources and texts, near-duplicate
hashes, and pixel sums recorded by pipe clean.
"""

import hashlib
import json

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
               pixel_squares=[i * i * 50, i * 900 + 7, 900_000 - i], **kw)


def text_row(root, key: str, label, i: int, **kw) -> dict:
    out = put(root, f"data/{label or 'none'}/{key}.txt", f"text {i} — ünïcode ✓ {'x' * (i * 37 % 700)}".encode())
    return row(source=f"{label or 'none'}/{key}.txt", key=key, kind="text", label=label, output=out,
               encoding="utf-8" if i % 3 else "cp1252", encoding_confidence=round(0.5 + i / 200, 3), **kw)


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
GOLDEN: dict[str, dict[str, str]] = {'by size': {'index.json': 'a11d8a71a36c3e23b03a6c7197fef427bf4251587373bf603e14afba72091b85',
             'train-000000.tar': '105cb22ae7a4eb0b6970f349d2fa93271f4f4673329a183bbc6d428bbd21b2e9',
             'train-000001.tar': '85e98917315f2bb89896623dd91ff323e32e06808083d666a5f7a11b5b03d43e',
             'train-000002.tar': 'ea8092537c6825e8a7a4422f2caf9a75a4a3960a4bedbd645c42be9d339a109c',
             'train-000003.tar': 'bddd4dc1b481c9353561f0d44c3eda314653af689db40ecdec2e9eee57f23be7',
             'train-000004.tar': '41fe842f613c3471ddcddc64509ef35a30b424f6c473f8b3d631eeb88746899b',
             'train-000005.tar': '348fe920661ed24befd8d75d79a68e06db51c9e6bcb8beef518edb448fe557bd',
             'train-000006.tar': '8c5be53068cf6c19d616cf6219f4774742fda0d8c1defea41568066f70624e21',
             'train-000007.tar': '563b76f73fcd65b281407382799442105bbc2083695ebf7bd96954db1b85d3d3',
             'train-000008.tar': '271897d29f3d4a9ca611ffdc5b8a5e22e8bae2645d2495af63892961514fa886',
             'train-000009.tar': '409d197dddcdb88c96ab03897af7ec3070dd28d7cba25da03b7d58cff3032b32',
             'train-000010.tar': 'c2d4febc1f02203065967befe6e2c4f00c988169934fe4456572911a10d1a998',
             'train-000011.tar': 'e90eed4480a0b582f38486b6ebe3f516a9f5c146abcadc3d69a9da61ff0cc177',
             'val-000000.tar': '3de46307b36564a219a7dac5889bcdf79687759c8c03e867841b49f2865ed073',
             'val-000001.tar': '3a9ed7f839f10adec928123991799c0c09ee3e53bd98a0089e774137a17144d8'},
 'small shards': {'index.json': '023d8b9f51199129bd2db9d5a5a7c7d4d276dd66aa0db2730d9a43437d98884b',
                  'train-000000.tar': '3fd45d9df683179bef3be9d7624c12074b7eab0d845b7e0ad3d4b3333d75e609',
                  'train-000001.tar': '23a777086bf3f51293311491ecb2af8bdb9d2a506f9f62535fef156b91be0348',
                  'train-000002.tar': '83873d6fd7f6406fe1b7defd93b2f42495b7fc09151489fa9bac6a1efcda74cd',
                  'train-000003.tar': '69d3b0ca70a97dd5d181647870ac441b137a97f95392289fa9bf93e1e0bc9d84',
                  'train-000004.tar': 'a125adb4b101906687695013bcf59f642649ea646705e19356e97c3b74b43f69',
                  'train-000005.tar': '5d93158c897854fcd258e472e3ee648aba0b7934f60a43a5dc51e47fed40431c',
                  'train-000006.tar': '5e544a46851d3bfe9b78447757ccd37580fc461fd819333bb78aba3eb6f7999f',
                  'train-000007.tar': '94a61ad264f1aee5841844b3d3d12674ce18e7b93560dcd56d6cdc29361e572a',
                  'train-000008.tar': 'ff3f00f2ddc2c3cd812f91e012b45dcdfc2480cd5001e9c2999cef16e6226b4e',
                  'val-000000.tar': '6eeba5b3ccaba232295d35a33d52eec5a2855157550a7c047766fa3713342a95',
                  'val-000001.tar': 'ac576290425fdaa0141d16777383fd44728bfec9c10dffe8b8793829f7409afd',
                  'val-000002.tar': '9f02a9ee58782fcf4f15926bc217f8b2a8c254a163f5e4a3869b752843c7e396'}}  # from main at 55e288f


@pytest.mark.parametrize("settings", SETTINGS)
def test_shards_are_byte_identical_to_those_of_the_writer_before(tmp_path, settings):
    clean = golden_clean_dir(tmp_path / "clean")
    stage.run(stage.ShardConfig(clean, tmp_path / "out", workers=1, **SETTINGS[settings]), show_progress=False)
    assert digests(tmp_path / "out") == GOLDEN[settings]
