"""decide on results built by hand: pairs kept or rejected together, labels, duplicates,
label-conflict policies, and which copy is kept."""

import numpy as np
import pytest

from pipeline.clean.decide import DecideSettings, decide
from pipeline.clean.records import FileResult
from pipeline.similarity.minhash import encode_keys, shingles, text_keys


def img(source, key=None, label=None, h="p1", w=100, hh=100, phash=0x0F0F0F0F0F0F0F0F, reason=None):
    return FileResult(source=source, key=key or source.rsplit(".", 1)[0].replace("/", "__"), kind="image",
                      label=label, content_hash=h, width=w, height=hh, phash=phash, reason=reason,
                      detail=reason or "", output=f"data/{source}")


def txt(source, text="a grey cat", key=None, label=None, h=None, reason=None):
    return FileResult(source=source, key=key or source.rsplit(".", 1)[0].replace("/", "__"), kind="text",
                      label=label, content_hash=h or f"t:{text}", minhash=encode_keys(text_keys(text)),
                      reason=reason, detail=reason or "", output=f"data/{source}")


class FakeOutputs:
    """Stands in for the cleaned files: images compare equal when their names say so."""

    def __init__(self, texts=None, same=lambda a, b: True):
        self.texts, self.same = texts or {}, same

    def view(self, r):
        return r.source

    def shingles(self, r):
        return shingles(self.texts[r.source])


ALIKE: set[frozenset] = set()  # pairs of sources the fake pixel check calls the same beyond folders


@pytest.fixture(autouse=True)
def _fake_pixels(monkeypatch):
    """Pixels are "the same" within a folder, or for pairs listed in ALIKE."""
    import pipeline.similarity.perceptual as p

    def same(a, b):
        return a.split("/")[0] == b.split("/")[0] or frozenset((a, b)) in ALIKE, "pixels"
    monkeypatch.setattr(p, "same_picture", same)
    yield
    ALIKE.clear()


def statuses(results, **kw):
    outs = kw.pop("outputs", None)
    o = decide(results, DecideSettings(**kw), outs)
    return {r.source: (d.status, d.reason, d.duplicate_of) for r, d in zip(results, o.decisions)}, o


def test_a_rejected_image_takes_its_caption_with_it():
    res = [img("cats/a.jpg", reason="truncated"), txt("cats/a.txt", key="cats__a")]
    got, o = statuses(res)
    assert got["cats/a.jpg"] == ("quarantined", "truncated", None)
    assert got["cats/a.txt"] == ("quarantined", "pair_rejected", None)
    assert o.decisions[1].detail == "its image was quarantined: truncated"


def test_a_rejected_caption_takes_its_image_with_it():
    res = [img("cats/a.jpg"), txt("cats/a.txt", key="cats__a", reason="garbled_text")]
    got, o = statuses(res)
    assert got["cats/a.jpg"] == ("quarantined", "pair_rejected", None)
    assert o.decisions[0].detail == "its caption was quarantined: garbled_text"


def test_missing_label_only_with_a_labels_file():
    res = [img("a.jpg"), img("b.jpg", label="cat", h="p2"), txt("b.txt", key="b")]
    got, _ = statuses(res, labels_required=True)
    assert got["a.jpg"] == ("quarantined", "missing_label", None)
    assert got["b.jpg"][0] == got["b.txt"][0] == "kept"  # the caption shares its image's label
    got, _ = statuses(res)
    assert got["a.jpg"][0] == "kept"


def test_a_captioned_image_is_deduplicated_as_its_image_whatever_its_caption():
    """Issue 14.3: a caption used to make its image unique, so byte copies with captions were all kept."""
    res = [img("a.jpg", h="same"), txt("a.txt", "a grey cat", key="a"),
           img("b.jpg", h="same"), txt("b.txt", "a grey cat", key="b"),
           img("c.jpg", h="same"), txt("c.txt", "a black dog on a red sofa", key="c"),
           img("d.jpg", h="other"), txt("d.txt", "a grey cat", key="d")]
    got, o = statuses(res, near_dedup=False)
    assert got["b.jpg"] == ("duplicate", "exact_duplicate", "a.jpg")
    assert got["b.txt"] == ("duplicate", "exact_duplicate", "a.txt")  # each half names its twin
    assert got["c.jpg"] == ("duplicate", "exact_duplicate", "a.jpg")  # another caption: the same picture
    assert got["c.txt"] == ("duplicate", "exact_duplicate", "a.txt")  # its caption goes with its image
    assert "another caption" in o.decisions[5].detail and not o.decisions[3].detail
    assert got["d.jpg"][0] == got["d.txt"][0] == "kept"  # the same caption on another picture: two samples


def test_an_image_alone_and_a_captioned_copy_are_one_picture():
    res = [img("a.jpg", h="same"), img("b.jpg", h="same"), txt("b.txt", key="b")]
    got, _ = statuses(res)
    # same size: the copy with a caption is kept, whatever the path order
    assert got["b.jpg"][0] == got["b.txt"][0] == "kept"
    assert got["a.jpg"] == ("duplicate", "exact_duplicate", "b.jpg")
    res[0] = img("a.jpg", h="same", w=400, hh=300)  # a larger copy without caption wins
    got, o = statuses(res)
    assert got["a.jpg"][0] == "kept"
    assert got["b.jpg"] == got["b.txt"] == ("duplicate", "exact_duplicate", "a.jpg")
    assert "the kept copy has no caption" in o.decisions[2].detail


def test_captions_from_the_labels_file_do_not_hide_copies_either():
    res = [img("cat/a.jpg", h="same", label="cat"), img("cat/b.jpg", h="same", label="cat")]
    res[0].caption, res[1].caption = "a grey cat", "a cat, grey and asleep"
    got, o = statuses(res, labels_required=True)
    assert got["cat/a.jpg"] == ("kept", None, None)
    assert got["cat/b.jpg"] == ("duplicate", "exact_duplicate", "cat/a.jpg")
    assert "another caption" in o.decisions[1].detail


def test_a_captioned_picture_under_two_labels_is_a_label_conflict():
    """The same photo in two class folders, each with its own caption, was kept twice."""
    res = [img("cat/p.jpg", label="cat", h="x"), txt("cat/p.txt", "my cat", key="cat__p", label="cat"),
           img("dog/p.jpg", label="dog", h="x"), txt("dog/p.txt", "not a dog", key="dog__p", label="dog")]
    got, o = statuses(res)
    assert {v[:2] for v in got.values()} == {("quarantined", "label_conflict")}
    assert o.label_conflicts[0]["labels"] == {"cat": 1, "dog": 1}


def test_best_copy_is_the_largest_then_the_first_path():
    res = [img("a.jpg", h="x", w=50, hh=50), img("b.jpg", h="x", w=200, hh=100), img("c.jpg", h="x", w=200, hh=100)]
    got, _ = statuses(res)
    assert got["b.jpg"][0] == "kept"
    assert got["a.jpg"] == got["c.jpg"] == ("duplicate", "exact_duplicate", "b.jpg")


def test_near_duplicate_needs_confirmation():
    # same folder prefix -> the fake pixel check says "same picture"
    res = [img("p/a.jpg", h="1", phash=0xFFFF0000FFFF0000), img("p/b.jpg", h="2", phash=0xFFFF0000FFFF0003),
           img("q/c.jpg", h="3", phash=0xFFFF0000FFFF0003)]
    got, o = statuses(res, outputs=FakeOutputs())
    assert got["p/b.jpg"] == ("duplicate", "near_duplicate", "p/a.jpg")
    assert got["q/c.jpg"][0] == "kept"  # a close hash, but the pixels differ
    assert o.near["confirmed"] == 1 and o.near["candidates"] >= 2
    got, _ = statuses(res, outputs=None)  # nothing to confirm with: nothing merged
    assert {s for s, _r, _d in got.values()} == {"kept"}


def test_near_duplicates_are_compared_with_the_kept_copy_not_chained():
    # b looks like a, c looks like b but not like a: c must not join a's group through b
    ALIKE.update({frozenset(("x/a.jpg", "y/b.jpg")), frozenset(("y/b.jpg", "z/c.jpg"))})
    res = [img("x/a.jpg", h="1", phash=0), img("y/b.jpg", h="2", phash=0b11), img("z/c.jpg", h="3", phash=0b1111)]
    got, _ = statuses(res, outputs=FakeOutputs())
    assert got["y/b.jpg"] == ("duplicate", "near_duplicate", "x/a.jpg")
    assert got["z/c.jpg"][0] == "kept"


def test_near_duplicate_texts_by_jaccard():
    a = "A black cat sitting on a red sofa in the living room, looking at the camera."
    b = "A black cat sitting on a red sofa in the living room, looking at the camera!"
    c = "A black cat sitting on a blue sofa in the living room, looking at the window."
    res = [txt("a.txt", a), txt("b.txt", b), txt("c.txt", c)]
    got, _ = statuses(res, outputs=FakeOutputs({"a.txt": a, "b.txt": b, "c.txt": c}))
    assert got["b.txt"] == ("duplicate", "near_duplicate", "a.txt")
    assert got["c.txt"][0] == "kept"
    got, _ = statuses(res, outputs=FakeOutputs({"a.txt": a, "b.txt": b, "c.txt": c}), near_text_jaccard=0.99)
    assert got["b.txt"][0] == "kept"


def test_near_duplicate_images_are_duplicates_whatever_their_captions():
    a, b = "a grey cat asleep on a wooden chair", "a brown dog running across a green park"
    res = [img("p/a.jpg", h="1", phash=0), txt("p/a.txt", a, key="p__a"),
           img("p/b.jpg", h="2", phash=1), txt("p/b.txt", b, key="p__b"),
           img("p/c.jpg", h="3", phash=3)]
    got, o = statuses(res, outputs=FakeOutputs({"p/a.txt": a, "p/b.txt": b}))
    assert got["p/b.jpg"] == ("duplicate", "near_duplicate", "p/a.jpg")  # same picture, another caption
    assert got["p/b.txt"] == ("duplicate", "near_duplicate", "p/a.txt")
    assert got["p/c.jpg"] == ("duplicate", "near_duplicate", "p/a.jpg")  # no caption: the same picture still
    assert "another caption" in o.decisions[3].detail


def test_near_duplicate_captioned_copies_under_two_labels_conflict():
    res = [img("p/a.jpg", label="cat", h="1", phash=0), txt("p/a.txt", "cat", key="p__a", label="cat"),
           img("p/b.jpg", label="dog", h="2", phash=1), txt("p/b.txt", "dog", key="p__b", label="dog")]
    got, o = statuses(res, outputs=FakeOutputs({"p/a.txt": "cat", "p/b.txt": "dog"}))
    assert {v[1] for v in got.values()} == {"label_conflict"}
    assert len(o.label_conflicts) == 1


CONFLICT = [img("cat/1.jpg", label="cat", h="x", w=10, hh=10), img("dog/2.jpg", label="dog", h="x", w=20, hh=20),
            img("cat/3.jpg", label="cat", h="x", w=10, hh=10), img("cat/4.jpg", label="cat", h="y")]


def test_label_conflict_quarantines_every_copy_by_default():
    got, o = statuses(CONFLICT)
    for s in ("cat/1.jpg", "dog/2.jpg", "cat/3.jpg"):
        assert got[s][:2] == ("quarantined", "label_conflict")
    assert got["cat/4.jpg"][0] == "kept"
    (entry,) = o.label_conflicts
    assert entry["labels"] == {"cat": 2, "dog": 1} and entry["kept"] is None
    assert entry["files"] == ["cat/1.jpg", "cat/3.jpg", "dog/2.jpg"]


def test_label_conflict_majority_keeps_the_best_copy_of_the_majority_label():
    got, o = statuses(CONFLICT, label_conflicts="majority")
    assert got["cat/1.jpg"] == ("kept", None, None)
    assert got["cat/3.jpg"] == ("duplicate", "exact_duplicate", "cat/1.jpg")
    assert got["dog/2.jpg"] == ("quarantined", "label_conflict", "cat/1.jpg")
    assert o.label_conflicts[0]["kept"] == "cat/1.jpg"


def test_label_conflict_majority_tie_quarantines():
    got, o = statuses(CONFLICT[:2], label_conflicts="majority")
    assert {v[1] for v in got.values()} == {"label_conflict"}
    assert o.label_conflicts[0]["action"] == "quarantined every copy"


def test_label_conflict_first_path_wins():
    res = [img("a/1.jpg", label="dog", h="x"), img("b/2.jpg", label="cat", h="x"), img("c/3.jpg", label="cat", h="x")]
    got, _ = statuses(res, label_conflicts="first")
    assert got["a/1.jpg"][0] == "kept"
    assert got["b/2.jpg"][:2] == got["c/3.jpg"][:2] == ("quarantined", "label_conflict")


def test_near_duplicates_with_different_labels_conflict_too():
    res = [img("p/a.jpg", label="cat", h="1", phash=0), img("p/b.jpg", label="dog", h="2", phash=1)]
    got, o = statuses(res, outputs=FakeOutputs())
    assert {v[1] for v in got.values()} == {"label_conflict"}
    assert len(o.label_conflicts) == 1


def test_decide_is_deterministic_under_input_order_of_equal_candidates():
    rng = np.random.default_rng(0)
    res = [img(f"p/{i:02d}.jpg", h=str(i % 7), phash=int(rng.integers(0, 4))) for i in range(30)]
    a, _ = statuses(res, outputs=FakeOutputs())
    b, _ = statuses(res, outputs=FakeOutputs())
    assert a == b
    kept = [s for s, v in a.items() if v[0] == "kept"]
    assert kept == ["p/00.jpg"]  # all one picture (fake pixels), same size: the first path


def test_binary_file_beside_an_image_is_no_caption(tmp_path):
    """photo.jpg + photo.raw (binary): the binary file is quarantined on its own and must not
    take the image down with it as a 'rejected caption'."""
    from pipeline.clean import stage as clean
    from pipeline.clean.stage import CleanConfig
    from tests.factories import photo, write

    src = tmp_path / "raw"
    photo(src / "cats" / "photo.jpg")
    write(src / "cats" / "photo.raw", bytes(range(256)) * 8)
    clean.run(CleanConfig(src, tmp_path / "out", workers=1), show_progress=False)
    import pyarrow.parquet as pq

    rows = {r["source"]: r for r in pq.read_table(tmp_path / "out" / "manifest.parquet").to_pylist()}
    assert rows["cats/photo.raw"]["reason"] == "binary_content"
    assert rows["cats/photo.jpg"]["status"] == "kept"


def test_arrays_parked_on_disk_come_back_as_they_were(tmp_path):
    """While the near-duplicate search runs, decide's arrays wait on the driver's disk."""
    from types import SimpleNamespace

    from pipeline.clean.decide import parked

    a = SimpleNamespace(big=np.arange(20_000, dtype=np.int32), small=np.arange(3), other="x")
    b = SimpleNamespace(flags=np.ones(70_000, dtype=np.uint8), gone=None)
    with parked(tmp_path, a, b):
        assert a.big is None and b.flags is None  # dropped for the block
        assert a.small.tolist() == [0, 1, 2] and a.other == "x"  # small ones stay
    assert a.big.tolist() == list(range(20_000)) and a.big.dtype == np.int32
    assert b.flags.sum() == 70_000 and b.gone is None
    assert not list(tmp_path.iterdir())
