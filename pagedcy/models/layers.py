"""Weights of one decoder layer, fused and laid out for the forward pass.

Projections are stored as checkpoints store them, C-contiguous float32 ``[out, in]``, with
q|k|v fused into one matrix and gate|up into another: ``pagedcy._libs._gemm.linear`` reads
them front to back for decode-sized batches and hands them to BLAS as ``W.T`` (no copy) for
prefill-sized ones.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from pagedcy.models.config import ModelConfig
from pagedcy.models.weights import CheckpointReader

__all__ = ["LayerWeights", "load_layer"]


@dataclasses.dataclass
class LayerWeights:
    """One decoder layer: norms ``[hidden]``, ``w_qkv [(H + 2*Hkv) * D, hidden]``,
    ``w_o [hidden, H * D]``, ``w_gate_up [2 * I, hidden]``, ``w_down [hidden, I]`` (float32,
    C-contiguous, ``[out, in]``), optional biases and per-head q/k norms ``[D]``, and the kernel's
    ``window_left`` (-1 = full attention)."""

    input_norm: np.ndarray
    post_norm: np.ndarray
    w_qkv: np.ndarray
    w_o: np.ndarray
    w_gate_up: np.ndarray
    w_down: np.ndarray
    window_left: int
    qkv_bias: np.ndarray | None = None
    o_bias: np.ndarray | None = None
    gate_up_bias: np.ndarray | None = None
    down_bias: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None

    def nbytes(self) -> int:
        """Bytes held by this layer's arrays."""
        return sum(a.nbytes for a in dataclasses.astuple(self) if isinstance(a, np.ndarray))


def load_layer(reader: CheckpointReader, cfg: ModelConfig, i: int) -> LayerWeights:
    """Read, check and fuse layer ``i`` of a checkpoint (ValueError names a missing tensor
    or a wrong shape)."""
    p = f"model.layers.{i}."
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    qd, kd = cfg.num_heads * d, cfg.num_kv_heads * d

    def get(name, shape):
        return reader.get(p + name, shape)

    attn = "self_attn."
    q, k, v = (get(attn + f"{n}_proj.weight", (w, h)) for n, w in (("q", qd), ("k", kd), ("v", kd)))
    w_qkv = np.concatenate([q, k, v])
    del q, k, v
    gate, up = get("mlp.gate_proj.weight", (inter, h)), get("mlp.up_proj.weight", (inter, h))
    w_gate_up = np.concatenate([gate, up])
    del gate, up
    layer = LayerWeights(
        input_norm=get("input_layernorm.weight", (h,)),
        post_norm=get("post_attention_layernorm.weight", (h,)),
        w_qkv=w_qkv,
        w_o=np.ascontiguousarray(get(attn + "o_proj.weight", (h, qd))),
        w_gate_up=w_gate_up,
        w_down=np.ascontiguousarray(get("mlp.down_proj.weight", (h, inter))),
        window_left=cfg.window_left(i))
    if cfg.attention_bias:
        layer.qkv_bias = np.concatenate([get(attn + "q_proj.bias", (qd,)),
                                         get(attn + "k_proj.bias", (kd,)),
                                         get(attn + "v_proj.bias", (kd,))])
    if cfg.o_proj_bias:
        layer.o_bias = get(attn + "o_proj.bias", (h,))
    if cfg.mlp_bias:
        layer.gate_up_bias = np.concatenate([get("mlp.gate_proj.bias", (inter,)),
                                             get("mlp.up_proj.bias", (inter,))])
        layer.down_bias = get("mlp.down_proj.bias", (h,))
    if cfg.qk_norm:
        layer.q_norm = get(attn + "q_norm.weight", (d,))
        layer.k_norm = get(attn + "k_norm.weight", (d,))
    return layer
