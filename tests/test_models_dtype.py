"""The ``dtype`` and ``quantization`` load options: 16-bit checkpoints stay 16-bit under
"auto" (same logits as float32, half the bytes, no float32 copy made), conversions to
float16/bfloat16, GGUF Q8_0/Q4_0 quantization at load (logits within stated bounds), the
engine and CLI plumbing, and bad values refused with the list of choices."""
import numpy as np
import pytest

pytest.importorskip("safetensors")

from model_helpers import SlotAllocator, assert_close  # noqa: E402

from pagedcy import LLM, SamplingParams  # noqa: E402
from pagedcy.engine import LLMEngine  # noqa: E402
from pagedcy.models import load_model, write_random_checkpoint  # noqa: E402
from pagedcy.models.linear import (PANEL_FORMATS, BlockWeight, DenseWeight, HalfWeight,  # noqa: E402
                                   PanelWeight)

N_PROMPTS = 32


@pytest.fixture(scope="module")
def bf16_dir(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("bf16"), dtype="bfloat16", seed=2,
                                   vocab_size=512)


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(0)
    return [rng.integers(6, 512, n) for n in rng.integers(3, 20, N_PROMPTS)]


def prefill(model, prompts):
    alloc = SlotAllocator(model, max_pages=256, page_size=4)
    ids = np.concatenate(prompts).astype(np.int32)
    return model.forward(alloc.store.pages(), ids, alloc.step(range(len(prompts)),
                                                               [len(p) for p in prompts])).copy()


def matrices(model):
    return [model._lm_head] + [w for lw in model._layers
                               for w in (lw.w_qkv, lw.w_o, lw.w_gate_up, lw.w_down)]


def test_auto_keeps_bf16_and_matches_float32(bf16_dir, prompts):
    auto, f32 = load_model(bf16_dir), load_model(bf16_dir, dtype="float32")
    assert all(isinstance(w, HalfWeight) and w.format == "bfloat16" for w in matrices(auto))
    assert all(isinstance(w, DenseWeight) for w in matrices(f32))
    # widening bf16 is exact and the fallback equals the widened weight: the same logits
    assert_close(prefill(auto, prompts), prefill(f32, prompts), rtol=1e-5)
    ratio = auto.weight_bytes / f32.weight_bytes
    assert 0.5 <= ratio < 0.51          # norms stay float32
    assert f32.weight_bytes == 4 * f32.config.num_parameters()


@pytest.mark.parametrize("ml_dtypes", [True, False])
def test_auto_never_widens_a_16bit_matrix(bf16_dir, monkeypatch, ml_dtypes):
    """No float32 copy of a bf16 matrix is made at load, with or without ml_dtypes (the raw
    path): only 1-D norm weights are widened."""
    from pagedcy.models import storage, weights

    real = weights.bf16_bits_to_f32

    def guarded(bits):
        assert bits.ndim == 1, f"a {bits.shape} bf16 tensor was widened to float32"
        return real(bits)

    monkeypatch.setattr(weights, "bf16_bits_to_f32", guarded)
    monkeypatch.setattr(storage, "bf16_bits_to_f32", guarded)
    if not ml_dtypes:
        monkeypatch.setattr(weights, "_has_ml_dtypes", lambda: False)
    model = load_model(bf16_dir)
    assert model.weight_bytes < 0.51 * 4 * model.config.num_parameters()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_float32_checkpoint_stored_in_16_bits(tmp_path, prompts, dtype):
    path = write_random_checkpoint(tmp_path, seed=2, vocab_size=512, tokenizer=False)
    f32, half = load_model(path), load_model(path, dtype=dtype)
    assert all(isinstance(w, HalfWeight) and w.format == dtype for w in matrices(half))
    assert half._embed.format == dtype
    assert 0.5 <= half.weight_bytes / f32.weight_bytes < 0.51
    # measured: 3.6e-3 (bf16), 5.8e-4 (f16)
    assert_close(prefill(half, prompts), prefill(f32, prompts), rtol=3e-2)


def test_float16_refuses_values_past_its_range(tmp_path):
    from pagedcy.models.storage import WeightStorage

    with pytest.raises(ValueError, match="float16's range"):
        WeightStorage("float16").table(np.full((2, 2), 1e5, np.float32), "float32", "w")


@pytest.mark.parametrize("quant, rtol, agree", [("q8_0", 0.03, 0.9), ("q4_0", 0.3, 0.5)])
def test_quantized_logits_within_bounds(bf16_dir, prompts, quant, rtol, agree):
    """Random Gaussian weights are Q4_0's worst case (no outliers to spare, errors compound
    over the layers); measured: q8_0 1.0e-2 relative, 97% top-1 agreement on 32 prompts;
    q4_0 0.16, 75%."""
    pytest.importorskip("gguf")
    f32, q = load_model(bf16_dir, dtype="float32"), load_model(bf16_dir, quantization=quant)
    held = PanelWeight if quant in PANEL_FORMATS else BlockWeight    # int8 activations for q8_0
    assert all(isinstance(w, held) and w.format == quant for w in matrices(q))
    assert isinstance(q._embed, HalfWeight)           # an untied table follows dtype
    want, got = prefill(f32, prompts), prefill(q, prompts)
    assert_close(got, want, rtol=rtol)
    assert np.mean(got.argmax(1) == want.argmax(1)) >= agree
    bytes_per_weight = {"q8_0": 34 / 32, "q4_0": 18 / 32}[quant]
    n = sum(w.shape[0] * w.shape[1] for w in matrices(q))
    assert sum(w.nbytes for w in matrices(q)) == n * bytes_per_weight


def test_q8_0_greedy_mostly_equal_through_llm(bf16_dir, prompts):
    pytest.importorskip("gguf")
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    batch = [{"prompt_token_ids": p.tolist()} for p in prompts[:8]]
    runs = [[o.outputs[0].token_ids for o in LLM(bf16_dir, kv_cache_pages=128, page_size=4, **kw)
             .generate(batch, greedy, use_tqdm=False)]
            for kw in (dict(dtype="float32"), dict(quantization="q8_0", activation_dtype="float32"))]
    # float32 activations: the weight rounding alone (int8 activations: test_gguf_model)
    assert sum(a == b for a, b in zip(*runs)) >= 6      # measured: 8 of 8


def test_gemma_tied_table_quantized_with_the_head(tmp_path):
    pytest.importorskip("gguf")
    path = write_random_checkpoint(tmp_path, "Gemma3ForCausalLM", seed=1, tokenizer=False)
    model = load_model(path, quantization="q8_0")
    assert model._embed is None and isinstance(model._lm_head, PanelWeight)
    rng = np.random.default_rng(1)
    ps = [rng.integers(0, model.config.vocab_size, n) for n in (5, 12)]
    assert_close(prefill(model, ps), prefill(load_model(path), ps), rtol=0.02)  # measured 2e-3


def test_quantization_needs_32_wide_rows(tmp_path):
    pytest.importorskip("gguf")
    path = write_random_checkpoint(tmp_path, hidden_size=48, num_attention_heads=4,
                                   num_key_value_heads=2, tokenizer=False)
    with pytest.raises(ValueError, match="multiple of 32"):
        load_model(path, quantization="q4_0")


@pytest.mark.parametrize("kw, match", [
    (dict(dtype="float64"), "dtype must be one of auto, float32, float16, bfloat16"),
    (dict(dtype=None), "dtype must be one of"),
    (dict(quantization="q4_k"), "quantization must be None or one of q8_0, q4_0"),
    (dict(quantization=8), "quantization must be"),
])
def test_bad_values_are_refused(bf16_dir, kw, match):
    with pytest.raises(ValueError, match=match):
        load_model(bf16_dir, **kw)
    with pytest.raises(ValueError, match=match):
        LLMEngine(bf16_dir, **kw)
    with pytest.raises(ValueError, match=match):
        load_model("/nonexistent/dir", **kw)           # checked before the disk


def test_engine_and_cli_pass_the_options(bf16_dir):
    from pagedcy.server.launch import add_engine_arguments, engine_kwargs
    import argparse

    engine = LLMEngine(bf16_dir, dtype="float32", kv_cache_pages=16)
    assert isinstance(engine.model._lm_head, DenseWeight)
    assert isinstance(LLM(bf16_dir, kv_cache_pages=16).llm_engine.model._lm_head, HalfWeight)
    p = argparse.ArgumentParser()
    add_engine_arguments(p)
    assert engine_kwargs(p.parse_args([]))["dtype"] == "auto"
    kw = engine_kwargs(p.parse_args(["--dtype", "bfloat16", "--quantization", "q8_0"]))
    assert (kw["dtype"], kw["quantization"]) == ("bfloat16", "q8_0")
    with pytest.raises(SystemExit):
        p.parse_args(["--dtype", "float64"])


class BlockReader:
    """A stand-in for a GGUF file's reader: the checkpoint's tensors by their HF names, with
    q/k/gate/up/down handed over as raw Q8_0 rows and v as float16 (Q4_K_M-style mixed
    formats in one fused q|k|v), or (``dense=True``) as float32 of the same values."""

    def __init__(self, path, dense=False):
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize, quantize

        from pagedcy.models.weights import CheckpointReader
        self._r, self._dense = CheckpointReader(path), dense
        self._q = lambda a: quantize(a, GGMLQuantizationType.Q8_0)
        self._dq = lambda raw: dequantize(raw, GGMLQuantizationType.Q8_0)

    def get(self, name, shape=None):
        return self._r.get(name, shape)

    def get_stored(self, name, shape=None):
        a = self._r.get(name, shape)
        if name.endswith("v_proj.weight"):
            half = a.astype(np.float16)
            return (half.astype(np.float32), "float32") if self._dense else (half, "float16")
        if name.endswith("proj.weight"):
            raw = self._q(a)
            return (self._dq(raw), "float32") if self._dense else (raw, "q8_0")
        return a, "float32"


def test_build_model_from_a_block_format_reader(tmp_path, prompts):
    """Loaders other than safetensors hand build_model raw block rows: mixed formats in one
    fused projection become a StackedWeight, and the logits are those of the same values
    held in float32."""
    pytest.importorskip("gguf")
    from pagedcy.models import ModelConfig
    from pagedcy.models.linear import StackedWeight
    from pagedcy.models.loader import build_model

    path = write_random_checkpoint(tmp_path, seed=4, vocab_size=512, tokenizer=False)
    cfg = ModelConfig.from_dir(path)
    mixed = build_model(cfg, BlockReader(path), activation_dtype="float32")
    dense = build_model(cfg, BlockReader(path, dense=True))
    lw = mixed._layers[0]
    assert isinstance(lw.w_qkv, StackedWeight) and lw.w_qkv.format == "q8_0+float16"
    assert isinstance(lw.w_gate_up, BlockWeight) and lw.w_gate_up.format == "q8_0"
    assert isinstance(mixed._lm_head, DenseWeight)
    # quantization applies to float tensors only: the reader's blocks stay as they are
    requant = build_model(cfg, BlockReader(path), quantization="q4_0")
    assert requant._layers[0].w_gate_up.format == "q8_0"
    assert requant._layers[0].w_qkv.format == "q8_0+q4_0"
    np.testing.assert_array_equal(lw.w_qkv.dense(), dense._layers[0].w_qkv.dense())
    assert_close(prefill(mixed, prompts), prefill(dense, prompts), rtol=1e-6)


def test_generate_cli_takes_dtype_and_quantization(bf16_dir, capsys):
    from pagedcy.tools.cli import main

    base = ["generate", "--model", bf16_dir, "--prompt", "Once upon", "--max-tokens", "4"]
    texts = []
    for extra in ([], ["--dtype", "float32"]):
        assert main(base + extra) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] and texts[0].strip()       # auto == float32 on a bf16 file
    with pytest.raises(SystemExit) as e:
        main(base + ["--quantization", "q2_k"])
    assert e.value.code == 2 and "q8_0" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_large_tensors_come_back_in_numpy_memory(tmp_path, dtype):
    """A tensor of 4 MiB or more is returned in NumPy's own allocation (NumPy asks for huge
    pages; safetensors' bytes are 4 KiB pages, which a decode step streams 1.5x slower), with
    the stored values; every tensor starts on a 64-byte boundary (the GEMM's loads)."""
    import ml_dtypes
    from safetensors.numpy import save_file

    from pagedcy.models.weights import CheckpointReader

    rng = np.random.default_rng(3)
    store = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[dtype]
    big = rng.standard_normal((1024, 2048 if dtype == "float32" else 4096)).astype(store)
    small = rng.standard_normal((8, 16)).astype(store)
    save_file({"big": big, "small": small}, str(tmp_path / "model.safetensors"))
    reader = CheckpointReader(tmp_path)
    arr, fmt = reader.get_stored("big")
    assert fmt == dtype and arr.nbytes >= 4 << 20
    owner = arr
    while not owner.flags.owndata:
        owner = owner.base
        assert isinstance(owner, np.ndarray)
    np.testing.assert_array_equal(arr, big.view(np.uint16) if dtype == "bfloat16" else big)
    got, _ = reader.get_stored("small")
    np.testing.assert_array_equal(got, small.view(np.uint16) if dtype == "bfloat16" else small)
    assert arr.ctypes.data % 64 == 0 and got.ctypes.data % 64 == 0
