"""Every shard-dir check: shards made by the real `pipe clean` + `pipe shard`, broken in exactly one
way (often by rewriting a shard and its index entry as another tool would), fail that check only."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from PIL import Image

from tests.check_fixtures import (
    build_raw,
    check,
    copy_dir,
    edit_json,
    failing,
    policy_file,
    read_samples,
    result,
    rewrite_shard,
    run_clean,
    run_shard,
    shard_names,
    zero_middle,
)
from tests.factories import image_bytes, noise_rgb


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    root = tmp_path_factory.mktemp("good")
    clean = run_clean(build_raw(root / "raw"), root / "clean")
    return run_shard(clean, root / "shards"), policy_file(root)


@pytest.fixture
def broken(good, tmp_path) -> Path:
    return copy_dir(good[0], tmp_path / "shards")


def shards_of(tmp_path: Path, classes: dict[str, int]) -> Path:
    clean = run_clean(build_raw(tmp_path / "raw", classes), tmp_path / "clean")
    return run_shard(clean, tmp_path / "shards")


def first_image(samples) -> tuple[int, str]:
    i = next(i for i, (_, m) in enumerate(samples) if "jpg" in m)
    return i, "jpg"


def first_train_image(broken: Path) -> tuple[bytes, bytes]:
    """The first train image and its .cls."""
    return next((m["jpg"], m["cls"]) for _, m in read_samples(broken / shard_names(broken, "train")[0]) if "jpg" in m)


def replace_val_image(broken: Path, data: bytes, cls: bytes) -> None:
    """Put ``data`` in the first val sample of class ``cls`` (into another class it would be a
    label conflict as well as a leak)."""
    for name in shard_names(broken, "val"):
        if any(m.get("cls") == cls and "jpg" in m for _, m in read_samples(broken / name)):
            def fn(samples):
                i = next(i for i, (_, m) in enumerate(samples) if m.get("cls") == cls and "jpg" in m)
                samples[i][1]["jpg"] = data
                return samples
            return rewrite_shard(broken, name, fn)
    pytest.fail("every class has a val sample in the good dataset")


def replace_image(broken: Path, data: bytes, split: str = "train") -> None:
    def fn(samples):
        i, ext = first_image(samples)
        samples[i][1][ext] = data
        return samples

    rewrite_shard(broken, shard_names(broken, split)[0], fn)


def test_good_shards_pass_everything(good):
    shards, policy = good
    for deep in (False, True):
        report = check(shards, policy, deep=deep)
        assert failing(report) == set(), [r.message for r in report.results if r.status == "fail"]
        assert report.folders[0].kind == "shard"
    assert result(report, "decodes").message.endswith("decode completely")


def test_a_rewritten_but_reindexed_shard_still_passes(broken, good):
    """The helper that breaks things changes nothing by itself (tarfile's own layout is fine)."""
    rewrite_shard(broken, shard_names(broken, "train")[0], lambda samples: samples)
    assert failing(check(broken, good[1])) == set()


@pytest.mark.parametrize("how", ["index", "sample_json"])
def test_schema(good, broken, how):
    if how == "index":
        edit_json(broken / "index.json", lambda d: d.update(made_by_hand=True))
    else:
        def fn(samples):
            samples[0][1]["json"] = b"{not json"
            return samples
        rewrite_shard(broken, shard_names(broken, "train")[0], fn)
    report = check(broken, good[1])
    assert failing(report) == {"schema"}
    assert ("made_by_hand" if how == "index" else "not valid UTF-8 JSON") in result(report, "schema").message


@pytest.mark.parametrize("how", ["bit_flip_in_padding", "bit_flip_in_end_marker", "unindexed_shard"])
def test_shard_checksums(good, broken, how):
    import tarfile

    name = shard_names(broken, "train")[0]
    data = bytearray((broken / name).read_bytes())
    if how == "bit_flip_in_padding":
        with tarfile.open(broken / name) as tar:
            cls = next(m for m in tar if m.name.endswith(".cls"))
        data[cls.offset_data + cls.size + 10] ^= 0x01  # zero padding after the data: readers skip it
        (broken / name).write_bytes(bytes(data))
    elif how == "bit_flip_in_end_marker":
        data[-700] ^= 0x01  # readers take a damaged end marker as the end: nothing is lost
        (broken / name).write_bytes(bytes(data))
    else:
        shutil.copy(broken / name, broken / "train-000099.tar")
    report = check(broken, good[1])
    assert failing(report) == {"shard_checksums"}
    assert ("train-000099.tar" if how == "unindexed_shard" else name) in result(report, "shard_checksums").message


@pytest.mark.parametrize("how", ["offset", "count"])
def test_shard_counts(good, broken, how):
    def fn(d):
        e = d["shards"][0]
        if how == "offset":
            e["offsets"][1] += 512
        else:
            e["count"] += 1
    edit_json(broken / "index.json", fn)
    report = check(broken, good[1])
    assert failing(report) == {"shard_counts"}


def test_keys_unique(good, broken):
    first, second = shard_names(broken, "train")[:2]
    taken = read_samples(broken / first)[0][0]

    def fn(samples):
        samples[0] = (taken, samples[0][1])
        return samples
    rewrite_shard(broken, second, fn)
    report = check(broken, good[1])
    assert failing(report) == {"keys_unique"}
    assert taken in result(report, "keys_unique").message


@pytest.mark.parametrize("cls", [b"7", b"x"])
def test_labels_in_range(good, broken, cls):
    def fn(samples):
        samples[0][1]["cls"] = cls
        return samples
    rewrite_shard(broken, shard_names(broken, "train")[0], fn)
    report = check(broken, good[1])
    assert failing(report) == {"labels_in_range"}


def test_labels_in_range_cls_disagrees_with_json_label(good, broken):
    def fn(samples):
        cls = int(samples[0][1]["cls"])
        samples[0][1]["cls"] = str(1 - cls).encode()
        return samples
    rewrite_shard(broken, shard_names(broken, "train")[0], fn)
    report = check(broken, good[1])
    assert failing(report) == {"labels_in_range"}
    assert "but .json says" in result(report, "labels_in_range").message


def test_min_samples_per_class(good, tmp_path):
    shards = shards_of(tmp_path, {"cats": 6, "dogs": 6, "birds": 4})  # birds: 3 train (+1 val) < 4
    report = check(shards, good[1])
    assert failing(report) == {"min_samples_per_class"}
    assert "'birds' has 3" in result(report, "min_samples_per_class").message


def test_class_imbalance(good, tmp_path):
    shards = shards_of(tmp_path, {"cats": 6, "dogs": 23})  # 5 vs 20 train samples: 4 > 3
    report = check(shards, good[1])
    assert failing(report) == {"class_imbalance"}


def test_val_has_every_class(good, broken):
    classes = json.loads((broken / "index.json").read_text())["classes"]
    cats = str(classes.index("cats")).encode()
    rewrite_shard(broken, shard_names(broken, "val")[0], lambda samples: [s for s in samples if s[1]["cls"] != cats])
    report = check(broken, good[1])
    assert failing(report) == {"val_has_every_class"}
    assert "'cats'" in result(report, "val_has_every_class").message


@pytest.mark.parametrize("how", ["exact", "reencoded"])
def test_leakage(good, broken, how):
    train_img, cls = first_train_image(broken)
    if how == "reencoded":
        import io
        train_img = image_bytes(Image.open(io.BytesIO(train_img)), quality=60)
    replace_val_image(broken, train_img, cls)
    report = check(broken, good[1])
    assert failing(report) == {"leakage"}
    r = result(report, "leakage")
    assert r.numbers["leaked"] == 1 and ("exact" if how == "exact" else "bits apart") in r.message


def test_leakage_within_the_policys_allowance_passes(good, broken, tmp_path):
    replace_val_image(broken, *first_train_image(broken))
    policy = policy_file(tmp_path, good[1].read_text().replace("[severity]", "max_leaked_samples = 1\n\n[severity]"))
    r = result(check(broken, policy), "leakage")
    assert r.status == "pass" and r.numbers["leaked"] == 1 and r.examples


def test_image_size(good, broken):
    replace_image(broken, image_bytes(noise_rgb(48, 48, seed=7)))
    report = check(broken, good[1])
    assert failing(report) == {"image_size"}
    assert "48x48" in result(report, "image_size").message


def test_image_mode(good, broken):
    replace_image(broken, image_bytes(Image.fromarray(noise_rgb(64, 64, seed=7)).convert("L")))
    report = check(broken, good[1])
    assert failing(report) == {"image_mode"}


@pytest.mark.parametrize("data", ["一只灰猫".encode("gbk"), "cafe\u0301".encode()])
def test_text_encoding(good, broken, data):
    for name in shard_names(broken, "train") + shard_names(broken, "val"):
        if any("txt" in m for _, m in read_samples(broken / name)):
            def fn(samples):
                for _, m in samples:
                    if "txt" in m:
                        m["txt"] = data
                return samples
            rewrite_shard(broken, name, fn)
            break
    else:
        pytest.fail("the good dataset has a caption; it must be in some shard")
    report = check(broken, good[1])
    assert failing(report) == {"text_encoding"}


def test_decodes(good, broken):
    img = next(m["jpg"] for _, m in read_samples(broken / shard_names(broken, "train")[0]) if "jpg" in m)
    replace_image(broken, img[: len(img) // 2])  # header intact: size and mode still read
    for deep in (False, True):
        report = check(broken, good[1], deep=deep)
        assert failing(report) == {"decodes"}


def test_decodes_deep_finds_damaged_jpeg_data_pillow_accepts(good, broken):
    """A JPEG member zeroed in place inside its tar (sizes unchanged, the index's sha256 updated, as a
    tool that rewrote the shard would): --deep decodes it strictly, as pipe clean does, and names it."""
    import hashlib
    import tarfile

    index = json.loads((broken / "index.json").read_text())
    for entry in index["shards"]:
        path = broken / entry["name"]
        with tarfile.open(path) as tar:
            jpgs = [m for m in tar if m.name.endswith(".jpg")]
        data = bytearray(path.read_bytes())
        hit = next(((m, b) for m in jpgs
                    if (b := zero_middle(bytes(data[m.offset_data : m.offset_data + m.size]))) is not None), None)
        if hit:
            break
    m, bad = hit
    data[m.offset_data : m.offset_data + m.size] = bad
    path.write_bytes(bytes(data))
    entry["sha256"] = hashlib.sha256(data).hexdigest()
    (broken / "index.json").write_text(json.dumps(index, indent=1))
    report = check(broken, good[1], deep=True)
    assert failing(report) == {"decodes"}
    msg = result(report, "decodes").message
    assert m.name.partition(".")[0] in msg and "corrupt" in msg and "premature end of data segment" in msg


def test_missing_index_json_with_tars_is_usage_error(good, broken, cli):
    (broken / "index.json").unlink()
    r = cli("check", broken)
    assert r.exit_code == 2 and "no index.json" in r.stderr


def test_unreadable_index_fails_schema_and_skips_the_rest(good, broken):
    (broken / "index.json").write_text("{ half written")
    report = check(broken, good[1])
    assert failing(report) == {"schema"}
    assert all(r.status == "skip" for r in report.results if r.name != "schema")
    assert report.exit_code == 1


def test_shards_are_read_in_worker_processes_with_the_same_result(good, broken, monkeypatch):
    from pipeline.check import shard_dir

    monkeypatch.setattr(shard_dir, "IN_PROCESS_BYTES", 0)
    replace_image(broken, image_bytes(noise_rgb(48, 48, seed=7)))
    report = check(broken, good[1], workers=2)
    assert failing(report) == {"image_size"}


def test_damaged_header_mid_shard_is_named(good, broken):
    name = shard_names(broken, "train")[0]
    offsets = json.loads((broken / "index.json").read_text())["shards"][0]["offsets"]
    data = bytearray((broken / name).read_bytes())
    data[offsets[2] + 148] ^= 0x07  # the header checksum of the third sample's first member
    (broken / name).write_bytes(bytes(data))
    report = check(broken, good[1])
    assert {"shard_checksums", "shard_counts"} <= failing(report)
    assert "unreachable" in result(report, "shard_counts").message


def test_look_alikes_that_are_different_pictures_do_not_leak(good, broken):
    """Two different handwritten 1s can have perceptual hashes a few bits apart; like pipe clean,
    the check confirms a hash candidate on pixels before it calls it a leak."""
    import io

    import numpy as np

    from pipeline.check.content import inspect_image
    from tests.image_samples import digit

    rng = np.random.default_rng(0)
    ones = [image_bytes(digit(rng, 1).convert("RGB").resize((512, 512), Image.Resampling.LANCZOS)) for _ in range(120)]
    hashes = [inspect_image(b, want_phash=True).phash for b in ones]
    dist, i, j = min((bin(hashes[i] ^ hashes[j]).count("1"), i, j) for i in range(120) for j in range(i + 1, 120))
    assert dist <= 4, "no look-alike pair within the policy's distance: the test would prove nothing"
    replace_image(broken, ones[i], split="train")
    replace_image(broken, ones[j], split="val")
    report = check(broken, good[1])
    r = result(report, "leakage")
    assert r.status == "pass" and r.numbers["leaked"] == 0 and r.numbers["candidates_not_confirmed"] >= 1
    # the same picture re-encoded is still a leak
    replace_image(broken, image_bytes(Image.open(io.BytesIO(ones[i])), quality=60), split="val")
    assert result(check(broken, good[1]), "leakage").numbers["leaked"] == 1


def _add_text_sample(broken: Path, split: str, key: str, text: str) -> None:
    meta = json.dumps({"label": "cats", "sources": {"text": f"cats/{key}.txt"}}).encode()
    rewrite_shard(broken, shard_names(broken, split)[0],
                  lambda samples: [*samples, (key, {"txt": text.encode(), "cls": b"0", "json": meta})])


STORY = ("The quick brown fox jumps over the lazy dog while the farmer watches from the old red barn, "
         "wondering whether the rain will come before the harvest is in.")


@pytest.mark.parametrize("val_text,leaks", [
    (STORY.replace("old red barn", "old red shed"), 1),  # the same story, one word changed
    ("A completely different caption about a harbour at dawn, gulls over the water.", 0),
])
def test_text_leakage_is_judged_by_real_jaccard(good, broken, val_text, leaks):
    _add_text_sample(broken, "train", "textonly_a", STORY)
    _add_text_sample(broken, "val", "textonly_b", val_text)
    r = result(check(broken, good[1]), "leakage")
    assert r.numbers["leaked"] == leaks
    if leaks:
        assert "textonly_b" in r.message and "(text," in r.message


def test_a_minhash_estimate_above_the_limit_is_checked_on_the_texts(good, broken, monkeypatch):
    """MinHash estimates the similarity (64 values: +-0.05); the real Jaccard decides, as in pipe clean."""
    from pipeline.check import shard_dir

    _add_text_sample(broken, "train", "textonly_a", STORY)
    _add_text_sample(broken, "val", "textonly_b", "A completely different caption about a harbour at dawn.")
    monkeypatch.setattr(shard_dir, "near_text_pairs", lambda train, val, t: [
        (j, next(i for i, s in enumerate(train) if s is not None), 0.9) for j, s in enumerate(val) if s is not None])
    r = result(check(broken, good[1]), "leakage")
    assert r.numbers["leaked"] == 0 and r.numbers["candidates_not_confirmed"] >= 1


class _Payload:
    """Unpickling this runs a command: what stock webdataset's .decode() does to .pyd/.pickle/.pth."""

    def __reduce__(self):
        import os

        return (os.system, ("touch /tmp/pipe-check-was-fooled",))


@pytest.mark.parametrize("ext", ["pyd", "pickle", "pth"])
def test_member_types_pipe_shard_never_writes_fail(good, broken, ext):
    import pickle

    def fn(samples):
        samples[0][1][ext] = pickle.dumps(_Payload())
        return samples
    rewrite_shard(broken, shard_names(broken, "train")[0], fn)
    report = check(broken, good[1])
    assert failing(report) == {"member_types"}
    message = result(report, "member_types").message
    assert f".{ext}" in message and "not a member type pipe shard writes" in message, message


def test_a_link_member_fails_member_types(good, broken):
    import io
    import tarfile

    from tests.check_fixtures import reindex

    name = shard_names(broken, "train")[0]
    with tarfile.open(broken / name) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar]
    with tarfile.open(broken / name, "w", format=tarfile.USTAR_FORMAT) as tar:
        first_key = members[0][0].name.partition(".")[0]
        for m, data in members:
            tar.addfile(m, io.BytesIO(data))
            if m.name == f"{first_key}.json":
                link = tarfile.TarInfo(f"{first_key}.txt")
                link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(link)
    reindex(broken)
    report = check(broken, good[1])
    assert "member_types" in failing(report)
    assert "symlink" in result(report, "member_types").message


@pytest.mark.parametrize("prefix", ["../../", "/etc/"])
def test_member_names_with_a_path_are_not_webdataset_safe(good, broken, prefix):
    def fn(samples):
        samples[0] = (prefix + samples[0][0], samples[0][1])
        return samples
    rewrite_shard(broken, shard_names(broken, "train")[0], fn)
    report = check(broken, good[1])
    assert failing(report) == {"keys_unique"}
    message = result(report, "keys_unique").message
    assert prefix in message and "not webdataset-safe" in message, message


def test_a_json_member_nested_too_deeply_fails_schema(good, broken, pipe_proc):
    def fn(samples):
        samples[0][1]["json"] = b"[" * 100_000
        return samples
    rewrite_shard(broken, shard_names(broken, "train")[0], fn)
    report = check(broken, good[1])
    assert failing(report) == {"schema"}
    assert "nested too deeply" in result(report, "schema").message
    p = pipe_proc("check", broken, "--policy", good[1])
    assert p.returncode == 1 and "internal error" not in p.stderr + p.stdout


def _copy_into_captioned(broken: Path, same_class: bool, reencode: bool = False) -> tuple[str, str]:
    """Put into the captioned sample (a .txt beside its image) the image of another sample of its
    split, of its class or of another; return (captioned key, copied key)."""
    import io

    index = json.loads((broken / "index.json").read_text())
    split = next(e["split"] for e in index["shards"]
                 if any("txt" in m for _, m in read_samples(broken / e["name"])))
    samples = [(name, k, m) for name in shard_names(broken, split) for k, m in read_samples(broken / name)]
    target = next(s for s in samples if "txt" in s[2])
    source = next(s for s in samples if s is not target and "jpg" in s[2] and (s[2]["cls"] == target[2]["cls"]) == same_class)
    data = source[2]["jpg"]
    if reencode:
        data = image_bytes(Image.open(io.BytesIO(data)), quality=80)  # within the policy's 4 bits

    def fn(shard):
        for k, m in shard:
            if k == target[1]:
                m["jpg"] = data
        return shard

    rewrite_shard(broken, target[0], fn)
    return target[1], source[1]


@pytest.mark.parametrize("reencode", [False, True])
def test_copies_within_one_split_fail_duplicates_whatever_their_caption(good, broken, reencode):
    """Issue 14.3: leakage looked only across splits; a copy inside train (here a captioned one) passed."""
    captioned, copied = _copy_into_captioned(broken, same_class=True, reencode=reencode)
    report = check(broken, good[1])
    assert failing(report) == {"duplicates"}
    r = result(report, "duplicates")
    assert r.numbers["found"] == 1 and captioned in r.message and copied in r.message
    assert ("bits apart" if reencode else "exact") in r.message


def test_one_content_under_two_classes_fails_label_conflicts(good, broken):
    captioned, copied = _copy_into_captioned(broken, same_class=False)
    report = check(broken, good[1])
    assert failing(report) == {"label_conflicts"}
    r = result(report, "label_conflicts")
    assert r.numbers["found"] == 1 and captioned in r.message and copied in r.message


def test_pairs_without_labels_pass_and_a_missing_cls_of_a_labelled_sample_fails(tmp_path):
    """An image-caption pair without a label has no .cls and says label null in its .json (issue 22);
    a labelled sample that lost its .cls still fails labels_in_range."""
    from tests.clean_dirs import Spec, make_clean_dir

    specs = [Spec(key=f"l{i}", label=f"c{i % 2}", seed=i, text=f"labelled {i}") for i in range(6)]
    specs += [Spec(key=f"p{i}", label=None, seed=50 + i, text=f"a pair {i}") for i in range(6)]
    shards = run_shard(make_clean_dir(tmp_path / "clean", specs), tmp_path / "shards")
    policy = policy_file(tmp_path, "min_samples_per_class = 1\n")
    assert result(check(shards, policy), "labels_in_range").status == "pass"

    def drop_a_cls(samples):
        i = next(i for i, (key, m) in enumerate(samples) if "cls" in m)
        samples[i][1].pop("cls")
        return samples

    rewrite_shard(shards, shard_names(shards, "train")[0], drop_a_cls)
    found = result(check(shards, policy), "labels_in_range")
    assert found.status == "fail" and "no .cls member" in found.message
