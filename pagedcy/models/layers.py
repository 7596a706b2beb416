"""Weights of one decoder layer, fused and laid out for the forward pass.

Projections are :class:`~pagedcy.models.linear.Weight` objects ``[out, in]`` as checkpoints
store them, in the format the load options chose (float32, 16-bit, a GGUF block format),
with q|k|v fused into one matrix and gate|up into another (:func:`concat_weights`: one
GEMM call each). Norm weights and biases are float32 vectors.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from pagedcy.models.config import ModelConfig
from pagedcy.models.linear import Weight, concat_weights
from pagedcy.models.storage import WeightStorage
from pagedcy.models.weights import CheckpointReader

__all__ = ["LayerWeights", "load_layer"]


@dataclasses.dataclass
class LayerWeights:
    """One decoder layer: norms float32 ``[hidden]``, ``w_qkv [(H + 2*Hkv) * D, hidden]``,
    ``w_o [hidden, H * D]``, ``w_gate_up [2 * I, hidden]``, ``w_down [hidden, I]``
    (:class:`Weight`, ``[out, in]``), optional float32 biases and per-head q/k norms ``[D]``,
    and the kernel's ``window_left`` (-1 = full attention).

    ``input_norm`` is the pre-attention norm and ``post_norm`` the pre-MLP norm (Llama's
    ``post_attention_layernorm``, Gemma's ``pre_feedforward_layernorm``). With sandwich norms
    (Gemma), ``attn_out_norm`` (Gemma's ``post_attention_layernorm``) and ``mlp_out_norm``
    (``post_feedforward_layernorm``) normalise the attention and MLP outputs before their
    residual adds. Norm weights are the scale applied (Gemma's ``1 + w`` already added)."""

    input_norm: np.ndarray
    post_norm: np.ndarray
    w_qkv: Weight
    w_o: Weight
    w_gate_up: Weight
    w_down: Weight
    window_left: int
    qkv_bias: np.ndarray | None = None
    o_bias: np.ndarray | None = None
    gate_up_bias: np.ndarray | None = None
    down_bias: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    attn_out_norm: np.ndarray | None = None
    mlp_out_norm: np.ndarray | None = None

    def nbytes(self) -> int:
        """Bytes held by this layer's weights, as stored."""
        return sum(a.nbytes for a in vars(self).values() if isinstance(a, (np.ndarray, Weight)))


def norm_weight(reader: CheckpointReader, cfg: ModelConfig, name: str, n: int) -> np.ndarray:
    """Norm weight ``name`` float32 ``[n]`` as the scale applied: ``1 + w`` for Gemma's
    convention (``cfg.norm_unit_offset``), once at load, so ``rms_norm`` runs unchanged."""
    w = reader.get(name, (n,))
    return (np.float32(1.0) + w).astype(np.float32) if cfg.norm_unit_offset else w


def load_layer(reader: CheckpointReader, cfg: ModelConfig, i: int,
               storage: WeightStorage | None = None) -> LayerWeights:
    """Read, check and fuse layer ``i`` of a checkpoint, holding its matrices per
    ``storage`` (default: as stored). ValueError names a missing tensor or a wrong shape."""
    storage = storage or WeightStorage()
    p = f"model.layers.{i}."
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    qd, kd = cfg.num_heads * d, cfg.num_kv_heads * d

    def mat(name, shape):
        return storage.matrix(*reader.get_stored(p + name, shape), name=p + name)

    def vec(name, n):
        return reader.get(p + name, (n,))

    def norm(name, n):
        return norm_weight(reader, cfg, p + name, n)

    attn = "self_attn."
    w_qkv = concat_weights(mat(attn + f"{n}_proj.weight", (w, h))
                           for n, w in (("q", qd), ("k", kd), ("v", kd)))
    w_gate_up = concat_weights([mat("mlp.gate_proj.weight", (inter, h)),
                                mat("mlp.up_proj.weight", (inter, h))])
    pre_mlp = "pre_feedforward_layernorm.weight" if cfg.sandwich_norms else \
        "post_attention_layernorm.weight"
    layer = LayerWeights(
        input_norm=norm("input_layernorm.weight", h), post_norm=norm(pre_mlp, h),
        w_qkv=w_qkv, w_o=mat(attn + "o_proj.weight", (h, qd)), w_gate_up=w_gate_up,
        w_down=mat("mlp.down_proj.weight", (h, inter)), window_left=cfg.window_left(i))
    if cfg.sandwich_norms:
        layer.attn_out_norm = norm("post_attention_layernorm.weight", h)
        layer.mlp_out_norm = norm("post_feedforward_layernorm.weight", h)
    if cfg.attention_bias:
        layer.qkv_bias = np.concatenate([vec(attn + "q_proj.bias", qd),
                                         vec(attn + "k_proj.bias", kd),
                                         vec(attn + "v_proj.bias", kd)])
    if cfg.o_proj_bias:
        layer.o_bias = vec(attn + "o_proj.bias", h)
    if cfg.mlp_bias:
        layer.gate_up_bias = np.concatenate([vec("mlp.gate_proj.bias", inter),
                                             vec("mlp.up_proj.bias", inter)])
        layer.down_bias = vec("mlp.down_proj.bias", h)
    if cfg.qk_norm:
        layer.q_norm = norm(attn + "q_norm.weight", d)
        layer.k_norm = norm(attn + "k_norm.weight", d)
    return layer
