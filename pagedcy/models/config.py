"""ModelConfig: what pagedcy needs from a checkpoint's config.json (and generation_config.json)."""
from __future__ import annotations

import dataclasses
import math
import os

from pagedcy._validate import read_json_object

__all__ = ["ModelConfig", "SUPPORTED_ARCHITECTURES", "SUPPORTED_ROPE_TYPES"]

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                           "Qwen3ForCausalLM", "Gemma3ForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
SUPPORTED_ACTIVATIONS = ("silu", "gelu_tanh")
# config.json's hidden_act / hidden_activation names -> the activation pagedcy runs
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh",
                "gelu_new": "gelu_tanh"}


_DEFAULT_HEAD_DIM = {"Gemma3ForCausalLM": 256, "Qwen3ForCausalLM": 128}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Geometry and options of a supported decoder-only checkpoint.

    ``rope_scaling`` is the RoPE scaling dict (with ``rope_type``) or None for plain RoPE.
    ``sliding_window`` is the window in tokens (a query sees itself and the
    ``sliding_window - 1`` tokens before it, as transformers masks it) or None;
    ``sliding_layers[i]`` says whether layer ``i`` uses it. ``attention_bias`` means q/k/v
    projections carry biases, ``o_proj_bias`` the output projection, ``mlp_bias`` the MLP.

    Gemma 3's differences from Llama, each an option (defaults: Llama's behaviour):
    ``norm_unit_offset`` (checkpoint norm weights ``w`` scale by ``1 + w``; the loader adds
    the 1 once), ``sandwich_norms`` (RMSNorm of the attention and MLP outputs before each
    residual add, and a separate pre-MLP norm), ``hidden_act`` ("silu" or "gelu_tanh"),
    ``query_scale`` (attention score scale; None: ``head_dim ** -0.5``), ``embed_scale``
    (embeddings times this; None: 1), ``rope_local_theta`` (with it, sliding layers use plain
    RoPE with this theta and ``rope_theta`` / ``rope_scaling`` apply to full-attention layers
    only; None: every layer uses ``rope_theta`` / ``rope_scaling``),
    ``final_logit_softcapping`` / ``attn_logit_softcapping`` (``c * tanh(s / c)`` on the
    logits / attention scores; None: off).
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    sliding_window: int | None
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    o_proj_bias: bool = False
    mlp_bias: bool = False
    sliding_layers: tuple[bool, ...] = ()
    norm_unit_offset: bool = False
    sandwich_norms: bool = False
    hidden_act: str = "silu"
    query_scale: float | None = None
    embed_scale: float | None = None
    rope_local_theta: float | None = None
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None

    def window_left(self, layer: int) -> int:
        """The attention kernel's ``window_left`` for ``layer``: -1 (none) or window - 1."""
        if self.sliding_window is not None and self.sliding_layers and self.sliding_layers[layer]:
            return self.sliding_window - 1
        return -1

    def rope_params(self, layer: int) -> tuple[float, dict | None]:
        """(theta, scaling dict or None) of ``layer``'s RoPE (see ``rope_local_theta``)."""
        if self.rope_local_theta is not None and self.window_left(layer) >= 0:
            return self.rope_local_theta, None
        return self.rope_theta, self.rope_scaling

    @classmethod
    def from_dir(cls, path: str | os.PathLike) -> "ModelConfig":
        """Read ``config.json`` (and ``generation_config.json`` when present) in ``path``.
        FileNotFoundError if config.json is missing, ValueError for an unsupported or
        malformed config (naming the field)."""
        cfg_path = os.path.join(path, "config.json")
        if not os.path.isfile(cfg_path):
            raise FileNotFoundError(f"no config.json in {os.fspath(path)!r}")
        raw = read_json_object(cfg_path)
        gen_path = os.path.join(path, "generation_config.json")
        gen = read_json_object(gen_path) if os.path.isfile(gen_path) else {}
        return cls.from_dict(raw, gen)

    @classmethod
    def from_dict(cls, raw: dict, generation: dict | None = None) -> "ModelConfig":
        """Build from a parsed config.json dict (and generation_config.json dict)."""
        archs = raw.get("architectures") or []
        arch = archs[0] if isinstance(archs, list) and archs else None
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"unsupported architecture {arch!r} (config.json 'architectures'); "
                             f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
        gemma = arch == "Gemma3ForCausalLM"
        hidden = _int(raw, "hidden_size")
        heads = _int(raw, "num_attention_heads")
        kv_heads = _int(raw, "num_key_value_heads", heads)
        # a missing head_dim means transformers' default for the class (Qwen3: 128, Gemma 3: 256)
        head_dim = raw.get("head_dim") or _DEFAULT_HEAD_DIM.get(arch) or hidden // heads
        head_dim = _int({"head_dim": head_dim}, "head_dim")
        if heads % kv_heads:
            raise ValueError(f"num_attention_heads ({heads}) must be a multiple of "
                             f"num_key_value_heads ({kv_heads})")
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {head_dim}")
        layers = _int(raw, "num_hidden_layers", upper=MAX_LAYERS)
        act = (raw.get("hidden_activation") if gemma else None) or raw.get("hidden_act", "silu")
        if act not in _ACTIVATIONS:
            raise ValueError(f"unsupported hidden_act {act!r}; supported: {', '.join(_ACTIVATIONS)}")
        window, sliding = _sliding(raw, arch, layers)
        extra = _gemma3(raw, hidden) if gemma else {}
        if gemma:
            theta, scaling = extra.pop("rope")
        else:
            theta, scaling = _rope(raw)
        bias = _bool(raw, "attention_bias")
        gen = generation or {}
        eos = gen.get("eos_token_id", raw.get("eos_token_id"))
        eos_ids = tuple(_token_id(e, "eos_token_id")
                        for e in (eos if isinstance(eos, list) else [eos]) if e is not None)
        bos = gen.get("bos_token_id", raw.get("bos_token_id"))
        return cls(
            architecture=arch, vocab_size=_int(raw, "vocab_size"), hidden_size=hidden,
            num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
            intermediate_size=_int(raw, "intermediate_size"),
            rms_norm_eps=_positive_float(raw, "rms_norm_eps", 1e-6), rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=_int(raw, "max_position_embeddings", 131072 if gemma else 2048),
            sliding_window=window, tie_word_embeddings=_bool(raw, "tie_word_embeddings", gemma),
            attention_bias=(arch == "Qwen2ForCausalLM") or (bias and arch != "MistralForCausalLM"),
            qk_norm=arch in ("Qwen3ForCausalLM", "Gemma3ForCausalLM"),
            bos_token_id=None if bos is None else _token_id(bos, "bos_token_id"),
            eos_token_ids=eos_ids,
            o_proj_bias=bias and arch in ("LlamaForCausalLM", "Qwen3ForCausalLM",
                                          "Gemma3ForCausalLM"),
            mlp_bias=_bool(raw, "mlp_bias") and arch == "LlamaForCausalLM",
            sliding_layers=sliding, hidden_act=_ACTIVATIONS[act], **extra)

    def num_parameters(self) -> int:
        """Parameter count of the checkpoint (tied embeddings counted once)."""
        h, d, i = self.hidden_size, self.head_dim, self.intermediate_size
        qkv = (self.num_heads + 2 * self.num_kv_heads) * d
        per_layer = h * qkv + self.num_heads * d * h + 3 * h * i + 2 * h
        per_layer += qkv if self.attention_bias else 0
        per_layer += h if self.o_proj_bias else 0
        per_layer += 2 * i + h if self.mlp_bias else 0
        per_layer += 2 * d if self.qk_norm else 0
        per_layer += 2 * h if self.sandwich_norms else 0
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + emb + h


#: More layers than any checkpoint has: a config asking for more is refused before
#: per-layer tables are built (10**9 layers took 8 GB before a tensor was checked).
MAX_LAYERS = 1 << 16


def _int(raw, key, default=None, upper=None):
    v = raw.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"config.json field {key!r} must be a positive integer, got {v!r}")
    if upper is not None and v > upper:
        raise ValueError(f"config.json field {key!r} is {v}, more than {upper}")
    return v


def _positive_float(raw, key, default):
    v = raw.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"config.json field {key!r} must be a positive finite number, got {v!r}")
    return float(v)


def _bool(raw, key, default=False):
    # JSON true/false only: bool("false") is True, which once silently untied embeddings
    v = raw.get(key, default)
    if v is None:                  # null: unset, as transformers reads it
        return default
    if not isinstance(v, bool):
        raise ValueError(f"config.json field {key!r} must be true or false, got {v!r}")
    return v


def _token_id(v, key):
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{key} must be a non-negative integer (or a list of them), got {v!r}")
    return v


def _rope(raw, params=None, theta_default=10000.0):
    """(rope_theta, scaling dict or None) from either transformers 5's ``rope_parameters``
    or the older ``rope_theta`` + ``rope_scaling`` fields (or from ``params``, one layer
    type's entry of a per-layer-type ``rope_parameters``)."""
    if params is None:
        params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ValueError(f"rope_scaling must be an object, got {params!r}")
    if params and all(isinstance(v, dict) for v in params.values()):
        raise ValueError("per-layer-type RoPE parameters are not supported")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"unsupported rope_scaling type {rope_type!r}; "
                         f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    theta = _positive_float(params if "rope_theta" in params else raw, "rope_theta", theta_default)
    if float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))) != 1.0:
        raise ValueError("partial_rotary_factor != 1 is not supported")
    if rope_type == "default":
        return theta, None
    scaling = {k: v for k, v in params.items() if k not in ("type", "rope_theta")}
    scaling["rope_type"] = rope_type
    if rope_type == "linear":
        return theta, {"rope_type": "linear", "factor": _scaling_number(scaling, "factor")}
    scaling.setdefault("original_max_position_embeddings", raw.get("max_position_embeddings"))
    for key in ("factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings"):
        _scaling_number(scaling, key)
    if scaling["high_freq_factor"] <= scaling["low_freq_factor"]:    # the smoothing divides by it
        raise ValueError("rope_scaling 'high_freq_factor' must exceed 'low_freq_factor'")
    return theta, scaling


def _scaling_number(scaling, key):
    v = scaling.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"rope_scaling type {scaling['rope_type']!r} needs a positive number "
                         f"{key!r}, got {v!r}")
    return float(v)


def _sliding(raw, arch, layers):
    """(window or None, per-layer flags) following transformers' rules per architecture."""
    window = raw.get("sliding_window")
    if arch == "Gemma3ForCausalLM" and raw.get("layer_types") is None:
        pattern = raw.get("sliding_window_pattern", raw.get("_sliding_window_pattern", 6))
        pattern = _int({"sliding_window_pattern": pattern}, "sliding_window_pattern")
        raw = dict(raw, layer_types=["sliding_attention" if (i + 1) % pattern else "full_attention"
                                     for i in range(layers)])
    if arch == "LlamaForCausalLM":
        return None, (False,) * layers
    if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and not _bool(raw, "use_sliding_window"):
        window = None
    if window is None:
        return None, (False,) * layers
    window = _int({"sliding_window": window}, "sliding_window")
    if arch == "MistralForCausalLM":
        return window, (True,) * layers
    types = raw.get("layer_types")
    if types is None:
        first = raw.get("max_window_layers", 28)
        if isinstance(first, bool) or not isinstance(first, int):
            raise ValueError(f"config.json field 'max_window_layers' must be an integer, got {first!r}")
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
    if not isinstance(types, list) or any(t not in _LAYER_TYPES for t in types):
        raise ValueError(f"config.json field 'layer_types' must be a list of {_LAYER_TYPES}")
    if len(types) != layers:
        raise ValueError(f"layer_types has {len(types)} entries for {layers} layers")
    return window, tuple(t == "sliding_attention" for t in types)


_LAYER_TYPES = ("full_attention", "sliding_attention")


def _optional_float(raw, key):
    return None if raw.get(key) is None else _positive_float(raw, key, None)


def _gemma3(raw, hidden):
    """Gemma 3's options (ModelConfig field -> value) and its two RoPE settings under "rope":
    transformers 5's per-layer-type ``rope_parameters``, or the older ``rope_theta`` (global
    layers, with ``rope_scaling``) + ``rope_local_base_freq`` (sliding layers)."""
    if _bool(raw, "use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention (EmbeddingGemma) is not supported")
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        full = _rope(raw, params.get("full_attention") or {}, 1e6)
        local = _rope(raw, params.get("sliding_attention") or {}, 10000.0)
    else:
        full = _rope(raw, None, 1e6)
        local = (_positive_float(raw, "rope_local_base_freq", 10000.0), None)
    if local[1] is not None:
        raise ValueError("RoPE scaling on Gemma 3's sliding layers is not supported")
    return dict(norm_unit_offset=True, sandwich_norms=True, rope=full, rope_local_theta=local[0],
                query_scale=_positive_float(raw, "query_pre_attn_scalar", 256) ** -0.5,
                embed_scale=hidden ** 0.5,
                final_logit_softcapping=_optional_float(raw, "final_logit_softcapping"),
                # transformers' Gemma3Attention never passes attn_logit_softcapping to the
                # attention (Gemma 2's does): checked, then ignored likewise, to match it
                attn_logit_softcapping=_optional_float(raw, "attn_logit_softcapping") and None)
