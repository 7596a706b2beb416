"""Where a forward pass spends its time: ``python -m pagedcy.tools.profile_model``.

Writes the benchmark model (a Llama with hidden 512, 8 layers, 8 query / 2 KV heads,
intermediate 1408, vocab 32000) with write_random_checkpoint, then times one prefill forward
(4 x 256 tokens) and one decode forward (16 sequences at context 512), each over a few
repetitions, split into GEMMs (np.matmul), attention, elementwise (the _layers kernels and
K/V writes) and the rest (:class:`~pagedcy.tools.engine_profile.StepProfile`); and compares the GEMMs' GFLOP/s with NumPy sgemm alone on the same shapes.
"""
from __future__ import annotations

import argparse
import tempfile
import time
import types

import numpy as np

from pagedcy.models import load_model, write_random_checkpoint
from pagedcy.tools.bench import blas_description
from pagedcy.tools.engine_profile import StepProfile, gemm_only_seconds
from pagedcy.tools.info import cpu_description

BENCH_CONFIG = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                    num_key_value_heads=2, intermediate_size=1408, vocab_size=32000,
                    max_position_embeddings=4096)
def _slots(batch, q_len, ctx, page_size, rng):
    """Slots for ``batch`` sequences whose last ``q_len`` of ``ctx`` tokens are new, pages in
    random order."""
    per = -(-ctx // page_size)
    perm = rng.permutation(batch * per).astype(np.int32).reshape(batch, per)
    pos = np.concatenate([np.arange(ctx - q_len, ctx, dtype=np.int32)] * batch)
    b = np.repeat(np.arange(batch), q_len)
    return types.SimpleNamespace(
        positions=pos, slot_pages=np.ascontiguousarray(perm[b, pos // page_size]),
        slot_offsets=(pos % page_size).astype(np.int32),
        qo_indptr=(np.arange(batch + 1) * q_len).astype(np.int32), block_tables=perm,
        kv_lens=np.full(batch, ctx, np.int32)), batch * per


def _time(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def profile(model, name, batch, q_len, ctx, reps, page_size=16):
    """Time one forward shape; prints the split and returns it as a dict."""
    from pagedcy._libs._store import KVPageStore

    rng = np.random.default_rng(0)
    slots, npages = _slots(batch, q_len, ctx, page_size, rng)
    store = KVPageStore(model.kv_cache_config(npages, page_size))
    pages = store.pages()
    pages[...] = rng.standard_normal(pages.shape, dtype=np.float32)  # a filled context
    ids = rng.integers(0, model.config.vocab_size, batch * q_len).astype(np.int32)
    model.forward(pages, ids, slots)  # warm-up: buffers, RoPE table, page adapter
    plain = min(_time(lambda: model.forward(pages, ids, slots)) for _ in range(reps))
    runs = []
    for _ in range(reps):
        with StepProfile() as prof:
            total = _time(lambda: model.forward(pages, ids, slots))
        runs.append((total, prof.acc))
    total, acc = min(runs, key=lambda r: r[0])
    flops = acc.pop("gemm_flops")
    alone = gemm_only_seconds(model.config, batch * q_len, batch, reps)
    parts = dict(acc, rest=total - sum(acc.values()))
    print(f"{name}: {batch} seq x {q_len} new tokens (context {ctx}): forward {plain * 1e3:.2f} ms "
          f"({total * 1e3:.2f} ms instrumented)")
    for part, s in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {part:15s} {s * 1e3:8.2f} ms  {100 * s / total:5.1f}%")
    gf = flops / parts["gemm"] / 1e9
    print(f"  GEMMs: {flops / 1e9:.2f} GFLOP at {gf:.1f} GFLOP/s; NumPy sgemm alone on the same "
          f"shapes {flops / alone / 1e9:.1f} GFLOP/s ({alone / parts['gemm']:.2f}x)")
    return dict(parts, total=total, plain=plain, gemm_gflops=gf, sgemm_gflops=flops / alone / 1e9)


def main(argv=None):
    """Write the benchmark model to a temporary directory and profile prefill and decode."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    print(f"CPU: {cpu_description()}; BLAS: {blas_description()}")
    with tempfile.TemporaryDirectory() as d:
        write_random_checkpoint(d, tokenizer=False, **BENCH_CONFIG)
        model = load_model(d, num_threads=args.threads)
    print(f"model: {model.weight_bytes / 2**20:.0f} MiB of weights, "
          f"{model.num_threads} threads")
    profile(model, "prefill", 4, 256, 256, args.reps)
    profile(model, "decode", 16, 1, 512, args.reps)


if __name__ == "__main__":
    main()
