"""Greedy agreement of compact KV caches with the float32 cache on random models.

``python asv_benches/kv_dtype_agreement.py [--models 3] [--tokens 64]``: for each of
``--models`` random Llama checkpoints (``write_random_checkpoint``, seeds 0, 1, ...), 8
prompts of 4-39 random token ids are generated greedily (``ignore_eos``) with
``kv_dtype="float32"`` and with each compact dtype, and the tokens are compared position by
position (``int8:float32``: the int8 cache with ``activation_dtype="float32"``, float32
queries; plain ``int8`` takes the default "auto", int8 queries). Prints, per dtype, the share
of equal tokens, how many sequences are identical and the median position of the first
difference. Random models have nearly flat logits, so this is a pessimistic figure: a
near-tie flips on the smallest change and the sequences part from then on.
"""
import argparse
import tempfile

import numpy as np

from pagedcy import LLM, SamplingParams
from pagedcy.models import write_random_checkpoint


def compare(tokens_a, tokens_b, n):
    """(equal positions, first differing position or n) of two token lists cut to n."""
    equal = sum(a == b for a, b in zip(tokens_a[:n], tokens_b[:n]))
    first = next((i for i, (a, b) in enumerate(zip(tokens_a[:n], tokens_b[:n])) if a != b), n)
    return equal, first


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--dtypes", nargs="+", default=["int8", "int8:float32", "float16", "bfloat16"])
    args = ap.parse_args(argv)
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    stats = {dt: [0, 0, []] for dt in args.dtypes}
    for seed in range(args.models):
        path = write_random_checkpoint(tempfile.mkdtemp(), seed=seed, max_position_embeddings=512)
        rng = np.random.default_rng(seed)
        prompts = [{"prompt_token_ids": rng.integers(3, 200, int(rng.integers(4, 40))).tolist()}
                   for _ in range(8)]
        ref = LLM(path, kv_cache_pages=256).generate(prompts, params, use_tqdm=False)
        for dt in args.dtypes:
            kv, _, act = dt.partition(":")
            outs = LLM(path, kv_cache_pages=256, kv_dtype=kv, activation_dtype=act or "auto").generate(
                prompts, params, use_tqdm=False)
            for o, r in zip(outs, ref):
                eq, first = compare(o.outputs[0].token_ids, r.outputs[0].token_ids, args.tokens)
                stats[dt][0] += eq
                stats[dt][1] += args.tokens
                stats[dt][2].append(first)
    for dt, (eq, total, firsts) in stats.items():
        same = sum(f == args.tokens for f in firsts)
        print(f"{dt:>12} vs float32 KV, greedy, {args.tokens} tokens x {len(firsts)} prompts: "
              f"{100 * eq / total:.1f}% of tokens equal, {same}/{len(firsts)} sequences identical, "
              f"first difference at median position {int(np.median(firsts))}")


if __name__ == "__main__":
    main()
