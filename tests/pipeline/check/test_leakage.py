"""`leakage.copies`: copies inside one set of samples, by hand-made hashes (no shards needed)."""

from pipeline.check.leakage import MAX_TRIES, copies


def find(exact, groups, labels, hashes=None, same=lambda i, j: (True, "")):
    n = len(exact)
    return copies(exact, hashes or [None] * n, [None] * n, groups, labels, 4, 0.8, same, lambda i, j: None)


def test_a_copy_in_its_own_split_is_found_even_when_the_first_copy_is_in_another():
    # train has the content first; the two val copies are still a duplicate inside val
    f = find(["x", "x", "x"], ["train", "val", "val"], ["cat", "cat", "cat"])
    assert f.same_group == {2: (1, "exact")} and not f.other_label


def test_a_copy_under_another_label_is_a_conflict_not_a_duplicate_in_any_split():
    f = find(["x", "x", "x"], ["train", "train", "val"], ["cat", "dog", "dog"])
    assert f.other_label == {1: (0, "exact"), 2: (0, "exact")}
    assert f.same_group == {}  # the dog copies are in two splits: leakage's finding, not this one
    assert find(["x", "x"], ["train", "train"], ["cat", None]).other_label == {}  # no label conflicts with none


def test_near_copies_are_confirmed_and_each_sample_is_tried_a_bounded_number_of_times():
    n = 40
    calls = []

    def never(i, j):
        calls.append((i, j))
        return False, ""
    f = find([str(i) for i in range(n)], ["train"] * n, ["cat"] * n, hashes=[0] * n, same=never)
    assert f.same_group == {} and f.unconfirmed == len(calls)
    assert max(sum(1 for _, j in calls if j == k) for k in range(n)) <= MAX_TRIES
    f = find(["a", "b"], ["train"] * 2, ["cat"] * 2, hashes=[0, 1])
    assert f.same_group == {1: (0, "image, 1 bits apart")}
