"""Decode speed of a GGUF file with its panel GEMVs' threads in fixed shares against chunks
claimed in turn (``pagedcy._libs._team._set_dynamic``), in one process.

``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python asv_benches/decode_split.py FILE.gguf
[--rounds 12] [--threads 2] [--tokens 64]``

Each round runs single-sequence decode (a 64-token prompt, then ``--tokens`` tokens, greedy)
once per split, the order reversed every other round, so a host whose bandwidth moves within
minutes moves every split alike. Prints each split's tok/s per round, and the median of the
per-round ratios to the fixed shares: the figure to quote (a single best-of is noise on a
shared VM). The same bits come out either way.
"""
import argparse

from pagedcy._libs import _team
from pagedcy.engine import LLM
from pagedcy.tools import bench_gguf
from pagedcy.tools.info import cpu_description

# name -> (weights from this many bytes split in chunks, chunks per thread)
SPLITS = {"fixed shares": (2**62, 1), "default": None, "chunks from 0 B": (0, 4),
          "4 chunks from 4 MiB": (4 << 20, 4)}


def main(argv=None):
    """Run the rounds and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args(argv)
    default = _team._set_dynamic(0, 1)       # read the default, then put it back
    _team._set_dynamic(*default)
    splits = {k: (v or default) for k, v in SPLITS.items()}
    eng = LLM(args.model, num_threads=args.threads).llm_engine
    vocab = eng.model.config.vocab_size
    bench_gguf._single(eng, 64, 16, vocab, seed=0)      # warm-up
    names = list(splits)
    tg = {k: [] for k in names}
    try:
        for r in range(args.rounds):
            for k in (names if r % 2 == 0 else names[::-1]):
                _team._set_dynamic(*splits[k])
                tg[k].append(bench_gguf._single(eng, 64, args.tokens, vocab, seed=10 + r)[1])
    finally:
        _team._set_dynamic(*default)
    print(f"# {args.model}: decode tok/s, {args.threads} threads, {args.rounds} rounds; CPU: "
          f"{cpu_description()}; default split: chunks for weights from {default[0]} B, "
          f"{default[1]} per thread")
    print("| split | tok/s per round | median | median of per-round ratios to fixed shares |")
    print("|---|---|---|---|")
    for k in names:
        xs = sorted(tg[k])
        rat = sorted(a / b for a, b in zip(tg[k], tg["fixed shares"]))
        print(f"| {k} | {' '.join(f'{x:.1f}' for x in tg[k])} | {xs[len(xs) // 2]:.1f} "
              f"| {rat[len(rat) // 2]:.3f} |")


if __name__ == "__main__":
    main()
