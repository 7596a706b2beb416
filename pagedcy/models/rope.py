"""Rotary position embedding tables (cos/sin per position), as transformers computes them."""
from __future__ import annotations

import math

import numpy as np

from pagedcy.models.config import ModelConfig

__all__ = ["RopeTable", "inv_freq"]


def inv_freq(config: ModelConfig, layer: int | None = None) -> np.ndarray:
    """Inverse frequencies float32 ``[head_dim / 2]``: plain RoPE from ``rope_theta``, then
    the ``linear`` or ``llama3`` scaling when configured; for ``layer``, that layer's theta
    and scaling (``ModelConfig.rope_params``: Gemma 3's sliding layers differ). Float32
    throughout, as transformers does, so the angles round the same way."""
    if layer is None:
        theta, sc = config.rope_theta, config.rope_scaling
    else:
        theta, sc = config.rope_params(layer)
    d = config.head_dim
    exps = np.arange(0, d, 2, dtype=np.float32) / np.float32(d)
    inv = (np.float32(1.0) / (np.float32(theta) ** exps)).astype(np.float32)
    if sc is None:
        return inv
    if sc["rope_type"] == "linear":
        return (inv / np.float32(sc["factor"])).astype(np.float32)
    factor = float(sc["factor"])
    low, high = float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
    old_ctx = float(sc["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = (np.float32(2 * math.pi) / inv).astype(np.float32)
    scaled = np.where(wavelen > low_wavelen, inv / np.float32(factor), inv).astype(np.float32)
    smooth = ((np.float32(old_ctx) / wavelen - np.float32(low)) / np.float32(high - low)).astype(np.float32)
    smoothed = ((1 - smooth) * scaled / np.float32(factor) + smooth * scaled).astype(np.float32)
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


class RopeTable:
    """cos/sin tables float32 ``[P, head_dim / 2]`` for positions ``0 .. P-1``, grown on demand
    (doubling) so a model with a 128k context does not allocate them all up front. With
    ``layer``, the table of that layer's RoPE parameters."""

    def __init__(self, config: ModelConfig, initial: int = 256, layer: int | None = None):
        self._inv = inv_freq(config, layer)
        self.cos = self.sin = np.empty((0, self._inv.shape[0]), np.float32)
        self._grow(initial)

    def _grow(self, n: int) -> None:
        pos = np.arange(n, dtype=np.float32)
        freqs = pos[:, None] * self._inv[None, :]  # float32 products, like transformers
        self.cos = np.ascontiguousarray(np.cos(freqs), dtype=np.float32)
        self.sin = np.ascontiguousarray(np.sin(freqs), dtype=np.float32)

    def ensure(self, max_position: int) -> None:
        """Make the tables cover ``max_position`` (inclusive)."""
        if max_position >= self.cos.shape[0]:
            n = self.cos.shape[0] or 1
            while n <= max_position:
                n *= 2
            self._grow(n)
