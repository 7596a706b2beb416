"""asv benchmarks for the engine: output tokens/s of ``LLM.generate`` on a small mixed-length
workload, and prefill / 16-sequence generation / single-sequence decode tokens/s in
llama-batched-bench's shape, on a random Llama with the full benchmark's layer shapes
(hidden 512, 8/2 heads x 64, intermediate 1408) but 2 layers and a 4096 vocabulary, so
``asv run --quick`` stays short. ``python -m pagedcy bench --engine`` is the full benchmark.
"""
import os
import tempfile

from pagedcy.tools import bench_engine as be

SMALL = dict(be.MODEL, num_hidden_layers=2, vocab_size=4096)


def _checkpoint():
    path = os.path.join(tempfile.gettempdir(), "pagedcy-asv-engine-llama")
    if not os.path.isfile(os.path.join(path, "config.json")):
        from pagedcy.models import write_random_checkpoint
        write_random_checkpoint(path, "LlamaForCausalLM", seed=0, tokenizer=False, **SMALL)
    return path


def setup_cache():
    return _checkpoint()


class EngineThroughput:
    """16 requests, prompts uniform in [64, 256] tokens, 32 new tokens each (greedy)."""

    timeout = 300
    number = 1
    repeat = 1

    def setup(self, path):
        self.prompts = be.workload_a_prompts(16, 64, 256, SMALL["vocab_size"])

    def track_generate_output_tokens_per_s(self, path):
        r = be.run_generate(path, self.prompts, 32, 2)
        return r["new_tokens"] / r["seconds"]
    track_generate_output_tokens_per_s.unit = "tokens/s"


class BatchedShape:
    """llama-batched-bench's shape, smaller: 8 sequences x (256 prompt + 16 generated),
    then one sequence's pp256 / tg32."""

    timeout = 300
    number = 1
    repeat = 1

    def setup(self, path):
        eng = be._engine(path, 2)
        be.run_batched(eng, 2, 16, 2, SMALL["vocab_size"], seed=99)       # warm-up
        self.r = be.run_batched(eng, 8, 256, 16, SMALL["vocab_size"])
        self.r["single_prefill_tps"], self.r["single_decode_tps"] = be.run_single(
            eng, 256, 32, SMALL["vocab_size"])

    def track_prefill_tokens_per_s(self, path):
        return self.r["prefill_tps"]
    track_prefill_tokens_per_s.unit = "tokens/s"

    def track_generation_tokens_per_s(self, path):
        return self.r["gen_tps"]
    track_generation_tokens_per_s.unit = "tokens/s"

    def track_single_sequence_decode_tokens_per_s(self, path):
        return self.r["single_decode_tps"]
    track_single_sequence_decode_tokens_per_s.unit = "tokens/s"
