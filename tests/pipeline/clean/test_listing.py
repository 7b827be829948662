"""The listing on the driver's disk gives back, file for file, what sorting and keying the
candidates in memory gave: the same order, keys (caption pairs share one, collisions are split),
labels (shared within a pair with a labels file) and, for each file, its key's first file."""

from __future__ import annotations

import copy
import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.clean import keys as keylib
from pipeline.clean.candidate import Candidate
from pipeline.clean.keys import assign_keys
from pipeline.clean.listing import Listing
from pipeline.formats.vocabulary import Kind, Reason

KINDS = {"jpg": Kind.IMAGE, "png": Kind.IMAGE, "txt": Kind.TEXT, "bin": Kind.OTHER}
FOLDERS = ["", "a/", "a b/", "a_b/", "z/", "/", "../", "./", "cafe\u0301/", "caf\u00e9/"]  # (NFD and NFC: one label)
names = st.tuples(st.sampled_from(FOLDERS), st.sampled_from(["x", "x y", "x_y", "y.1"]), st.sampled_from(sorted(KINDS)))


def _cands(picked) -> list[Candidate]:
    out = {}
    for folder, stem, ext in picked:
        source = f"{folder}{stem}.{ext}"
        out[source] = Candidate(source, source, KINDS[ext], ext, size=len(source),
                                problem=Reason.UNREADABLE if ext == "bin" else None)
    return list(out.values())


def _in_memory(cands: list[Candidate], labels: dict[str, str] | None) -> list[Candidate]:
    """What discovery did before the listing: sort, label, key, and share a label within a pair."""
    out = sorted(copy.deepcopy(cands), key=lambda c: c.source)
    for c in out:
        folder = c.source.split("/", 1)[0] if "/" in c.source else None
        if labels is not None:
            c.label = labels.get(c.source)
        elif folder not in (None, "", ".", ".."):
            c.label = unicodedata.normalize("NFC", folder)
    assign_keys(out)
    if labels is not None:
        by_key: dict[str, list] = {}
        for c in out:
            by_key.setdefault(c.key, []).append(c)
        for members in by_key.values():
            given_ = {c.label for c in members if c.label is not None}
            if len(members) > 1 and len(given_) == 1:
                for c in members:
                    c.label = next(iter(given_))
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(names, max_size=14), st.booleans(), st.randoms(use_true_random=False))
def test_the_listing_is_the_candidates_sorted_labelled_and_keyed(picked, with_labels, rnd):
    cands = _cands(picked)
    labels = {c.source: rnd.choice(["cat", "dog"]) for c in cands if rnd.random() < 0.5} if with_labels else None
    want = _in_memory(cands, labels)
    handed = sorted(cands, key=lambda c: c.source)
    if rnd.random() < 0.3:
        rnd.shuffle(handed)  # out of order (names that are not UTF-8 sort otherwise in the walk): sorted here
    listing = Listing.of(handed, labels=labels)
    assert list(listing) == want
    assert len(listing) == len(want)
    first = {}
    for i, c in enumerate(want):
        first.setdefault(c.key, i)
    assert listing.leads(0, len(listing)).tolist() == [first[c.key] for c in want]
    codes = listing.labels(0, len(listing)).tolist()
    assert [None if k < 0 else listing.label_names[k] for k in codes] == [c.label for c in want]
    if want:
        assert listing[len(want) - 1] == want[-1] and listing[-1] == want[-1]
        assert listing[1:3] == want[1:3]


def test_a_renamed_key_steps_around_every_slug_and_every_key_given(monkeypatch):
    """Hashed keys that would collide (a short hash made constant here) get longer, as they do
    in memory: with another file's slug as much as with a key given before."""
    monkeypatch.setattr(keylib, "short_hash", lambda s: "00000000")
    cands = _cands([("c/", "b", "jpg"), ("c/", "b", "png"), ("c/", "b-00000000", "jpg")])
    assert list(Listing.of(sorted(cands, key=lambda c: c.source))) == _in_memory(cands, None)
    keys = [c.key for c in Listing.of(sorted(cands, key=lambda c: c.source))]
    assert len(set(keys)) == 3


def test_the_listing_is_read_across_its_batches(monkeypatch, tmp_path):
    from pipeline.clean import listing as listing_module

    monkeypatch.setattr(listing_module, "BATCH", 4)
    cands = [Candidate(f"c/{i:03d}.jpg", f"c/{i:03d}.jpg", Kind.IMAGE, "jpeg") for i in range(11)]
    got = Listing.of(cands, tmp_path)
    assert [c.source for c in got] == [c.source for c in cands]
    assert [c.source for c in got[3:9]] == [c.source for c in cands[3:9]]
    assert got.leads(2, 7).tolist() == [2, 3, 4, 5, 6]
    assert not list(tmp_path.iterdir())  # unnamed files: nothing left to clean up
