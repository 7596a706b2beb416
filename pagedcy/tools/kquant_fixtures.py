"""Write the K-quant GGUF fixtures of ``tests/data/`` (tiny random models, quantized by
llama.cpp's own ``llama-quantize``, which ``gguf`` cannot do for Q4_K/Q5_K/Q6_K).

    python -m pagedcy.tools.kquant_fixtures tests/data --llama-quantize PATH

``PATH`` is a ``llama-quantize`` binary, e.g. the one ``../shared/anchors/llama_cpp_gguf.sh``
builds under ``~/.cache/pagedcy-anchors``. Each fixture is a random Llama (hidden 256, so its
rows hold whole 256-value super-blocks) with the random checkpoint's byte-level BPE tokenizer,
written as F32 GGUF by :func:`pagedcy.tools.gguf_fixture.write_gguf` and then quantized to
``Q4_K_M``, ``Q5_K_M`` and ``Q6_K``: the block-type mixes real files of those types hold. The
tests need only the files, so CI builds no llama.cpp. :func:`write_random_q4_k_m` writes a
larger Q4_K_M-typed file of random blocks without llama-quantize (the asv decode track).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from typing import Any

TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K")
SHAPE: dict[str, Any] = dict(hidden_size=256, intermediate_size=256, num_hidden_layers=1,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


def fixture_name(qtype: str) -> str:
    """The file name of the fixture of quantization type ``qtype``."""
    return f"tiny-llama-{qtype.lower()}.gguf"


def write_fixtures(out_dir: str, llama_quantize: str, seed: int = 7) -> list[str]:
    """Write every fixture into ``out_dir``; returns their paths."""
    from pagedcy.models import write_random_checkpoint
    from pagedcy.tools.gguf_fixture import write_gguf

    os.makedirs(out_dir, exist_ok=True)
    paths = []
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_random_checkpoint(os.path.join(tmp, "ckpt"), seed=seed, **SHAPE)
        f32 = write_gguf(ckpt, os.path.join(tmp, "f32.gguf"), tensor_type="F32")
        for qtype in TYPES:
            path = os.path.join(out_dir, fixture_name(qtype))
            subprocess.run([llama_quantize, f32, path, qtype], check=True,
                           capture_output=True, timeout=600)
            paths.append(path)
    return paths


#: per-block ``(bytes, fp16 scale offsets)`` of the K-quants :func:`random_blocks` writes
_BLOCKS = {"Q4_K": (144, (0, 2)), "Q6_K": (210, (208,))}


def random_blocks(rng, qtype: str, n: int, k: int):
    """Random ``[n, k]`` rows of ``qtype`` ("Q4_K" or "Q6_K"): random quants and sub-block
    scales, every fp16 super-block scale 0.01 (finite, so a forward stays finite). For
    speed runs: the values are not any weight's quantization."""
    import numpy as np
    nbytes, offsets = _BLOCKS[qtype]
    if k % 256:
        raise ValueError(f"{qtype} rows need a multiple of 256 values, got {k}")
    raw = rng.integers(0, 256, (n, k // 256 * nbytes), dtype=np.uint8)
    blocks = raw.reshape(-1, nbytes)
    for off in offsets:
        blocks[:, off:off + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    return raw


def write_random_q4_k_m(path: str, seed: int = 0, **config) -> str:
    """A random Llama (``config``: Hugging Face config fields, dims multiples of 256) as a
    GGUF file with Q4_K_M's block types, without llama-quantize: random Q4_K blocks, Q6_K
    for ``output.weight`` and layer 0's ``attn_v`` / ``ffn_down`` (as llama.cpp gives a few
    layers more bits), norms F32, and the checkpoint's byte-level BPE tokenizer. For
    benchmarks where no llama.cpp build exists (asv in CI). Returns ``path``."""
    import gguf
    import numpy as np
    from pagedcy.models import write_random_checkpoint
    from pagedcy.tools.gguf_fixture import write_gguf

    rng = np.random.default_rng(seed)
    more_bits = ("output.weight", "blk.0.attn_v.weight", "blk.0.ffn_down.weight")

    def encode(name, data, _type):
        qtype = "Q6_K" if name in more_bits else "Q4_K"
        return random_blocks(rng, qtype, *data.shape), gguf.GGMLQuantizationType[qtype]

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_random_checkpoint(os.path.join(tmp, "ckpt"), seed=seed, **config)
        return write_gguf(ckpt, path, encoder=encode)


def main(argv=None):
    """Command line: write the fixtures into ``out_dir`` and print their paths and sizes."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--llama-quantize", required=True, help="path of a llama-quantize binary")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    for p in write_fixtures(args.out_dir, args.llama_quantize, args.seed):
        print(p, os.path.getsize(p))


if __name__ == "__main__":
    main()
