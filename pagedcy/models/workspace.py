"""Activation buffers of the forward pass, sized for the largest batch seen and reused."""
from __future__ import annotations

import numpy as np

from pagedcy.models.config import ModelConfig
from pagedcy.models.linear import aligned_empty

__all__ = ["Workspace"]


class Workspace:
    """Float32 C-contiguous activation buffers for up to ``capacity`` token rows.

    ``rows(n)`` returns views of the first ``n`` rows of each buffer (contiguous, so BLAS
    and the kernels write straight into them); the buffers grow (to the next power of two)
    when a larger batch comes, and never shrink.
    """

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.capacity = 0
        self.seq_capacity = 0
        self._grow(16)
        self._grow_seqs(16)

    def _grow(self, n: int) -> None:
        c = self.cfg
        h, d = c.hidden_size, c.head_dim
        qkv = (c.num_heads + 2 * c.num_kv_heads) * d
        z = lambda *shape: aligned_empty(shape)  # noqa: E731  (64-byte rows for the GEMM)
        self.residual, self.normed, self.delta = z(n, h), z(n, h), z(n, h)
        self.qkv, self.q, self.attn = z(n, qkv), z(n, c.num_heads, d), z(n, c.num_heads, d)
        self.k, self.v = z(n, c.num_kv_heads * d), z(n, c.num_kv_heads * d)
        self.gate_up, self.act = z(n, 2 * c.intermediate_size), z(n, c.intermediate_size)
        self.capacity = n

    def _grow_seqs(self, b: int) -> None:
        c = self.cfg
        self.last = aligned_empty((b, c.hidden_size))
        self.last_normed = aligned_empty((b, c.hidden_size))
        self.logits = aligned_empty((b, c.vocab_size))
        self.seq_capacity = b

    def ensure(self, n: int, b: int) -> None:
        """Make room for ``n`` token rows and ``b`` sequences."""
        if n > self.capacity:
            self._grow(1 << (n - 1).bit_length())
        if b > self.seq_capacity:
            self._grow_seqs(1 << (b - 1).bit_length())

    def nbytes(self) -> int:
        """Bytes held by the buffers now."""
        return sum(a.nbytes for a in vars(self).values() if isinstance(a, np.ndarray))
