"""The engine against transformers: greedy continuous batching gives exactly the tokens of
``transformers``' ``generate`` (do_sample=False) for each prompt run alone, on tiny random
Llama (default RoPE, llama3 RoPE scaling, tied embeddings, BF16 weights), Qwen2 (q/k/v
biases), Qwen3 (q/k norms) and Mistral (a sliding window smaller than the prompts), also
with a pool far too small for the batch (preemption by recompute and by swap), a token
budget that forces chunked prefill, and a second pass served from the prefix cache."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

from pagedcy.engine import LLMEngine, SamplingParams  # noqa: E402
from pagedcy.models import write_random_checkpoint  # noqa: E402

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, vocab_size=300, max_position_embeddings=256)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
CASES = {
    "llama": ("LlamaForCausalLM", {}, "float32"),
    "llama3-rope": ("LlamaForCausalLM", dict(rope_scaling=LLAMA3, rope_theta=5000.0), "float32"),
    "llama-tied": ("LlamaForCausalLM", dict(tie_word_embeddings=True), "float32"),
    "llama-bf16": ("LlamaForCausalLM", {}, "bfloat16"),
    "qwen2-bias": ("Qwen2ForCausalLM", {}, "float32"),
    "qwen3": ("Qwen3ForCausalLM", dict(head_dim=32), "float32"),
    "mistral-window": ("MistralForCausalLM", dict(sliding_window=6), "float32"),
}
NEW_TOKENS = 16
LENGTHS = [3, 7, 12, 17, 21, 26, 30, 37]      # 8 prompts; the longer ones share a prefix
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
ENGINES = {
    "roomy": dict(kv_cache_pages=128, max_num_batched_tokens=64),
    "tiny-pool-recompute": dict(kv_cache_pages=16, max_num_batched_tokens=8),
    "tiny-pool-swap": dict(kv_cache_pages=16, max_num_batched_tokens=8,
                           preemption_mode="swap", swap_pages=40),
}


def prompts_for(vocab):
    rng = np.random.default_rng(42)
    prefix = rng.integers(6, vocab, 12).tolist()
    out = []
    for n in LENGTHS:
        own = rng.integers(6, vocab, n).tolist()
        out.append(prefix + own[:n - 12] if n > 14 else own)
    return out


def hf_generate(path, prompts):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager").eval()
    eos = model.generation_config.eos_token_id
    out = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)      # tiny matrices: threads only add contention
    try:
        with torch.no_grad():
            for p in prompts:
                ids = model.generate(torch.tensor([p]), attention_mask=torch.ones_like(
                    torch.tensor([p])), do_sample=False, max_new_tokens=NEW_TOKENS,
                    pad_token_id=eos)
                out.append(ids[0, len(p):].tolist())
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    arch, overrides, dtype = CASES[request.param]
    path = str(tmp_path_factory.mktemp(request.param))
    write_random_checkpoint(path, arch, dtype=dtype, seed=3, **dict(TINY, **overrides))
    prompts = prompts_for(TINY["vocab_size"])
    if "sliding_window" in overrides:
        assert overrides["sliding_window"] < max(LENGTHS)
    return path, prompts, hf_generate(path, prompts)


def generate(engine, prompts, prefix="r"):
    for i, p in enumerate(prompts):
        engine.add_request(f"{prefix}{i}", p, GREEDY)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return [done[f"{prefix}{i}"] for i in range(len(prompts))]


@pytest.mark.parametrize("setup", sorted(ENGINES))
def test_continuous_batching_equals_transformers_generate(case, setup):
    path, prompts, want = case
    engine = LLMEngine(path, page_size=4, num_threads=1, **ENGINES[setup])
    first = generate(engine, prompts)
    for i, (out, ref) in enumerate(zip(first, want)):
        assert out.outputs[0].token_ids == ref, f"prompt {i} ({len(prompts[i])} tokens)"
    st = engine.stats()
    if setup != "roomy":
        assert st.num_preemptions > 0
        if setup.endswith("swap"):
            assert engine.manager.stats().swap_outs > 0
    # a second pass reuses the pages the first one left in the prefix cache
    hits = st.prefix_cache_hits
    second = generate(engine, prompts, prefix="again")
    assert engine.stats().prefix_cache_hits > hits
    assert any(o.num_cached_tokens > 0 for o in second)
    assert [o.outputs[0].token_ids for o in second] == want
    engine.manager.check_invariants()
    assert engine.manager.stats().used_blocks == 0

