"""Shingles, MinHash LSH keys and candidate pairs for near-duplicate texts."""

import random
import subprocess
import sys

import numpy as np

from pipeline.similarity.minhash import (
    BANDS,
    candidate_pairs,
    decode_keys,
    encode_keys,
    estimated_jaccard,
    jaccard,
    normalize_for_shingles,
    shingles,
    text_keys,
    text_signature,
)
from tests.conftest import pipe_env
from tests.text_samples import LANGUAGES

WORDS = ("cat dog bird red blue green small large sits runs on under the a sofa table garden park "
         "photo picture of with and near tree house car street window light dark old young").split()


def _sentence(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _python_jaccard(a: str, b: str, n=5) -> float:
    def grams(t):
        t = normalize_for_shingles(t)
        return {t[i:i + n] for i in range(max(1, len(t) - n + 1))}
    ga, gb = grams(a), grams(b)
    return len(ga & gb) / len(ga | gb)


def test_jaccard_is_the_real_set_similarity():
    rng = random.Random(1)
    for _ in range(50):
        a = _sentence(rng, 12)
        b = " ".join(w if rng.random() > 0.3 else rng.choice(WORDS) for w in a.split())
        assert abs(jaccard(shingles(a), shingles(b)) - _python_jaccard(a, b)) < 1e-9


def test_shingles_ignore_case_and_spacing_and_work_without_spaces():
    assert np.array_equal(shingles("A  Grey\nCat"), shingles("a grey cat"))
    zh = LANGUAGES["zh-Hans"][1]
    assert len(shingles(zh)) > 100  # Chinese has no spaces; characters still shingle
    assert len(shingles("cat")) == 1 and len(shingles("")) == 0


def _edit(rng, text, share):
    words = text.split()
    for i in rng.sample(range(len(words)), int(len(words) * share)):
        words[i] = rng.choice(WORDS)
    return " ".join(words)


def test_lsh_finds_near_duplicates_and_rarely_pairs_distinct_texts():
    rng = random.Random(7)
    near, far = [], []
    for _ in range(300):
        a = _sentence(rng, 60)
        b = _edit(rng, a, 0.03)
        near.append((jaccard(shingles(a), shingles(b)), bool((text_keys(a) == text_keys(b)).any())))
        c = _sentence(rng, 60)
        far.append(bool((text_keys(a) == text_keys(c)).any()))
    found = [hit for j, hit in near if j >= 0.8]
    assert len(found) > 200 and sum(found) / len(found) >= 0.99
    assert sum(far) / len(far) <= 0.05  # random texts over one vocabulary share ~25% of shingles


def test_signatures_estimate_the_real_jaccard():
    """pipe check's leakage search takes its text candidates from this estimate (then confirms them
    on the real Jaccard): it must be close to what pipe clean's near-duplicate search measures."""
    rng = random.Random(3)
    errors = []
    for _ in range(200):
        a = _sentence(rng, 60)
        b = _edit(rng, a, rng.choice((0.02, 0.1, 0.3)))
        errors.append(abs(estimated_jaccard(text_signature(a), text_signature(b)) - jaccard(shingles(a), shingles(b))))
    assert np.mean(errors) < 0.05 and max(errors) < 0.2
    assert estimated_jaccard(text_signature("A  Grey\nCat"), text_signature("a grey cat")) == 1.0
    assert len(text_signature("a grey cat")) == 4 * 64


def test_keys_are_compact_and_round_trip():
    k = text_keys(LANGUAGES["ru"][1])
    assert k.dtype == np.uint32 and k.shape == (BANDS,)
    s = encode_keys(k)
    assert len(s) <= 88 and np.array_equal(decode_keys(s), k)


def test_keys_are_the_same_in_another_process():
    """No Python hash(): a resumed run in a new process must agree with the journal."""
    code = "from pipeline.similarity.minhash import text_keys, encode_keys; print(encode_keys(text_keys('a grey cat on a mat')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=pipe_env(), check=True)
    assert out.stdout.strip() == encode_keys(text_keys("a grey cat on a mat"))


def test_candidate_pairs_are_linear_in_a_big_group():
    keys = np.zeros((1000, BANDS), dtype=np.uint32)  # a thousand texts agreeing on every band
    pairs = candidate_pairs(keys)
    assert len(pairs) < 2000
    assert (pairs[:, 0] < pairs[:, 1]).all()
    assert {int(j) for j in pairs[:, 1]} == set(range(1, 1000))  # every member linked to an earlier one


def test_candidate_pairs_only_for_shared_bands():
    keys = np.arange(2 * BANDS, dtype=np.uint32).reshape(2, BANDS)
    assert len(candidate_pairs(keys)) == 0
    keys[1, 5] = keys[0, 5]
    assert candidate_pairs(keys).tolist() == [[0, 1]]
