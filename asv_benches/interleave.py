"""Do OpenMP and BLAS fight? A NumPy-only Llama decode step with pagedcy's attention between
the GEMMs, timed against the sum of its parts timed alone, once per OpenMP / BLAS setting.

``python asv_benches/interleave.py [--seconds 4] [--batch 16] [--kv-len 512]``

The step is Llama-shaped: 8 layers, hidden 512, 8 query / 2 KV heads, head_dim 64,
intermediate 1408, vocab 32000, float32; every GEMM is ``np.matmul`` (OpenBLAS, its own
pthreads) and each layer's attention is one ``pagedcy.batch_paged_attention`` call (libgomp)
over random pages in random order. Three variants run round after round, interleaved, in one
process: the whole step; the step without its attention calls ("numpy alone"); the eight
attention calls back to back ("attention alone"). When the two thread pools leave each other
alone, step ~ numpy alone + attention alone. Each setting runs in a fresh subprocess, because
libgomp reads ``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT`` once, when it loads.
"""
import argparse
import json
import os
import subprocess
import sys
import time

# What each child runs under: (label, env to add, import torch before pagedcy).
# GOMP_SPINCOUNT=300000 is libgomp's own default (about 3 ms of spinning at the end of each
# parallel region), i.e. what every process got before pagedcy chose a wait policy itself.
SETTINGS = [
    ("default", {}, False),
    ("libgomp default (GOMP_SPINCOUNT=300000)", {"GOMP_SPINCOUNT": "300000"}, False),
    ("OMP_WAIT_POLICY=passive", {"OMP_WAIT_POLICY": "passive"}, False),
    ("OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=3000 (pagedcy's default)",
     {"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": "3000"}, False),
    ("OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=1000 (pagedcy's earlier default)",
     {"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": "1000"}, False),
    ("OMP_WAIT_POLICY=active", {"OMP_WAIT_POLICY": "active"}, False),
    ("GOMP_SPINCOUNT=1000", {"GOMP_SPINCOUNT": "1000"}, False),
    ("OPENBLAS_NUM_THREADS=1", {"OPENBLAS_NUM_THREADS": "1"}, False),
    ("default, torch imported first", {}, True),
]
# removed from every child's environment, so each row runs only what its label says
CLEARED = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
           "KMP_BLOCKTIME", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "PAGEDCY_NUM_THREADS")

LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, PAGE = 8, 512, 8, 2, 64, 1408, 32000, 16


def _model(rng):
    def w(*shape):
        return (rng.standard_normal(shape, dtype="float32") * 0.02)
    qkv = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    layers = [dict(wqkv=w(HIDDEN, qkv), wo=w(HEADS * HEAD_DIM, HIDDEN), wgu=w(HIDDEN, 2 * INTER),
                   wd=w(INTER, HIDDEN)) for _ in range(LAYERS)]
    return layers, w(VOCAB, HIDDEN), w(HIDDEN, VOCAB)


def _child(args):
    import numpy as np
    if args.torch_first:
        import torch  # noqa: F401  (loads torch's libgomp before pagedcy's)
    from pagedcy import batch_paged_attention

    rng = np.random.default_rng(0)
    B, T = args.batch, args.kv_len
    layers, embed, lm_head = _model(rng)
    npg = -(-T // PAGE)
    pages = rng.standard_normal((B * npg, LAYERS, 2, PAGE, KV_HEADS, HEAD_DIM), dtype="float32")
    block_tables = rng.permutation(B * npg).astype(np.int32).reshape(B, npg)
    kv_lens = np.full(B, T, np.int32)
    indptr = np.arange(B + 1, dtype=np.int32)
    slot_page, slot_off = block_tables[:, (T - 1) // PAGE], (T - 1) % PAGE
    inv = 1.0 / 10000 ** (np.arange(0, HEAD_DIM, 2, dtype=np.float32) / HEAD_DIM)
    ang = (T - 1) * inv
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    ids = rng.integers(0, VOCAB, B)
    attn_out = np.zeros((B, HEADS, HEAD_DIM), np.float32)
    saved_q = [rng.standard_normal((B, HEADS, HEAD_DIM), dtype="float32") for _ in range(LAYERS)]
    inside = [0.0]

    def rms(x):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)

    def rope(x):
        a, b = x[..., 0::2], x[..., 1::2]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)

    def attention(layer, q):
        t0 = time.perf_counter()
        out = batch_paged_attention(q, indptr, pages, layer, block_tables, kv_lens)
        inside[0] += time.perf_counter() - t0
        return out

    def step(with_attention=True):
        x = embed[ids]
        for li, p in enumerate(layers):
            qkv = rms(x) @ p["wqkv"]
            q = rope(qkv[:, :HEADS * HEAD_DIM].reshape(B, HEADS, HEAD_DIM))
            k = rope(qkv[:, HEADS * HEAD_DIM:(HEADS + KV_HEADS) * HEAD_DIM].reshape(B, KV_HEADS, HEAD_DIM))
            v = qkv[:, (HEADS + KV_HEADS) * HEAD_DIM:].reshape(B, KV_HEADS, HEAD_DIM)
            pages[slot_page, li, 0, slot_off] = k
            pages[slot_page, li, 1, slot_off] = v
            a = attention(li, np.ascontiguousarray(q)) if with_attention else attn_out
            x = x + a.reshape(B, HEADS * HEAD_DIM) @ p["wo"]
            gu = rms(x) @ p["wgu"]
            g, u = gu[:, :INTER], gu[:, INTER:]
            x = x + (g / (1.0 + np.exp(-g)) * u) @ p["wd"]
        return (rms(x) @ lm_head).argmax(-1)

    def attention_alone():
        for li in range(LAYERS):
            batch_paged_attention(saved_q[li], indptr, pages, li, block_tables, kv_lens)

    variants = {"step": step, "numpy": lambda: step(False), "attention": attention_alone}
    times = {k: [] for k in variants}
    inside_step = []
    for fn in variants.values():
        fn()
    t_end = time.perf_counter() + args.seconds
    while time.perf_counter() < t_end or len(times["step"]) < 3 * args.per_round:
        for name, fn in variants.items():
            for _ in range(args.per_round):
                inside[0] = 0.0
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
                if name == "step":
                    inside_step.append(inside[0])
    import threadpoolctl
    info = threadpoolctl.threadpool_info()
    med = {k: float(np.median(v)) for k, v in times.items()}
    med["attention_in_step"] = float(np.median(inside_step))
    med["steps"] = len(times["step"])
    med["libs"] = [f"{i['internal_api']}:{os.path.basename(i['filepath'])}"
                   f"{':' + i['architecture'] if i.get('architecture') else ''}"
                   f" x{i['num_threads']}" for i in info]
    from pagedcy.tools.info import config_dict
    med["wait_policy"] = config_dict().get("wait_policy", "-")
    print(json.dumps(med))


def _run_setting(args, env_add, torch_first):
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(env_add)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--seconds", str(args.seconds),
           "--batch", str(args.batch), "--kv-len", str(args.kv_len), "--per-round", str(args.per_round)]
    if torch_first:
        cmd.append("--torch-first")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="timing time per setting")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--kv-len", type=int, default=512)
    ap.add_argument("--per-round", type=int, default=3, help="calls of each variant per round")
    ap.add_argument("--only", default=None, help="run only the settings whose label contains this")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--torch-first", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return _child(args)
    from pagedcy.tools.bench_engine import machine_header
    print(machine_header())
    print(f"decode step: {LAYERS} layers, hidden {HIDDEN}, {HEADS}/{KV_HEADS} heads x {HEAD_DIM}, "
          f"intermediate {INTER}, vocab {VOCAB}, fp32, {args.batch} sequences x {args.kv_len} "
          f"context; median of every call, variants interleaved for {args.seconds:g} s per setting")
    head = (f"{'setting':<42}{'step ms':>9}{'numpy ms':>10}{'attn ms':>9}{'sum ms':>8}"
            f"{'step/sum':>10}{'attn in step':>14}  wait policy (pagedcy)")
    print(head)
    print("-" * len(head))
    libs = None
    for label, env_add, torch_first in SETTINGS:
        if args.only and args.only not in label:
            continue
        r = _run_setting(args, env_add, torch_first)
        if "error" in r:
            print(f"{label:<42} failed: {r['error']}")
            continue
        libs = libs or r["libs"]
        s = r["numpy"] + r["attention"]
        print(f"{label:<42}{r['step'] * 1e3:>9.2f}{r['numpy'] * 1e3:>10.2f}{r['attention'] * 1e3:>9.2f}"
              f"{s * 1e3:>8.2f}{r['step'] / s:>10.2f}{r['attention_in_step'] * 1e3:>14.2f}  "
              f"{r['wait_policy']}", flush=True)
    if libs:
        print("thread pools in the children (threadpoolctl): " + "; ".join(libs))
    print("numpy = the step without its attention calls; attn = the 8 attention calls back to back; "
          "attn in step = time inside the 8 attention calls of the whole step")


if __name__ == "__main__":
    main()
