"""CausalLM.forward driven by the manager's step API (prepare_step / commit_step): prefix-cache
hits, copy-on-write forks and decode steps give transformers' logits."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import pagedcy as pc  # noqa: E402
from model_helpers import assert_close, hf_logits  # noqa: E402

from pagedcy.models import load_model, write_random_checkpoint  # noqa: E402

if not hasattr(pc.PagedKVCacheManager, "prepare_step"):  # the step API lands with manager-split
    pytest.skip("PagedKVCacheManager has no step API in this tree", allow_module_level=True)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = write_random_checkpoint(tmp_path_factory.mktemp("step"), "Qwen2ForCausalLM", seed=4,
                                   tokenizer=False, vocab_size=300)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    return load_model(path), ref


def run(mgr, model, handles, q_lens, ids):
    slots = mgr.prepare_step(handles, q_lens)
    out = model.forward(mgr.store.pages(), np.asarray(ids, np.int32), slots).copy()
    mgr.commit_step(handles, q_lens)
    return out


def test_step_api_prefix_cache_fork_and_decode(setup):
    model, ref = setup
    mgr = pc.PagedKVCacheManager(model.kv_cache_config(64, page_size=4), enable_prefix_cache=True)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 300, 13)
    a = mgr.allocate(pc.AllocationRequest(prompt_tokens=prompt, request_id="a"))
    out = run(mgr, model, [a], [13], prompt)
    assert_close(out[0], hf_logits(ref, prompt)[-1])

    # b shares a's first 12 tokens through the prefix cache and prefills only the rest.
    prompt_b = np.concatenate([prompt[:12], rng.integers(0, 300, 5)])
    b = mgr.allocate(pc.AllocationRequest(prompt_tokens=prompt_b, request_id="b"))
    cached = b.num_cached_tokens()
    assert cached == 12
    c = mgr.fork(a, "c")  # shares every page of a, copy-on-write on the first write
    seq = {"a": list(prompt), "b": list(prompt_b), "c": list(prompt)}
    nxt = {"a": 7, "c": 9}
    for h in (a, c):
        mgr.extend(h, 1)
        seq[h.request_id].append(nxt[h.request_id])
    out = run(mgr, model, [b, a, c], [17 - cached, 1, 1],
              np.concatenate([prompt_b[cached:], [7, 9]]))
    for row, name in enumerate("bac"):
        assert_close(out[row], hf_logits(ref, seq[name])[-1])
    for step in range(3):
        toks = rng.integers(0, 300, 3)
        for h, t in zip((a, b, c), toks):
            mgr.extend(h, 1)
            seq[h.request_id].append(int(t))
        out = run(mgr, model, [a, b, c], [1, 1, 1], toks)
        for row, name in enumerate("abc"):
            assert_close(out[row], hf_logits(ref, seq[name])[-1])
