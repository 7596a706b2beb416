"""write_random_checkpoint (read back by transformers), load errors, and forward's input checks."""
import json
import os
import shutil
import types

import numpy as np
import pytest

pytest.importorskip("safetensors")

from model_helpers import SlotAllocator, assert_close, hf_logits  # noqa: E402

from pagedcy.models import (SUPPORTED_ARCHITECTURES, load_model,  # noqa: E402
                            write_random_checkpoint)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("rand"), seed=3)


@pytest.mark.parametrize("arch, extra", [
    ("LlamaForCausalLM", dict(tie_word_embeddings=True)),
    ("Qwen2ForCausalLM", {}),
    ("Qwen3ForCausalLM", dict(head_dim=16)),
    ("MistralForCausalLM", dict(sliding_window=6)),
    ("LlamaForCausalLM", dict(attention_bias=True, mlp_bias=True)),
    ("LlamaForCausalLM", dict(rope_theta=300.0, rope_scaling={  # the pre-5.0 config keys
        "type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16})),
])
def test_random_checkpoint_matches_transformers(tmp_path, arch, extra):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = write_random_checkpoint(tmp_path, arch, seed=1, tokenizer=False, **extra)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    model = load_model(path)
    assert model.weight_bytes == 4 * sum(p.numel() for p in ref.parameters())
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, model.config.vocab_size, n) for n in (9, 14)]
    alloc = SlotAllocator(model, max_pages=16, page_size=4, seed=2)
    got = model.forward(alloc.store.pages(), np.concatenate(prompts).astype(np.int32),
                        alloc.step([0, 1], [9, 14]))
    want = np.stack([hf_logits(ref, p)[-1] for p in prompts])
    assert_close(got, want)
    # Logits spread by several units: greedy picks are far from ties at 1e-4 error.
    top2 = np.sort(got, axis=1)[:, -2:]
    assert got.std() > 1.0 and np.all(top2[:, 1] - top2[:, 0] > 1e-3)


def test_benchmark_shape_greedy_margins(tmp_path):
    """The benchmark geometry (scaled down in layers): greedy margins are wide."""
    path = write_random_checkpoint(tmp_path, hidden_size=512, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=2,
                                   intermediate_size=1408, vocab_size=32000, tokenizer=False)
    model = load_model(path)
    rng = np.random.default_rng(0)
    alloc = SlotAllocator(model, max_pages=64, page_size=16, seed=0)
    seqs = list(range(8))
    logits = model.forward(alloc.store.pages(), rng.integers(0, 32000, 8 * 20).astype(np.int32),
                           alloc.step(seqs, [20] * 8))
    top2 = np.sort(logits, axis=1)[:, -2:]
    assert np.median(top2[:, 1] - top2[:, 0]) > 0.05


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_random_checkpoint_dtypes(tmp_path, dtype):
    from safetensors import safe_open

    path = write_random_checkpoint(tmp_path, dtype=dtype, seed=5, tokenizer=False)
    with safe_open(os.path.join(path, "model.safetensors"), framework="numpy") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {
            "float16": {"F16"}, "bfloat16": {"BF16"}}[dtype]
    f32 = load_model(write_random_checkpoint(tmp_path / "f32", seed=5, tokenizer=False))
    half = load_model(path)
    alloc = [SlotAllocator(m, 8, 4) for m in (f32, half)]
    ids = np.arange(7, dtype=np.int32)
    out = [m.forward(a.store.pages(), ids, a.step([0], [7])).copy() for m, a in zip((f32, half), alloc)]
    assert_close(out[1], out[0], rtol=0.05)
    assert np.abs(out[1] - out[0]).max() > 0  # really rounded


def test_tokenizer_loads_in_transformers_and_tokenizers(ckpt):
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    cfg = load_model(ckpt).config
    assert len(tok) == cfg.vocab_size
    assert tok.bos_token == "<s>" and tok.eos_token == "</s>"
    assert tok.convert_tokens_to_ids("</s>") in cfg.eos_token_ids
    assert tok.convert_tokens_to_ids("<s>") == cfg.bos_token_id
    text = "Hello, the quick brown fox! héllo 😀"
    ids = tok.encode(text, add_special_tokens=False)
    assert max(ids) < cfg.vocab_size and tok.decode(ids) == text
    assert len(ids) < len(text.encode())  # merges were learned
    raw = Tokenizer.from_file(os.path.join(ckpt, "tokenizer.json"))
    assert raw.encode(text).ids == ids and raw.get_vocab_size() == cfg.vocab_size
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert chat == "<s><|user|>\nhi</s>\n<|assistant|>\n"
    assert tok.decode([cfg.vocab_size - 1])  # every model id decodes


def test_vocab_raised_to_fit_tokenizer(tmp_path):
    path = write_random_checkpoint(tmp_path, vocab_size=100)
    assert load_model(path).config.vocab_size >= 256


def test_write_random_checkpoint_bad_args(tmp_path):
    with pytest.raises(ValueError, match="GPT2"):
        write_random_checkpoint(tmp_path / "a", "GPT2LMHeadModel")
    with pytest.raises(ValueError, match="dtype"):
        write_random_checkpoint(tmp_path / "b", dtype="int8")
    with pytest.raises(ValueError, match="hidden_size"):
        write_random_checkpoint(tmp_path / "c", hidden_size=0)
    assert not os.path.exists(tmp_path / "c")


# -- load errors -----------------------------------------------------------------------

def _copy(ckpt, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(ckpt, dst)
    return dst


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_missing_files(ckpt, tmp_path):
    with pytest.raises(FileNotFoundError):
        load_model(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(tmp_path)
    p = _copy(ckpt, tmp_path)
    os.remove(p / "model.safetensors")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_model(p)


def test_unsupported_architecture_and_rope(ckpt, tmp_path):
    p = _copy(ckpt, tmp_path)
    _edit_config(p, architectures=["GPT2LMHeadModel"])
    with pytest.raises(ValueError) as e:
        load_model(p)
    assert "GPT2LMHeadModel" in str(e.value)
    assert all(a in str(e.value) for a in SUPPORTED_ARCHITECTURES)
    _edit_config(p, architectures=["LlamaForCausalLM"], rope_scaling={"type": "yarn", "factor": 4.0})
    with pytest.raises(ValueError, match="yarn.*llama3"):
        load_model(p)
    _edit_config(p, rope_scaling={"rope_type": "llama3", "factor": 8.0})
    with pytest.raises(ValueError, match="low_freq_factor"):
        load_model(p)
    (p / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="JSON"):
        load_model(p)


_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 16}


@pytest.mark.parametrize("changes, word", [
    (dict(tie_word_embeddings="false"), "tie_word_embeddings"),   # bool("false") is True
    (dict(attention_bias="yes"), "attention_bias"),
    (dict(rms_norm_eps=-1.0), "rms_norm_eps"),
    (dict(rms_norm_eps="1e-6"), "rms_norm_eps"),
    (dict(rope_theta=0), "rope_theta"),
    (dict(rope_theta=float("nan")), "rope_theta"),
    (dict(num_hidden_layers=10**12), "num_hidden_layers"),        # before any per-layer table
    (dict(eos_token_id="x"), "eos_token_id"),
    (dict(eos_token_id=[1, -2]), "eos_token_id"),
    (dict(bos_token_id=1.5), "bos_token_id"),
    (dict(rope_scaling=dict(_LLAMA3, low_freq_factor=0)), "low_freq_factor"),
    (dict(rope_scaling=dict(_LLAMA3, factor=-8)), "factor"),
    (dict(rope_scaling=dict(_LLAMA3, high_freq_factor=1.0)), "high_freq_factor"),
])
def test_config_values_are_checked(ckpt, tmp_path, changes, word):
    p = _copy(ckpt, tmp_path)
    if word.endswith("token_id"):          # generation_config.json's win over config.json's
        gen = json.loads((p / "generation_config.json").read_text())
        (p / "generation_config.json").write_text(json.dumps(dict(gen, **changes)))
    else:
        _edit_config(p, **changes)
    with pytest.raises(ValueError, match=word):
        load_model(p)


def test_sliding_layer_fields_are_checked():
    from pagedcy.models import ModelConfig
    base = dict(architectures=["Qwen2ForCausalLM"], hidden_size=32, num_attention_heads=4,
                num_hidden_layers=2, vocab_size=64, intermediate_size=64, use_sliding_window=True,
                sliding_window=8)
    cfg = ModelConfig.from_dict(dict(base, layer_types=["full_attention", "sliding_attention"]))
    assert cfg.sliding_layers == (False, True)
    for bad in (dict(layer_types=["full_attention", "bogus"]), dict(layer_types=5),
                dict(max_window_layers="x"), dict(use_sliding_window="true")):
        with pytest.raises(ValueError):
            ModelConfig.from_dict(dict(base, **bad))


@pytest.mark.parametrize("name", ["config.json", "generation_config.json"])
def test_json_nested_past_the_parser_is_value_error(ckpt, tmp_path, name):
    p = _copy(ckpt, tmp_path)
    (p / name).write_text("[" * 100_000)
    with pytest.raises(ValueError, match="JSON"):
        load_model(p)


def _resave(path, drop=None, reshape=None):
    from safetensors.numpy import load_file, save_file

    file = os.path.join(path, "model.safetensors")
    t = load_file(file)
    if drop:
        del t[drop]
    if reshape:
        t[reshape] = t[reshape][:-1]
    save_file(t, file)


@pytest.mark.parametrize("how", ["drop", "reshape"])
def test_missing_or_misshaped_tensor(ckpt, tmp_path, how):
    p = _copy(ckpt, tmp_path)
    name = "model.layers.1.self_attn.k_proj.weight"
    _resave(p, **{how: name})
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        load_model(p)


@pytest.mark.parametrize("cut", [10, 1000, -100])
def test_corrupt_safetensors(ckpt, tmp_path, cut):
    p = _copy(ckpt, tmp_path)
    f = p / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:cut] if cut > 0 else data[:cut])
    with pytest.raises(ValueError, match="safetensors|tensor"):
        load_model(p)


def test_garbage_safetensors(ckpt, tmp_path):
    p = _copy(ckpt, tmp_path)
    (p / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match="corrupt"):
        load_model(p)


def test_sharded_index_errors(ckpt, tmp_path):
    p = _copy(ckpt, tmp_path)
    os.rename(p / "model.safetensors", p / "model-00001-of-00001.safetensors")
    (p / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(FileNotFoundError, match="00002"):
        load_model(p)
    (p / "model.safetensors.index.json").write_text("[]")
    with pytest.raises(ValueError, match="index"):
        load_model(p)
    # a shard that exists but lacks the tensor the index sends there
    from safetensors.numpy import load_file, save_file
    names = list(load_file(p / "model-00001-of-00001.safetensors"))
    save_file({"unused": np.zeros(1, np.float32)}, p / "model-00002-of-00002.safetensors")
    weight_map = {n: "model-00001-of-00001.safetensors" for n in names}
    weight_map["model.norm.weight"] = "model-00002-of-00002.safetensors"
    (p / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ValueError, match="model.norm.weight"):
        load_model(p)


# -- forward input checks --------------------------------------------------------------

def test_forward_bad_input_writes_nothing(ckpt):
    model = load_model(ckpt)
    alloc = SlotAllocator(model, 8, 4)
    pages = alloc.store.pages()
    slots = alloc.step([0], [5])
    ids = np.arange(5, dtype=np.int32)
    good = vars(slots)

    def bad(**kw):
        return types.SimpleNamespace(**dict(good, **kw))

    cases = [
        (ids.astype(np.float32), slots, TypeError),
        (np.array([0, 1, 2, 3, 10**6], np.int32), slots, ValueError),
        (ids[:4], slots, ValueError),
        (ids, bad(qo_indptr=np.array([0, 4], np.int32)), ValueError),
        (ids, bad(qo_indptr=np.array([1, 5], np.int32)), ValueError),
        (ids, bad(kv_lens=np.array([6], np.int32)), ValueError),
        (ids, bad(positions=np.arange(1, 6, dtype=np.int32)), ValueError),
        (ids, bad(slot_pages=np.full(5, 99, np.int32)), IndexError),
        (ids, bad(slot_offsets=np.full(5, 4, np.int32)), IndexError),
        (ids, bad(block_tables=np.zeros(3, np.int32)), ValueError),
        (ids.reshape(1, 5), slots, ValueError),
        (ids, bad(positions=np.array([0, 1, 2, 4, 4], np.int32)), ValueError),
        (ids, bad(qo_indptr=np.array([0, 2, 5], np.int32), kv_lens=np.array([1, 3], np.int32),
                  block_tables=np.zeros((2, 1), np.int32)), ValueError),
        (ids, bad(block_tables=good["block_tables"][:, :1]), ValueError),
        (ids, bad(block_tables=good["block_tables"] + 100), IndexError),
        # slots in the pool but not where the block table puts the positions: another
        # sequence's page (this used to write there)
        (ids, bad(slot_pages=np.full(5, 7, np.int32)), ValueError),
        (ids, bad(slot_offsets=(good["slot_offsets"] + 1) % 4), ValueError),
        (ids, None, TypeError),
        (ids, types.SimpleNamespace(positions=good["positions"]), TypeError),
    ]
    for tok, sl, exc in cases:
        with pytest.raises(exc):
            model.forward(pages, tok, sl)
        assert not pages.any()
    with pytest.raises(ValueError, match="kv_pages"):
        model.forward(np.zeros((8, 2, 2, 4, 3, 32), np.float32), ids, slots)
    with pytest.raises(TypeError):
        model.forward(pages.astype(np.float64), ids, slots)
    with pytest.raises(TypeError):
        model.forward(pages.tolist(), ids, slots)
    out = model.forward(pages, ids, slots)  # still works after the errors
    assert out.shape == (1, model.config.vocab_size) and np.isfinite(out).all()


def test_forward_reuses_buffers_and_grows(ckpt):
    model = load_model(ckpt)
    alloc = SlotAllocator(model, 200, 4)
    small = model.forward(alloc.store.pages(), np.arange(3, dtype=np.int32), alloc.step([0], [3]))
    first = small.copy()
    ids = np.arange(300, dtype=np.int32) % model.config.vocab_size
    big = model.forward(alloc.store.pages(), ids, alloc.step(list(range(1, 31)), [10] * 30))
    assert big.shape == (30, model.config.vocab_size)
    fresh = SlotAllocator(model, 8, 4)
    again = model.forward(fresh.store.pages(), np.arange(3, dtype=np.int32), fresh.step([0], [3]))
    np.testing.assert_array_equal(again, first)


def test_profile_accounts_for_every_part(ckpt, capsys):
    """The forward profiler's parts add up to the instrumented time and restore the module."""
    from pagedcy.models import model as model_mod
    from pagedcy.tools import profile_model as profile

    model = load_model(ckpt)
    saved = model_mod.run_attention
    parts = profile.profile(model, "tiny", batch=2, q_len=3, ctx=9, reps=1, page_size=4)
    assert model_mod.run_attention is saved and model_mod.np is np
    named = ("gemm", "attention", "elementwise", "rest")
    assert set(named) <= set(parts)
    assert abs(sum(parts[k] for k in named) - parts["total"]) < 1e-9
    assert parts["gemm"] > 0 and parts["attention"] > 0
    assert "GFLOP/s" in capsys.readouterr().out
