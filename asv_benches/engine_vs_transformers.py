"""Offline generation throughput: pagedcy's ``LLM.generate`` against transformers'
``generate`` on the same random checkpoint, in one run.

``python asv_benches/engine_vs_transformers.py [--seqs 32] [--prompt 128] [--new 32] [--threads N]``

Benchmark model: a random Llama (hidden 512, 8 layers, 8 heads, 4 KV heads, intermediate
1376, vocab 32000). All prompts have the same length, so transformers needs no padding;
both run greedy for exactly ``--new`` tokens (EOS ignored) with the same thread count
(``torch.set_num_threads``; pagedcy's ``num_threads``). Prints tokens/s of each, their
ratio, and whether the generated tokens agree.
"""
import argparse
import tempfile
import time

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seqs", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    import torch
    import transformers
    from threadpoolctl import threadpool_info, threadpool_limits
    from step_overhead import cpu_model      # run as a script from asv_benches/
    from pagedcy.engine import LLM, SamplingParams
    from pagedcy.models import write_random_checkpoint

    print(f"CPU: {cpu_model()}; BLAS: " + ", ".join(
        f"{i.get('internal_api')} {i.get('architecture', '')}"
        for i in threadpool_info() if i.get("user_api") == "blas") + f"; {a.threads} threads")
    prompts = np.random.default_rng(0).integers(10, 32000, (a.seqs, a.prompt))
    with tempfile.TemporaryDirectory() as d, threadpool_limits(a.threads):
        write_random_checkpoint(d, "LlamaForCausalLM", vocab_size=32000, hidden_size=512,
                                num_hidden_layers=8, num_attention_heads=8,
                                num_key_value_heads=4, intermediate_size=1376,
                                max_position_embeddings=4096, seed=0)
        llm = LLM(d, max_num_seqs=a.seqs, num_threads=a.threads)
        params = SamplingParams(temperature=0, max_tokens=a.new, ignore_eos=True)
        llm.generate(prompts[:2].tolist(), params, use_tqdm=False)      # warm-up
        t0 = time.perf_counter()
        ours = llm.generate(prompts.tolist(), params, use_tqdm=False)
        t_ours = time.perf_counter() - t0

        torch.set_num_threads(a.threads)
        hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        hf.generation_config.eos_token_id = None
        ids = torch.tensor(prompts)
        with torch.no_grad():
            hf.generate(ids[:2], max_new_tokens=2, do_sample=False)      # warm-up
            t0 = time.perf_counter()
            theirs = hf.generate(ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False)
            t_hf = time.perf_counter() - t0
    n = a.seqs * a.new
    same = sum(o.outputs[0].token_ids == t[a.prompt:].tolist() for o, t in zip(ours, theirs))
    print(f"{a.seqs} prompts x {a.prompt} tokens, {a.new} new tokens each (greedy)")
    print(f"  pagedcy LLM.generate     {t_ours:7.2f} s  {n / t_ours:8.1f} generated tokens/s")
    print(f"  transformers generate    {t_hf:7.2f} s  {n / t_hf:8.1f} generated tokens/s")
    print(f"  pagedcy / transformers   {t_hf / t_ours:.2f}x; identical completions: "
          f"{same} of {a.seqs}")


if __name__ == "__main__":
    main()
