"""load_model: a Hugging Face checkpoint directory -> CausalLM."""
from __future__ import annotations

import os

from pagedcy.models.config import ModelConfig
from pagedcy.models.layers import load_layer, norm_weight
from pagedcy.models.model import CausalLM
from pagedcy.models.storage import WeightStorage, check_load_options
from pagedcy.models.weights import CheckpointReader

__all__ = ["load_model", "load_gguf", "is_gguf", "build_model"]


def load_model(path: str | os.PathLike, *, num_threads: int | None = None, dtype: str = "auto",
               quantization: str | None = None, activation_dtype: str = "auto") -> CausalLM:
    """Load ``config.json`` and ``model.safetensors`` (or a sharded index) from ``path``, or a
    GGUF file (:func:`load_gguf`).

    ``dtype`` ("auto", "float32", "float16", "bfloat16") and ``quantization`` (None, "q8_0",
    "q4_0") choose how the matrices are held (:mod:`pagedcy.models.storage`): "auto" keeps
    F16/BF16 tensors in 16 bits and F32 ones in float32; compute is float32 either way.
    ``activation_dtype`` ("auto": int8 activations for Q4_K / Q5_0 / Q6_K / Q8_0 matrices, as
    llama.cpp; "float32") says what block-format matrices multiply (same module), and whether
    decode queries over int8 K/V pages are rounded to int8 (``CausalLM.quantize_query``).
    FileNotFoundError when the directory, config.json or the weights are missing;
    ValueError for a bad dtype/quantization, an unsupported architecture or rope_scaling
    type (listing the supported ones) and for a corrupt file or a missing/mis-shaped tensor
    (naming it).
    """
    check_load_options(dtype, quantization, activation_dtype)     # before touching the disk
    if is_gguf(path):
        return load_gguf(path, num_threads=num_threads, dtype=dtype, quantization=quantization,
                         activation_dtype=activation_dtype)[0]
    if not os.path.isdir(path):
        raise FileNotFoundError(f"model directory {os.fspath(path)!r} does not exist")
    cfg = ModelConfig.from_dir(path)
    return build_model(cfg, CheckpointReader(path), num_threads=num_threads, dtype=dtype,
                       quantization=quantization, activation_dtype=activation_dtype)


def is_gguf(path) -> bool:
    """True when ``path`` is a file that starts with GGUF's magic (a ``.gguf`` file that does
    not is left to :func:`load_gguf`'s error)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        return False
    if path.endswith(".gguf"):
        return True
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def load_gguf(path: str | os.PathLike, *, num_threads: int | None = None, dtype: str = "auto",
              quantization: str | None = None, activation_dtype: str = "auto"):
    """``(CausalLM, Tokenizer, chat_template)`` of a GGUF file: architecture and
    hyper-parameters from its metadata, tensors memory-mapped and kept in their block
    formats (Q4_K, Q8_0, F16, ...: no float32 copy of the model), the tokenizer built from
    ``tokenizer.ggml.*`` and ``tokenizer.chat_template`` (str or None). FileNotFoundError
    for a missing file, ValueError for a malformed or unsupported one (naming the problem)."""
    from pagedcy.models.gguf_model import read_gguf

    check_load_options(dtype, quantization, activation_dtype)
    f = read_gguf(path)
    try:
        cfg = ModelConfig.from_dict(f.config_dict, f.generation)
        model = build_model(cfg, f, num_threads=num_threads, dtype=dtype,
                            quantization=quantization, activation_dtype=activation_dtype)
        return model, f.tokenizer(), f.chat_template
    finally:
        f.close()     # the weights' views keep the mapping alive


def build_model(cfg: ModelConfig, reader, *, num_threads: int | None = None, dtype: str = "auto",
                quantization: str | None = None, activation_dtype: str = "auto") -> CausalLM:
    """A CausalLM of ``cfg`` from the tensors of ``reader``, by their Hugging Face names and
    conventions (Gemma's norm weights as ``w`` for a scale of ``1 + w``).

    ``reader`` is a :class:`~pagedcy.models.weights.CheckpointReader` or any object with
    ``get(name, shape) -> float32 array`` and ``get_stored(name, shape) -> (array, fmt)``
    (``shape`` the logical shape; ``fmt`` "float32", "float16", "bfloat16" or a GGML block
    type's lower-case name with raw rows uint8 ``[N, row_bytes]``): a GGUF file's reader
    builds the same layers and model this way. ValueError names a missing or mis-shaped
    tensor; ``dtype`` / ``quantization`` / ``activation_dtype`` as :func:`load_model`.
    """
    storage = WeightStorage(dtype, quantization, activation_dtype)
    h, v = cfg.hidden_size, cfg.vocab_size
    name = "model.embed_tokens.weight"
    stored, fmt = reader.get_stored(name, (v, h))
    if cfg.tie_word_embeddings:
        # one table for both: lookups take the LM head's rows (quantized with it)
        lm_head, embed = storage.matrix(stored, fmt, name=name), None
    else:
        head = "lm_head.weight"
        head_stored, head_fmt = reader.get_stored(head, (v, h))
        lm_head = storage.matrix(head_stored, head_fmt, name=head)
        embed = storage.table(stored, fmt, name=name)
    del stored
    layers = [load_layer(reader, cfg, i, storage) for i in range(cfg.num_layers)]
    final_norm = norm_weight(reader, cfg, "model.norm.weight", h)
    return CausalLM(cfg, embed, layers, final_norm, lm_head, num_threads=num_threads,
                    quantize_query=activation_dtype == "auto")
