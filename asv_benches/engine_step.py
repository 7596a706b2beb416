"""Engine overhead per decode step: everything but the model forward (scheduling, the
manager's step API, sampling, detokenization, outputs) against the forward itself.

``python asv_benches/engine_step.py [--seqs 32] [--prompt 128] [--steps 48] [--sampling]``

The benchmark model is a random Llama (hidden 512, 8 layers, 8 heads, 4 KV heads,
intermediate 1376, vocab 32000) with a tokenizer, written to a temporary directory. All
``--seqs`` requests are prefilled first; then only decode steps are timed. Prints the
mean decode-step time, the forward time inside it and the overhead as a share of the
step, plus where the overhead goes.
"""
import argparse
import tempfile
import time

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seqs", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--sampling", action="store_true",
                    help="temperature 0.8, top_p 0.95, top_k 50, seeded (default greedy)")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    from threadpoolctl import threadpool_info
    from step_overhead import cpu_model      # run as a script from asv_benches/
    from pagedcy.engine import LLMEngine, SamplingParams
    from pagedcy.models import write_random_checkpoint

    print(f"CPU: {cpu_model()}; BLAS: " + ", ".join(
        f"{i.get('internal_api')} {i.get('architecture', '')} x{i.get('num_threads')}"
        for i in threadpool_info() if i.get("user_api") == "blas"))
    with tempfile.TemporaryDirectory() as d:
        write_random_checkpoint(d, "LlamaForCausalLM", vocab_size=32000, hidden_size=512,
                                num_hidden_layers=8, num_attention_heads=8,
                                num_key_value_heads=4, intermediate_size=1376,
                                max_position_embeddings=4096, seed=0)
        eng = LLMEngine(d, kv_cache_pages=a.seqs * ((a.prompt + a.steps + 40) // 16 + 2),
                        max_num_seqs=a.seqs, max_num_batched_tokens=a.seqs * a.prompt,
                        num_threads=a.threads)
        rng = np.random.default_rng(0)
        for i in range(a.seqs):
            p = (SamplingParams(temperature=0.8, top_p=0.95, top_k=50, seed=i,
                                max_tokens=a.steps + 8, ignore_eos=True) if a.sampling else
                 SamplingParams(temperature=0.0, max_tokens=a.steps + 8, ignore_eos=True))
            eng.add_request(str(i), rng.integers(10, 32000, a.prompt).tolist(), p)
        while eng.stats().generation_tokens < a.seqs:      # prefill everything
            eng.step()
        eng.step()                                          # warm-up decode
        s0 = eng.stats()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            eng.step()
        wall = time.perf_counter() - t0
        s1 = eng.stats()
        assert s1.generation_tokens - s0.generation_tokens == a.steps * a.seqs
        fwd = s1.forward_seconds - s0.forward_seconds
    step = wall / a.steps * 1e3
    f = fwd / a.steps * 1e3
    print(f"{a.seqs} sequences x {a.prompt}+ tokens, {'sampling' if a.sampling else 'greedy'}, "
          f"{a.steps} decode steps")
    print(f"  decode step {step:.2f} ms = forward {f:.2f} ms + engine {step - f:.2f} ms "
          f"({100 * (step - f) / step:.1f}% of the step)")


if __name__ == "__main__":
    main()
