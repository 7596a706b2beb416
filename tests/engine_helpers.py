"""A tiny stand-in for ``pagedcy.models.CausalLM`` (interfaces.md section 2) for fast
engine tests: a real paged-attention network (embeddings + positions, attention layers
that write K/V into the step's slots and read them back through the block tables), so
any mistake in the engine's page handling changes the logits."""
import dataclasses

import numpy as np

from pagedcy import PagedKVCacheConfig
from pagedcy._libs._attention import batch_paged_attention


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    vocab_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 2
    head_dim: int = 8
    max_position_embeddings: int = 512
    eos_token_ids: tuple = ()
    architecture: str = "ToyForCausalLM"


class ToyModel:
    """``forward(kv_pages, token_ids, slots) -> float32 [B, vocab]`` like CausalLM."""

    def __init__(self, seed=0, **config):
        self.config = c = ToyConfig(**config)
        rng = np.random.default_rng(seed)
        d = c.num_kv_heads * c.head_dim
        self.emb = rng.standard_normal((c.vocab_size, d)).astype(np.float32)
        self.pe = rng.standard_normal((c.max_position_embeddings, d)).astype(np.float32) * 0.5
        self.wq = rng.standard_normal((c.num_layers, d, d)).astype(np.float32) / np.sqrt(d)
        self.wk = rng.standard_normal((c.num_layers, d, d)).astype(np.float32) / np.sqrt(d)
        self.wv = rng.standard_normal((c.num_layers, d, d)).astype(np.float32) / np.sqrt(d)
        # large output weights: logits far apart, so greedy choices are never near-ties
        self.wout = rng.standard_normal((d, c.vocab_size)).astype(np.float32) * 4
        self.calls = 0

    def kv_cache_config(self, max_pages, page_size=16, dtype="float32"):
        c = self.config
        return PagedKVCacheConfig(page_size, max_pages, c.num_layers, c.num_kv_heads,
                                  c.head_dim, dtype=dtype)

    def forward(self, kv_pages, token_ids, slots):
        c = self.config
        self.calls += 1
        n = token_ids.shape[0]
        assert slots.positions.shape == (n,)
        x = self.emb[token_ids] + self.pe[slots.positions]
        for layer in range(c.num_layers):
            k = (x @ self.wk[layer]).reshape(n, c.num_kv_heads, c.head_dim)
            v = (x @ self.wv[layer]).reshape(n, c.num_kv_heads, c.head_dim)
            kv_pages[slots.slot_pages, layer, 0, slots.slot_offsets] = k
            kv_pages[slots.slot_pages, layer, 1, slots.slot_offsets] = v
            q = (x @ self.wq[layer]).reshape(n, c.num_heads, c.head_dim)
            o = batch_paged_attention(q, slots.qo_indptr, kv_pages, layer, slots.block_tables,
                                      slots.kv_lens, num_threads=1)
            x = x + o.reshape(n, -1)
        return np.ascontiguousarray(x[slots.qo_indptr[1:] - 1] @ self.wout, dtype=np.float32)

    def reference_greedy(self, prompt, max_tokens):
        """Greedy tokens of ``prompt`` alone, recomputing the whole sequence each step
        without any cache (plain NumPy attention)."""
        return self.reference(prompt, max_tokens)[0]

    def reference(self, prompt, max_tokens, tokens=None):
        """(greedy tokens, float64 logits of each step) of ``prompt`` alone; with
        ``tokens``, those are fed instead of the greedy choices (teacher forcing)."""
        c = self.config
        toks = list(prompt)
        out, logits = [], []
        for i in range(max_tokens):
            n = len(toks)
            x = self.emb[toks] + self.pe[:n]
            for layer in range(c.num_layers):
                k = (x @ self.wk[layer]).reshape(n, c.num_kv_heads, c.head_dim)
                v = (x @ self.wv[layer]).reshape(n, c.num_kv_heads, c.head_dim)
                q = (x @ self.wq[layer]).reshape(n, c.num_heads, c.head_dim)
                s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(c.head_dim)
                s = s + np.triu(np.full((n, n), -np.inf), 1)
                p = np.exp(s - s.max(-1, keepdims=True))
                p /= p.sum(-1, keepdims=True)
                x = x + np.einsum("hqk,khd->qhd", p, v).reshape(n, -1)
            lg = x[-1].astype(np.float64) @ self.wout
            logits.append(lg)
            t = int(np.argmax(lg)) if tokens is None else int(tokens[i])
            out.append(t)
            toks.append(t)
        return out, logits


def complete(eng, prompt, params):
    """Token ids of each completion of one request run to the end on the idle engine
    ``eng``."""
    eng.add_request("x", prompt, params)
    out = None
    while eng.has_unfinished_requests():
        for o in eng.step():
            out = o
    return [c.token_ids for c in out.outputs]


def run_alone(model, prompt, params, memo):
    """Token ids of each completion of one request run alone on a roomy engine over
    ``model`` (page_size 4), memoised in the dict ``memo``."""
    from pagedcy.engine import LLMEngine
    key = (tuple(prompt), params)
    if key not in memo:
        memo[key] = complete(LLMEngine.from_model(model, page_size=4, kv_cache_pages=64),
                             prompt, params)
    return memo[key]
