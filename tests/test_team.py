"""The step team (``pagedcy._libs._team``, pagedcy_team.h): ``run_in_team`` returns and raises
what its function does, and every kernel that posts to the team gives the bits of its own
OpenMP region (the same static split): panel and raw-row projections, fused parts, attention
and a model's decode step. With 1 thread or in a serial build the team runs its function
plainly, and the comparisons still hold."""
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pagedcy.models.model as model_mod
from pagedcy import PagedKVCacheManager, AllocationRequest
from pagedcy._libs import _gemm, _q8panel
from pagedcy._libs._attention import batch_paged_attention
from pagedcy._libs._team import in_team, jobs_posted, run_in_team
from pagedcy._libs._threads import openmp_enabled
from pagedcy.models import load_model, write_random_checkpoint

from attn_helpers import make_batch

gguf = pytest.importorskip("gguf")
from test_q8a import QTYPES, _bits, _weights  # noqa: E402


#: a team of 2 forms only where kernels run in parallel at all
TEAMS = openmp_enabled()


class posts:
    """Asserts the block posted kernel work to a team (where teams form)."""

    def __enter__(self):
        self.before = jobs_posted()

    def __exit__(self, *exc):
        if exc[0] is None:
            assert (jobs_posted() > self.before) == TEAMS


def test_returns_and_raises_what_fn_does():
    assert not in_team()
    assert run_in_team(lambda: (in_team(), 7), 2) == (TEAMS, 7)
    assert run_in_team(lambda: (in_team(), 7), 1) == (False, 7)
    with pytest.raises(KeyError, match="boom"):
        run_in_team(lambda: {}["boom"], 2)
    assert not in_team()
    assert run_in_team(lambda: 8, 2) == 8          # the team still forms after an error
    # nested: the inner call runs plainly, on the outer team
    assert run_in_team(lambda: run_in_team(lambda: in_team(), 2), 2) == TEAMS
    with pytest.raises(TypeError):
        run_in_team(3, 2)
    with pytest.raises(ValueError):
        run_in_team(lambda: 1, 0)


def _panel_case(rng, fmt, m, k=None):
    n, k = int(rng.integers(600, 900)), k or 256 * int(rng.integers(4, 6))    # parallel sizes
    raw, _ = _weights(rng, fmt, n, k)
    x = rng.standard_normal((m, k), dtype=np.float32)
    return x, _q8panel.repack(raw, fmt), n


@settings(max_examples=15, deadline=None)
@given(fmt=st.sampled_from(sorted(QTYPES)), m=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_panel_linear_bits_on_a_team(fmt, m, seed):
    rng = np.random.default_rng(seed)
    x, panel, n = _panel_case(rng, fmt, m)
    plain = _q8panel.linear(x, panel, fmt, n, np.empty((m, n), np.float32), 2)
    with posts():
        teamed = run_in_team(lambda: _q8panel.linear(x, panel, fmt, n, np.empty((m, n), np.float32), 2), 2)
    np.testing.assert_array_equal(_bits(teamed), _bits(plain))
    # fused parts of two formats, one region (here: one team job) over both
    _, panel2, n2 = _panel_case(rng, "q8_0", m, x.shape[1])
    parts = [(panel, fmt, n), (panel2, "q8_0", n2)]
    a = _q8panel.linear_parts(x, parts, np.empty((m, n + n2), np.float32), 2)
    with posts():
        b = run_in_team(lambda: _q8panel.linear_parts(x, parts, np.empty((m, n + n2), np.float32), 2), 2)
    np.testing.assert_array_equal(_bits(b), _bits(a))


@pytest.mark.parametrize("fmt", ["f32", "bf16", "f16"])
def test_dense_linear_bits_on_a_team(fmt):
    rng = np.random.default_rng(1)
    n, k = 777, 1024
    w32 = rng.standard_normal((n, k), dtype=np.float32)
    for m in (1, 3, 16):
        x = rng.standard_normal((m, k), dtype=np.float32)
        if fmt == "f32":
            f = lambda: _gemm.linear(x, w32, np.empty((m, n), np.float32), 2)   # noqa: E731
        else:
            w = w32.astype(np.float16).view(np.uint16) if fmt == "f16" else \
                (w32.view(np.uint32) >> 16).astype(np.uint16)
            f = lambda: _gemm.linear_rows(x, w, fmt, np.empty((m, n), np.float32), 2)  # noqa: E731
        with posts():
            teamed = run_in_team(f, 2)
        np.testing.assert_array_equal(_bits(teamed), _bits(f()))


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_attention_bits_on_a_team(dtype):
    rng = np.random.default_rng(2)
    B = 12
    q, indptr, pages, bt, lens, _, _ = make_batch(
        rng, q_lens=[1] * B, kv_lens=list(rng.integers(500, 900, B)), num_heads=8,
        num_kv_heads=2, head_dim=64, page_size=16, dtype=dtype)

    def run():
        return batch_paged_attention(q, indptr, pages, 1, bt, lens, causal=True, num_threads=2)
    with posts():
        teamed = run_in_team(run, 2)
    np.testing.assert_array_equal(_bits(teamed), _bits(run()))


@pytest.mark.parametrize("kv_len", [100, 300, 700])
def test_small_attention_uses_the_spinning_team(kv_len):
    """One sequence's decode attention is too little work to wake sleeping threads, but on
    a team (whose threads spin) it splits from PAGEDCY_ATTN_TEAM_MIN_WORK: the team takes
    the work, the result matches float64 (and the one-thread bits when the split is by
    heads, not by KV range), and the threshold only moves the split."""
    from pagedcy._libs import _attention
    from attn_helpers import reference
    rng = np.random.default_rng(kv_len)
    q, indptr, pages, bt, lens, Ks, Vs = make_batch(
        rng, q_lens=[1], kv_lens=[kv_len], num_heads=8, num_kv_heads=2, head_dim=64,
        page_size=16, dtype="float32")

    def run(nt):
        return batch_paged_attention(q, indptr, pages, 1, bt, lens, causal=True, num_threads=nt)
    one = run(1)
    with posts():
        teamed = run_in_team(lambda: run(2), 2)
    np.testing.assert_allclose(teamed, reference(q, indptr, Ks, Vs)[0], rtol=1e-5, atol=1e-5)
    if kv_len < 256:                                    # too short for a KV split
        np.testing.assert_array_equal(_bits(teamed), _bits(one))
    prev = _attention._set_min_parallel_work(2.0**62, 2.0**62)
    try:
        before = jobs_posted()
        alone = run_in_team(lambda: run(2), 2)
        assert jobs_posted() == before                  # below the threshold: not posted
        np.testing.assert_array_equal(_bits(alone), _bits(one))
    finally:
        _attention._set_min_parallel_work(*prev)
    with pytest.raises(ValueError):
        _attention._set_min_parallel_work(-1, 0)


def test_two_threads_each_with_a_team():
    rng = np.random.default_rng(3)
    x, panel, n = _panel_case(rng, "q4_k", 2)
    want = _q8panel.linear(x, panel, "q4_k", n, np.empty((2, n), np.float32), 2)
    got, errors = [], []

    def worker():
        try:
            for _ in range(20):
                got.append(run_in_team(
                    lambda: _q8panel.linear(x, panel, "q4_k", n, np.empty((2, n), np.float32), 2), 2))
        except BaseException as e:      # pragma: no cover - reported below
            errors.append(e)
    ts = [threading.Thread(target=worker) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors and len(got) == 40
    for g in got:
        np.testing.assert_array_equal(_bits(g), _bits(want))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_step_bits_with_and_without_the_team(tmp_path, monkeypatch, dtype):
    path = write_random_checkpoint(tmp_path, "LlamaForCausalLM", dtype=dtype, seed=5, tokenizer=False,
                                   hidden_size=512, intermediate_size=1408, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=2, vocab_size=4096)
    model = load_model(path, num_threads=2)
    rng = np.random.default_rng(0)

    def steps(team_tokens):
        monkeypatch.setattr(model_mod, "TEAM_MAX_TOKENS", team_tokens)
        mgr = PagedKVCacheManager(model.kv_cache_config(64, page_size=16))
        hs = [mgr.allocate(AllocationRequest(prompt_tokens=p, request_id=str(i)))
              for i, p in enumerate(prompts)]
        outs = []
        slots = mgr.prepare_step(hs, [len(p) for p in prompts])
        outs.append(model.forward(mgr.store.pages(), np.concatenate(prompts).astype(np.int32), slots).copy())
        mgr.commit_step(hs, [len(p) for p in prompts])
        for tok in toks:
            for h in hs:
                mgr.extend(h, 1)
            slots = mgr.prepare_step(hs, [1] * len(hs))
            outs.append(model.forward(mgr.store.pages(), tok, slots).copy())
            mgr.commit_step(hs, [1] * len(hs))
        return outs
    prompts = [rng.integers(0, 4096, int(rng.integers(3, 40))) for _ in range(5)]
    toks = [rng.integers(0, 4096, 5).astype(np.int32) for _ in range(4)]
    with posts():
        teamed = steps(16)
    for a, b in zip(teamed, steps(0)):
        np.testing.assert_array_equal(_bits(a), _bits(b))
