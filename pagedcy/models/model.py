"""CausalLM: the decoder-only forward pass over a flat varlen batch on the paged KV cache."""
from __future__ import annotations

from typing import Any

import numpy as np

from pagedcy.config import PagedKVCacheConfig
from pagedcy._validate import int32_array
from pagedcy._libs._attention import AttentionBatch
from pagedcy._libs._layers import gelu_tanh_mul, qkv_rope, rms_norm, silu_mul
from pagedcy._libs._manager_ops import write_token_rows
from pagedcy._libs._slots import check_step_layout, check_step_pages
from pagedcy._libs._team import run_in_team
from pagedcy._libs._threads import resolve_num_threads
from pagedcy.models.config import ModelConfig
from pagedcy.models.layers import LayerWeights
from pagedcy.models.linear import DenseWeight, HalfWeight, Weight
from pagedcy.models.pages import PagesAdapter
from pagedcy.models.rope import RopeTable
from pagedcy.models.weights import bf16_bits_to_f32, to_bf16_bits
from pagedcy.models.workspace import Workspace

__all__ = ["CausalLM"]

# Positions past this are refused rather than growing the RoPE tables without bound.
MAX_POSITION = 1 << 24
#: Steps of at most this many tokens run on a step team (``CausalLM.forward``): their
#: elementwise kernels stay on one thread (below ``_layers.PARALLEL_ELEMENTS``), so every
#: parallel call in them is one that posts to the team
TEAM_MAX_TOKENS = 16
_SLOT_FIELDS = ("positions", "slot_pages", "slot_offsets", "qo_indptr", "kv_lens", "block_tables")


#: ``AttentionBatch.run`` as a module-level name (``engine_profile`` times it here)
run_attention = AttentionBatch.run


def linear(x: np.ndarray, weight: Weight, out: np.ndarray, num_threads: int) -> np.ndarray:
    """``out = x @ weight.T`` (``x`` float32 ``[M, K]``, ``out`` float32 ``[M, N]``) in the
    weight's format: every projection of the forward pass goes through here (one name for
    the step profiler to time)."""
    return weight.linear(x, out, num_threads)


def _as_weight(w) -> Weight:
    return w if isinstance(w, Weight) else DenseWeight(w)


def embed_multiplier(scale: float, table: Weight) -> np.float32:
    """The embedding multiplier ``scale`` rounded to the table's dtype first, as transformers
    does for Gemma (``torch.tensor(hidden ** 0.5, dtype=embed dtype)``: sqrt(1152) = 33.94 is
    34.0 in bfloat16), so a 16-bit table matches transformers run in that dtype and a float32
    one matches transformers in float32. Block formats take it unrounded (as llama.cpp)."""
    s = np.float32(scale)       # torch.tensor(float) is float32, then .to(the table's dtype)
    if isinstance(table, HalfWeight) and table.format == "bfloat16":
        return bf16_bits_to_f32(to_bf16_bits(np.array([s])))[0]
    if isinstance(table, HalfWeight):
        return np.float32(np.float16(s))
    return s


class CausalLM:
    """A loaded checkpoint: ``config`` (ModelConfig), weights, and ``forward``.

    Build with :func:`pagedcy.models.load_model`. Matrices are :class:`Weight` objects in the
    format the load options chose (float32 ndarrays are taken as float32 weights); compute is
    float32. ``weight_bytes`` is the RAM its weights take as held (tied embeddings stored once).
    ``quantize_query``: over int8 K/V pages, decode attention rounds each query to int8 and
    scores with integer dot products (``batch_paged_attention``'s option, and its stated
    bound), as llama.cpp does over a quantized cache; the loaders set it for
    ``activation_dtype="auto"``. No effect on float pages.
    """

    def __init__(self, config: ModelConfig, embed, layers: list[LayerWeights],
                 final_norm: np.ndarray, lm_head, *, num_threads=None, quantize_query=False):
        self.config = config
        self.quantize_query = bool(quantize_query)
        # embed [vocab, hidden]; None when tied: rows are then gathered from lm_head.
        self._embed = None if embed is None else _as_weight(embed)
        self._layers = layers
        self._final_norm = final_norm
        self._lm_head = _as_weight(lm_head)  # [vocab, hidden]
        table = self._embed if self._embed is not None else self._lm_head
        self._embed_scale = None if config.embed_scale is None else \
            embed_multiplier(config.embed_scale, table)
        self._nt = resolve_num_threads(num_threads)
        # one RoPE table per distinct (theta, scaling): Gemma's sliding and global layers differ
        tables: dict[str, RopeTable] = {}
        for i in range(config.num_layers):
            key = repr(config.rope_params(i))
            if key not in tables:
                tables[key] = RopeTable(config, layer=i)
        self._layer_rope = [tables[repr(config.rope_params(i))] for i in range(config.num_layers)]
        self._ropes = list(tables.values())
        self._ws = Workspace(config)
        self._pages = PagesAdapter(config.num_layers, config.num_kv_heads, config.head_dim)
        held: list[Any] = [final_norm, self._lm_head] + ([self._embed] if self._embed is not None else [])
        self.weight_bytes = sum(a.nbytes for a in held) + sum(l.nbytes() for l in layers)

    @property
    def num_threads(self) -> int:
        """Threads the attention kernel and the row kernels use."""
        return self._nt

    def kv_cache_config(self, max_pages: int, page_size: int = 16,
                        dtype="float32") -> PagedKVCacheConfig:
        """The paged KV cache geometry this model writes and reads."""
        c = self.config
        return PagedKVCacheConfig(page_size=page_size, max_pages=max_pages, num_layers=c.num_layers,
                                  num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, dtype=dtype)

    def _check(self, token_ids, slots):
        """Validate one step's inputs; returns them as int32 C-contiguous arrays."""
        missing = [f for f in _SLOT_FIELDS if not hasattr(slots, f)]
        if missing:
            raise TypeError(f"slots must be a StepSlots (prepare_step's result); "
                            f"{type(slots).__name__} has no {', '.join(missing)}")
        ids = int32_array(token_ids, "token_ids", (-1,))
        n = ids.shape[0]
        if n == 0:
            raise ValueError("token_ids must not be empty")
        pos = int32_array(slots.positions, "positions", (n,))
        pages = int32_array(slots.slot_pages, "slot_pages", (n,))
        offs = int32_array(slots.slot_offsets, "slot_offsets", (n,))
        indptr = np.asarray(slots.qo_indptr)
        b = indptr.shape[0] - 1 if indptr.ndim == 1 else -1
        if b < 1:
            raise ValueError("qo_indptr must be 1-D with at least 2 entries")
        indptr = int32_array(indptr, "qo_indptr", (b + 1,))
        lens = int32_array(slots.kv_lens, "kv_lens", (b,))
        tables = int32_array(slots.block_tables, "block_tables", (b, -1))
        # ids in range; qo_indptr 0 .. n, >= 1 row each; kv_lens >= q_lens, < MAX_POSITION;
        # positions where the kernel places each sequence's new rows (RoPE must agree)
        check_step_layout(ids, pos, indptr, lens, self.config.vocab_size, MAX_POSITION)
        return ids, pos, pages, offs, indptr, lens, tables

    @staticmethod
    def _check_pages(kv_pages, pages, offs, lens, tables, pos, indptr):
        """Every slot and every block-table entry the kernel will read is a page of the pool,
        and each token's slot is where its sequence's block table puts its position (else
        its K/V would land in another sequence's page), checked before anything is written."""
        check_step_pages(pages, offs, lens, tables, pos, indptr, kv_pages.shape[0], kv_pages.shape[3])

    def _embed_rows(self, ids, out):
        table = self._embed if self._embed is not None else self._lm_head
        table.take_rows(ids, out)
        if self._embed_scale is not None:
            out *= self._embed_scale

    def forward(self, kv_pages, token_ids, slots) -> np.ndarray:
        """Run all layers on ``token_ids`` (int32 ``[N]``) laid out by ``slots`` (StepSlots:
        positions/slot_pages/slot_offsets ``[N]``, qo_indptr ``[B+1]``, block_tables
        ``[B, W]``, kv_lens ``[B]``), writing each token's K/V into its slot of ``kv_pages``
        (a store's ``pages()`` array for this model's geometry), and return float32
        ``[B, vocab_size]`` logits of each sequence's last row. The result is a reused
        buffer, valid until the next call. TypeError/ValueError/IndexError for bad input
        (nothing is written when the slots or token ids are invalid).

        A step of at most ``TEAM_MAX_TOKENS`` tokens (decode) runs with its threads held
        awake from the first kernel to the last (:func:`pagedcy._libs._team.run_in_team`):
        its sixty-odd short kernel calls then find the other threads spinning, not asleep.
        """
        if self._nt > 1 and 0 < len(token_ids) <= TEAM_MAX_TOKENS:
            return run_in_team(lambda: self._forward(kv_pages, token_ids, slots), self._nt)
        return self._forward(kv_pages, token_ids, slots)

    def _forward(self, kv_pages, token_ids, slots) -> np.ndarray:
        """``forward`` on the calling thread's team or none."""
        ids, pos, pages, offs, indptr, lens, tables = self._check(token_ids, slots)
        store = self._pages.store_for(kv_pages)
        self._check_pages(kv_pages, pages, offs, lens, tables, pos, indptr)
        n, b = ids.shape[0], lens.shape[0]
        c, ws, nt = self.config, self._ws, self._nt
        ws.ensure(n, b)
        top = int(pos.max())
        for table in self._ropes:
            table.ensure(top)
        eps, H, Hk = c.rms_norm_eps, c.num_heads, c.num_kv_heads
        scale, cap = c.query_scale, c.attn_logit_softcapping or 0.0
        int8_q = self.quantize_query
        act_mul = gelu_tanh_mul if c.hidden_act == "gelu_tanh" else silu_mul
        resid, normed, delta = ws.residual[:n], ws.normed[:n], ws.delta[:n]
        qkv, q, k, v = ws.qkv[:n], ws.q[:n], ws.k[:n], ws.v[:n]
        attn, gate_up, act = ws.attn[:n], ws.gate_up[:n], ws.act[:n]
        attn2d = attn.reshape(n, -1)
        # the ragged layout checked once for every layer (_check_pages checked its pages)
        batch = AttentionBatch(indptr, tables, lens, page_size=kv_pages.shape[3],
                               max_pages=kv_pages.shape[0])
        self._embed_rows(ids, resid)
        for li, lw in enumerate(self._layers):
            if li == 0:
                rms_norm(resid, lw.input_norm, eps, normed, None, nt)
            else:
                rms_norm(delta, lw.input_norm, eps, normed, resid, nt)
            linear(normed, lw.w_qkv, qkv, nt)
            rope = self._layer_rope[li]
            qkv_rope(qkv, pos, rope.cos, rope.sin, q, k, v, H, Hk, lw.qkv_bias, lw.q_norm,
                     lw.k_norm, eps, nt)
            write_token_rows(store, pages, offs, li, k, v)
            run_attention(batch, q, kv_pages, li, scale=scale, window_left=lw.window_left,
                          soft_cap=cap, out=attn, num_threads=nt, quantize_query=int8_q)
            linear(attn2d, lw.w_o, delta, nt)
            if lw.o_bias is not None:
                delta += lw.o_bias
            if lw.attn_out_norm is not None:      # sandwich norm (Gemma), before the residual add
                rms_norm(delta, lw.attn_out_norm, eps, delta, None, nt)
            rms_norm(delta, lw.post_norm, eps, normed, resid, nt)
            linear(normed, lw.w_gate_up, gate_up, nt)
            if lw.gate_up_bias is not None:
                gate_up += lw.gate_up_bias
            act_mul(gate_up, act, nt)
            linear(act, lw.w_down, delta, nt)
            if lw.down_bias is not None:
                delta += lw.down_bias
            if lw.mlp_out_norm is not None:
                rms_norm(delta, lw.mlp_out_norm, eps, delta, None, nt)
        hn, logits = ws.last_normed[:b], ws.logits[:b]
        if n == b:
            # one row per sequence (a decode step): every row is a last row. No gathers:
            # right after the weights have streamed, each NumPy call costs ~10 us cold.
            last, dlast = resid, delta
        else:
            last_rows = indptr[1:] - 1
            last = ws.last[:b]
            np.take(resid, last_rows, axis=0, out=last)
            dlast = np.take(delta, last_rows, axis=0)
        rms_norm(dlast, self._final_norm, eps, hn, last, nt)
        linear(hn, self._lm_head, logits, nt)
        if c.final_logit_softcapping is not None:
            cap = float(np.float32(c.final_logit_softcapping))
            np.tanh(logits / cap, out=logits)
            logits *= cap
        return logits
