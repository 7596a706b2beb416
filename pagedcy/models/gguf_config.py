"""A GGUF file's metadata as a Hugging Face ``config.json`` dict, and its tensors under HF names.

The keys follow llama.cpp's ``convert_hf_to_gguf.py`` (the writer) and transformers' GGUF
loader (``integrations/ggml.py``, ``modeling_gguf_pytorch_utils.py``), which maps them back.
Where transformers leaves a field to the config class's default but llama.cpp fixes it in code
(Gemma 3's ``query_pre_attn_scalar``, local RoPE base and sliding pattern), llama.cpp's value
is used, since that is what the file's producer ran.
"""
from __future__ import annotations

import math
import re

import numpy as np

from pagedcy.models.gguf_file import GGUFFile, GGUFTensor

__all__ = ["GGUF_ARCHITECTURES", "config_from_metadata", "generation_from_metadata", "hf_tensors"]

#: GGUF ``general.architecture`` -> (HF architecture, HF model_type). Mistral files say llama.
GGUF_ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
}

_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "ffn_norm": "post_attention_layernorm",
}
# Gemma 3 norms around both sublayers: ffn_norm is the pre-FFN norm there.
_GEMMA3_NAMES = dict(_LAYER_NAMES, ffn_norm="pre_feedforward_layernorm",
                     post_attention_norm="post_attention_layernorm",
                     post_ffw_norm="post_feedforward_layernorm")
_LAYER_RE = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)")
#: Tensors a converter adds that are not HF parameters (read into the config instead).
_NOT_PARAMETERS = ("rope_freqs.weight",)
#: End-of-generation tokens llama.cpp recognises by their text (llama-vocab.cpp).
_EOG_TEXTS = ("<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")
_REQUIRED = object()
#: Bounds on sizes read from metadata, so per-layer tables stay small for any file.
_MAX_LAYERS = 1 << 16
_MAX_SIZE = 1 << 40


def _arch(md) -> str:
    arch = _get(md, "general.architecture", str)
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"unsupported GGUF architecture {arch!r}; supported: "
                         f"{', '.join(GGUF_ARCHITECTURES)}")
    return arch


def _get(md, key, kind, default=_REQUIRED, upper=None):
    """``md[key]`` checked to be of ``kind`` (int, float, str or bool; ints with ``upper``
    set must lie in ``[1, upper]``); ValueError naming the key when missing (without a
    default), of another type or out of range."""
    if key not in md:
        if default is _REQUIRED:
            raise ValueError(f"GGUF metadata {key!r} is missing")
        return default
    v = md[key]
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if isinstance(v, bool) != (kind is bool) or not isinstance(v, kind):
        raise ValueError(f"GGUF metadata {key!r} must be {kind.__name__}, got {type(v).__name__}")
    if kind is float and not math.isfinite(v):
        raise ValueError(f"GGUF metadata {key!r} must be finite, got {v}")
    if upper is not None and not 1 <= v <= upper:
        raise ValueError(f"GGUF metadata {key!r} must be in [1, {upper}], got {v}")
    return v


def _per_layer_int(md, key, layers, default=_REQUIRED):
    """A positive int, or a per-layer array of equal ones (llama.cpp writes either)."""
    v = md.get(key)
    if isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in "iu":
        if len(v) != layers or len(set(v.tolist())) != 1:
            raise ValueError(f"GGUF metadata {key!r}: {len(v)} per-layer values for {layers} "
                             "layers, or values that differ between layers, are not supported")
        md = {key: int(v[0])}
    return _get(md, key, int, default, upper=_MAX_SIZE)


def config_from_metadata(gguf: GGUFFile) -> dict:
    """The HF config.json dict of a GGUF file (see :func:`pagedcy.models.gguf_model.read_gguf`).
    ValueError naming the key for missing, mistyped or unsupported metadata."""
    md, arch = gguf.metadata, _arch(gguf.metadata)
    hf_arch, model_type = GGUF_ARCHITECTURES[arch]
    p = arch + "."
    layers = _get(md, p + "block_count", int, upper=_MAX_LAYERS)
    heads = _per_layer_int(md, p + "attention.head_count", layers)
    kv_heads = _per_layer_int(md, p + "attention.head_count_kv", layers, heads)
    hidden = _get(md, p + "embedding_length", int, upper=_MAX_SIZE)
    q = gguf.tensors.get("blk.0.attn_q.weight")
    head_dim = _get(md, p + "attention.key_length", int,
                    q.shape[0] // heads if q is not None else hidden // heads, upper=_MAX_SIZE)
    embd = gguf.tensors.get("token_embd.weight")
    tokens = md.get("tokenizer.ggml.tokens")
    vocab = embd.shape[0] if embd is not None else len(tokens) if isinstance(tokens, list) else None
    cfg = {
        "architectures": [hf_arch], "model_type": model_type,
        "vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "intermediate_size": _per_layer_int(md, p + "feed_forward_length", layers),
        "max_position_embeddings": _get(md, p + "context_length", int, 2048, upper=_MAX_SIZE),
        "rms_norm_eps": _get(md, p + "attention.layer_norm_rms_epsilon", float, 1e-6),
        "rope_theta": _get(md, p + "rope.freq_base", float, 10000.0),
        "rope_scaling": _rope_scaling(gguf, p, head_dim),
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        "bos_token_id": _get(md, "tokenizer.ggml.bos_token_id", int, None),
        "eos_token_id": _get(md, "tokenizer.ggml.eos_token_id", int, None),
        "pad_token_id": _get(md, "tokenizer.ggml.padding_token_id", int, None),
    }
    bias = "blk.0.attn_q.bias" in gguf.tensors
    if arch == "gemma3":
        cfg.update(_gemma3(md, p, cfg))
    else:
        cfg["hidden_act"] = "silu"
        cfg["attention_bias"] = bias
    if arch == "llama":
        cfg["mlp_bias"] = "blk.0.ffn_gate.bias" in gguf.tensors
    if arch in ("qwen2", "qwen3"):
        cfg["use_sliding_window"] = False
    return cfg


def _gemma3(md, p, cfg):
    """Gemma 3 fields llama.cpp (src/llama-model.cpp) reads or fixes for this architecture."""
    layers = cfg["num_hidden_layers"]
    pattern = md.get(p + "attention.sliding_window_pattern", 6)
    if isinstance(pattern, np.ndarray):        # one flag per layer, True = sliding
        if pattern.ndim != 1 or len(pattern) != layers:
            raise ValueError(f"GGUF metadata {p}attention.sliding_window_pattern must have "
                             f"{layers} entries")
        sliding = [bool(x) for x in pattern]
        pattern = None
    else:
        pattern = _get({p + "attention.sliding_window_pattern": pattern},
                       p + "attention.sliding_window_pattern", int, upper=_MAX_LAYERS)
        sliding = [bool((i + 1) % pattern) for i in range(layers)]
    # the 27B model scales queries by hidden/heads, the others by head_dim (as llama.cpp)
    scalar = (cfg["hidden_size"] // cfg["num_attention_heads"] if layers == 62
              else cfg["head_dim"])
    out = {
        "hidden_activation": "gelu_pytorch_tanh", "attention_bias": False,
        "query_pre_attn_scalar": scalar,
        "sliding_window": _get(md, p + "attention.sliding_window", int, 4096, upper=_MAX_SIZE),
        "rope_local_base_freq": _get(md, p + "rope.freq_base_swa", float, 10000.0),
        "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
        "final_logit_softcapping": _get(md, p + "final_logit_softcapping", float, None),
        "attn_logit_softcapping": _get(md, p + "attn_logit_softcapping", float, None),
    }
    if pattern is not None:
        out["sliding_window_pattern"] = pattern
    return out


def _rope_scaling(gguf, p, head_dim):
    """The HF ``rope_scaling`` dict from ``rope.scaling.*`` keys, or (llama3 scaling, which the
    converter stores only as the ``rope_freqs`` factors) recovered from those factors."""
    md = gguf.metadata
    kind = _get(md, p + "rope.scaling.type", str, "none")
    if "rope_freqs.weight" in gguf.tensors:
        if kind not in ("none", "llama3"):
            raise ValueError(f"rope_freqs.weight with rope scaling {kind!r} is not supported")
        return _llama3_from_factors(gguf.tensors["rope_freqs.weight"], head_dim,
                                    _get(md, p + "rope.freq_base", float, 10000.0))
    if kind == "none":
        return None
    if kind not in ("linear", "yarn"):
        raise ValueError(f"unsupported GGUF rope scaling type {kind!r}; supported: none, "
                         "linear, yarn, llama3 (rope_freqs)")
    out = {"rope_type": kind, "factor": _get(md, p + "rope.scaling.factor", float)}
    orig = _get(md, p + "rope.scaling.original_context_length", int, None)
    if orig is not None:
        out["original_max_position_embeddings"] = orig
    return out


def _llama3_from_factors(tensor: GGUFTensor, head_dim, theta):
    """Llama 3 RoPE parameters whose per-frequency factors equal ``rope_freqs``.

    The converter writes factor 1 for high frequencies, ``factor`` for low ones and
    ``1 / ((1 - s) / factor + s)`` between, with ``s = (old_ctx / wavelen - low) / (high - low)``
    linear in the frequency. Fitting that line fixes ``old_ctx / (high - low)`` and
    ``low / (high - low)``; any parameters sharing those give identical factors, so
    ``low_freq_factor`` is taken as 1 (every Llama 3.x release uses 1) and the rest follow.
    ValueError if the factors are not of that shape (checked by recomputing them).
    """
    if tensor.raw is None or tensor.shape != (head_dim // 2,):
        raise ValueError(f"rope_freqs.weight must have shape ({head_dim // 2},), got {tensor.shape}")
    f = tensor.dequantize().astype(np.float64)
    if not np.all(np.isfinite(f)) or f.min() < 1 - 1e-6:
        raise ValueError("rope_freqs.weight must hold finite factors >= 1")
    factor = float(f.max())
    freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    mid = (f > 1 + 1e-6) & (f < factor * (1 - 1e-6))
    if factor <= 1 + 1e-6:
        return None
    if mid.sum() < 2:
        raise ValueError("cannot recover llama3 RoPE scaling from rope_freqs.weight: fewer "
                         "than two smoothed frequencies")
    s = (1 / f[mid] - 1 / factor) / (1 - 1 / factor)
    a, b = np.polyfit(freq[mid], s, 1)
    if not b < 0 or not a > 0:
        raise ValueError("rope_freqs.weight does not follow llama3 RoPE scaling")
    span = -1 / b                                         # high - low with low = 1
    old = 2 * math.pi * a * span

    def tidy(x):  # the fit is exact up to float32 rounding: snap to round values
        r = round(x)
        return float(r) if abs(x - r) < 1e-3 * max(1.0, abs(x)) else x

    out = {"rope_type": "llama3", "factor": tidy(factor), "low_freq_factor": 1.0,
           "high_freq_factor": tidy(1 + span), "original_max_position_embeddings": int(round(old))}
    wavelen = 2 * math.pi / freq
    smooth = np.clip((out["original_max_position_embeddings"] / wavelen - 1)
                     / (out["high_freq_factor"] - 1), 0, 1)
    again = 1 / ((1 - smooth) / out["factor"] + smooth)
    if not np.allclose(again, f, rtol=1e-4):
        raise ValueError("rope_freqs.weight does not follow llama3 RoPE scaling")
    return out


def generation_from_metadata(gguf: GGUFFile) -> dict:
    """A generation_config.json-style dict: ``bos_token_id``, ``eos_token_id`` (a list: the
    file's eos, eot and eom ids, then control tokens llama.cpp treats as end of generation,
    such as ``<end_of_turn>``), ``pad_token_id`` (absent ids left out)."""
    md = gguf.metadata
    eos = [_get(md, f"tokenizer.ggml.{k}_token_id", int, None) for k in ("eos", "eot", "eom")]
    tokens = md.get("tokenizer.ggml.tokens")
    types = md.get("tokenizer.ggml.token_type")
    if (isinstance(tokens, list) and all(isinstance(t, str) for t in tokens)
            and isinstance(types, np.ndarray) and types.shape == (len(tokens),)):
        found = {}
        for i, t in enumerate(tokens):
            if t in _EOG_TEXTS and t not in found and types[i] in (3, 4):
                found[t] = i
        eos += [found[t] for t in _EOG_TEXTS if t in found]
    out = {"bos_token_id": _get(md, "tokenizer.ggml.bos_token_id", int, None),
           "eos_token_id": list(dict.fromkeys(e for e in eos if e is not None)),
           "pad_token_id": _get(md, "tokenizer.ggml.padding_token_id", int, None)}
    return {k: v for k, v in out.items() if v not in (None, [])}


def hf_tensors(gguf: GGUFFile, config: dict, hf_norms: bool = True) -> dict[str, GGUFTensor]:
    """The file's tensors keyed by HF parameter name, ``GGUFTensor.name`` set to it.

    Llama: the converter permutes q/k rows (pairs of rotary halves interleaved); this undoes
    it as transformers' GGUF loader does (``reverse_permute``), by reordering rows, which works
    on quantized data too since each row is whole blocks; q and k (and their biases) are then
    copies, not views. Gemma 3: the file stores every ``*norm.weight`` as ``1 + w``; with
    ``hf_norms`` (default) these become float32 copies holding ``w``, the value a Hugging Face
    checkpoint holds (the model computes ``x * (1 + w)``), as transformers loads them;
    ``hf_norms=False`` keeps the file's ``1 + w``. ValueError for a tensor with no HF name or
    of a type pagedcy does not load (naming it).
    """
    arch = _arch(gguf.metadata)
    names = _GEMMA3_NAMES if arch == "gemma3" else _LAYER_NAMES
    out = {}
    for gname, t in gguf.tensors.items():
        if gname in _NOT_PARAMETERS:
            continue
        hf = _GLOBAL_NAMES.get(gname)
        m = _LAYER_RE.fullmatch(gname)
        if hf is None and m and m[2] in names and int(m[1]) < config["num_hidden_layers"]:
            hf = f"model.layers.{int(m[1])}.{names[m[2]]}.{m[3]}"
        if hf is None:
            raise ValueError(f"GGUF tensor {gname!r} has no Hugging Face counterpart in a "
                             f"{arch} model")
        gguf.check_types([gname])
        t = t.with_raw(hf, t.raw)
        if arch == "llama" and m and m[2] in ("attn_q", "attn_k"):
            heads = config["num_attention_heads" if m[2] == "attn_q" else "num_key_value_heads"]
            t = _unpermute(t, heads)
        elif arch == "gemma3" and hf_norms and gname.endswith("norm.weight"):
            t = _f32_tensor(hf, t.dequantize() - np.float32(1.0))
        out[hf] = t
    return out


def _f32_tensor(name, values):
    raw = np.ascontiguousarray(values, dtype=np.float32)
    shape = raw.shape
    raw = raw.reshape(-1, shape[-1]).view(np.uint8)
    raw.flags.writeable = False
    return GGUFTensor(name, 0, shape, raw)


def _unpermute(t: GGUFTensor, heads):
    """Undo ``convert_hf_to_gguf.LlamaModel.permute`` on the rows of ``t`` (a copy)."""
    rows = t.shape[0]
    if heads < 1 or rows % (2 * heads):
        raise ValueError(f"tensor {t.name!r} has {rows} rows, not a multiple of 2 * {heads} heads")
    order = np.arange(rows).reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(rows)
    # converted row j is HF row order[j]: HF row i is converted row inverse[i]
    inverse = np.argsort(order)
    if len(t.shape) == 1:                  # a bias: elements, not rows
        return _f32_tensor(t.name, t.dequantize()[inverse])
    raw = t.raw[inverse]
    raw.flags.writeable = False
    return t.with_raw(t.name, raw)
