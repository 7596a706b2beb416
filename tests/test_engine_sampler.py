"""The sampler, the stop checker and the tokenizer's incremental detokenizer, unit by unit."""
import numpy as np
import pytest

from pagedcy.engine import SamplingParams
from pagedcy.engine import sampler
from pagedcy.engine.stop_checker import StopChecker


def softmax(x, t=1.0):
    z = np.asarray(x, np.float64) / t
    p = np.exp(z - z.max())
    return p / p.sum()


def frequencies(row, params, n=4000, seed=0):
    rng = np.random.default_rng(seed)
    counts = np.zeros(row.shape[0])
    for _ in range(n):
        counts[sampler.sample_row(row, params, rng)] += 1
    return counts / n


@pytest.mark.parametrize("vocab", [7, 300, 5000])
def test_temperature_sampling_follows_the_softmax(vocab):
    rng = np.random.default_rng(vocab)
    row = rng.standard_normal(vocab).astype(np.float32) * 2
    row[:3] += 6          # a few likely tokens, so frequencies are measurable
    for t in (0.5, 1.0, 1.7):
        want = softmax(row, t)
        got = frequencies(row, SamplingParams(temperature=t))
        # 4000 draws: 5 standard errors on each token
        assert np.all(np.abs(got - want) <= 5 * np.sqrt(want * (1 - want) / 4000) + 1e-3)


def test_filters_restrict_the_support():
    row = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0], np.float32)
    p = softmax(row)
    top2 = frequencies(row, SamplingParams(top_k=2), n=2000)
    assert set(np.flatnonzero(top2)) == {0, 1}
    assert top2[0] == pytest.approx(p[0] / (p[0] + p[1]), abs=0.04)
    # top_p: the smallest prefix of most likely tokens reaching the mass
    k = int(np.searchsorted(np.cumsum(p), 0.9)) + 1
    assert set(np.flatnonzero(frequencies(row, SamplingParams(top_p=0.9), n=3000))) \
        == set(range(k))
    # min_p: tokens below min_p times the best one's probability
    keep = set(np.flatnonzero(p >= 0.1 * p.max()))
    assert set(np.flatnonzero(frequencies(row, SamplingParams(min_p=0.1), n=3000))) == keep
    for params in (SamplingParams(top_k=1), SamplingParams(top_p=1e-6),
                   SamplingParams(min_p=1.0), SamplingParams(temperature=1e-3)):
        assert set(np.flatnonzero(frequencies(row, params, n=200))) == {0}


def test_top_k_block_prefilter_matches_a_full_partition():
    rng = np.random.default_rng(3)
    for trial in range(20):
        row = rng.standard_normal(4096).astype(np.float32) * rng.uniform(0.1, 5)
        k = int(rng.integers(1, 200))
        ids, p = sampler.candidates(row, SamplingParams(top_k=k))
        assert set(ids.tolist()) == set(np.argsort(-row, kind="stable")[:k].tolist())


def test_top_p_over_a_flat_large_vocabulary():
    rng = np.random.default_rng(4)
    row = rng.standard_normal(40000).astype(np.float32) * 0.3      # needs the whole ladder
    ids, p = sampler.candidates(row, SamplingParams(top_p=0.97))
    q = softmax(row)
    order = np.argsort(-q, kind="stable")
    k = int(np.searchsorted(np.cumsum(q[order]), 0.97)) + 1
    assert abs(ids.shape[0] - k) <= 2          # float32 vs float64 mass at the boundary
    assert set(ids[:k - 2].tolist()) <= set(order[:k].tolist())


def test_draw_is_inverse_cdf():
    rng = np.random.default_rng(5)
    for n in (1, 3, 700, 1025, 9000):
        p = rng.random(n).astype(np.float32)
        p[rng.random(n) < 0.3] = 0
        p[0] += 1e-3
        cdf = np.cumsum(p, dtype=np.float64)
        for u in (0.0, 1e-9, 0.25, 0.5, 0.999999, rng.random()):
            want = min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), n - 1)
            got = sampler.draw(p, u)
            assert p[got] > 0
            # block sums round differently from one running sum: at most a neighbour
            assert abs(cdf[got] - cdf[want]) <= 1e-5 * cdf[-1]


def test_same_generator_state_gives_the_same_token():
    row = np.random.default_rng(6).standard_normal(32000).astype(np.float32)
    params = SamplingParams(temperature=0.9, top_p=0.9, top_k=100)
    a = [sampler.sample_row(row, params, np.random.default_rng(s)) for s in range(20)]
    b = [sampler.sample_row(row.copy(), params, np.random.default_rng(s)) for s in range(20)]
    assert a == b and len(set(a)) > 1


def test_draw_never_picks_a_removed_token():
    # float32 block sums against a float64 running sum: a target in the gap used to run
    # past a block's last candidate onto a token min_p had removed (p = 0)
    params = SamplingParams(temperature=1.0, min_p=0.1)
    row = np.random.default_rng(274).uniform(-2.3, 0, 2048).astype(np.float32)
    row[255::256] = -10.0

    class Fixed:
        def random(self):
            return 0.7532205668228442

    ids, p = sampler.candidates(row, params)
    tok = sampler.sample_row(row, params, Fixed())
    pos = tok if ids is None else int(np.flatnonzero(ids == tok)[0])
    assert p[pos] > 0


def test_non_finite_logits_give_a_token():
    rng = np.random.default_rng(0)
    for params in (SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.5, top_k=4)):
        nan_but_one = np.full(50, np.nan, np.float32)
        nan_but_one[7] = -3.0
        assert sampler.sample_row(nan_but_one, params, rng) == 7      # NaN: impossible
        certain = np.zeros(50, np.float32)
        certain[11] = np.inf
        assert sampler.sample_row(certain, params, rng) == 11          # +inf: certain
        for hopeless in (np.full(50, np.nan, np.float32), np.full(50, -np.inf, np.float32)):
            assert sampler.sample_row(hopeless, params, rng) == 0
        ok = sampler.sample_row(np.r_[np.full(49, -np.inf), 0.0].astype(np.float32), params, rng)
        assert ok == 49


def test_greedy_and_logprobs():
    logits = np.random.default_rng(7).standard_normal((5, 50)).astype(np.float32)
    assert sampler.greedy(logits, [0, 1, 2, 3, 4]).tolist() == logits.argmax(1).tolist()
    assert sampler.greedy(logits, [3, 1]).tolist() == logits[[3, 1]].argmax(1).tolist()
    for rows in ([1, 1, 2, 3, 4], [4, 3, 2, 1, 0], [0, 0, 0, 0, 0]):   # as many rows as B
        assert sampler.greedy(logits, rows).tolist() == logits[rows].argmax(1).tolist()
    row = logits[2]
    ref = np.log(softmax(row))
    chosen, entry = sampler.token_logprobs(row, 7, 4)
    assert chosen == pytest.approx(ref[7], abs=1e-6)
    assert set(entry) == set(np.argsort(-ref)[:4].tolist()) | {7}
    assert all(entry[t] == pytest.approx(ref[t], abs=1e-6) for t in entry)
    assert list(sampler.token_logprobs(row, 7, 0)[1]) == [7]


# -- stop checker -------------------------------------------------------------------------------
def test_stop_checker_tokens_and_length():
    c = StopChecker(SamplingParams(stop_token_ids=[9]), eos_token_ids=(2,), max_tokens=4)
    assert c.check_token(2) == ("stop", None)
    assert c.check_token(9) == ("stop", 9)
    assert c.check_token(3) is None
    assert c.check_length(3) is None and c.check_length(4) == ("length", None)
    c = StopChecker(SamplingParams(ignore_eos=True), eos_token_ids=(2,), max_tokens=4)
    assert c.check_token(2) is None


def test_stop_strings_and_holdback():
    c = StopChecker(SamplingParams(stop=["END", "\n\n"]), (), 100)
    assert c.find_stop_string("abc", 3) is None
    assert c.find_stop_string("abcEN", 2) is None
    assert c.holdback("abcEN") == 2 and c.holdback("abc\n") == 1 and c.holdback("abc") == 0
    assert c.find_stop_string("abcEND", 1) == (3, "END")
    assert c.find_stop_string("x\n\nEND", 4) == (1, "\n\n")     # the earliest one wins
    # only stops ending in the new text count (older ones were checked before)
    assert c.find_stop_string("END then more", 4) is None
    c = StopChecker(SamplingParams(stop=["aab"]), (), 100)
    assert c.holdback("xaa") == 2 and c.holdback("xa") == 1 and c.holdback("aax") == 0
