"""pagedcy.models against transformers on the same tiny checkpoints.

Each checkpoint is built with transformers' own classes (random weights with a wide
spread), saved with save_pretrained, loaded by pagedcy and compared logit by logit:
a varlen prefill of several prompts in one forward over permuted pages, batched decode
steps with teacher forcing, and prompts fed in chunks across forwards.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from model_helpers import (SlotAllocator, assert_close, hf_logits, randomize,  # noqa: E402
                           run_and_compare)

from pagedcy.models import load_model  # noqa: E402

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, vocab_size=101, max_position_embeddings=256)

CASES = {
    "llama-tied": ("LlamaConfig", dict(tie_word_embeddings=True)),
    "llama3-rope": ("LlamaConfig", dict(rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}, rope_theta=5000.0)),
    "llama-linear-rope": ("LlamaConfig", dict(rope_scaling={"rope_type": "linear", "factor": 4.0})),
    "qwen2-bias": ("Qwen2Config", dict()),
    "qwen3-qknorm": ("Qwen3Config", dict(head_dim=32)),
    "mistral-window": ("MistralConfig", dict(sliding_window=5)),
}


def build_hf(tmp_path_factory, name, cls_name, overrides, *, dtype=None, shard=None, seed=0):
    cfg = getattr(transformers, cls_name)(**dict(TINY, **overrides))
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    randomize(model.float(), seed=seed)
    path = tmp_path_factory.mktemp(name)
    if dtype is not None:
        model = model.to(dtype)
    kw = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(path, **kw)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                            attn_implementation="eager")
    return str(path), ref.eval()


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    cls_name, overrides = CASES[request.param]
    path, ref = build_hf(tmp_path_factory, request.param, cls_name, overrides)
    return load_model(path, num_threads=2), ref


def test_prefill_and_decode_match_transformers(pair):
    model, ref = pair
    rng = np.random.default_rng(0)
    V = model.config.vocab_size
    prompts = [rng.integers(0, V, n) for n in (11, 3, 17, 1)]
    run_and_compare(model, ref, prompts)


def test_chunked_prefill_mixed_with_decode(pair):
    model, ref = pair
    rng = np.random.default_rng(2)
    V = model.config.vocab_size
    long_seq = rng.integers(0, V, 14)
    short = rng.integers(0, V, 9)  # prefilled at once, then decodes next to the chunks
    want_long, want_short = hf_logits(ref, long_seq), hf_logits(ref, short)
    alloc = SlotAllocator(model, max_pages=32, page_size=4, seed=3)
    slots = alloc.step([1], [6])
    got = model.forward(alloc.store.pages(), short[:6].astype(np.int32), slots)
    assert_close(got[0], want_short[5])
    done_long, done_short = 0, 6
    for chunk in (5, 6, 3):
        ids = np.concatenate([long_seq[done_long:done_long + chunk], short[done_short:done_short + 1]])
        slots = alloc.step([0, 1], [chunk, 1])
        got = model.forward(alloc.store.pages(), ids.astype(np.int32), slots)
        done_long += chunk
        done_short += 1
        assert_close(got[0], want_long[done_long - 1])
        assert_close(got[1], want_short[done_short - 1])


def test_sliding_window_matters(tmp_path_factory):
    """Mistral's window is smaller than the prompts: a full-attention model would differ."""
    path, ref = build_hf(tmp_path_factory, "mistral-w3", "MistralConfig", dict(sliding_window=3))
    model = load_model(path)
    assert model.config.sliding_window == 3
    assert [model.config.window_left(i) for i in range(2)] == [2, 2]
    run_and_compare(model, ref, [np.arange(12) % 101, (np.arange(7) * 5) % 101], decode_steps=2)
    full = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", sliding_window=None)
    ids = np.arange(12) % 101
    assert np.abs(hf_logits(full, ids)[-1] - hf_logits(ref, ids)[-1]).max() > 1e-3


def test_qwen2_sliding_window_disabled_by_default(tmp_path_factory):
    path, ref = build_hf(tmp_path_factory, "qwen2-sw", "Qwen2Config",
                         dict(sliding_window=4, use_sliding_window=False))
    model = load_model(path)
    assert model.config.sliding_window is None
    run_and_compare(model, ref, [np.arange(10) * 3 % 101], decode_steps=1)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_checkpoints(tmp_path_factory, dtype):
    path, ref = build_hf(tmp_path_factory, f"llama-{dtype}", "LlamaConfig", {},
                         dtype=getattr(torch, dtype))
    model = load_model(path)
    rng = np.random.default_rng(5)
    run_and_compare(model, ref, [rng.integers(0, 101, 9), rng.integers(0, 101, 4)], decode_steps=2)


def test_bf16_without_ml_dtypes(tmp_path_factory, monkeypatch):
    """The raw-bytes path (no ml_dtypes) widens BF16 to exactly the same float32 values."""
    from pagedcy.models import weights

    path, ref = build_hf(tmp_path_factory, "llama-bf16-raw", "LlamaConfig", {}, dtype=torch.bfloat16)
    monkeypatch.setattr(weights, "_has_ml_dtypes", lambda: False)
    raw = weights.CheckpointReader(path)
    assert not raw._bf16_native
    name = "model.layers.1.mlp.down_proj.weight"
    want = ref.state_dict()[name].numpy()
    np.testing.assert_array_equal(raw.get(name), want)


def test_sharded_checkpoint(tmp_path_factory):
    import os

    path, ref = build_hf(tmp_path_factory, "qwen2-sharded", "Qwen2Config", {}, shard="40KB")
    assert os.path.exists(os.path.join(path, "model.safetensors.index.json"))
    assert len([f for f in os.listdir(path) if f.endswith(".safetensors")]) > 1
    model = load_model(path)
    run_and_compare(model, ref, [np.arange(8) % 101], decode_steps=1)


def test_weight_bytes_and_cache_config(pair):
    model, ref = pair
    n_params = sum(p.numel() for p in ref.parameters())
    if model.config.tie_word_embeddings:
        assert ref.lm_head.weight.data_ptr() == ref.model.embed_tokens.weight.data_ptr()
    assert model.weight_bytes == 4 * n_params == 4 * model.config.num_parameters()
    kc = model.kv_cache_config(10, page_size=8, dtype="float16")
    assert (kc.max_pages, kc.page_size, kc.num_layers, kc.num_kv_heads, kc.head_dim, kc.dtype) == \
        (10, 8, 2, 2, model.config.head_dim, "float16")


@pytest.mark.parametrize("kv_dtype, rtol", [("float16", 3e-2), ("bfloat16", 3e-2), ("int8", 3e-2)])
def test_compact_kv_cache_close(pair, kv_dtype, rtol):
    """K/V stored in 16 bits or int8 (rows of head_dim + 4 with their scale): logits stay
    close to the float32 cache's."""
    model, _ = pair
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 101, 10), rng.integers(0, 101, 5)]
    ids = np.concatenate(prompts).astype(np.int32)
    out = []
    for dt in ("float32", kv_dtype):
        alloc = SlotAllocator(model, max_pages=16, page_size=4, seed=1, dtype=dt)
        out.append(model.forward(alloc.store.pages(), ids, alloc.step([0, 1], [10, 5])).copy())
    assert_close(out[1], out[0], rtol=rtol)     # measured: 4e-4, 3e-3, 1.2e-2


def test_int8_cache_queries_follow_activation_dtype(tmp_path_factory, monkeypatch):
    """activation_dtype="auto" rounds decode queries to int8 over an int8 cache (integer dot
    products, as llama.cpp) and "float32" keeps them float: the attention calls carry the
    option, the logits differ in their bits but both stay close to the float32 cache's, and
    over float pages the two give the same bits."""
    import pagedcy.models.model as mm

    path, _ = build_hf(tmp_path_factory, "int8q", "LlamaConfig",
                       dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2))
    models = {a: load_model(path, num_threads=2, activation_dtype=a) for a in ("auto", "float32")}
    assert models["auto"].quantize_query and not models["float32"].quantize_query
    seen = []
    run = mm.run_attention

    def spy(*args, **kw):
        seen.append(kw["quantize_query"])
        return run(*args, **kw)
    monkeypatch.setattr(mm, "run_attention", spy)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 101, 40), rng.integers(0, 101, 23)]

    def logits(model, kv_dtype):
        alloc = SlotAllocator(model, max_pages=40, page_size=4, seed=2, dtype=kv_dtype)
        pages = alloc.store.pages()
        model.forward(pages, np.concatenate(prompts).astype(np.int32), alloc.step([0, 1], [40, 23]))
        steps = []
        for t in range(3):               # decode steps: one query per sequence
            ids = np.array([prompts[0][t], prompts[1][t]], np.int32)
            steps.append(model.forward(pages, ids, alloc.step([0, 1], [1, 1])).copy())
        return np.concatenate(steps)
    ref = logits(models["float32"], "float32")
    seen.clear()
    got = {a: logits(m, "int8") for a, m in models.items()}
    assert seen == [True] * 8 + [False] * 8          # 2 layers x 4 forwards each
    assert not np.array_equal(got["auto"], got["float32"])
    for a in got:
        assert_close(got[a], ref, rtol=3e-2)
    np.testing.assert_array_equal(logits(models["auto"], "float32"), ref)


def test_rope_inverse_frequencies_match(pair):
    """Our inv_freq (with llama3 scaling where configured) is transformers' buffer."""
    from pagedcy.models.rope import inv_freq

    model, ref = pair
    want = ref.model.rotary_emb.inv_freq.numpy()
    np.testing.assert_allclose(inv_freq(model.config), want, rtol=1e-6)
    if model.config.rope_scaling is not None:
        plain = dict(vars(model.config))
        plain["rope_scaling"] = None
        from pagedcy.models import ModelConfig
        assert np.abs(inv_freq(ModelConfig(**plain)) - want).max() > 1e-4
