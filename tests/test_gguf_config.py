"""read_gguf on GGUF files written (as llama.cpp's converter writes them) from random HF
checkpoints: the config equals the checkpoint's, tensors come back under HF names and equal
the originals (exactly for F32/F16/BF16, as gguf.quants rounds them for Q*), llama's q/k row
permutation undone, Gemma 3 norms in the HF convention."""
import json
import os
from types import SimpleNamespace

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize, quantize                            # noqa: E402

from pagedcy.models import ModelConfig, write_random_checkpoint        # noqa: E402
from pagedcy.models.checkpoint import to_bf16_bits                      # noqa: E402
from pagedcy.models.gguf_config import generation_from_metadata        # noqa: E402
from pagedcy.models.gguf_model import read_gguf                         # noqa: E402
from pagedcy.models.rope import inv_freq                                # noqa: E402
from pagedcy.models.weights import bf16_bits_to_f32                     # noqa: E402
from pagedcy.tools.gguf_fixture import write_gguf                       # noqa: E402

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
CASES = {
    "llama": ("LlamaForCausalLM", {}),
    "llama_bias_tied": ("LlamaForCausalLM", dict(attention_bias=True, mlp_bias=True,
                                                 tie_word_embeddings=True)),
    "llama_llama3_rope": ("LlamaForCausalLM", dict(num_attention_heads=1, num_key_value_heads=1,
                                                   rope_theta=500000.0, rope_scaling=LLAMA3_ROPE,
                                                   max_position_embeddings=131072)),
    "llama_mha": ("LlamaForCausalLM", dict(num_key_value_heads=4)),
    "qwen2": ("Qwen2ForCausalLM", dict(rope_theta=1e6)),
    "qwen3": ("Qwen3ForCausalLM", dict(head_dim=64)),
    "qwen3_tied": ("Qwen3ForCausalLM", dict(tie_word_embeddings=True, rms_norm_eps=1e-5)),
}


def _hf(path):
    from safetensors.numpy import load_file

    return load_file(os.path.join(path, "model.safetensors"))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf_cfg")
    return {k: write_random_checkpoint(d / k, arch, **cfg) for k, (arch, cfg) in CASES.items()}


@pytest.mark.parametrize("case", list(CASES))
def test_config_and_f32_tensors_equal_the_checkpoint(checkpoints, case, tmp_path):
    path = checkpoints[case]
    with read_gguf(write_gguf(path, tmp_path / "m.gguf")) as f:
        got = ModelConfig.from_dict(f.config_dict, f.generation)
        assert got == ModelConfig.from_dir(path)
        np.testing.assert_array_equal(inv_freq(got), inv_freq(ModelConfig.from_dir(path)))
        hf = _hf(path)
        assert set(f.tensors) == set(hf)
        for name, t in f.tensors.items():
            assert t.name == name and t.shape == hf[name].shape and t.ggml_type == 0
            assert not t.raw.flags.writeable and t.raw.dtype == np.uint8
            np.testing.assert_array_equal(t.dequantize(), hf[name], err_msg=name)


def test_qk_rows_are_stored_permuted_and_read_back(checkpoints, tmp_path):
    """The file really holds permuted rows (so the equality above tests the un-permutation),
    the other weights are zero-copy views of the map, q/k are copies."""
    path = checkpoints["llama"]
    g = write_gguf(path, tmp_path / "m.gguf")
    from pagedcy.models.gguf_file import GGUFFile

    hf = _hf(path)
    with GGUFFile(g) as raw, read_gguf(g) as f:
        stored = raw.tensors["blk.0.attn_q.weight"].dequantize()
        want = hf["model.layers.0.self_attn.q_proj.weight"]
        assert not np.array_equal(stored, want)
        assert sorted(map(tuple, stored)) == sorted(map(tuple, want))      # same rows, reordered
        mapped = f._file.tensors                           # the views of f's own map
        v = f.tensors["model.layers.0.self_attn.v_proj.weight"].raw
        q = f.tensors["model.layers.0.self_attn.q_proj.weight"].raw
        assert np.shares_memory(v, mapped["blk.0.attn_v.weight"].raw)
        assert not np.shares_memory(q, mapped["blk.0.attn_q.weight"].raw)


def test_qwen_files_are_not_permuted(checkpoints, tmp_path):
    from pagedcy.models.gguf_file import GGUFFile

    path = checkpoints["qwen2"]
    with GGUFFile(write_gguf(path, tmp_path / "m.gguf")) as raw:
        np.testing.assert_array_equal(raw.tensors["blk.1.attn_k.weight"].dequantize(),
                                      _hf(path)["model.layers.1.self_attn.k_proj.weight"])


@pytest.mark.parametrize("qtype", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
@pytest.mark.parametrize("case", ["llama", "qwen3"])
def test_typed_tensors(checkpoints, case, qtype, tmp_path):
    path = checkpoints[case]
    hf = _hf(path)
    code = gguf.GGMLQuantizationType[qtype]
    with read_gguf(write_gguf(path, tmp_path / "m.gguf", tensor_type=qtype)) as f:
        for name, t in f.tensors.items():
            a = hf[name]
            got = t.dequantize()
            if a.ndim == 1:                                   # norms, biases stay F32
                assert t.ggml_type == 0
                np.testing.assert_array_equal(got, a)
                continue
            assert t.ggml_type == int(code) and t.raw.shape[0] == a.shape[0]
            if qtype == "F16":
                want = a.astype(np.float16).astype(np.float32)
            elif qtype == "BF16":
                want = bf16_bits_to_f32(to_bf16_bits(a))
            else:   # rows quantize independently: permuting rows commutes with quantizing
                want = dequantize(quantize(a, code), code)
                scale = np.abs(a).max(axis=1, keepdims=True)
                assert np.all(np.abs(got - a) <= 0.15 * scale), name
            np.testing.assert_array_equal(got, want, err_msg=name)


def test_config_matches_transformers_autoconfig(checkpoints, tmp_path):
    from transformers import AutoConfig

    for case in ("llama", "qwen2", "llama_bias_tied"):
        g = write_gguf(checkpoints[case], tmp_path / f"{case}.gguf")
        theirs = AutoConfig.from_pretrained(str(tmp_path), gguf_file=os.path.basename(g))
        with read_gguf(g) as f:
            ours = f.config_dict
        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "intermediate_size", "max_position_embeddings",
                    "tie_word_embeddings", "bos_token_id", "eos_token_id"):
            assert ours[key] == getattr(theirs, key), (case, key)
        assert ours["rms_norm_eps"] == pytest.approx(theirs.rms_norm_eps, rel=1e-6)
        theta = (getattr(theirs, "rope_parameters", None) or {}).get("rope_theta",
                                                                    getattr(theirs, "rope_theta", None))
        assert ours["rope_theta"] == pytest.approx(theta, rel=1e-6)


# ---- Gemma 3 (written from a random transformers Gemma3ForCausalLM) --------------------------

@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    torch = pytest.importorskip("torch")
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    d = tmp_path_factory.mktemp("gemma3")
    cfg = Gemma3TextConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=7,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                           query_pre_attn_scalar=32, sliding_window=16, max_position_embeddings=512,
                           rms_norm_eps=1e-6, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.save_pretrained(d / "hf")
    write_random_checkpoint(d / "tok", "LlamaForCausalLM", vocab_size=320)   # a tokenizer.json
    for name in ("tokenizer.json", "tokenizer_config.json"):
        os.replace(d / "tok" / name, d / "hf" / name)
    return d / "hf", write_gguf(d / "hf", d / "gemma3.gguf")


def test_gemma3_config(gemma3):
    from transformers import AutoConfig, Gemma3TextConfig

    hf_dir, g = gemma3
    want = AutoConfig.from_pretrained(hf_dir)
    theirs = AutoConfig.from_pretrained(os.path.dirname(g), gguf_file=os.path.basename(g))
    with read_gguf(g) as f:
        raw = f.config_dict
    assert raw["architectures"] == ["Gemma3ForCausalLM"] and raw["model_type"] == "gemma3_text"
    ours = Gemma3TextConfig(**{k: v for k, v in raw.items() if k not in ("architectures", "model_type")})
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "sliding_window",
            "layer_types", "query_pre_attn_scalar", "rope_parameters", "max_position_embeddings",
            "tie_word_embeddings", "final_logit_softcapping", "attn_logit_softcapping",
            "hidden_activation", "attention_bias")
    for key in keys:
        assert getattr(ours, key) == getattr(want, key), key
    assert ours.rms_norm_eps == pytest.approx(want.rms_norm_eps, rel=1e-6)
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "head_dim", "sliding_window",
                "num_key_value_heads", "layer_types", "tie_word_embeddings"):
        assert raw[key] == getattr(theirs, key), key
    assert raw["sliding_window_pattern"] == 6
    assert raw["layer_types"][5] == "full_attention" and raw["layer_types"].count("full_attention") == 1


def test_gemma3_tensors(gemma3):
    from safetensors.numpy import load_file

    hf_dir, g = gemma3
    hf = load_file(os.path.join(hf_dir, "model.safetensors"))
    hf.pop("lm_head.weight", None)                       # tied: llama.cpp writes no output.weight
    with read_gguf(g) as f, read_gguf(g, hf_norms=False) as stored:
        assert set(f.tensors) == set(hf)
        assert "model.layers.0.pre_feedforward_layernorm.weight" in f.tensors
        assert "model.layers.0.post_feedforward_layernorm.weight" in f.tensors
        assert "model.layers.0.self_attn.q_norm.weight" in f.tensors
        for name, t in f.tensors.items():
            got = t.dequantize()
            if name.endswith("norm.weight"):   # file holds 1 + w; (1 + w) - 1 rounds in float32
                np.testing.assert_allclose(got, hf[name], atol=1e-6, err_msg=name)
                np.testing.assert_array_equal(stored.tensors[name].dequantize(), hf[name] + np.float32(1))
            else:
                np.testing.assert_array_equal(got, hf[name], err_msg=name)


# ---- K-quants, unsupported types, bad metadata -----------------------------------------------

def _write(path, tensors, arch="llama", extra=None, block_count=1):
    """A GGUF with the given metadata and ``{name: (uint8 or f32 array, ggml type or None)}``."""
    w = gguf.GGUFWriter(os.fspath(path), arch)
    if block_count is not None:
        w.add_block_count(block_count)
    meta = {f"{arch}.embedding_length": 256, f"{arch}.attention.head_count": 2,
            f"{arch}.feed_forward_length": 512, **(extra or {})}
    for k, v in meta.items():
        {str: w.add_string, int: w.add_uint32, float: w.add_float32, bool: w.add_bool}[type(v)](k, v)
    for name, (a, code) in tensors.items():
        w.add_tensor(name, a, raw_dtype=code)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _blocks(code, rows, cols, rng):
    """Random bytes shaped as ``rows`` rows of ``cols`` elements of ``code``, with the
    float16 scale fields set to small finite values."""
    block, size = gguf.GGML_QUANT_SIZES[code]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    scale = np.array([0.01], np.float16).view(np.uint8)
    if code in (gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q5_K):
        raw[..., 0:4] = np.tile(scale, 2)                # d, dmin
    elif code == gguf.GGMLQuantizationType.Q6_K:
        raw[..., size - 2:] = scale                      # d is last
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K"])
def test_k_quant_tensors_are_read(tmp_path, qtype):
    code = gguf.GGMLQuantizationType[qtype]
    raw = _blocks(code, 8, 512, np.random.default_rng(1))
    tensors = {"token_embd.weight": (raw, code), "blk.0.ffn_down.weight": (raw, code)}
    with read_gguf(_write(tmp_path / "k.gguf", tensors)) as f:
        t = f.tensors["model.layers.0.mlp.down_proj.weight"]
        assert t.shape == (8, 512) and t.type_name == qtype
        np.testing.assert_array_equal(t.raw, raw)
        np.testing.assert_array_equal(t.dequantize(), dequantize(raw, code))


@pytest.mark.parametrize("qtype", ["Q2_K", "Q3_K", "IQ4_NL", "IQ2_XXS", "TQ1_0", "I32"])
def test_unsupported_tensor_type_names_tensor_and_type(tmp_path, qtype):
    code = gguf.GGMLQuantizationType[qtype]
    block, size = gguf.GGML_QUANT_SIZES[code]
    raw = np.zeros((4, 256 // block * size), np.uint8)
    path = _write(tmp_path / "u.gguf", {"blk.0.ffn_up.weight": (raw, code)})
    with pytest.raises(ValueError, match=rf"'blk\.0\.ffn_up\.weight'.*{qtype}"):
        read_gguf(path)


@pytest.mark.parametrize("extra,block_count,arch,match", [
    ({}, None, "llama", "block_count.*missing"),
    ({"llama.attention.layer_norm_rms_epsilon": "tiny"}, 1, "llama", "layer_norm_rms_epsilon.*float"),
    ({"llama.context_length": 1.5}, 1, "llama", "context_length.*int"),
    ({"llama.rope.scaling.type": "weird"}, 1, "llama", "rope scaling type 'weird'"),
    ({}, 1, "mamba", "unsupported GGUF architecture 'mamba'"),
    ({}, 2**31, "gemma3", "block_count.*must be in"),
    ({"llama.attention.head_count_kv": 0}, 1, "llama", "head_count_kv.*must be in"),
    ({"llama.feed_forward_length": 0}, 1, "llama", "feed_forward_length"),
])
def test_bad_metadata(tmp_path, extra, block_count, arch, match):
    t = {"token_embd.weight": (np.zeros((4, 256), np.float32), None)}
    with pytest.raises(ValueError, match=match):
        read_gguf(_write(tmp_path / "b.gguf", t, arch=arch, extra=extra, block_count=block_count))


def test_unknown_tensor_name_refused(tmp_path):
    t = {"blk.0.attn_qkv.weight": (np.zeros((4, 256), np.float32), None)}
    with pytest.raises(ValueError, match="'blk.0.attn_qkv.weight' has no Hugging Face"):
        read_gguf(_write(tmp_path / "n.gguf", t))


def test_missing_file():
    with pytest.raises(FileNotFoundError):
        read_gguf("/nonexistent/model.gguf")


def test_generation_eos_list():
    tokens = ["<pad>", "<eos>", "<bos>", "x", "<end_of_turn>", "<|im_end|>"]
    md = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": np.array([3, 3, 3, 1, 3, 1]),
          "tokenizer.ggml.eos_token_id": 1, "tokenizer.ggml.bos_token_id": 2,
          "tokenizer.ggml.eot_token_id": 4}
    gen = generation_from_metadata(SimpleNamespace(metadata=md))
    assert gen == {"bos_token_id": 2, "eos_token_id": [1, 4]}      # <|im_end|> is not control here
    md["tokenizer.ggml.token_type"][5] = 3
    assert generation_from_metadata(SimpleNamespace(metadata=md))["eos_token_id"] == [1, 4, 5]
    md["tokenizer.ggml.eos_token_id"] = "1"
    with pytest.raises(ValueError, match="eos_token_id"):
        generation_from_metadata(SimpleNamespace(metadata=md))


def test_config_json_roundtrip(checkpoints, tmp_path):
    """config_dict is plain JSON (the lead may write it out as config.json)."""
    with read_gguf(write_gguf(checkpoints["qwen3"], tmp_path / "m.gguf")) as f:
        assert json.loads(json.dumps(f.config_dict)) == f.config_dict
        assert f.tokenizer().encode("hello") and f.file_size == os.path.getsize(tmp_path / "m.gguf")


def _transformers_state(gguf_path):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf_path), dtype=torch.float32,
                                                 gguf_file=os.path.basename(gguf_path))
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("case,qtype", [("llama", "Q8_0"), ("llama_bias_tied", "Q4_1"),
                                        ("qwen2", "F16")])
def test_tensors_equal_transformers_gguf_loader(checkpoints, tmp_path, case, qtype):
    """transformers' own GGUF loader (its dequantization and reverse_permute) gives the same
    float32 weights as ours, bit for bit."""
    g = write_gguf(checkpoints[case], tmp_path / "m.gguf", tensor_type=qtype)
    theirs = _transformers_state(g)
    with read_gguf(g) as f:
        if f.config_dict["tie_word_embeddings"]:
            theirs.pop("lm_head.weight")
        # transformers' GGUF config has no attention_bias/mlp_bias: its model drops the biases
        assert set(theirs) <= set(f.tensors)
        assert len(theirs) > 10
        for name, want in theirs.items():
            np.testing.assert_array_equal(f.tensors[name].dequantize(), want, err_msg=name)


def test_gemma3_tensors_equal_transformers_gguf_loader(gemma3):
    _, g = gemma3
    theirs = _transformers_state(g)
    with read_gguf(g) as f:
        assert set(f.tensors) == set(theirs) - {"lm_head.weight"}
        for name, t in f.tensors.items():
            np.testing.assert_array_equal(t.dequantize(), theirs[name], err_msg=name)


def test_reader_interface(checkpoints, tmp_path):
    """names/contains/shape/get, as CheckpointReader offers them, with named errors."""
    path = checkpoints["qwen2"]
    hf = _hf(path)
    with read_gguf(write_gguf(path, tmp_path / "m.gguf", tensor_type="F16")) as f:
        assert sorted(f.names()) == sorted(hf) and "model.norm.weight" in f
        name = "model.layers.1.mlp.down_proj.weight"
        assert f.shape(name) == hf[name].shape
        got = f.get(name, hf[name].shape)
        assert got.dtype == np.float32 and got.flags.writeable and got.flags.c_contiguous
        np.testing.assert_array_equal(got, hf[name].astype(np.float16).astype(np.float32))
        with pytest.raises(ValueError, match="no tensor 'nope'"):
            f.get("nope")
        with pytest.raises(ValueError, match=r"shape \[128, 256\], expected \[1, 2\]"):
            f.get(name, (1, 2))
