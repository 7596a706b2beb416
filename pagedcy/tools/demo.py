"""``python -m pagedcy demo``: an offline continuous-batching run of a small random Llama.

It writes a random Llama checkpoint (``pagedcy.models.write_random_checkpoint``: weights,
config and a locally trained byte-level BPE tokenizer; no network) into a temporary
directory and serves a batch of text requests through :class:`pagedcy.LLM`: prompts share
a few long "system prompt" prefixes (so the prefix cache hits), lengths and answer lengths
vary, some requests ask for two completions (forked copy-on-write) and some sample with a
seed. The KV pool is deliberately too small for the whole batch, so sequences get
preempted (swapped out while the swap pool has room, recomputed otherwise) and resumed.
The run ends with a summary, a spot check that a few requests give the same tokens when
run alone on a roomy engine, and a leak check; the exit code is 1 if a page leaked or a
spot check disagreed.
"""
import sys
import tempfile
import time

import numpy as np

SYSTEM_PROMPTS = [
    "You are a helpful assistant. Answer briefly and clearly, and say so when you do not "
    "know. Keep every answer under a hundred words.",
    "The following is a conversation about a little town by the sea, its harbour, its "
    "boats and the fishermen who go out every morning and come back every evening.",
    "You are a careful programmer. Read the question, think about the data structures "
    "involved, then answer with a short Python function and one sentence about it.",
    "Summarise the text for a busy reader: one line with the main point, then three "
    "bullet points with the details that matter most.",
]
QUESTIONS = [
    "What is a paged key-value cache?", "How many boats came back today?",
    "Write a function that adds two numbers.", "Why is the sky blue?",
    "Tell me a story about a fox.", "What is continuous batching?",
    "Count from one to ten.", "What is the weather like?", "Shall we go for a walk?",
    "Explain prefix caching in one sentence.", "Hello! How are you today?",
    "What does the assistant do?",
]


def build_checkpoint(path, quick):
    """A random Llama in ``path``; small for --quick."""
    from pagedcy.models import write_random_checkpoint
    size = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=256) if quick else \
        dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, intermediate_size=512)
    return write_random_checkpoint(path, "LlamaForCausalLM", vocab_size=512,
                                   max_position_embeddings=2048, seed=0, **size)


def workload(n, seed, quick):
    """(prompts, SamplingParams list) of ``n`` requests."""
    from pagedcy.engine import SamplingParams
    rng = np.random.default_rng(seed)
    prompts, params = [], []
    hi = 48 if quick else 128
    for i in range(n):
        system = SYSTEM_PROMPTS[int(rng.integers(len(SYSTEM_PROMPTS)))]
        question = QUESTIONS[int(rng.integers(len(QUESTIONS)))]
        prompts.append(f"{system}\nUser {i}: {question}\nAssistant:")
        max_tokens = int(rng.integers(8, hi + 1))
        kind = rng.random()
        if kind < 0.15:      # parallel sampling: the prompt's pages are forked
            params.append(SamplingParams(n=2, temperature=0.8, top_p=0.95, seed=i,
                                         max_tokens=max_tokens))
        elif kind < 0.4:
            params.append(SamplingParams(temperature=0.7, top_k=50, seed=i,
                                         max_tokens=max_tokens))
        else:
            params.append(SamplingParams(temperature=0.0, max_tokens=max_tokens))
    return prompts, params


def pool_pages(prompts_tokens, params, page_size, max_num_seqs):
    """A pool about 25% of what the largest ``max_num_seqs`` requests would hold at once
    (so preemption happens), never below what one request needs."""
    need = sorted((-(-(len(t) + p.max_tokens) // page_size) * p.n
                   for t, p in zip(prompts_tokens, params)), reverse=True)
    one = max(-(-(len(t) + p.max_tokens) // page_size) for t, p in zip(prompts_tokens, params))
    return max(int(0.25 * sum(need[:max_num_seqs])), one + 2)


def spot_check(path, prompts, params, outputs, num_threads, k=3):
    """Re-run the ``k`` longest greedy requests alone on a roomy engine; returns
    (checked, mismatched)."""
    from pagedcy.engine import LLM
    greedy = [i for i, p in enumerate(params) if p.temperature == 0.0]
    pick = sorted(greedy, key=lambda i: -len(outputs[i].outputs[0].token_ids))[:k]
    if not pick:
        return 0, 0
    llm = LLM(path, kv_cache_pages=512, max_num_seqs=1, num_threads=num_threads,
              enable_prefix_cache=False)
    bad = 0
    for i in pick:
        alone = llm.generate([prompts[i]], params[i], use_tqdm=False)[0]
        bad += alone.outputs[0].token_ids != outputs[i].outputs[0].token_ids
    return len(pick), bad


def leak_check(engine):
    """True when every page is back: no handle, no held or swapped page, invariants hold,
    and dropping the prefix cache empties the pool."""
    mgr = engine.manager
    try:
        mgr.check_invariants()
    except AssertionError:
        return False
    s = mgr.stats()
    if s.used_blocks or s.num_handles or s.swap_used_blocks:
        return False
    mgr.reset_prefix_cache()
    return mgr.pool.free_count() == mgr.total_blocks()


def run(args, tmpdir):
    """Build, serve, check; returns (summary dict, ok)."""
    from pagedcy.engine import LLM
    quick = args.quick
    n = args.requests if args.requests is not None else (48 if quick else 200)
    threads = getattr(args, "threads", None)
    path = build_checkpoint(tmpdir, quick)
    prompts, params = workload(n, args.seed, quick)
    page_size, max_num_seqs = 16, 32
    probe = LLM(path, kv_cache_pages=1, num_threads=threads)
    tokens = [probe.get_tokenizer().encode(p) for p in prompts]
    pages = pool_pages(tokens, params, page_size, max_num_seqs)
    llm = LLM(path, kv_cache_pages=pages, page_size=page_size, max_num_seqs=max_num_seqs,
              max_num_batched_tokens=512, preemption_mode="swap", swap_pages=pages // 10,
              num_threads=threads, seed=args.seed)
    engine = llm.llm_engine
    t0 = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=not args.no_progress)
    elapsed = time.perf_counter() - t0
    st = engine.stats()
    ms = engine.manager.stats()
    mc = engine.model_config
    completions = sum(len(o.outputs) for o in outputs)
    prompt_total = sum(len(t) for t in tokens)
    checked, mismatched = spot_check(path, prompts, params, outputs, threads)
    ok_pages = leak_check(engine)
    cfg = engine.manager.config
    summary = {
        "model": f"random {mc.architecture}, {mc.num_parameters() / 1e6:.1f}M parameters, "
                 f"{mc.num_layers} layers, hidden {mc.hidden_size}, vocab {mc.vocab_size}",
        "requests": f"{n} ({completions} completions, "
                    f"{sum(p.n > 1 for p in params)} with n=2 forked copy-on-write)",
        "prompt tokens": f"{prompt_total:,} ({ms.prefix_hits:,} served by the prefix cache, "
                         f"{st.prompt_tokens:,} computed incl. recomputation)",
        "generated tokens": f"{st.generation_tokens:,} in {st.num_steps:,} steps "
                            f"(mean {st.generation_tokens / max(st.num_steps, 1):.1f} per step)",
        "throughput": f"{(st.prompt_tokens + st.generation_tokens) / elapsed:,.0f} tokens/s "
                      f"({st.generation_tokens / elapsed:,.0f} generated/s, {elapsed:.1f} s)",
        "prefill/decode": f"{st.prefill_step_seconds:.2f} s in steps with prefill chunks, "
                          f"{st.decode_step_seconds:.2f} s in decode-only steps "
                          f"({100 * st.forward_seconds / max(elapsed, 1e-9):.0f}% of the run "
                          f"inside the model)",
        "prefix-cache hit": f"{100 * ms.prefix_hit_rate:.1f}% of prompt tokens looked up",
        "preemptions": f"{st.num_preemptions} ({ms.swap_outs} swapped out, "
                       f"{st.num_preemptions - ms.swap_outs} recomputed), "
                       f"{ms.swap_ins} swapped back in",
        "peak pages used": f"{ms.peak_used_blocks} of {pages} "
                           f"({ms.peak_bytes / 2**20:.1f} MiB of {cfg.total_bytes() / 2**20:.1f}"
                           f" MiB, page {page_size} tokens)",
        "forks / COW copies": f"{ms.forks} / {ms.cow_copies}",
        "spot check": f"{checked} requests re-run alone: "
                      + (f"{mismatched} MISMATCHED" if mismatched else "same tokens"),
        "leak check": "ok (every page back in the pool)" if ok_pages else "LEAKED pages",
    }
    return summary, ok_pages and not mismatched


def main(args):
    """Run the demo and print its summary; 1 if a page leaked or a spot check failed."""
    print("pagedcy demo: continuous batching of a random Llama checkpoint "
          "(prefix cache, preemption, copy-on-write forks)")
    sys.stdout.flush()
    with tempfile.TemporaryDirectory(prefix="pagedcy-demo-") as tmp:
        summary, ok = run(args, tmp)
    for k, v in summary.items():
        print(f"  {k:>18}: {v}")
    return 0 if ok else 1
