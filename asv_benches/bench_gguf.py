"""asv benchmarks for a Q4_K_M GGUF file through the engine: single-sequence decode (tg32) and
prefill (pp256) tokens/s, 2 threads.

The file is a random Llama (hidden 512, 4 layers, 8/2 heads x 64, intermediate 1536, vocab
8192: 13 MB) with Q4_K_M's block types, written in setup by
``pagedcy.tools.kquant_fixtures.write_random_q4_k_m`` from random blocks, so it needs no
llama.cpp build (CI has none). ``python -m pagedcy bench --engine --gguf FILE`` is the full
benchmark on real models' shapes, beside llama.cpp.
"""
import os
import tempfile

from pagedcy.tools import bench_engine as be
from pagedcy.tools import bench_gguf as bg

SHAPE = dict(vocab_size=8192, hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, intermediate_size=1536, max_position_embeddings=2048)


def setup_cache():
    path = os.path.join(tempfile.gettempdir(), "pagedcy-asv-q4_k_m-v1.gguf")
    if not os.path.isfile(path):
        from pagedcy.tools.kquant_fixtures import write_random_q4_k_m
        write_random_q4_k_m(path + ".tmp", seed=0, **SHAPE)
        os.replace(path + ".tmp", path)
    return path


class GGUFQ4KM:
    """One engine on the Q4_K_M file; best of 3 runs of each rate, distinct prompts."""

    timeout = 300
    number = 1
    repeat = 1

    def setup(self, path):
        eng = be._engine(path, 2, kv_cache_pages=128)
        bg._single(eng, 16, 2, SHAPE["vocab_size"], seed=100)             # warm-up
        runs = [bg._single(eng, 256, 32, SHAPE["vocab_size"], seed=200 + i) for i in range(3)]
        self.pp, self.tg = max(r[0] for r in runs), max(r[1] for r in runs)

    def track_decode_tokens_per_s(self, path):
        return self.tg
    track_decode_tokens_per_s.unit = "tokens/s"

    def track_prefill_tokens_per_s(self, path):
        return self.pp
    track_prefill_tokens_per_s.unit = "tokens/s"
