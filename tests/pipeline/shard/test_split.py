"""The split's near-duplicate grouping finds every close pair (checked against all pairs) and a
group never straddles train and val."""

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.shard.split import near_duplicate_groups, split, val_target


def brute_force_groups(hashes, d):
    parent = list(range(len(hashes)))

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for i in range(len(hashes)):
        for j in range(i + 1, len(hashes)):
            if hashes[i] is not None and hashes[j] is not None and (hashes[i] ^ hashes[j]).bit_count() <= d:
                parent[max(find(i), find(j))] = min(find(i), find(j))
    return [find(i) for i in range(len(hashes))]


@st.composite
def hash_sets(draw):
    """Random hashes plus mutated copies (a few bits flipped), so close pairs exist."""
    seeds = draw(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=25))
    out = list(seeds)
    for h in seeds:
        for _ in range(draw(st.integers(0, 3))):
            bits = draw(st.lists(st.integers(0, 63), max_size=12))
            for b in bits:
                h ^= 1 << b
            out.append(h)
    out += [None] * draw(st.integers(0, 3))
    return draw(st.permutations(out))


@settings(max_examples=200, deadline=None)
@given(hash_sets(), st.integers(0, 12))
def test_groups_equal_brute_force(hashes, d):
    assert near_duplicate_groups(hashes, d) == brute_force_groups(hashes, d)


@settings(max_examples=100, deadline=None)
@given(hash_sets(), st.integers(0, 12), st.floats(0, 0.9), st.integers(0, 2**32))
def test_groups_never_straddle_and_targets_hold(hashes, d, fraction, seed):
    labels = [f"c{i % 3}" for i in range(len(hashes))]
    res = split(labels, hashes, fraction, seed, d)
    groups = near_duplicate_groups(hashes, d)
    for g in set(groups):
        assert len({res.is_val[i] for i in range(len(hashes)) if groups[i] == g}) == 1
    for c in set(labels):
        n = labels.count(c)
        val = sum(v for v, lab in zip(res.is_val, labels) if lab == c)
        assert val < n, "a whole class went to validation"
        assert fraction > 0 or val == 0


def test_every_class_with_two_samples_reaches_val_when_groups_allow():
    labels = ["a"] * 10 + ["b"] * 2 + ["c"]
    res = split(labels, [None] * 13, 0.1, 0, 8)
    val = [lab for lab, v in zip(labels, res.is_val) if v]
    assert sorted(val) == ["a", "b"] and res.classes_without_val == []


def test_val_target():
    assert [val_target(n, 0.1) for n in (0, 1, 2, 10, 15, 100)] == [0, 0, 1, 1, 2, 10]
    assert val_target(5, 0.0) == 0 and val_target(3, 0.9) == 2
