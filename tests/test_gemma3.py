"""Gemma 3 (text-only ``Gemma3ForCausalLM``) against transformers.

Checkpoints built by transformers' own classes (random weights, norms around Gemma's zero
init) and by ``write_random_checkpoint``: prefill and decode logits within 1e-4 relative on
prompts longer than the sliding window, greedy continuous batching equal to ``generate``
token for token, the config's two RoPE settings and layer pattern as transformers reads them,
the embedding multiplier rounded as transformers rounds it, softcapping, and EOS lists.
"""
import json
import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from model_helpers import (SlotAllocator, assert_close, hf_logits,  # noqa: E402
                           run_and_compare)

from pagedcy import LLM, SamplingParams  # noqa: E402
from pagedcy.models import ModelConfig, load_model, write_random_checkpoint  # noqa: E402

TINY = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            head_dim=48, intermediate_size=96, vocab_size=101, max_position_embeddings=256,
            sliding_window=5, query_pre_attn_scalar=24,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"])
CASES = {
    "plain": {},
    "linear-rope-global": dict(rope_scaling={"rope_type": "linear", "factor": 4.0}),
    # transformers' Gemma 3 applies the final softcap and ignores the attention one
    "softcaps": dict(final_logit_softcapping=5.0, attn_logit_softcapping=3.0),
}


def build_hf(tmp_path_factory, name, overrides, seed=0):
    """A transformers Gemma3ForCausalLM with wide random weights (norm weights w near 0:
    Gemma scales by 1 + w), saved and reloaded in float32 with eager attention."""
    cfg = transformers.Gemma3TextConfig(**dict(TINY, **overrides))
    torch.manual_seed(seed)
    model = transformers.Gemma3ForCausalLM(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            std = 0.1 if "norm" in pname else 0.15
            p.copy_(std * torch.randn(p.shape, generator=g))
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                            attn_implementation="eager")
    return str(path), ref.eval()


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    path, ref = build_hf(tmp_path_factory, request.param, CASES[request.param])
    return load_model(path, num_threads=2), ref


def test_prefill_and_decode_match_transformers(pair):
    model, ref = pair
    assert model.config.architecture == "Gemma3ForCausalLM"
    assert model.config.sliding_window == 5 < 11
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 101, n) for n in (11, 3, 17, 1, 6)]
    run_and_compare(model, ref, prompts, decode_steps=4)


def test_chunked_prefill_across_the_window(pair):
    """A 19-token prompt fed in chunks of 4, 7, 8 (each crossing the 5-token window)."""
    model, ref = pair
    seq = np.random.default_rng(3).integers(0, 101, 19)
    want = hf_logits(ref, seq)
    alloc = SlotAllocator(model, max_pages=32, page_size=4, seed=4)
    done = 0
    for chunk in (4, 7, 8):
        got = model.forward(alloc.store.pages(), seq[done:done + chunk].astype(np.int32),
                            alloc.step([0], [chunk]))
        done += chunk
        assert_close(got[0], want[done - 1])


def test_config_as_transformers_reads_it(pair):
    """Layer types, per-layer window, RoPE inverse frequencies (local theta on sliding
    layers, global theta + scaling on full ones) and query scale are transformers'."""
    from pagedcy.models.rope import inv_freq

    model, ref = pair
    c, hc = model.config, ref.config
    assert [c.window_left(i) >= 0 for i in range(c.num_layers)] == \
        [t == "sliding_attention" for t in hc.layer_types]
    assert {c.window_left(i) for i in range(c.num_layers)} == {-1, hc.sliding_window - 1}
    for i, t in enumerate(hc.layer_types):
        want = getattr(ref.model.rotary_emb, f"{t}_inv_freq").numpy()
        np.testing.assert_allclose(inv_freq(c, i), want, rtol=1e-6)
    assert c.query_scale == pytest.approx(hc.query_pre_attn_scalar ** -0.5)
    assert c.num_parameters() == sum(p.numel() for p in ref.parameters())
    assert model.weight_bytes == 4 * c.num_parameters()


def test_sliding_window_matters(pair):
    """The window is what makes the logits match: without it a long prompt differs."""
    model, ref = pair
    ids = np.arange(14) * 7 % 101
    wide = transformers.AutoModelForCausalLM.from_pretrained(
        ref.config._name_or_path, dtype=torch.float32, attn_implementation="eager",
        sliding_window=1000).eval()
    assert np.abs(hf_logits(wide, ids)[-1] - hf_logits(ref, ids)[-1]).max() > 1e-3


def test_hub_style_config_fields():
    """The pre-5.0 config.json of the Hub's Gemma 3 1B: rope_theta (global) +
    rope_local_base_freq (sliding) + rope_scaling, every 6th layer global
    (sliding_window_pattern), tied embeddings and head_dim 256 by default."""
    raw = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
           "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
           "num_attention_heads": 4, "num_key_value_heads": 1, "vocab_size": 262144,
           "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
           "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window": 512,
           "sliding_window_pattern": 6, "query_pre_attn_scalar": 256,
           "hidden_activation": "gelu_pytorch_tanh", "eos_token_id": [1, 106],
           "final_logit_softcapping": None, "attn_logit_softcapping": None}
    c = ModelConfig.from_dict(raw)
    hc = transformers.Gemma3TextConfig(**{k: v for k, v in raw.items() if k != "architectures"})
    assert [c.window_left(i) >= 0 for i in range(26)] == \
        [t == "sliding_attention" for t in hc.layer_types]
    assert c.window_left(0) == 511 and c.window_left(5) == -1
    assert c.head_dim == 256 and c.tie_word_embeddings and c.eos_token_ids == (1, 106)
    assert c.rope_params(0) == (10000.0, None)
    assert c.rope_params(5) == (1e6, {"rope_type": "linear", "factor": 8.0})
    assert c.hidden_act == "gelu_tanh" and c.embed_scale == pytest.approx(1152 ** 0.5)


@pytest.mark.parametrize("bad, match", [
    (dict(use_bidirectional_attention=True), "bidirectional"),
    (dict(hidden_activation="gelu"), "hidden_act"),
    (dict(rope_parameters={"sliding_attention": {"rope_type": "linear", "factor": 2.0},
                           "full_attention": {"rope_type": "default"}}), "sliding layers"),
    (dict(final_logit_softcapping=-1.0), "final_logit_softcapping"),
])
def test_bad_gemma_configs_are_refused(bad, match):
    raw = dict(TINY, architectures=["Gemma3ForCausalLM"], **bad)
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_dict(raw)


def test_embedding_multiplier_rounds_like_transformers():
    """sqrt(hidden) in the embedding table's dtype, as Gemma3TextScaledWordEmbedding does."""
    from pagedcy.models.linear import DenseWeight, HalfWeight
    from pagedcy.models.model import embed_multiplier

    for h in (64, 1152, 2560, 3072):
        for tdt, table in ((torch.float32, DenseWeight(np.zeros((1, 2), np.float32))),
                           (torch.bfloat16, HalfWeight(np.zeros((1, 2), np.uint16), "bfloat16")),
                           (torch.float16, HalfWeight(np.zeros((1, 2), np.float16)))):
            want = torch.tensor(h ** 0.5).to(tdt).float().item()
            assert embed_multiplier(h ** 0.5, table) == want


def test_random_checkpoint_matches_transformers(tmp_path):
    path = write_random_checkpoint(tmp_path, "Gemma3ForCausalLM", seed=1, tokenizer=False,
                                   num_hidden_layers=3)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    model = load_model(path)
    c = model.config
    assert c.head_dim * c.num_heads != c.hidden_size and c.sliding_window < 14
    assert model.weight_bytes == 4 * sum(p.numel() for p in ref.parameters())
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, c.vocab_size, n) for n in (9, 14)]
    alloc = SlotAllocator(model, max_pages=16, page_size=4, seed=2)
    got = model.forward(alloc.store.pages(), np.concatenate(prompts).astype(np.int32),
                        alloc.step([0, 1], [9, 14]))
    assert_close(got, np.stack([hf_logits(ref, p)[-1] for p in prompts]))
    top2 = np.sort(got, axis=1)[:, -2:]
    assert got.std() > 1.0 and np.all(top2[:, 1] - top2[:, 0] > 1e-3)


# -- the engine: greedy continuous batching against transformers' generate ---------------

GEN = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
           head_dim=32, intermediate_size=96, vocab_size=300, max_position_embeddings=256,
           sliding_window=6, layer_types=["sliding_attention", "sliding_attention", "full_attention"])
LENGTHS = [3, 7, 12, 17, 25]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def gen_case(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gemma3-gen"))
    write_random_checkpoint(path, "Gemma3ForCausalLM", seed=5, **GEN)
    rng = np.random.default_rng(9)
    prompts = [rng.integers(6, 300, n).tolist() for n in LENGTHS]
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager").eval()
    want = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            out = ref.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=NEW_TOKENS, pad_token_id=0)
            want.append(out[0, len(p):].tolist())
    return path, prompts, want


def _generate(path, prompts, **params):
    llm = LLM(path, page_size=4, num_threads=1, kv_cache_pages=96,
              max_num_batched_tokens=params.pop("budget", 64))
    return llm, llm.generate([{"prompt_token_ids": p} for p in prompts],
                             SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, **params),
                             use_tqdm=False)


@pytest.mark.parametrize("budget", [64, 8])
def test_continuous_batching_equals_generate(gen_case, budget):
    """All prompts through one pagedcy.LLM (chunked prefill with budget 8), prompts up to 4x
    the window: the same tokens as transformers' generate for each prompt alone."""
    path, prompts, want = gen_case
    _, got = _generate(path, prompts, budget=budget)
    for i, (out, ref) in enumerate(zip(got, want)):
        assert out.outputs[0].token_ids == ref, f"prompt {i} ({len(prompts[i])} tokens)"


def test_generation_stops_at_every_eos_id(gen_case, tmp_path):
    """eos_token_id as a list (generation_config.json): whichever id comes first stops."""
    path, prompts, _ = gen_case
    free = _generate(path, prompts[:1], ignore_eos=True)[1][0].outputs[0].token_ids
    stop = free[4]
    first = free.index(stop)
    copy = str(tmp_path / "eos-list")
    shutil.copytree(path, copy)
    with open(os.path.join(copy, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": [299 if stop != 299 else 298, stop]}, f)
    llm, (out,) = _generate(copy, prompts[:1])
    assert stop in llm.llm_engine.model_config.eos_token_ids
    assert len(llm.llm_engine.model_config.eos_token_ids) == 2
    assert out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].token_ids == free[:first + 1]      # the EOS token is kept, as vLLM
