"""Helpers for the model tests: paged slots from a permuted page order, and transformers
references on the same checkpoints."""
from __future__ import annotations

import types

import numpy as np

import pagedcy as pc


class SlotAllocator:
    """Hands out pages from a random permutation and builds StepSlots-like objects for a
    flat varlen batch, as the manager's step API would."""

    def __init__(self, model, max_pages=64, page_size=4, seed=0, dtype="float32"):
        self.store = pc.KVPageStore(model.kv_cache_config(max_pages, page_size, dtype))
        self.page_size = page_size
        self.free = [int(p) for p in np.random.default_rng(seed).permutation(max_pages)]
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    def step(self, seqs, q_lens):
        """Extend each sequence in ``seqs`` by its q_len tokens; return the slots."""
        pos, pages, offs, indptr, kv_lens = [], [], [], [0], []
        for s, q in zip(seqs, q_lens):
            table = self.tables.setdefault(s, [])
            start = self.lens.get(s, 0)
            end = start + q
            while len(table) * self.page_size < end:
                table.append(self.free.pop())
            for p in range(start, end):
                pos.append(p)
                pages.append(table[p // self.page_size])
                offs.append(p % self.page_size)
            self.lens[s] = end
            indptr.append(indptr[-1] + q)
            kv_lens.append(end)
        width = max(len(self.tables[s]) for s in seqs)
        bt = np.zeros((len(seqs), width), np.int32)
        for b, s in enumerate(seqs):
            bt[b, :len(self.tables[s])] = self.tables[s]
        i32 = lambda x: np.asarray(x, dtype=np.int32)  # noqa: E731
        return types.SimpleNamespace(positions=i32(pos), slot_pages=i32(pages),
                                     slot_offsets=i32(offs), qo_indptr=i32(indptr),
                                     block_tables=bt, kv_lens=i32(kv_lens))


def hf_logits(hf_model, ids):
    """transformers' float32 logits [len(ids), vocab] for one sequence."""
    import torch

    with torch.no_grad():
        return hf_model(input_ids=torch.tensor([list(ids)])).logits[0].float().numpy()


def randomize(hf_model, seed=0, std=0.15):
    """Re-draw a transformers model's weights with a large spread (its 0.02 init makes
    near-uniform logits; zero biases and unit norms would hide layout bugs)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(std * torch.randn(p.shape, generator=g))
    return hf_model


def assert_close(got, want, rtol=1e-4):
    """max |got - want| <= rtol * max |want|."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    err = np.abs(got - want).max()
    assert err <= rtol * np.abs(want).max(), f"max abs err {err:.3g} vs scale {np.abs(want).max():.3g}"


def run_and_compare(model, ref, prompts, decode_steps=3, seed=1):
    """Prefill all prompts in one forward, then decode_steps batched teacher-forced steps;
    every step's logits match transformers' on the full sequences."""
    rng = np.random.default_rng(seed)
    V = model.config.vocab_size
    seqs = [list(p) + list(rng.integers(0, V, decode_steps)) for p in prompts]
    want = [hf_logits(ref, s) for s in seqs]
    alloc = SlotAllocator(model, max_pages=96, page_size=4, seed=seed)
    ids = np.concatenate([np.asarray(p, np.int32) for p in prompts])
    slots = alloc.step(range(len(prompts)), [len(p) for p in prompts])
    got = model.forward(alloc.store.pages(), ids, slots)
    assert got.shape == (len(prompts), V) and got.dtype == np.float32
    assert_close(got, np.stack([w[len(p) - 1] for w, p in zip(want, prompts)]))
    for t in range(decode_steps):
        ids = np.asarray([s[len(p) + t] for s, p in zip(seqs, prompts)], np.int32)
        slots = alloc.step(range(len(prompts)), [1] * len(prompts))
        got = model.forward(alloc.store.pages(), ids, slots)
        assert_close(got, np.stack([w[len(p) + t] for w, p in zip(want, prompts)]))
