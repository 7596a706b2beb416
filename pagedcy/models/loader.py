"""load_model: a Hugging Face checkpoint directory -> CausalLM."""
from __future__ import annotations

import os

import numpy as np

from pagedcy.models.config import ModelConfig
from pagedcy.models.layers import load_layer
from pagedcy.models.model import CausalLM
from pagedcy.models.weights import CheckpointReader

__all__ = ["load_model"]


def load_model(path: str | os.PathLike, *, num_threads: int | None = None) -> CausalLM:
    """Load ``config.json`` and ``model.safetensors`` (or a sharded index) from ``path``.

    Weights (F32, F16 or BF16 in the file) are held as float32: 4 bytes per parameter.
    FileNotFoundError when the directory, config.json or the weights are missing;
    ValueError for an unsupported architecture or rope_scaling type (listing the supported
    ones) and for a corrupt file or a missing/mis-shaped tensor (naming it).
    """
    if not os.path.isdir(path):
        raise FileNotFoundError(f"model directory {os.fspath(path)!r} does not exist")
    cfg = ModelConfig.from_dir(path)
    reader = CheckpointReader(path)
    h, v = cfg.hidden_size, cfg.vocab_size
    table = reader.get("model.embed_tokens.weight", (v, h))
    layers = [load_layer(reader, cfg, i) for i in range(cfg.num_layers)]
    final_norm = reader.get("model.norm.weight", (h,))
    embed: np.ndarray | None = table
    if cfg.tie_word_embeddings:
        lm_head = np.ascontiguousarray(table)
        embed = None  # lookups take lm_head's rows: the table is stored once
    else:
        lm_head = np.ascontiguousarray(reader.get("lm_head.weight", (v, h)))
    del table
    return CausalLM(cfg, embed, layers, final_norm, lm_head, num_threads=num_threads)
