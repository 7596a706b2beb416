"""write_random_checkpoint: a random model that pagedcy and transformers both load."""
from __future__ import annotations

import json
import os

from typing import Any

import numpy as np

from pagedcy.models.config import SUPPORTED_ARCHITECTURES, ModelConfig
from pagedcy.models import tokenizer as _tok
from pagedcy.models.weights import to_bf16_bits

__all__ = ["write_random_checkpoint", "to_bf16_bits"]

_MODEL_TYPES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
                "Gemma3ForCausalLM": "gemma3_text"}
_DTYPES = {"float32": ("F32", np.float32), "float16": ("F16", np.float16),
           "bfloat16": ("BF16", None)}

DEFAULTS = dict(vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=256, max_position_embeddings=4096,
                rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False)
# Gemma 3's own defaults on top: head_dim not hidden / heads, a sliding window shorter than
# test prompts, sliding and global layers mixed, two RoPE thetas, its query scale.
GEMMA3_DEFAULTS = dict(head_dim=48, sliding_window=8,
                       layer_types=["sliding_attention", "full_attention"], rope_theta=1e6, rope_local_base_freq=10000.0, query_pre_attn_scalar=64,
                       hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                       final_logit_softcapping=None, attn_logit_softcapping=None)


def _tensors(cfg: ModelConfig, rng):
    """Random weights scaled so activations keep unit size and logits have a spread of a
    few units: greedy choices are far from ties (transformers' 0.02-std init would make all
    logits nearly equal). HF layout: [out, in]."""
    h, d, inter, v = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size
    qd, kd = cfg.num_heads * d, cfg.num_kv_heads * d

    def lin(out, inp):
        return rng.standard_normal((out, inp), dtype=np.float32) / np.float32(np.sqrt(inp))

    unit = 0.0 if cfg.norm_unit_offset else 1.0    # Gemma stores w for a scale of 1 + w

    def norm(n):
        return (unit + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def bias(n):
        return (0.1 * rng.standard_normal(n)).astype(np.float32)

    t = {"model.embed_tokens.weight": rng.standard_normal((v, h), dtype=np.float32)}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(h)
        t[p + "post_attention_layernorm.weight"] = norm(h)
        if cfg.sandwich_norms:
            t[p + "pre_feedforward_layernorm.weight"] = norm(h)
            t[p + "post_feedforward_layernorm.weight"] = norm(h)
        for name, out in (("q", qd), ("k", kd), ("v", kd)):
            t[p + f"self_attn.{name}_proj.weight"] = lin(out, h)
            if cfg.attention_bias:
                t[p + f"self_attn.{name}_proj.bias"] = bias(out)
        t[p + "self_attn.o_proj.weight"] = lin(h, qd)
        if cfg.o_proj_bias:
            t[p + "self_attn.o_proj.bias"] = bias(h)
        if cfg.qk_norm:
            t[p + "self_attn.q_norm.weight"] = norm(d)
            t[p + "self_attn.k_norm.weight"] = norm(d)
        t[p + "mlp.gate_proj.weight"] = lin(inter, h)
        t[p + "mlp.up_proj.weight"] = lin(inter, h)
        t[p + "mlp.down_proj.weight"] = lin(h, inter)
        if cfg.mlp_bias:
            for name, n in (("gate", inter), ("up", inter), ("down", h)):
                t[p + f"mlp.{name}_proj.bias"] = bias(n)
    t["model.norm.weight"] = norm(h)
    if not cfg.tie_word_embeddings:
        t["lm_head.weight"] = 3.0 * lin(v, h)
    return t


def _save(tensors, file, dtype):
    import safetensors

    code, np_dtype = _DTYPES[dtype]
    arrays = {name: np.ascontiguousarray(to_bf16_bits(a) if np_dtype is None else a.astype(np_dtype))
              for name, a in tensors.items()}
    spec = getattr(safetensors, "TensorSpec", None)
    if spec is not None:  # safetensors >= 0.8: specs point at the arrays' memory
        payload = {name: spec(dtype=dtype, shape=a.shape, data_ptr=a.ctypes.data, data_len=a.nbytes)
                   for name, a in arrays.items()}
    else:
        payload = {name: {"dtype": code, "shape": list(a.shape), "data": a.tobytes()}
                   for name, a in arrays.items()}
    safetensors.serialize_file(payload, file, metadata={"format": "pt"})


def write_random_checkpoint(path, architecture: str = "LlamaForCausalLM", *, dtype: str = "float32",
                            seed: int = 0, tokenizer: bool = True, **config) -> str:
    """Write a random checkpoint to directory ``path`` (created if needed): ``config.json``,
    ``generation_config.json``, ``model.safetensors`` in ``dtype`` (float32, float16 or
    bfloat16) and, with ``tokenizer``, a byte-level BPE ``tokenizer.json`` +
    ``tokenizer_config.json`` (chat template, ``<s>``/``</s>`` specials) trained locally.

    ``config`` overrides config.json fields by their Hugging Face names (defaults: a tiny
    model, :data:`DEFAULTS`, and for ``Gemma3ForCausalLM`` :data:`GEMMA3_DEFAULTS`). With a
    tokenizer, ``vocab_size`` is raised to fit it if needed. Returns ``path``. ValueError
    for an unsupported architecture/dtype/config.
    """
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"unsupported architecture {architecture!r}; supported: "
                         f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    gemma = architecture == "Gemma3ForCausalLM"
    raw: dict[str, Any] = dict(DEFAULTS, **(GEMMA3_DEFAULTS if gemma else {}))
    if gemma and "num_hidden_layers" in config and "layer_types" not in config:
        raw["layer_types"] = ["full_attention" if i % 2 else "sliding_attention"
                              for i in range(config["num_hidden_layers"])]
    raw.update(config)
    raw["architectures"] = [architecture]
    raw["model_type"] = _MODEL_TYPES[architecture]
    if not gemma:
        raw.setdefault("hidden_act", "silu")
        # explicit, as real checkpoints write it: transformers' defaults differ (Qwen3: 128)
        raw.setdefault("head_dim", raw["hidden_size"] // raw["num_attention_heads"])
    raw.setdefault("torch_dtype", dtype)
    specials = _tok.special_token_ids()
    raw.setdefault("bos_token_id", specials["<s>"])
    raw.setdefault("eos_token_id", specials["</s>"])
    if tokenizer:
        raw["vocab_size"] = max(int(raw["vocab_size"]), _tok.min_vocab_size())
    cfg = ModelConfig.from_dict(raw)  # validates before anything is written
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(raw, f, indent=2)
    with open(os.path.join(path, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token_id": raw["bos_token_id"], "eos_token_id": raw["eos_token_id"]}, f)
    _save(_tensors(cfg, np.random.default_rng(seed)), os.path.join(path, "model.safetensors"), dtype)
    if tokenizer:
        _tok.write_tokenizer(path, cfg.vocab_size, cfg.max_position_embeddings)
    return os.fspath(path)
